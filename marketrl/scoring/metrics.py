"""Performance metrics for one strategy's per-bar evaluation table (portfolio, daily and per-bar statistics).

Conventions (see docs/METRICS.md): 252 sessions a year, risk-free rate 0, daily statistics annualised by √252,
per-bar statistics never annualised, equal-weight portfolio across instruments rebalanced every bar.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import polars as pl

from marketrl.calendars.annual import ANNUALIZER, SESSIONS_PER_YEAR
from marketrl.scoring.stats import ratio_or_convention, sharpe_ratio

REQUIRED_COLUMNS = ("ts_event", "trading_day", "symbol", "position", "gross_return", "cost", "net_return")

# Tolerance for net_return == gross_return − cost; loose enough for values stored as float32.
_NET_RETURN_ATOL = 1e-6

# Equity within this relative distance of its running peak counts as recovered (compounding rounding).
_RECOVERY_RTOL = 1e-12


class MetricsInputError(ValueError):
    """Raised when a per-bar evaluation table cannot be summarised (missing columns, NaN, negative cost...)."""


def _as_numpy(values: object) -> np.ndarray:
    return values.to_numpy() if isinstance(values, pl.Series) else np.asarray(values)


def daily_returns(trading_day: object, bar_returns: object) -> tuple[np.ndarray, np.ndarray]:
    """Compound per-bar returns into one return per trading day: (1 + r).prod() − 1, days sorted ascending."""
    days = _as_numpy(trading_day)
    returns = np.asarray(_as_numpy(bar_returns), dtype=np.float64)
    if days.shape != returns.shape or returns.ndim != 1:
        raise MetricsInputError(
            f"daily_returns: trading_day and bar_returns must be 1-D of equal length, got {days.shape}, "
            f"{returns.shape}"
        )
    if returns.size == 0:
        return days[:0], returns[:0]
    order = np.argsort(days, kind="stable")
    sorted_days = days[order]
    day_starts = np.flatnonzero(np.r_[True, sorted_days[1:] != sorted_days[:-1]])
    growth = np.multiply.reduceat(1.0 + returns[order], day_starts)
    return sorted_days[day_starts], growth - 1.0


def equity_curve(returns: object) -> np.ndarray:
    """Wealth after each period starting from 1: cumprod(1 + r)."""
    return np.cumprod(1.0 + np.asarray(returns, dtype=np.float64))


def drawdown_series(returns: object) -> np.ndarray:
    """Drawdown after each period, equity / running peak − 1 (≤ 0); the starting wealth 1 counts as a peak."""
    equity = equity_curve(returns)
    running_peak = np.maximum.accumulate(np.maximum(equity, 1.0))
    return np.minimum(equity / running_peak - 1.0, 0.0)


def drawdown_stats(returns: object) -> dict[str, float | int]:
    """Max drawdown (≤ 0), its duration and the longest drawdown, durations in periods (trading days).

    Duration runs from the peak before the trough to the first period back at that peak, or to the end of the
    series if it never recovers. The start (wealth 1, before the first period) counts as a peak.
    """
    equity = np.r_[1.0, equity_curve(returns)]
    running_peak = np.maximum.accumulate(equity)
    underwater = equity < running_peak * (1.0 - _RECOVERY_RTOL)
    drawdown = equity / running_peak - 1.0
    last = equity.size - 1
    at_peak = np.flatnonzero(~underwater)  # always contains 0
    gaps = np.diff(at_peak)
    closed_durations = gaps[gaps > 1]
    open_duration = last - at_peak[-1]
    longest = int(max(closed_durations.max(initial=0), open_duration))
    if not underwater.any():
        return {"max_drawdown": 0.0, "max_drawdown_duration_days": 0, "longest_drawdown_days": 0}
    trough = int(np.argmin(np.where(underwater, drawdown, 0.0)))
    peak = int(at_peak[at_peak < trough][-1])
    later_peaks = at_peak[at_peak > trough]
    recovery = int(later_peaks[0]) if later_peaks.size else last
    return {
        "max_drawdown": float(min(drawdown[trough], 0.0)),
        "max_drawdown_duration_days": recovery - peak,
        "longest_drawdown_days": longest,
    }


def _validate_bars(bars: pl.DataFrame, return_column: str) -> None:
    if not isinstance(bars, pl.DataFrame):
        raise MetricsInputError(
            f"performance_summary: expected a polars DataFrame, got {type(bars).__name__}"
        )
    missing = [c for c in (*REQUIRED_COLUMNS, return_column) if c not in bars.columns]
    if missing:
        raise MetricsInputError(
            f"per-bar table: missing column(s) {missing}; expected {list(REQUIRED_COLUMNS)}"
        )
    if bars.height == 0:
        raise MetricsInputError("per-bar table: expected at least one bar, got an empty table")
    numeric = ["position", "gross_return", "cost", "net_return", return_column]
    for column in REQUIRED_COLUMNS:
        if bars[column].null_count():
            raise MetricsInputError(f"per-bar table: column {column!r} has null values")
    for column in numeric:
        if not np.all(np.isfinite(bars[column].cast(pl.Float64).to_numpy())):
            raise MetricsInputError(f"per-bar table: column {column!r} must be finite (found NaN or inf)")
    if (bars["cost"] < 0).any():
        raise MetricsInputError("per-bar table: column 'cost' must be ≥ 0 (a fraction of notional)")
    mismatch = (bars["net_return"] - (bars["gross_return"] - bars["cost"])).abs().max()
    if mismatch > _NET_RETURN_ATOL:
        raise MetricsInputError(
            f"per-bar table: net_return must equal gross_return − cost (off by {mismatch:g})"
        )
    if bars.select(pl.struct("symbol", "ts_event").is_duplicated().any()).item():
        raise MetricsInputError("per-bar table: duplicate (symbol, ts_event) rows")
    days_per_ts = bars.group_by("ts_event").agg(pl.col("trading_day").n_unique()).get_column("trading_day")
    if (days_per_ts > 1).any():
        raise MetricsInputError("per-bar table: instruments disagree on trading_day at the same ts_event")


def portfolio_bars(bars: pl.DataFrame, return_column: str = "net_return") -> pl.DataFrame:
    """Equal-weight portfolio per bar: at each ts_event, the sum over instruments divided by the number of
    instruments in the table (an instrument without a bar at that ts holds its 1/K sleeve in cash: return 0).

    Columns: ts_event, trading_day, portfolio_return (from ``return_column``), gross_return, cost.
    """
    _validate_bars(bars, return_column)
    n_instruments = bars["symbol"].n_unique()
    # Sorted input and maintain_order make every float sum run in a fixed order: same bars, same bytes.
    return (
        bars.sort("ts_event", "symbol")
        .group_by("ts_event", maintain_order=True)
        .agg(
            pl.col("trading_day").first(),
            (pl.col(return_column).cast(pl.Float64).sum() / n_instruments).alias("portfolio_return"),
            (pl.col("gross_return").cast(pl.Float64).sum() / n_instruments).alias("gross_return"),
            (pl.col("cost").cast(pl.Float64).sum() / n_instruments).alias("cost"),
        )
        .sort("ts_event")
    )


def average_strategies(tables: Iterable[pl.DataFrame]) -> pl.DataFrame:
    """One strategy that gives each of ``tables`` (per-bar tables of the same bars) an equal share of capital: per
    (symbol, bar) the mean position, gross return and cost over the tables, in their order; net = gross − cost.

    This is how the random baseline's seeds become one baseline, in the evaluation job and in the report alike.
    ``tables`` may be a generator: one table is held at a time.
    """
    keys = ["symbol", "ts_event"]
    columns = ("position", "gross_return", "cost")
    first: pl.DataFrame | None = None
    sums: dict[str, np.ndarray] = {}
    count = 0
    for table in tables:
        ordered = table.sort(keys)
        if first is None:
            first = ordered.select(REQUIRED_COLUMNS[:3])
        elif not ordered.select(keys).equals(first.select(keys)):
            raise MetricsInputError(
                "average_strategies: the tables must hold the same (symbol, ts_event) bars"
            )
        values = {column: ordered[column].cast(pl.Float64).to_numpy() for column in columns}
        # Added in table order, then divided: the same bits as np.mean over the stacked tables (numpy sums the
        # leading axis in order), without stacking them.
        sums = values if not sums else {column: sums[column] + values[column] for column in columns}
        count += 1
    if first is None:
        raise MetricsInputError("average_strategies: expected at least one per-bar table")
    means = {column: sums[column] / count for column in columns}
    return first.with_columns(**means).with_columns(net_return=pl.col("gross_return") - pl.col("cost"))


def _position_changes(bars: pl.DataFrame) -> pl.DataFrame:
    """Per (symbol, bar): |Δposition| with a flat position before the first bar, and a holding-period id."""
    previous = pl.col("position").shift(1).over("symbol")
    changed = previous.is_null() | (pl.col("position") != previous)
    return (
        bars.sort("symbol", "ts_event")
        .with_columns(
            (pl.col("position") - previous.fill_null(0.0)).abs().alias("abs_position_change"),
            changed.cum_sum().over("symbol").alias("holding_period"),
        )
        .with_columns(
            (pl.col("abs_position_change") > 0).alias("position_changed"),
        )
    )


def _trade_hit_rate(changes: pl.DataFrame, return_column: str) -> tuple[float, int]:
    trades = (
        changes.filter(pl.col("position") != 0)
        .group_by("symbol", "holding_period", maintain_order=True)
        .agg(((1.0 + pl.col(return_column).cast(pl.Float64)).product() - 1.0).alias("trade_return"))
    )
    n_holding = trades.height
    if n_holding == 0:
        return math.nan, 0
    return float((trades["trade_return"] > 0).mean()), n_holding


def performance_summary(bars: pl.DataFrame, return_column: str = "net_return") -> dict[str, float | int]:
    """Summary statistics of one strategy over one per-bar evaluation table (one or several instruments).

    Daily statistics (annualised by √252, ``ANNUALIZER``) come from the equal-weight portfolio's bar returns
    compounded per trading_day; per-bar statistics (``bar_*``) are reported as they are, not annualised.
    Ratios with a zero denominator are 0 when the numerator is 0 too and NaN otherwise (see docs/METRICS.md).
    """
    portfolio = portfolio_bars(bars, return_column)
    days, day_returns = daily_returns(portfolio["trading_day"], portfolio["portfolio_return"])
    _, gross_day_returns = daily_returns(portfolio["trading_day"], portfolio["gross_return"])
    changes = _position_changes(bars)
    trade_hit_rate, n_holding_periods = _trade_hit_rate(changes, return_column)
    return summarize(
        days=days,
        day_returns=day_returns,
        gross_day_returns=gross_day_returns,
        bar_returns=portfolio["portfolio_return"].to_numpy(),
        n_instruments=int(bars["symbol"].n_unique()),
        total_abs_position_change=float(changes["abs_position_change"].sum()),
        trade_hit_rate=trade_hit_rate,
        n_holding_periods=n_holding_periods,
        exposure=float((bars["position"] != 0).mean()),
        n_trades=int(changes["position_changed"].sum()),
        total_cost=float(portfolio["cost"].sum()),
    )


def summarize(
    *,
    days: np.ndarray,
    day_returns: np.ndarray,
    gross_day_returns: np.ndarray,
    bar_returns: np.ndarray,
    n_instruments: int,
    total_abs_position_change: float,
    trade_hit_rate: float,
    n_holding_periods: int,
    exposure: float,
    n_trades: int,
    total_cost: float,
) -> dict[str, float | int]:
    """`performance_summary` from one strategy's aggregates: its session days (sorted), daily net and gross
    portfolio returns, portfolio bar returns, and the per-bar counts. The one definition of the summary, shared
    by the per-bar table (`performance_summary`) and the batched scoring of many traders
    (`marketrl.scoring.batched`)."""
    n_days = int(day_returns.size)
    wealth = float(np.prod(1.0 + day_returns))
    total_return = wealth - 1.0
    cagr = wealth ** (SESSIONS_PER_YEAR / n_days) - 1.0 if wealth > 0 else -1.0
    daily_std = float(np.std(day_returns, ddof=1)) if n_days > 1 else math.nan
    daily_sharpe = sharpe_ratio(day_returns)
    downside_deviation = float(np.sqrt(np.mean(np.minimum(day_returns, 0.0) ** 2)))
    drawdowns = drawdown_stats(day_returns)
    gains = float(day_returns[day_returns > 0].sum())
    losses = float(-day_returns[day_returns < 0].sum())
    nonzero_days = int(np.count_nonzero(day_returns))
    # the mean over days of each day's |Δposition| per instrument is the total over the days
    avg_daily_turnover = total_abs_position_change / n_instruments / n_days

    return {
        "n_instruments": int(n_instruments),
        "n_bars": int(bar_returns.size),
        "n_days": n_days,
        "first_day": str(days[0]),
        "last_day": str(days[-1]),
        "total_return": total_return,
        "gross_total_return": float(np.prod(1.0 + gross_day_returns) - 1.0),
        "cagr": float(cagr),
        "ann_volatility": daily_std * ANNUALIZER,
        "sharpe": float(daily_sharpe) * ANNUALIZER,
        "gross_sharpe": float(sharpe_ratio(gross_day_returns)) * ANNUALIZER,
        "sortino": float(ratio_or_convention(float(np.mean(day_returns)), downside_deviation)) * ANNUALIZER,
        "max_drawdown": drawdowns["max_drawdown"],
        "max_drawdown_duration_days": drawdowns["max_drawdown_duration_days"],
        "longest_drawdown_days": drawdowns["longest_drawdown_days"],
        "calmar": float(ratio_or_convention(cagr, abs(drawdowns["max_drawdown"]))),
        "hit_rate_days": float(np.count_nonzero(day_returns > 0) / nonzero_days)
        if nonzero_days
        else math.nan,
        "trade_hit_rate": trade_hit_rate,
        "n_holding_periods": int(n_holding_periods),
        "profit_factor": gains / losses if losses > 0 else math.nan,
        "avg_daily_turnover": float(avg_daily_turnover),
        "exposure": float(exposure),
        "n_trades": int(n_trades),
        "total_cost": float(total_cost),
        "bar_mean": float(np.mean(bar_returns)),
        "bar_std": float(np.std(bar_returns, ddof=1)) if bar_returns.size > 1 else math.nan,
        "bar_sharpe": float(sharpe_ratio(bar_returns)),
    }


def to_json_safe(value: Any) -> Any:
    """Recursively convert mappings, sequences and numpy scalars/arrays to plain Python values and NaN/±inf to
    None, for json.dumps and yaml.safe_dump."""
    if isinstance(value, Mapping):
        return {str(key): to_json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_safe(item) for item in value]
    if isinstance(value, np.ndarray):
        return [to_json_safe(item) for item in value.tolist()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# ----------------------------------------------------------------------------------- forecast quality (model zoo)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), as Spearman's correlation needs."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    ends = np.r_[starts[1:], values.size]
    mean_rank = (starts + ends - 1) / 2.0
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat(mean_rank, ends - starts)
    return ranks


def _is_constant(values: np.ndarray, centered: np.ndarray) -> bool:
    """A side whose spread is below 1e-9 of its root-mean-square is constant (docs/METRICS.md, Conventions)."""
    spread = math.sqrt(float(centered @ centered))
    return spread <= 1e-9 * math.sqrt(float(values @ values))


def _correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation, NaN when either side is constant."""
    dx, dy = x - x.mean(), y - y.mean()
    if _is_constant(x, dx) or _is_constant(y, dy):
        return math.nan
    value = float(dx @ dy) / math.sqrt(float(dx @ dx) * float(dy @ dy))
    return min(1.0, max(-1.0, value))  # rounding can leave |r| a few ulps above 1


