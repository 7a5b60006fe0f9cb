"""The break-even cost (marketrl.verdict.break_even): the cost multiple at which a strategy's pooled net return
over flat is zero, on hand-made returns, then in the report's leaderboard and verdict.json."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from marketrl.report import build_report
from marketrl.verdict.break_even import break_even
from marketrl.verdict.strategies import ReturnSeries, Strategy
from tests.report_fixtures import write_pipeline_outputs
from tests.test_report import _parse


def _strategy(gross: np.ndarray, cost: np.ndarray, seed_index: int = 0) -> Strategy:
    """One bar a day: its gross return and the cost it paid."""
    days = np.arange(np.datetime64("2024-03-01"), np.datetime64("2024-03-01") + gross.size)
    series = ReturnSeries(
        ts=days.astype("datetime64[ns]"), day=days, net=gross - cost, gross=gross, cost=cost
    )
    return Strategy("model", True, seed_index, {}, pooled=series)


def test_the_break_even_multiple_is_the_gross_over_the_costs_paid() -> None:
    rng = np.random.default_rng(0)
    gross = rng.normal(3e-4, 1e-3, 60)
    cost = np.full(60, 1e-4)
    result = break_even([_strategy(gross, cost)], n_boot=500, seed=1)
    assert result.point == pytest.approx(gross.sum() / cost.sum())
    assert result.lo < result.point < result.hi and not result.no_gross_edge
    # at that multiple the net mean is zero; two seeds are one equal-weight portfolio
    assert (gross - result.point * cost).mean() == pytest.approx(0.0, abs=1e-12)
    other = rng.normal(1e-4, 1e-3, 60)
    both = break_even([_strategy(gross, cost), _strategy(other, 2 * cost, 1)], n_boot=0, seed=1)
    assert both.point == pytest.approx((gross.sum() + other.sum()) / (3 * cost.sum()))
    assert math.isnan(both.lo)  # no resamples asked for: no interval


def test_no_gross_edge_breaks_even_at_zero_and_a_strategy_that_never_traded_has_none() -> None:
    losing = break_even([_strategy(np.full(30, -1e-4), np.full(30, 1e-4))], n_boot=200, seed=0)
    assert losing.no_gross_edge and losing.point == 0.0
    flat = break_even([_strategy(np.zeros(30), np.zeros(30))], n_boot=200, seed=0)
    assert math.isnan(flat.point) and not flat.no_gross_edge
    assert flat.to_record() == {"point": None, "lo": None, "hi": None, "no_gross_edge": False}


def test_the_leaderboard_and_verdict_json_carry_each_models_break_even(tmp_path: Path) -> None:
    outputs = write_pipeline_outputs(
        tmp_path / "run", models=("dqn", "linear"), n_folds=2, n_seeds=5, skill={"linear": 0.3}, seed=2
    )
    verdict = tmp_path / "verdict.json"
    build_report(**outputs.report_kwargs(tmp_path / "eval_report.html"), verdict_path=str(verdict))
    record = json.loads(verdict.read_text(encoding="utf-8"))
    html = (tmp_path / "eval_report.html").read_text(encoding="utf-8")
    cells = {
        attrs["data-value"]
        for tag, attrs in _parse(html).tags
        if tag == "td" and attrs.get("data-metric") == "lb-break-even"
    }
    checked = 0
    for model in ("dqn", "linear"):
        cost = record["models"][model]["break_even_cost"]
        assert set(cost) == {"point", "lo", "hi", "no_gross_edge"}
        if cost["point"] is not None and not cost["no_gross_edge"]:
            assert cost["lo"] <= cost["point"] <= cost["hi"]
            assert any(abs(float(v) - cost["point"]) < 1e-9 for v in cells if v), model
            checked += 1
        elif cost["no_gross_edge"]:
            assert cost["point"] == 0.0
    assert checked  # this fixture's dqn has a gross edge its costs eat half of
