"""The strategies the report compares (agents, forecasters, baselines, matched random traders), their pooled
daily returns, and the rules a verdict is held to.

Conventions (docs/REPORT.md): per-bar PnL of the equal-weight portfolio compounded to daily returns; Sharpe
ratios shown annualised (daily × √252) while PSR/DSR and the bootstraps work in daily units; "pooled" means the
test days of all folds concatenated in time, computed per agent seed and then aggregated across seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl

from marketrl.calendars.annual import ANNUALIZER
from marketrl.scoring.metrics import (
    daily_information_coefficients,
    daily_returns,
    drawdown_series,
    equity_curve,
    performance_summary,
    portfolio_bars,
)
from marketrl.scoring.stats import ConfidenceInterval, sharpe_ratio, stratified_bootstrap_ci
from marketrl.verdict.inputs import (
    MATCHED_RANDOM,
    RANDOM_BASELINE,
    ReportInputError,
    ReportInputs,
    Run,
)

DSR_THRESHOLD = 0.95
FAMILY_ALPHA = 0.05
POWER = 0.8
# A model whose seeds hold a position on fewer than this share of their test days (mean over its seeds) has almost
# no information in its test: its studentized t* is heavy-tailed, so it is left out of the primary family (no claim,
# not in the family's critical values) and its figure is shown apart (docs/METRICS.md, "Verdict rules" 6). 20%: at
# the demo's 60 pooled test days that is 12 days in the market, just above the 9 days from which the bootstrap-t
# interval is calibrated (evaluation.min_test_days, "Coverage").
MIN_TRADING_SHARE = 0.2
# hyperopt's user attribute of a trial interrupted by a killed worker and rerun in its slot (marketrl.training.hyperopt).
INTERRUPTED_ATTR = "interrupted"
BASELINE_LABELS = {
    "buy_and_hold": "buy & hold",
    "flat": "flat",
    "momentum": "momentum",
    "random": "random",
    MATCHED_RANDOM: "turnover-matched random",
}


def config_value(config: Mapping[str, Any], dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``, with a one-line error naming the key when absent."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise ReportInputError(f"config key '{dotted}' is required by the report")
        node = node[part]
    return node


@dataclass(frozen=True)
class ReturnSeries:
    """A strategy's equal-weight portfolio per bar over some test days, in time order."""

    ts: np.ndarray
    day: np.ndarray
    net: np.ndarray
    gross: np.ndarray
    cost: np.ndarray

    @classmethod
    def from_bars(cls, bars: pl.DataFrame) -> ReturnSeries:
        portfolio = portfolio_bars(bars)
        return cls(
            ts=portfolio["ts_event"].to_numpy(),
            day=portfolio["trading_day"].to_numpy(),
            net=portfolio["portfolio_return"].to_numpy(),
            gross=portfolio["gross_return"].to_numpy(),
            cost=portfolio["cost"].to_numpy(),
        )

    def bar_returns(self, multiplier: float = 1.0) -> np.ndarray:
        """Per-bar net returns at ``multiplier`` × costs (the stored net returns at 1×)."""
        return self.net if multiplier == 1.0 else self.gross - multiplier * self.cost

    def daily(self, multiplier: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(trading days, compounded daily returns) at ``multiplier`` × costs."""
        return daily_returns(self.day, self.bar_returns(multiplier))


@dataclass(frozen=True)
class DailyReturns:
    """A strategy's pooled daily returns without its bars: compounded per trading day at each cost multiple the
    report asks for (`returns[m]`: gross − m × cost per bar; 0 is before costs, 1 the stored net returns)."""

    days: np.ndarray
    returns: Mapping[float, np.ndarray]

    @classmethod
    def of(cls, series: ReturnSeries, multipliers: Sequence[float] = ()) -> DailyReturns:
        """`series` compounded per day at 0×, 1× and each of `multipliers` × costs."""
        daily = {m: series.daily(m) for m in sorted({0.0, 1.0, *(float(m) for m in multipliers)})}
        return cls(daily[1.0][0], {m: returns for m, (_, returns) in daily.items()})

    def daily(self, multiplier: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(trading days, compounded daily returns) at ``multiplier`` × costs, one of those kept."""
        returns = self.returns.get(float(multiplier))
        if returns is None:
            kept = ", ".join(f"{m:g}x" for m in self.returns)
            raise ValueError(f"DailyReturns: only {kept} costs are kept, not {multiplier:g}x")
        return self.days, returns


def evenly_spaced(n: int, max_points: int) -> np.ndarray:
    """Indices of at most `max_points` of `n` items, evenly spaced, first and last included (all when fewer)."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


#: bars of a strategy's pooled equity and drawdown kept for the report's figures (a line draws at most this many)
PATH_POINTS = 1200


@dataclass(frozen=True)
class EquityPath:
    """A strategy's pooled wealth (from 1) net of costs and before costs and its drawdown net of costs, at no
    more than PATH_POINTS of its bars, evenly spaced: what the equity and drawdown figures draw. Each kept bar is
    placed by its trading day and its place in that day (k / the day's bars, in [0, 1)), so strategies line up
    on a trading-time axis of days."""

    day: np.ndarray  # datetime64[D]
    place: np.ndarray
    net: np.ndarray
    gross: np.ndarray
    drawdown: np.ndarray
    fold_starts: Mapping[int, np.datetime64]  # each fold's first test day

    @classmethod
    def of(
        cls, series: ReturnSeries, fold_starts: Mapping[int, np.datetime64], points: int = PATH_POINTS
    ) -> EquityPath:
        day = series.day.astype("datetime64[D]")
        starts = np.flatnonzero(np.r_[True, day[1:] != day[:-1]]) if day.size else np.zeros(0, np.int64)
        lengths = np.diff(np.r_[starts, day.size])
        place = (np.arange(day.size) - np.repeat(starts, lengths)) / np.repeat(lengths, lengths)
        keep = evenly_spaced(day.size, points)
        return cls(
            day[keep],
            place[keep],
            equity_curve(series.bar_returns(1.0))[keep],
            equity_curve(series.bar_returns(0.0))[keep],
            drawdown_series(series.bar_returns(1.0))[keep],
            dict(fold_starts),
        )


#: prediction bins of the report's calibration panel (equal-count bins of the pooled predictions: deciles)
CALIBRATION_BINS = 10


def calibration_bins(
    prediction: np.ndarray, realized: np.ndarray, n_bins: int = CALIBRATION_BINS
) -> tuple[np.ndarray, np.ndarray]:
    """(mean prediction, mean realized) in ``n_bins`` equal-count bins of the prediction (ties split by
    order); rows with a non-finite side are dropped; NaN bins when there are fewer rows than bins."""
    keep = np.isfinite(prediction) & np.isfinite(realized)
    x, y = prediction[keep], realized[keep]
    if x.size < n_bins:
        return np.full(n_bins, math.nan), np.full(n_bins, math.nan)
    order = np.argsort(x, kind="stable")
    bins = np.empty(x.size, dtype=np.int64)
    bins[order] = np.arange(x.size) * n_bins // x.size
    counts = np.bincount(bins, minlength=n_bins)
    return (
        np.bincount(bins, weights=x, minlength=n_bins) / counts,
        np.bincount(bins, weights=y, minlength=n_bins) / counts,
    )


@dataclass(frozen=True)
class SeedForecasts:
    """What the forecast-quality section reads of one forecaster seed, without its bars: per fold its daily IC and
    Rank IC, and the calibration bins of its predictions pooled over the folds (marketrl.report.forecast)."""

    daily_ic: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # fold -> (days, IC, Rank IC)
    bins: tuple[np.ndarray, np.ndarray]  # mean prediction and mean realized per calibration bin
    n_pairs: int  # (prediction, realized) pairs with both sides finite, pooled

    @classmethod
    def of(cls, runs: Mapping[int, Run]) -> SeedForecasts | None:
        """The runs' forecasts reduced (None unless every run has them)."""
        frames = {fold: runs[fold].forecasts for fold in sorted(runs)}
        present = {fold: frame for fold, frame in frames.items() if frame is not None}
        if not present or len(present) < len(frames):
            return None
        daily_ic = {
            fold: daily_information_coefficients(
                frame["trading_day"], frame["prediction"], frame["forward_return"]
            )
            for fold, frame in present.items()
        }
        prediction = np.concatenate([frame["prediction"].to_numpy() for frame in present.values()])
        realized = np.concatenate([frame["forward_return"].to_numpy() for frame in present.values()])
        n_pairs = int((np.isfinite(prediction) & np.isfinite(realized)).sum())
        return cls(daily_ic, calibration_bins(prediction, realized), n_pairs)


@dataclass(frozen=True)
class DailySeries:
    """Daily net returns known only per day (a turnover-matched random trader, from metrics.json)."""

    days: np.ndarray
    returns: np.ndarray

    def daily(self) -> tuple[np.ndarray, np.ndarray]:
        return self.days, self.returns


def matched_traders(members: Sequence[Strategy]) -> list[list[DailySeries]] | None:
    """Per agent seed (in `members` order), its turnover-matched random traders pooled over the folds in time
    order; None when a run of these seeds has no `matched_random` block (outputs from before it existed)."""
    per_seed = []
    for member in members:
        runs = [member.fold_runs[fold] for fold in sorted(member.fold_runs)]
        blocks = [run.matched for run in runs]
        if any(block is None for block in blocks) or len({block.daily.shape[0] for block in blocks}) != 1:
            return None
        days = np.concatenate([block.days for block in blocks])
        daily = np.concatenate([block.daily for block in blocks], axis=1)
        per_seed.append([DailySeries(days, row) for row in daily])
    return per_seed


@dataclass
class Strategy:
    """One strategy (agent seed, baseline or random-baseline seed) per fold and pooled over all folds."""

    name: str
    is_agent: bool
    seed_index: int | None
    fold_runs: dict[int, Run]
    fold_summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    pooled_summary: dict[str, Any] = field(default_factory=dict)
    pooled: ReturnSeries | DailyReturns | None = None  # DailyReturns once built (`build_strategies`)
    long_share: float = math.nan
    short_share: float = math.nan
    trading_share: float = math.nan  # share of its pooled test days with a nonzero position at some bar
    path: EquityPath | None = None  # the figures' lines
    forecasts: SeedForecasts | None = None  # forecasters only
    bars_per_day: float = math.nan  # median bars per instrument and trading day
    symbols: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        if self.is_agent:
            return f"{self.name} seed {self.seed_index}"
        if self.name == RANDOM_BASELINE and self.seed_index is not None:
            return f"random seed {self.seed_index}"
        return BASELINE_LABELS.get(self.name, self.name)


def build_strategies(
    runs: Sequence[Run], pooled_summary: bool = True, multipliers: Sequence[float] = ()
) -> list[Strategy]:
    """Group runs by (strategy, seed) over folds and reduce each group to what the report keeps of it: per-fold
    and pooled summaries, shares, pooled daily returns at 0×, 1× and `multipliers` × costs, the figures' equity
    path, fills and forecasts (`digest`). A run load_inputs left on disk is read here, one strategy at a time, so
    memory holds one strategy's per-bar tables at a time, never every run's."""
    grouped: dict[tuple[str, int | None], dict[int, Run]] = {}
    for run in runs:
        grouped.setdefault((run.strategy, run.seed_index), {})[run.fold] = run
    strategies = [digest(fold_runs, pooled_summary, multipliers) for fold_runs in grouped.values()]
    return sorted(strategies, key=lambda s: (not s.is_agent, s.name, s.seed_index or 0))


def digest(
    runs: Mapping[int, Run], pooled_summary: bool = True, multipliers: Sequence[float] = ()
) -> Strategy:
    """One strategy's runs (one per fold) read and reduced to days, summaries and the figures' bounded path; the
    runs it keeps hold no bars (their fills instead)."""
    runs = {fold: runs[fold].read() for fold in sorted(runs)}
    first = next(iter(runs.values()))
    strategy = Strategy(first.strategy, first.is_agent, first.seed_index, {})
    for fold, run in runs.items():
        strategy.fold_summaries[fold] = performance_summary(run.bars)
    bars = pl.concat([run.bars for run in runs.values()], how="vertical_relaxed")
    if pooled_summary:
        strategy.pooled_summary = performance_summary(bars)
    series = ReturnSeries.from_bars(bars)
    position = bars["position"].cast(pl.Float64)
    strategy.long_share = float((position > 0).mean())
    strategy.short_share = float((position < 0).mean())
    strategy.trading_share = trading_share(bars)
    strategy.bars_per_day = float(bars.group_by("symbol", "trading_day").len()["len"].median())
    strategy.symbols = tuple(sorted(bars["symbol"].unique().to_list()))
    strategy.pooled = DailyReturns.of(series, multipliers)
    first_days = {fold: run.bars["trading_day"].min() for fold, run in runs.items()}
    strategy.path = EquityPath.of(series, {fold: np.datetime64(day, "D") for fold, day in first_days.items()})
    strategy.forecasts = SeedForecasts.of(runs)
    strategy.fold_runs = {
        fold: replace(run, bars=run.bars.clear(), fills=run.fills_paid(), forecasts=None)
        for fold, run in runs.items()
    }
    return strategy


def random_seed_strategies(inputs: ReportInputs) -> list[Strategy]:
    """The random baseline's traders as strategies: those given as tables (`random_seed_runs`) and those on disk
    (`random_traders`), the latter read one trader at a time and digested before the next, so the report's memory
    holds one trader's bars, not fifty."""
    strategies = build_strategies(inputs.random_seed_runs)
    for seed in inputs.random_traders.seeds:
        strategies += build_strategies(inputs.random_traders.runs(seed))
    return sorted(strategies, key=lambda s: (not s.is_agent, s.name, s.seed_index or 0))


def trading_share(bars: pl.DataFrame) -> float:
    """Share of the trading days of ``bars`` (columns ``trading_day``, ``position``) on which a nonzero position
    is held at some bar; NaN without any day."""
    if bars.is_empty():
        return math.nan
    per_day = bars.group_by("trading_day").agg(
        (pl.col("position").cast(pl.Float64) != 0).any().alias("trades")
    )
    return float(np.mean(per_day["trades"].to_numpy()))


def model_trading_share(members: Sequence[Strategy]) -> float:
    """A model's trading share: the mean over its seeds of each seed's `trading_share` (NaN when none is known)."""
    shares = [m.trading_share for m in members if math.isfinite(m.trading_share)]
    return float(np.mean(shares)) if shares else math.nan


def annualized_sharpe(daily: np.ndarray) -> float:
    """Sharpe of daily returns × √252 (NaN when undefined)."""
    return float(sharpe_ratio(daily)) * ANNUALIZER if daily.size >= 2 else math.nan


def gross_and_net_sharpe(series: ReturnSeries | DailyReturns) -> tuple[float, float]:
    """Annualised Sharpe of the daily returns before costs (``gross_return``) and at 1× costs (``net_return``)."""
    return annualized_sharpe(series.daily(0.0)[1]), annualized_sharpe(series.daily(1.0)[1])


def annualized_ci(ci: ConfidenceInterval) -> ConfidenceInterval:
    return ConfidenceInterval(ci.point * ANNUALIZER, ci.lo * ANNUALIZER, ci.hi * ANNUALIZER)


@dataclass(frozen=True)
class VerdictRules:
    """The config keys that decide whether a run may make a claim (docs/METRICS.md, "Verdict rules")."""

    n_boot: int
    min_test_days: int
    min_seeds: int
    alpha: float = FAMILY_ALPHA
    power: float = POWER
    min_trading_share: float = MIN_TRADING_SHARE

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> VerdictRules:
        return cls(
            n_boot=int(config_value(config, "evaluation.bootstrap_samples")),
            min_test_days=int(config_value(config, "evaluation.min_test_days")),
            min_seeds=int(config_value(config, "evaluation.min_seeds")),
        )


def column_sharpes(matrix: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """Annualised Sharpe of each of `columns` of the aligned daily-return matrix."""
    return np.array([annualized_sharpe(matrix[:, j]) for j in columns])


def seed_aggregate(scores: np.ndarray, n_boot: int, seed: int) -> ConfidenceInterval:
    """IQM with a stratified-bootstrap CI over seeds ([n_seeds] or [n_seeds, n_folds]); NaN if undefined."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        return ConfidenceInterval(math.nan, math.nan, math.nan)
    return stratified_bootstrap_ci(scores, n_boot=n_boot, seed=seed)
