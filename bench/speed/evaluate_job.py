"""Benchmark: the CPU seconds of one evaluate (or baselines) job, as the job script runs it, on a finished run.

    python bench/speed/evaluate_job.py RUN MODEL FOLD OUT [--compare] [--profile]
    python bench/speed/evaluate_job.py --quick      # a tiny synthetic run: one DQN seed trained here, then evaluated

Calls `marketrl.evaluation.evaluate.evaluate_job` (MODEL = baselines: `baselines_job`) with the arguments
workflow_scripts/evaluate.py passes (the config slice of `marketrl.workflow.stages.stage_config`, the run's
manifest, folds and every seed's model), writing into OUT instead of the run's results/. Prints one JSON line:
imports_cpu, job_cpu, total_cpu (`time.process_time`) and wall seconds. `--compare` checks OUT against the run's
own outputs (metrics.json values without provenance and model path; bars.parquet frames), `--profile` writes a
cProfile (on CPU time) to OUT/prof.out. Run it with `/usr/bin/time -f "%U %S"` for the process's whole CPU.

The checkout is appended to sys.path, so PYTHONPATH=<other checkout> times that checkout's code (before/after).
docs/PERFORMANCE.md ("Evaluate job CPU") has the figures.
"""

from __future__ import annotations

import time

START_CPU, START_WALL = time.process_time(), time.perf_counter()

import argparse  # noqa: E402  (after the clock starts: the imports are part of the job's cost)
import cProfile  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))  # appended: a PYTHONPATH checkout wins

import polars as pl  # noqa: E402

from marketrl.evaluation.evaluate import baselines_job, evaluate_job  # noqa: E402
from marketrl.runtime.jobs import job_context  # noqa: E402
from marketrl.settings import paths  # noqa: E402
from marketrl.workflow import pipeline, stages  # noqa: E402

IMPORTS_CPU = time.process_time() - START_CPU


def run_config(run: Path) -> dict[str, Any]:
    """The run's config.yaml as rules/common.smk completes it (defaults, contract specs)."""
    import yaml

    from marketrl.data.definitions import resolve_definitions
    from marketrl.settings.config import validate_config

    config = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    config.update(validate_config(config))
    config.update(resolve_definitions(config))
    return config


def job_call(config: dict[str, Any], model: str, fold: int, out: Path) -> Callable[[], Any]:
    """The job, as its script calls it, with outputs under `out` (run from the run directory)."""
    if model == "baselines":
        return lambda: baselines_job(
            fold=fold,
            manifest_path=paths.FEATURE_MANIFEST,
            folds_path=paths.FOLDS,
            config=stages.stage_config(config, "baselines"),
            metrics_path=str(out / "metrics.json"),
            bars_path=str(out / "bars.parquet"),
        )
    seeds = pipeline.seed_indices(config, model)
    return lambda: evaluate_job(
        model=model,
        fold=fold,
        seed_indices=seeds,
        manifest_path=paths.FEATURE_MANIFEST,
        folds_path=paths.FOLDS,
        model_paths=[paths.MODEL.format(model=model, fold=fold, seed=s) for s in seeds],
        config=stages.stage_config(config, "evaluate", model=model),
        metrics_paths=[str(out / f"seed_{s}" / "metrics.json") for s in seeds],
        bars_paths=[str(out / f"seed_{s}" / "bars.parquet") for s in seeds],
    )


def timed(job: Callable[[], Any], out: Path, profile: bool) -> dict[str, float]:
    """Run `job` in a job context (one thread, as the rule's `threads: 1`); its CPU and the process's so far."""
    with job_context(str(out / "job.log"), 1, uses_torch=True):
        start = time.process_time()
        if profile:
            profiler = cProfile.Profile(time.process_time)
            profiler.runcall(job)
            profiler.dump_stats(str(out / "prof.out"))
        else:
            job()
        job_cpu = time.process_time() - start
    return {
        "imports_cpu": round(IMPORTS_CPU, 2),
        "job_cpu": round(job_cpu, 2),
        "total_cpu": round(time.process_time() - START_CPU, 2),
        "wall": round(time.perf_counter() - START_WALL, 2),
    }


