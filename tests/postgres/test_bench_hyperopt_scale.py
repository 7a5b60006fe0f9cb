"""bench/speed/hyperopt_scale.py --quick on the session's PostgreSQL cluster: the claim loop of 2 workers runs every
trial of a study and the table is printed (tests/test_bench_quick.py runs the other bench scripts' --quick)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.bench import run_quick


@pytest.mark.bench
def test_hyperopt_scale_quick_runs_every_trial(database: Callable[[], str]) -> None:
    out = run_quick("speed/hyperopt_scale.py", "--storage", database(), "--workers", "2")
    assert "6 tiny trials per study" in out
    (row,) = [line for line in out.splitlines() if line.strip().startswith("2 |")]
    assert float(row.split("|")[1]) > 0  # trials per minute
