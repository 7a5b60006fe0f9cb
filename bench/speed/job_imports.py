"""Benchmark: CPU seconds of each job script's imports, in a fresh interpreter, and whether they load torch.

    python bench/speed/job_imports.py                     # features, hyperopt_worker, train, evaluate; 3 runs each
    python bench/speed/job_imports.py --stages features --runs 5

A job script's top-level import statements (`workflow_scripts/{stage}.py`, without `_checkout`, which only puts
the checkout on sys.path) run in `python -c` with this checkout first on PYTHONPATH; the figure is
`time.process_time()` around them (the interpreter's own start-up is not counted), the median of `--runs`.
Every Snakemake job pays it once: with ~170 jobs in make run, a second of imports is ~3 minutes of CPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/speed/job_imports.py`: sys.path holds bench/speed/, not the checkout that tests.support is in
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.job_scripts import script_imports  # noqa: E402


def import_cost(stage: str) -> tuple[float, bool]:
    """(CPU seconds of the stage's imports, whether torch got imported) in a fresh interpreter."""
    code = "\n".join(
        [
            "import sys, time",
            "started = time.process_time()",
            *script_imports(stage),
            "print(time.process_time() - started, 'torch' in sys.modules)",
        ]
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    seconds, torch = done.stdout.split()
    return float(seconds), torch == "True"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", nargs="+", default=["features", "hyperopt_worker", "train", "evaluate"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run per stage")
    args = parser.parse_args(argv)
    runs = 1 if args.quick else args.runs
    print("| job script | imports CPU-s (median) | runs | torch |\n|---|---|---|---|")
    for stage in args.stages:
        results = [import_cost(stage) for _ in range(runs)]
        seconds = [s for s, _ in results]
        torch = "yes" if results[-1][1] else "no"
        spread = ", ".join(f"{s:.2f}" for s in seconds)
        print(f"| {stage} | {statistics.median(seconds):.2f} | {spread} | {torch} |")


if __name__ == "__main__":
    main()