def same_outputs(out: Path, reference: Path) -> list[str]:
    """The output files under `out` that differ from those under `reference` (empty: all equal)."""
    differ = []
    for metrics in sorted(out.rglob("metrics.json")):
        relative = metrics.relative_to(out)
        ours, theirs = (json.loads(p.read_text(encoding="utf-8")) for p in (metrics, reference / relative))
        for record in (ours, theirs):
            record.pop("provenance", None)
            record.get("model", {}).pop("path", None)
        if ours != theirs:
            differ.append(str(relative))
        bars = relative.with_name("bars.parquet")
        if not pl.read_parquet(out / bars).equals(pl.read_parquet(reference / bars)):
            differ.append(str(bars))
    return differ


def quick() -> None:
    """A tiny synthetic run (tests/support/runs.py): train one DQN seed, evaluate it, and check the evaluation's
    positions (the agents' action table) against the lockstep pass of the same policy."""
    from marketrl.agents import load_policy
    from marketrl.env import MarketData, evaluate
    from marketrl.splits.datasets import cost_model_from_config, env_config_from_config, load_features
    from marketrl.splits.folds import FoldPlan, select_rows
    from marketrl.splits.normalize import FeatureNormalizer
    from marketrl.training.train import train_job
    from tests.support.runs import synthetic_job_inputs

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        _, manifest, folds, config = synthetic_job_inputs(root, n_instruments=2)
        config["training"].update(total_steps=256, n_envs=4, checkpoint_every=10_000)
        config["env"].update(window=2, episode_length=16)  # the days hold 24 bars; a window reads 2 rows
        hparams = root / "dqn.json"
        best = {"learning_rate": 1e-3, "batch_size": 16, "learning_starts": 32, "target_update": 20}
        hparams.write_text(json.dumps({"algo": "dqn", "best_params": {**best, "hidden_dim_base": 8}}))
        common = {"model": "dqn", "fold": 0, "seed_indices": [0], "config": config}
        inputs = {"manifest_path": str(manifest), "folds_path": str(folds)}
        model = root / "model.pt"
        train_job(
            **common,
            **inputs,
            hparams_path=str(hparams),
            model_paths=[str(model)],
            log_paths=[str(root / "train_log.json")],
            resume_path=str(root / "resume.pt"),
        )
        out = root / "eval"
        figures = timed(
            lambda: evaluate_job(
                **common,
                **inputs,
                model_paths=[str(model)],
                metrics_paths=[str(out / "metrics.json")],
                bars_paths=[str(out / "bars.parquet")],
            ),
            root,
            profile=False,
        )
        policy, meta = load_policy(model)
        normalizer = FeatureNormalizer.from_state_dict(meta["normalizer"])
        rows = select_rows(load_features(manifest), FoldPlan.load(folds).fold(0), "test")
        costs = cost_model_from_config(config["costs"])
        env_config = env_config_from_config(config)
        data = MarketData.from_frame(
            rows, normalizer.feature_names, normalizer, costs, max_gap=env_config.max_gap
        )
        lockstep = evaluate(policy, data, env_config)  # one forward per bar, the training-side path
        written = pl.read_parquet(out / "bars.parquet")
        assert written.height == lockstep.height > 0
        assert written["position"].equals(lockstep["position"]), "the table's positions differ from lockstep"
        print("equal work (checked after timing): the evaluation's positions are the lockstep pass's")
        print(json.dumps({"model": "dqn (quick)", **figures}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "run", nargs="?", type=Path, help="a finished run's directory (config.yaml, results/)"
    )
    parser.add_argument("model", nargs="?", help="a model of the run, or 'baselines'")
    parser.add_argument("fold", nargs="?", type=int)
    parser.add_argument("out", nargs="?", type=Path, help="where the job's outputs go")
    parser.add_argument("--compare", action="store_true", help="check OUT against the run's own outputs")
    parser.add_argument("--profile", action="store_true", help="write a cProfile (CPU time) to OUT/prof.out")
    parser.add_argument("--quick", action="store_true", help="a tiny synthetic run instead (seconds)")
    args = parser.parse_args()
    if args.quick:
        quick()
        return
    if args.out is None:
        parser.error("RUN MODEL FOLD OUT are required (or --quick)")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = run_config(args.run)
    os.chdir(args.run)  # the job's paths are relative to the run directory, as under Snakemake
    figures = timed(job_call(config, args.model, args.fold, out), out, args.profile)
    print(json.dumps({"model": args.model, "fold": args.fold, **figures}))
    if args.compare:
        reference = Path("results/eval") / args.model / f"fold_{args.fold}"
        differ = same_outputs(out, reference)
        print(
            f"{args.model} fold {args.fold}: " + (f"DIFFER {differ}" if differ else "outputs equal the run's")
        )
        if differ:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
