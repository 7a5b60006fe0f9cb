"""Every script of `make bench` runs to the end in its --quick mode (small sizes, seconds), and the equal-work
checks each makes before timing pass: a broken bench fails `make test`. Never asserts a speed."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
HAS_SB3 = importlib.util.find_spec("stable_baselines3") is not None


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=BENCH,  # env.py and agents.py import their siblings (adapters, env) from here
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"},
    )
    assert done.returncode == 0, f"{script} --quick failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.bench
def test_features_bench_quick_compares_equal_rows() -> None:
    out = _run("features.py")
    assert "equal work (checked before timing" in out
    assert "read_bars CME / UTC calendar" in out and "(b)/(a) =" in out
    rows = [line for line in out.splitlines() if line.startswith("(b)/(a)")]
    assert len(rows) == 1 and "rows out each" in rows[0]


@pytest.mark.bench
def test_env_bench_quick_checks_the_same_transitions() -> None:
    out = _run("env.py")
    assert "equal work (checked before timing)" in out and "TradingEnv and PlainGymEnv agree" in out
    assert sum(line.strip().startswith(("1 |", "64 |")) for line in out.splitlines()) == 2


@pytest.mark.bench
def test_agents_bench_quick_runs_every_configuration() -> None:
    out = _run("agents.py", "--clock", "cpu", *([] if HAS_SB3 else ["--skip-sb3"]))
    for name in ("ppo-64", "dqn-64", "ppo-sb3-defaults", "ppo-1024", "dqn-1024"):
        assert any(line.startswith(name) for line in out.splitlines()), name


@pytest.mark.bench
def test_hyperopt_cost_bench_quick_times_every_corner(tmp_path: Path) -> None:
    out = _run("hyperopt_cost.py", "--json", str(tmp_path / "cost.json"))
    report = json.loads((tmp_path / "cost.json").read_text())
    assert (report["trial_steps"], report["trial_updates"]) == (2048, 10)  # the quick budgets
    models = {m["model"]: m for m in report["models"]}
    assert list(models) == ["dqn", "mlp"]
    for name, m in models.items():
        assert len(m["median_trials"]) == 2, name
        assert len(m["corners"]) == 2 ** len(m["drivers"]), name  # every combination of the drivers' extremes
        assert len({tuple(c["hparams"][d] for d in m["drivers"]) for c in m["corners"]}) == len(m["corners"])
        for trial in m["median_trials"] + m["corners"]:
            assert trial["cpu_s"] > 0 and trial["proxy"] > 0, name
            assert trial["ratio"] == pytest.approx(trial["cpu_s"] / m["median_s"]), name
        assert m["worst_ratio"] == max(c["ratio"] for c in m["corners"]), name
        assert out.count(f"**{name}**: median trial") == 1
    assert "worst corner over all models:" in out and "log-log correlation" in out


def test_unequal_rows_fail_in_one_line_naming_the_row() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from features import UnequalWork, check_same_rows
    finally:
        sys.path.remove(str(BENCH))
    ts = pl.Series([1_705_000_000 * 10**9 + k * 60 * 10**9 for k in range(3)]).cast(pl.Datetime("ns", "UTC"))
    rows = pl.DataFrame(
        {"instrument_id": [1, 1, 1], "ts_event": ts, "trading_day": [dt.date(2024, 1, 12)] * 3}
    )
    assert check_same_rows(rows, rows, "bars in") == 3
    with pytest.raises(UnequalWork) as raised:
        check_same_rows(rows, rows.head(2), "bars in")
    message = str(raised.value)
    assert "\n" not in message and "bars in: stage 3 rows, naive 2" in message and "only in stage" in message


@pytest.mark.bench
def test_seeds_bench_quick_times_batched_and_sequential_ppo() -> None:
    out = _run("seeds.py")
    rows = [line.split("|") for line in out.splitlines() if line.startswith("ppo ")]
    assert [int(row[1]) for row in rows] == [1, 2]
    assert all(int(row[2]) == 128 * 64 for row in rows)  # the same env steps per seed on both sides
    assert sum("no S can beat" in line for line in out.splitlines()) == 1  # the per-seed / shared split


@pytest.mark.bench
def test_evaluate_job_bench_quick_checks_the_positions_against_lockstep() -> None:
    out = _run("evaluate_job.py")
    assert "equal work (checked after timing): the evaluation's positions are the lockstep pass's" in out
    figures = json.loads(out.strip().splitlines()[-1])
    assert figures["algo"] == "dqn (quick)" and figures["job_cpu"] >= 0 and figures["imports_cpu"] > 0
