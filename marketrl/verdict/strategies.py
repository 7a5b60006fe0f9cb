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
    daily_returns,
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
    """A strategy's pooled daily returns net of costs and before costs, without its bars (a random trader's
    `digest`): `ReturnSeries.daily` at 1× and 0× costs, the only multipliers the report asks of a random trader."""

    days: np.ndarray
    net: np.ndarray
    gross: np.ndarray

    def daily(self, multiplier: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(trading days, compounded daily returns) at 1× (net) or 0× (gross) costs."""
        if multiplier not in (0.0, 1.0):
            raise ValueError(f"DailyReturns: only 0x and 1x costs are kept, not {multiplier}x")
        return self.days, self.net if multiplier == 1.0 else self.gross


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
    pooled: ReturnSeries | DailyReturns | None = None  # DailyReturns: a `digest`ed random trader
    long_share: float = math.nan
    short_share: float = math.nan
    trading_share: float = math.nan  # share of its pooled test days with a nonzero position at some bar

    @property
    def label(self) -> str:
        if self.is_agent:
            return f"{self.name} seed {self.seed_index}"
        if self.name == RANDOM_BASELINE and self.seed_index is not None:
            return f"random seed {self.seed_index}"
        return BASELINE_LABELS.get(self.name, self.name)


def _pooled_bars(runs: Mapping[int, Run]) -> pl.DataFrame:
    return pl.concat([runs[fold].bars for fold in sorted(runs)], how="vertical_relaxed")


def build_strategies(runs: Sequence[Run], pooled_summary: bool = True) -> list[Strategy]:
    """Group runs by (strategy, seed) over folds and compute their per-fold and pooled summaries."""
    grouped: dict[tuple[str, int | None], Strategy] = {}
    for run in runs:
        key = (run.strategy, run.seed_index)
        strategy = grouped.setdefault(key, Strategy(run.strategy, run.is_agent, run.seed_index, {}))
        strategy.fold_runs[run.fold] = run
    for strategy in grouped.values():
        for fold, run in strategy.fold_runs.items():
            strategy.fold_summaries[fold] = performance_summary(run.bars)
        bars = _pooled_bars(strategy.fold_runs)
        if pooled_summary:
            strategy.pooled_summary = performance_summary(bars)
        strategy.pooled = ReturnSeries.from_bars(bars)
        position = bars["position"].cast(pl.Float64)
        strategy.long_share = float((position > 0).mean())
        strategy.short_share = float((position < 0).mean())
        strategy.trading_share = trading_share(bars)
    return sorted(grouped.values(), key=lambda s: (not s.is_agent, s.name, s.seed_index or 0))


def digest(strategy: Strategy) -> Strategy:
    """`strategy` without its per-bar data: pooled daily returns at 1× and 0× costs (`DailyReturns`) and its runs'
    fills instead of their tables; its summaries and shares as they were. What the report keeps of a random
    trader (none of its figures draws one)."""
    assert isinstance(strategy.pooled, ReturnSeries)
    days, net = strategy.pooled.daily(1.0)
    _, gross = strategy.pooled.daily(0.0)
    runs = {
        fold: replace(run, bars=run.bars.clear(), fills=run.fills_paid())
        for fold, run in strategy.fold_runs.items()
    }
    return replace(strategy, fold_runs=runs, pooled=DailyReturns(days, net, gross))


def random_seed_strategies(inputs: ReportInputs) -> list[Strategy]:
    """The random baseline's traders as strategies: those given as tables (`random_seed_runs`) and those on disk
    (`random_traders`), the latter read one trader at a time and `digest`ed before the next, so the report's memory
    holds one trader's bars, not fifty."""
    strategies = build_strategies(inputs.random_seed_runs)
    for seed in inputs.random_traders.seeds:
        strategies += [digest(s) for s in build_strategies(inputs.random_traders.runs(seed))]
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
