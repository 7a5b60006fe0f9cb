"""Metrics checked against independent hand computations on small known series."""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import warnings

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marketrl.scoring.metrics import (
    MetricsInputError,
    average_strategies,
    daily_returns,
    drawdown_series,
    drawdown_stats,
    equity_curve,
    performance_summary,
    portfolio_bars,
    to_json_safe,
)

START = dt.datetime(2024, 3, 4, 14, 30, tzinfo=dt.UTC)


def make_bars(
    days: list[int], positions: list[float], gross: list[float], cost: list[float], symbol: str = "ESM4"
) -> pl.DataFrame:
    """One bar per entry; `days` are offsets from START's date, bars within a day one minute apart."""
    ts = [START + dt.timedelta(days=d, minutes=i) for i, d in enumerate(days)]
    return pl.DataFrame(
        {
            "ts_event": ts,
            "trading_day": [t.date() for t in ts],
            "symbol": [symbol] * len(ts),
            "position": positions,
            "gross_return": gross,
            "cost": cost,
            "net_return": [g - c for g, c in zip(gross, cost, strict=True)],
        }
    )


def daily_bars(net: list[float]) -> pl.DataFrame:
    """One always-long bar per day with the given net returns and no costs."""
    n = len(net)
    return make_bars(list(range(n)), [1.0] * n, net, [0.0] * n)


def test_daily_returns_compound_within_day_in_any_order():
    days = np.array(
        ["2024-01-03", "2024-01-02", "2024-01-03", "2024-01-02", "2024-01-03"], dtype="datetime64[D]"
    )
    bar_returns = [0.01, 0.1, 0.02, -0.1, 0.0]
    out_days, out_returns = daily_returns(days, bar_returns)
    assert out_days.tolist() == [dt.date(2024, 1, 2), dt.date(2024, 1, 3)]
    np.testing.assert_allclose(out_returns, [1.1 * 0.9 - 1, 1.01 * 1.02 - 1], rtol=1e-14)
    _, series_returns = daily_returns(pl.Series(days), pl.Series(bar_returns))
    np.testing.assert_allclose(series_returns, out_returns, rtol=1e-14)


def test_equity_and_drawdown_series_by_hand():
    returns = [0.1, -0.5, 0.2, 1.0]
    np.testing.assert_allclose(equity_curve(returns), [1.1, 0.55, 0.66, 1.32])
    np.testing.assert_allclose(drawdown_series(returns), [0.0, -0.5, -0.4, 0.0], atol=1e-15)
    # The starting wealth of 1 is a peak: an initial loss is a drawdown.
    np.testing.assert_allclose(drawdown_series([-0.1, 0.05]), [-0.1, 0.9 * 1.05 - 1])


def test_drawdown_duration_peak_to_recovery():
    stats = drawdown_stats([0.1, -0.5, 0.2, 1.0, -0.1])
    # Wealth: 1, 1.1 (peak, day 1), 0.55 (trough, day 2), 0.66, 1.32 (recovered, day 4), 1.188.
    assert stats["max_drawdown"] == pytest.approx(-0.5)
    assert stats["max_drawdown_duration_days"] == 3
    assert stats["longest_drawdown_days"] == 3


def test_drawdown_duration_runs_to_end_without_recovery():
    stats = drawdown_stats([0.1, -0.2, 0.05])
    assert stats["max_drawdown"] == pytest.approx(-0.2)
    assert stats["max_drawdown_duration_days"] == 2  # peak at day 1, series ends at day 3


def test_longest_drawdown_differs_from_deepest():
    # A slow 4-day bleed recovered on day 5, then a sharp 30% loss recovered two days later.
    stats = drawdown_stats([-0.01, -0.01, -0.01, -0.01, 0.05, -0.3, 0.5])
    assert stats["max_drawdown"] == pytest.approx(-0.3)
    assert stats["max_drawdown_duration_days"] == 2
    assert stats["longest_drawdown_days"] == 5


