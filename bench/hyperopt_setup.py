"""Benchmark: per-trial setup time with the data loaded once per study process vs reloaded for every trial.

Builds the demo data, features, manifest and folds in a temp dir, then runs the same trials twice, side by side:
  shared:  load the tuning window once; each trial only samples parameters and builds its agent
  reload:  every trial reads the feature tables, selects and normalizes the tuning rows and moves them to the
           device again (what the seed pipeline did)
Prints per-trial setup seconds, trial wall seconds and setup as a share of the trial. Target (shared): <= 1%.
    .venv/bin/python bench/hyperopt_setup.py [--days 30] [--trials 3] [--steps 5000]
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
from marketrl.splits.datasets import load_features, tuning_window, write_feature_manifest
from marketrl.splits.folds import write_fold_plan
from marketrl.training.hyperopt import run_trial
from marketrl.training.zoo import ZOO
from marketrl.workflow.config import validate_config


def build_inputs(workdir: Path, days: int) -> tuple[Path, Path]:
    raw = generate_demo_files(workdir / "raw", "2024-01-02", days, seed=7)
    features = []
    for i, path in enumerate(raw):
        out = workdir / "features" / path.name.replace(".dbn.zst", ".parquet")
        build_feature_file(path, out, prev_src=raw[i - 1] if i else None)
        features.append(out)
    manifest = workdir / "manifest.json"
    write_feature_manifest(features, manifest)
    folds = workdir / "folds.json"
    write_fold_plan(features, validate_config({})["folds"], folds)
    return manifest, folds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--algo", default="dqn", choices=tuple(ZOO))
    args = parser.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = torch.device("cpu")
    precision = detect_precision(device, "auto")
    budget = HardwareBudget.detect(device)
    with tempfile.TemporaryDirectory() as tmp:
        manifest, folds_path = build_inputs(Path(tmp), args.days)
        overrides = {"hyperopt": {"trial_steps": args.steps}, "training": {"device": "cpu"}}
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
                space = lambda t, w=window: ZOO[args.algo].search_space(budget, w, config)(t)  # noqa: E731
                value = run_trial(trial, args.algo, window, config, device, precision, space, budget)
                wall = time.perf_counter() - started
                results[mode].append((reload_s + trial.user_attrs["setup_s"], wall))
                study.tell(trial, value)
    print(f"{args.algo}: {args.trials} trials x {args.steps} env steps, {args.days} demo days, CPU, 1 thread")
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
