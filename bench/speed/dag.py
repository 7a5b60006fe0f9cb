"""Benchmark: how long Snakemake takes to build (dry-run) the DAG of a large fan-out.

100 folds x config.yaml's models x 5 seeds on 130 demo days. Run:
    .venv/bin/python bench/speed/dag.py [--folds 100] [--seeds 5]
    .venv/bin/python bench/speed/dag.py --quick      # 2 folds x 1 seed: a sanity run in seconds
Prints the wall time of `snakemake -n` (parse + DAG + job listing) and the job count. Target: <= 20 s.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from marketrl.settings.registry import MODEL_NAMES

REPO_ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, default=None, help="default 100 (quick 2)")
    parser.add_argument("--seeds", type=int, default=None, help="default 5 (quick 1)")
    parser.add_argument("--quick", action="store_true", help="2 folds x 1 seed: a sanity run in seconds")
    args = parser.parse_args()
    args.folds = args.folds or (2 if args.quick else 100)
    args.seeds = args.seeds or (1 if args.quick else 5)
    config = yaml.safe_load((REPO_ROOT / "config.yaml").read_text())
    config["data"]["demo"]["days"] = args.folds + 30
    config["folds"].update(n=args.folds, test_days=1, train_days=12, validation_days=2, tuning_days=12)
    config["training"]["seeds"] = args.seeds
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, "config.yaml").write_text(yaml.safe_dump(config))
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-m", "snakemake", "-s", str(REPO_ROOT / "Snakefile"), "-n", "--quiet", "rules"],
            cwd=workdir,
            capture_output=True,
            text=True,
            check=True,
        )
        elapsed = time.perf_counter() - started
    total = re.search(r"^total\s+(\d+)", result.stdout + result.stderr, re.MULTILINE)
    models = config["training"].get("models") or MODEL_NAMES  # unset: every registered model
    print(
        f"folds={args.folds} models={len(models)} seeds={args.seeds} jobs={total.group(1) if total else '?'}"
    )
    print(f"dry-run wall time: {elapsed:.2f} s (target <= 20 s)")


if __name__ == "__main__":
    main()