def test_summary_single_instrument_matches_hand_computation():
    positions = [1.0, 1.0, -1.0, 0.0, 1.0, 1.0]
    cost = [0.001, 0.0, 0.002, 0.001, 0.001, 0.0]  # 0.001 per contract traded
    gross = [0.011, 0.02, -0.028, 0.0, 0.021, 0.01]
    net = [g - c for g, c in zip(gross, cost, strict=True)]
    bars = make_bars([0, 0, 1, 1, 2, 2], positions, gross, cost)
    summary = performance_summary(bars)

    day = [(1 + net[0]) * (1 + net[1]) - 1, (1 + net[2]) * (1 + net[3]) - 1, (1 + net[4]) * (1 + net[5]) - 1]
    wealth = math.prod(1 + r for r in day)
    mean_day, std_day = statistics.mean(day), statistics.stdev(day)
    downside = math.sqrt(sum(min(r, 0.0) ** 2 for r in day) / 3)
    peak = max(1.0, 1 + day[0])
    max_dd = (1 + day[0]) * (1 + day[1]) / peak - 1
    cagr = wealth ** (252 / 3) - 1
    trades = [(1 + net[0]) * (1 + net[1]) - 1, net[2], (1 + net[4]) * (1 + net[5]) - 1]

    assert summary["n_days"] == 3 and summary["n_bars"] == 6 and summary["n_instruments"] == 1
    assert summary["total_return"] == pytest.approx(wealth - 1, rel=1e-12)
    assert summary["gross_total_return"] == pytest.approx(
        math.prod((1 + gross[2 * i]) * (1 + gross[2 * i + 1]) for i in range(3)) - 1, rel=1e-12
    )
    assert summary["cagr"] == pytest.approx(cagr, rel=1e-10)
    assert summary["ann_volatility"] == pytest.approx(std_day * math.sqrt(252), rel=1e-12)
    assert summary["sharpe"] == pytest.approx(mean_day / std_day * math.sqrt(252), rel=1e-12)
    assert summary["sortino"] == pytest.approx(mean_day / downside * math.sqrt(252), rel=1e-12)
    assert summary["max_drawdown"] == pytest.approx(max_dd, rel=1e-12)
    assert summary["max_drawdown_duration_days"] == 2  # peak day 1, not recovered by day 3 (the end)
    assert summary["calmar"] == pytest.approx(cagr / abs(max_dd), rel=1e-10)
    assert summary["hit_rate_days"] == pytest.approx(2 / 3)
    assert summary["profit_factor"] == pytest.approx((day[0] + day[2]) / -day[1], rel=1e-12)
    assert summary["trade_hit_rate"] == pytest.approx(sum(t > 0 for t in trades) / 3)
    assert summary["n_holding_periods"] == 3
    assert summary["n_trades"] == 4  # changes at bars 0 (from flat), 2, 3, 4
    assert summary["avg_daily_turnover"] == pytest.approx((1 + 2 + 1 + 1) / 3)
    assert summary["exposure"] == pytest.approx(5 / 6)
    assert summary["total_cost"] == pytest.approx(0.005)
    assert summary["bar_mean"] == pytest.approx(statistics.mean(net), rel=1e-12)
    assert summary["bar_std"] == pytest.approx(statistics.stdev(net), rel=1e-12)
    # Per-bar Sharpe is reported raw: no √(bars per year) scaling.
    assert summary["bar_sharpe"] == pytest.approx(statistics.mean(net) / statistics.stdev(net), rel=1e-12)


def test_portfolio_is_equal_weight_with_missing_bar_as_cash():
    a = make_bars([0, 0], [1.0, 1.0], [0.02, 0.04], [0.0, 0.0], symbol="ESM4")
    b = make_bars([0], [-1.0], [0.0], [0.0], symbol="NQM4")
    bars = pl.concat([a, b])
    portfolio = portfolio_bars(bars)
    np.testing.assert_allclose(portfolio["portfolio_return"].to_numpy(), [0.01, 0.02])
    summary = performance_summary(bars)
    assert summary["n_instruments"] == 2
    assert summary["total_return"] == pytest.approx(1.01 * 1.02 - 1)
    assert summary["avg_daily_turnover"] == pytest.approx(1.0)  # 2 contracts traded / 2 instruments, 1 day
    assert summary["n_trades"] == 2
    assert summary["exposure"] == pytest.approx(1.0)


def test_average_strategies_is_the_equal_capital_mix():
    one = make_bars([0, 0, 1], [1.0, -1.0, 0.0], [0.02, -0.01, 0.0], [0.001, 0.002, 0.0])
    two = make_bars([0, 0, 1], [-1.0, -1.0, 1.0], [-0.02, -0.01, 0.03], [0.001, 0.0, 0.002])
    # Row order does not matter: each table is aligned on (symbol, ts_event).
    mix = average_strategies([one.reverse(), two])
    assert mix.columns == list(one.columns) and mix["ts_event"].equals(one["ts_event"])
    np.testing.assert_allclose(mix["position"].to_numpy(), [0.0, -1.0, 0.5])
    np.testing.assert_allclose(mix["gross_return"].to_numpy(), [0.0, -0.01, 0.015])
    np.testing.assert_allclose(mix["cost"].to_numpy(), [0.001, 0.001, 0.001])
    np.testing.assert_allclose(mix["net_return"].to_numpy(), [-0.001, -0.011, 0.014])
    assert performance_summary(average_strategies([one]))["total_return"] == pytest.approx(
        performance_summary(one)["total_return"], rel=1e-15
    )
    with pytest.raises(MetricsInputError, match="same \\(symbol, ts_event\\) bars"):
        average_strategies([one, two.head(2)])
    with pytest.raises(MetricsInputError, match="at least one"):
        average_strategies([])


