"""Benchmark (issue 24): what evaluating a model × fold costs against training it, both as Snakemake runs them,
at the run's training budget and at multiples of it.

    python bench/speed/eval_vs_train.py RUN SCRATCH                              # dqn ppo dlinear lstm lightgbm linear
    python bench/speed/eval_vs_train.py RUN SCRATCH --models dqn ppo --scales 1 10 --json out.json
    python bench/speed/eval_vs_train.py RUN SCRATCH --quick         # the run's first model at 1x only

RUN is a finished `make run` (config.yaml, results/, its .venv); it is copied once to SCRATCH (timestamps kept),
and every job runs there with the run's own code. For each scale k, SCRATCH's config.yaml gets k × the run's
`training.total_steps` (agents), `training.epochs` and `training.max_updates` (forecasters; early stopping still
applies); then, per model, `snakemake --cores 1 -f` of fold FOLD's seed models (its one train job) and of its
seed metrics (its one evaluate job). A job's cost is the CPU seconds (user + sys, `getrusage` of the children) of
that Snakemake call minus those of the same call with `-n` (parsing the DAG), so both sides carry the job
script's start-up and imports. The evaluate job's work does not depend on k; it is measured again at each k all
the same. Prints one row per model and scale, and the ratio evaluate / train. A RUN without its own .venv (a
run directory of this checkout's Snakefile, such as the tests' shared run) is run with this interpreter's
Snakemake and this checkout's Snakefile.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))

from evaluate_job import run_config  # noqa: E402  (bench/speed/evaluate_job.py, a sibling)

from marketrl.settings import paths  # noqa: E402
from marketrl.workflow import pipeline  # noqa: E402

DEFAULT_MODELS = ["dqn", "ppo", "dlinear", "lstm", "lightgbm", "linear"]
SCALED_KEYS = ("total_steps", "epochs", "max_updates")


def children_cpu() -> float:
    """User + sys CPU seconds of every waited-for child so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def snakemake(scratch: Path) -> list[str]:
    """The run's own Snakemake (its .venv, its Snakefile), else this interpreter's with this checkout's Snakefile."""
    own = scratch / ".venv" / "bin" / "snakemake"
    if own.exists():
        return [str(own)]
    snakefile = scratch / "Snakefile" if (scratch / "Snakefile").exists() else ROOT / "Snakefile"
    return [sys.executable, "-m", "snakemake", "-s", str(snakefile)]


def snakemake_cpu(scratch: Path, targets: list[str], *, dry: bool) -> float:
    """CPU seconds of one `snakemake --cores 1 -f TARGETS` in `scratch` (with `-n`: the DAG only)."""
    command = [
        *snakemake(scratch),
        "--cores",
        "1",
        "--rerun-triggers",
        "mtime",
        "-f",
        *targets,
        *(["-n"] if dry else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(scratch), "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"}
    before = children_cpu()
    done = subprocess.run(command, cwd=scratch, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed in {scratch}:\n{done.stderr[-3000:]}")
    if not dry and "1 of 1 steps (100%) done" not in done.stderr:
        raise SystemExit(f"expected exactly one job for {targets[0]} ...:\n{done.stderr[-3000:]}")
    return children_cpu() - before


def job_cpu(scratch: Path, targets: list[str]) -> float:
    """One job's CPU seconds: its Snakemake call minus the same call's dry run."""
    return snakemake_cpu(scratch, targets, dry=False) - snakemake_cpu(scratch, targets, dry=True)


def scale_config(scratch: Path, base: dict[str, Any], scale: int) -> None:
    """SCRATCH/config.yaml = the run's config with the training budget keys × scale."""
    config = json.loads(json.dumps(base))
    for key in SCALED_KEYS:
        config["training"][key] = int(base["training"][key]) * scale
    (scratch / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a finished run's directory (config.yaml, results/, .venv)")
    parser.add_argument("scratch", type=Path, help="where the run is copied (reused when it exists)")
    parser.add_argument(
        "--models", nargs="+", help=f"default {' '.join(DEFAULT_MODELS)} (quick: the run's first)"
    )
    parser.add_argument("--scales", type=int, nargs="+", help="default 1 10 (quick 1)")
    parser.add_argument("--fold", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument(
        "--quick", action="store_true", help="one model (the run's first) at 1x: a sanity run"
    )
    args = parser.parse_args()
    scratch = args.scratch.resolve()
    if not scratch.exists():
        shutil.copytree(args.run, scratch, symlinks=True)
    config = run_config(args.run)  # validated, defaults filled in
    args.models = args.models or (config["training"]["models"][:1] if args.quick else DEFAULT_MODELS)
    args.scales = args.scales or ([1] if args.quick else [1, 10])
    base = yaml.safe_load((args.run / "config.yaml").read_text(encoding="utf-8"))
    for key in SCALED_KEYS:
        base.setdefault("training", {}).setdefault(key, config["training"][key])
    rows = []
    print("model | scale | train CPU-s | evaluate CPU-s | evaluate / train")
    for scale in args.scales:
        scale_config(scratch, base, scale)
        for model in args.models:
            seeds = pipeline.seed_indices(config, model)
            models = [paths.MODEL.format(model=model, fold=args.fold, seed=s) for s in seeds]
            metrics = [paths.EVAL_METRICS.format(model=model, fold=args.fold, seed=s) for s in seeds]
            train, evaluate = job_cpu(scratch, models), job_cpu(scratch, metrics)
            row = {"model": model, "scale": scale, "seeds": len(seeds), "train": train, "evaluate": evaluate}
            rows.append(row)
            print(f"{model} | {scale}× | {train:.1f} | {evaluate:.1f} | {evaluate / train:.0%}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
