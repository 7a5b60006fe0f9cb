"""Benchmark: per-trial setup time with the data loaded once per study process vs reloaded for every trial.

Builds the demo data, features, manifest and folds in a temp dir, then runs the same trials twice, side by side:
  shared:  load the tuning window once; each trial only samples parameters and builds its agent
  reload:  every trial reads the feature tables, selects and normalizes the tuning rows and moves them to the
           device again (what the seed pipeline did)
Prints per-trial setup seconds, trial wall seconds and setup as a share of the trial. Target (shared): <= 1%.
    .venv/bin/python bench/speed/hyperopt_setup.py [--days 30] [--trials 3] [--steps 5000]
    .venv/bin/python bench/speed/hyperopt_setup.py --quick    # 6 days, one small fold, 1 trial x 512 steps
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import optuna
import torch

from gpu_utils import HardwareBudget, detect_precision
from marketrl.data.definitions import demo_run_config
from marketrl.data.demo import generate_demo_files
from marketrl.features import build_feature_file
from marketrl.settings.config import validate_config
from marketrl.splits.datasets import load_features, tuning_window, write_feature_manifest
from marketrl.splits.folds import write_fold_plan
from marketrl.training.hyperopt import run_trial
from marketrl.training.zoo import ZOO

#: --quick: one fold that 6 demo days hold (tests/configs/tiny.yaml's; the schema's defaults need 30 days)
QUICK_FOLDS = {
    "n": 1,
    "train_days": 4,
    "validation_days": 2,
    "test_days": 2,
    "tuning_days": 4,
    "tuning_validation_days": 2,
    "embargo_bars": 0,
}


def build_inputs(workdir: Path, days: int, folds: dict) -> tuple[Path, Path]:
    raw = generate_demo_files(workdir / "raw", "2024-01-02", days, seed=7)
    features = []
    for i, path in enumerate(raw):
        out = workdir / "features" / path.name.replace(".dbn.zst", ".parquet")
        build_feature_file(path, out, prev_src=raw[i - 1] if i else None)
        features.append(out)
    manifest = workdir / "manifest.json"
    write_feature_manifest(features, manifest)
    folds_path = workdir / "folds.json"
    write_fold_plan(features, validate_config({"folds": folds})["folds"], folds_path)
    return manifest, folds_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=None, help="demo days (default 30; quick 6)")
    parser.add_argument("--trials", type=int, default=None, help="trials per mode (default 3; quick 1)")
    parser.add_argument(
        "--steps", type=int, default=None, help="env steps per trial (default 5000; quick 512)"
    )
    parser.add_argument("--model", default="dqn", choices=tuple(ZOO))
    parser.add_argument("--quick", action="store_true", help="a sanity run in seconds (small folds)")
    args = parser.parse_args()
    args.days = args.days or (6 if args.quick else 30)
    args.trials = args.trials or (1 if args.quick else 3)
    args.steps = args.steps or (512 if args.quick else 5000)
    folds = QUICK_FOLDS if args.quick else {}
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = torch.device("cpu")
    precision = detect_precision(device, "auto")
    budget = HardwareBudget.detect(device)
    with tempfile.TemporaryDirectory() as tmp:
        manifest, folds_path = build_inputs(Path(tmp), args.days, folds)
        overrides = {"hyperopt": {"trial_steps": args.steps}, "training": {"device": "cpu"}, "folds": folds}
        config = demo_run_config(Path(tmp) / "raw", overrides)  # each instrument costed with its own spec
        from marketrl.splits.folds import FoldPlan

        plan = FoldPlan.load(folds_path)
        results: dict[str, list[tuple[float, float]]] = {"shared": [], "reload": []}
        shared_window = tuning_window(load_features(manifest), plan, config, device)
        for mode in ("shared", "reload"):
            study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=1))
            for _ in range(args.trials):
                trial = study.ask()
                started = time.perf_counter()
                window = shared_window
                if mode == "reload":
                    window = tuning_window(load_features(manifest), plan, config, device)
                reload_s = time.perf_counter() - started
                space = lambda t, w=window: ZOO[args.model].search_space(budget, w, config)(t)  # noqa: E731
                value = run_trial(trial, args.model, window, config, device, precision, space, budget)
                wall = time.perf_counter() - started
                results[mode].append((reload_s + trial.user_attrs["setup_s"], wall))
                study.tell(trial, value)
    print(
        f"{args.model}: {args.trials} trials x {args.steps} env steps, {args.days} demo days, CPU, 1 thread"
    )
    print(f"{'mode':<8} {'setup s/trial':>14} {'trial wall s':>13} {'setup share':>12}")
    for mode, rows in results.items():
        setup = statistics.mean(r[0] for r in rows)
        wall = statistics.mean(r[1] for r in rows)
        print(f"{mode:<8} {setup:>14.4f} {wall:>13.2f} {100 * setup / wall:>11.2f}%")
    ratio = statistics.mean(r[0] for r in results["reload"]) / statistics.mean(
        r[0] for r in results["shared"]
    )
    print(f"setup time reload/shared: {ratio:.0f}x")


if __name__ == "__main__":
    main()