#: fewest (prediction, realized) pairs a session day needs for an IC; fewer give no IC for that day.
IC_MIN_PAIRS = 3


def daily_information_coefficients(
    trading_day: object, prediction: object, realized: object, min_rows: int = IC_MIN_PAIRS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(days, IC, Rank IC) per session day: Pearson and Spearman correlation of predictions with realized
    forward returns over that day's rows (all instruments pooled), days ascending.

    Rows where either side is null/NaN/inf are dropped first (the last ``horizon`` bars of a segment have no
    realized forward return). A day with fewer than ``min_rows`` remaining pairs, or with a constant side,
    has no IC: NaN in both arrays, and the summaries skip it."""
    days = _as_numpy(trading_day)
    pred = np.asarray(_as_numpy(prediction), dtype=np.float64)
    real = np.asarray(_as_numpy(realized), dtype=np.float64)
    if not days.shape == pred.shape == real.shape or pred.ndim != 1:
        raise MetricsInputError(
            f"information coefficients: trading_day, prediction and realized must be 1-D of equal length, got "
            f"{days.shape}, {pred.shape}, {real.shape}"
        )
    order = np.argsort(days, kind="stable")
    days, pred, real = days[order], pred[order], real[order]
    starts = np.flatnonzero(np.r_[True, days[1:] != days[:-1]]) if days.size else np.zeros(0, dtype=np.int64)
    ends = np.r_[starts[1:], days.size].astype(np.int64)
    usable = np.isfinite(pred) & np.isfinite(real)
    ic = np.full(starts.size, math.nan)
    rank_ic = np.full(starts.size, math.nan)
    for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
        keep = usable[start:end]
        if int(keep.sum()) < min_rows:
            continue
        x, y = pred[start:end][keep], real[start:end][keep]
        ic[k] = _correlation(x, y)
        rank_ic[k] = _correlation(_ranks(x), _ranks(y))
    return days[starts], ic, rank_ic


def summarize_information_coefficients(ic: object, rank_ic: object) -> dict[str, float | int]:
    """Mean IC and Rank IC over the days that have one, and their ICIR = mean / sample std (ddof = 1) across
    those days (NaN with fewer than two such days or no spread). ``n_days`` counts the days with an IC."""
    ic = np.asarray(ic, dtype=np.float64)
    rank_ic = np.asarray(rank_ic, dtype=np.float64)
    summary: dict[str, float | int] = {"n_days": int(np.isfinite(ic).sum())}
    for name, values in (("ic", ic), ("rank_ic", rank_ic)):
        scored = values[np.isfinite(values)]
        mean = float(scored.mean()) if scored.size else math.nan
        spread = float(scored.std(ddof=1)) if scored.size > 1 else math.nan
        summary[name] = mean
        summary[f"{name}ir"] = mean / spread if scored.size > 1 and spread > 0 else math.nan
    return summary


def information_coefficient_summary(
    trading_day: object, prediction: object, realized: object, min_rows: int = IC_MIN_PAIRS
) -> dict[str, float | int]:
    """Mean IC and Rank IC over session days, their ICIR and ``n_days`` (see the two functions above)."""
    _, ic, rank_ic = daily_information_coefficients(trading_day, prediction, realized, min_rows)
    return summarize_information_coefficients(ic, rank_ic)