def test_constant_positive_returns_have_undefined_risk_ratios():
    summary = performance_summary(daily_bars([0.001] * 10))
    assert summary["total_return"] == pytest.approx(1.001**10 - 1)
    assert summary["ann_volatility"] == pytest.approx(0.0, abs=1e-15)
    assert math.isnan(summary["sharpe"]) and math.isnan(summary["sortino"]) and math.isnan(summary["calmar"])
    assert summary["max_drawdown"] == 0.0 and summary["max_drawdown_duration_days"] == 0
    assert summary["hit_rate_days"] == 1.0
    assert math.isnan(summary["profit_factor"])
    safe = to_json_safe(summary)
    assert safe["sharpe"] is None and safe["profit_factor"] is None


def test_alternating_returns_never_recover():
    net = [0.01, -0.01] * 5
    summary = performance_summary(daily_bars(net))
    assert summary["hit_rate_days"] == pytest.approx(0.5)
    assert summary["profit_factor"] == pytest.approx(1.0)
    assert summary["sharpe"] == pytest.approx(0.0, abs=1e-12)
    # Wealth peaks at 1.01 after day 1 and ends at 0.9999^5 on day 10 without recovering.
    assert summary["max_drawdown"] == pytest.approx(0.9999**5 / 1.01 - 1, rel=1e-12)
    assert summary["max_drawdown_duration_days"] == 9


def test_flat_strategy_is_all_zero_without_warnings():
    n = 8
    bars = make_bars([i // 2 for i in range(n)], [0.0] * n, [0.0] * n, [0.0] * n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = performance_summary(bars)
    for key in ("total_return", "cagr", "ann_volatility", "sharpe", "sortino", "calmar", "max_drawdown"):
        assert summary[key] == 0.0, key
    assert summary["exposure"] == 0.0 and summary["n_trades"] == 0 and summary["avg_daily_turnover"] == 0.0
    assert math.isnan(summary["hit_rate_days"]) and math.isnan(summary["profit_factor"])
    assert math.isnan(summary["trade_hit_rate"]) and summary["n_holding_periods"] == 0
    json.dumps(to_json_safe(summary), allow_nan=False)


def test_to_json_safe_converts_numpy_and_non_finite():
    value = {"a": np.float32("nan"), "b": (np.int64(3), np.inf), "c": np.array([1.5, -np.inf]), 4: "x"}
    assert to_json_safe(value) == {"a": None, "b": [3, None], "c": [1.5, None], "4": "x"}
    json.dumps(to_json_safe(value), allow_nan=False)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda df: df.drop("cost"), "missing column"),
        (lambda df: df.with_columns(pl.lit(-0.001).alias("cost")), "'cost' must be ≥ 0"),
        (lambda df: df.with_columns(pl.lit(0.5).alias("net_return")), "net_return must equal"),
        (lambda df: df.with_columns(pl.lit(float("nan")).alias("position")), "'position' must be finite"),
        (lambda df: pl.concat([df, df]), "duplicate"),
        (lambda df: df.head(0), "at least one bar"),
    ],
)
def test_bad_tables_raise_one_line_value_errors(mutate, message):
    bars = daily_bars([0.01, -0.02, 0.03])
    with pytest.raises(MetricsInputError, match=message) as info:
        performance_summary(mutate(bars))
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


returns_lists = st.lists(st.floats(-0.5, 0.5, allow_nan=False), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(returns_lists)
def test_drawdown_properties(returns):
    drawdown = drawdown_series(returns)
    assert np.all(drawdown <= 0) and np.all(drawdown >= -1)
    stats = drawdown_stats(returns)
    assert stats["max_drawdown"] == pytest.approx(min(drawdown.min(), 0.0), abs=1e-12)
    assert 0 <= stats["max_drawdown_duration_days"] <= stats["longest_drawdown_days"] <= len(returns)


@settings(max_examples=60, deadline=None)
@given(returns_lists, st.integers(0, 2**32 - 1))
def test_daily_compounding_preserves_total_wealth(returns, seed):
    days = np.sort(np.random.default_rng(seed).integers(0, 5, size=len(returns)))
    _, day_returns = daily_returns(days, returns)
    assert np.prod(1 + day_returns) == pytest.approx(np.prod(1 + np.asarray(returns)), rel=1e-10)
    assert day_returns.size == np.unique(days).size
