"""A bench/ script's --quick mode in a subprocess, as `make test` runs it (tests/test_bench_quick.py): from the
repository root, with nothing on PYTHONPATH but what the caller has (each script puts the checkout on sys.path
itself where it imports tests.support)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
HAS_SB3 = importlib.util.find_spec("stable_baselines3") is not None


def run_quick(script: str, *args: str, timeout: int = 240) -> str:
    """Run `bench/<script> --quick ARGS` to the end; its stdout (the test fails with its output otherwise)."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, f"{script} --quick failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout
