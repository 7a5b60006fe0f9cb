"""The numbers behind the report: per-fold and pooled summaries, the verdict, seed spread and cost sensitivity.

Conventions (docs/REPORT.md): per-bar PnL of the equal-weight portfolio compounded to daily returns; Sharpe
ratios shown annualised (daily × √252) while PSR/DSR and the bootstraps work in daily units; "pooled" means the
test days of all folds concatenated in time, computed per agent seed and then aggregated across seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from marketrl.config import derive_seed
from marketrl.metrics import daily_returns, performance_summary, portfolio_bars
from marketrl.report.inputs import BASELINES, RANDOM_BASELINE, ReportInputError, ReportInputs, Run
from marketrl.stats import (
    ConfidenceInterval,
    align_daily_returns,
    deflated_sharpe_ratio,
    interquartile_mean,
    probabilistic_sharpe_ratio,
    sharpe_difference_ci,
    sharpe_ratio,
    stationary_bootstrap_ci,
    stratified_bootstrap_ci,
)

ANNUALIZER = math.sqrt(252)
DSR_THRESHOLD = 0.95
BASELINE_LABELS = {
    "buy_and_hold": "buy & hold",
    "flat": "flat",
    "momentum": "momentum",
    "random": "random",
}
# Relative tolerance for the stored metrics.json values against the recomputation from bars.parquet.
_STORED_RTOL = 1e-6
_STORED_ATOL = 1e-9


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


@dataclass
class Strategy:
    """One strategy (agent seed, baseline or random-baseline seed) per fold and pooled over all folds."""

    name: str
    is_agent: bool
    seed_index: int | None
    fold_runs: dict[int, Run]
    fold_summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    pooled_summary: dict[str, Any] = field(default_factory=dict)
    pooled: ReturnSeries | None = None
    long_share: float = math.nan
    short_share: float = math.nan

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
    return sorted(grouped.values(), key=lambda s: (not s.is_agent, s.name, s.seed_index or 0))


def annualized_sharpe(daily: np.ndarray) -> float:
    """Sharpe of daily returns × √252 (NaN when undefined)."""
    return float(sharpe_ratio(daily)) * ANNUALIZER if daily.size else math.nan


def _annualized_ci(ci: ConfidenceInterval) -> ConfidenceInterval:
    return ConfidenceInterval(ci.point * ANNUALIZER, ci.lo * ANNUALIZER, ci.hi * ANNUALIZER)


@dataclass(frozen=True)
class Deflation:
    """What the Deflated Sharpe Ratio of one algorithm is corrected for."""

    n_trials: int
    trials_sr_variance: float
    note: str

    @property
    def available(self) -> bool:
        return self.n_trials >= 1


def deflation_for(inputs: ReportInputs, algo: str) -> Deflation:
    """N and V from the algorithm's hyperopt JSON (``trial_sharpe_daily``); unavailable without trials."""
    summary = inputs.hyperopt.get(algo)
    if summary is None:
        return Deflation(0, math.nan, "no hyperopt summary for this algorithm")
    sharpes = np.asarray(summary.trial_sharpe_daily, dtype=np.float64)
    sharpes = sharpes[np.isfinite(sharpes)]
    if sharpes.size == 0:
        return Deflation(0, math.nan, "no completed hyperopt trials")
    if sharpes.size == 1:
        return Deflation(1, 0.0, "one completed trial: no selection to deflate for (DSR = PSR)")
    return Deflation(int(sharpes.size), float(np.var(sharpes, ddof=1)), "")


@dataclass(frozen=True)
class SharpeStats:
    """Pooled out-of-sample statistics of one strategy, net of costs (Sharpe annualised, CI from the
    stationary bootstrap of daily returns)."""

    sharpe: ConfidenceInterval
    psr: float
    dsr: float
    n_days: int
    total_return: float
    max_drawdown: float


@dataclass(frozen=True)
class Comparison:
    """Paired Sharpe(agent) − Sharpe(baseline), annualised, with its bootstrap CI."""

    baseline: str
    diff: float
    lo: float
    hi: float
    prob_better: float

    @property
    def significant_better(self) -> bool:
        return bool(self.lo > 0)

    @property
    def significant_worse(self) -> bool:
        return bool(self.hi < 0)


@dataclass
class SeedVerdict:
    """One agent seed against every baseline."""

    seed_index: int
    stats: SharpeStats
    comparisons: list[Comparison]
    random_seed_share: float = math.nan

    @property
    def beats_all(self) -> bool:
        return bool(self.comparisons) and all(c.significant_better for c in self.comparisons)

    @property
    def dsr_passes(self) -> bool:
        return bool(np.isfinite(self.stats.dsr) and self.stats.dsr > DSR_THRESHOLD)


@dataclass
class AgentVerdict:
    """Headline result of one algorithm: per-seed verdicts, seed aggregates and the plain-language sentence."""

    algo: str
    seeds: list[SeedVerdict]
    deflation: Deflation
    iqm_sharpe: ConfidenceInterval
    iqm_diff: dict[str, float]
    beats: bool
    sentence: str


def sharpe_stats(
    series: ReturnSeries, summary: Mapping[str, Any], deflation: Deflation | None, n_boot: int, seed: int
) -> SharpeStats:
    """Sharpe with stationary-bootstrap CI, PSR (vs 0) and DSR of one pooled series."""
    _, daily = series.daily()
    ci = _annualized_ci(stationary_bootstrap_ci(daily, n_boot=n_boot, seed=seed))
    dsr = math.nan
    if deflation is not None and deflation.available:
        dsr = deflated_sharpe_ratio(daily, deflation.n_trials, deflation.trials_sr_variance)
    return SharpeStats(
        sharpe=ci,
        psr=probabilistic_sharpe_ratio(daily),
        dsr=dsr,
        n_days=int(daily.size),
        total_return=float(summary.get("total_return", math.nan)),
        max_drawdown=float(summary.get("max_drawdown", math.nan)),
    )


def compare(agent: ReturnSeries, baseline: ReturnSeries, name: str, n_boot: int, seed: int) -> Comparison:
    """Paired stationary-bootstrap comparison on the two series' daily returns aligned by trading day."""
    days_a, ra = agent.daily()
    days_b, rb = baseline.daily()
    _, a, b = align_daily_returns(days_a, ra, days_b, rb)
    result = sharpe_difference_ci(a, b, n_boot=n_boot, seed=seed)
    return Comparison(
        name, result.point * ANNUALIZER, result.lo * ANNUALIZER, result.hi * ANNUALIZER, result.prob_a_better
    )


def _fmt(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{x:+.2f}".replace("-", "−")


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def verdict_sentence(algo: str, seeds: Sequence[SeedVerdict], deflation: Deflation) -> tuple[bool, str]:
    """Conservative plain-language verdict: "beats" only if, for every seed, the paired Sharpe-difference CI
    excludes 0 against every baseline and the DSR exceeds 0.95."""
    n = len(seeds)
    beats = n > 0 and all(seed.beats_all and seed.dsr_passes for seed in seeds)
    if beats:
        return True, (
            f"{algo} beats every baseline after costs: for each of its {n} seed(s) the paired Sharpe-difference "
            f"interval excludes 0 against all {len(seeds[0].comparisons)} baselines on the pooled out-of-sample "
            f"days, and the deflated Sharpe ratio (N = {deflation.n_trials} hyperopt trials) exceeds "
            f"{DSR_THRESHOLD:.2f}."
        )
    worse, unclear, better = [], [], []
    for name in [c.baseline for c in seeds[0].comparisons] if seeds else []:
        results = [next(c for c in seed.comparisons if c.baseline == name) for seed in seeds]
        label = BASELINE_LABELS.get(name, name)
        if any(c.significant_worse for c in results):
            worse.append(label)
        elif all(c.significant_better for c in results):
            better.append(label)
        else:
            unclear.append(label)
    reasons = []
    if worse:
        reasons.append(f"it is significantly worse than {_join(worse)} (in at least one of {n} seeds)")
    if unclear:
        reasons.append(f"it is not significantly better than {_join(unclear)} in every seed")
    if better:
        reasons.append(f"it is significantly better than {_join(better)} in every seed")
    if not deflation.available:
        reasons.append(f"its deflated Sharpe ratio is unavailable ({deflation.note})")
    elif not all(seed.dsr_passes for seed in seeds):
        values = ", ".join("n/a" if not np.isfinite(s.stats.dsr) else f"{s.stats.dsr:.2f}" for s in seeds)
        reasons.append(
            f"its deflated Sharpe ratio (N = {deflation.n_trials} trials) is not above {DSR_THRESHOLD:.2f} in every "
            f"seed ({values})"
        )
    verb = "does not significantly beat" if better or not (worse or unclear) else "does not beat"
    return False, f"{algo} {verb} the baselines after costs: " + "; ".join(reasons) + "."


def agent_verdicts(
    inputs: ReportInputs,
    agents: Sequence[Strategy],
    baselines: Sequence[Strategy],
    random_seeds: Sequence[Strategy],
    n_boot: int,
    root_seed: int,
) -> list[AgentVerdict]:
    """The headline table: every agent seed against every baseline on the pooled out-of-sample days."""
    verdicts = []
    for algo in inputs.algos:
        deflation = deflation_for(inputs, algo)
        seeds = []
        for agent in (a for a in agents if a.name == algo):
            assert agent.pooled is not None and agent.seed_index is not None
            boot_seed = derive_seed(root_seed, "report", "sharpe", algo, agent.seed_index)
            stats = sharpe_stats(agent.pooled, agent.pooled_summary, deflation, n_boot, boot_seed)
            comparisons = []
            for baseline in baselines:
                assert baseline.pooled is not None
                pair_seed = derive_seed(root_seed, "report", "pair", algo, agent.seed_index, baseline.name)
                comparisons.append(compare(agent.pooled, baseline.pooled, baseline.name, n_boot, pair_seed))
            seeds.append(
                SeedVerdict(
                    agent.seed_index, stats, comparisons, _share_below(stats.sharpe.point, random_seeds)
                )
            )
        sharpes = np.array([seed.stats.sharpe.point for seed in seeds])
        iqm_sharpe = seed_aggregate(sharpes, n_boot, derive_seed(root_seed, "report", "iqm", algo))
        iqm_diff = {
            name: float(
                interquartile_mean(
                    np.array([c.diff for s in seeds for c in s.comparisons if c.baseline == name])
                )
            )
            for name in (b.name for b in baselines)
        }
        beats, sentence = verdict_sentence(algo, seeds, deflation)
        verdicts.append(AgentVerdict(algo, seeds, deflation, iqm_sharpe, iqm_diff, beats, sentence))
    return verdicts


def _share_below(sharpe: float, random_seeds: Sequence[Strategy]) -> float:
    """Share of random-baseline seeds whose pooled net Sharpe is below ``sharpe`` (NaN without seeds)."""
    values = np.array([s.pooled_summary.get("sharpe", math.nan) for s in random_seeds], dtype=np.float64)
    values = values[np.isfinite(values)]
    if not values.size or not np.isfinite(sharpe):
        return math.nan
    return float(np.mean(values < sharpe))


def seed_aggregate(scores: np.ndarray, n_boot: int, seed: int) -> ConfidenceInterval:
    """IQM with a stratified-bootstrap CI over seeds ([n_seeds] or [n_seeds, n_folds]); NaN if undefined."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        return ConfidenceInterval(math.nan, math.nan, math.nan)
    return stratified_bootstrap_ci(scores, n_boot=n_boot, seed=seed)


@dataclass
class SeedSpread:
    """Per-fold and pooled net Sharpe (annualised) of every seed of one algorithm, with IQM and CIs."""

    algo: str
    folds: list[int]
    seeds: list[int]
    fold_sharpe: np.ndarray  # [n_seeds, n_folds]
    pooled_sharpe: np.ndarray  # [n_seeds]
    fold_return: np.ndarray  # [n_seeds, n_folds]
    per_fold_iqm: list[ConfidenceInterval]
    across_folds_iqm: ConfidenceInterval
    pooled_iqm: ConfidenceInterval
    return_iqm: ConfidenceInterval


def seed_spread(algo: str, agents: Sequence[Strategy], n_boot: int, root_seed: int) -> SeedSpread:
    """rliable-style aggregation of one algorithm's seeds: seeds resampled within folds."""
    members = sorted((a for a in agents if a.name == algo), key=lambda a: a.seed_index or 0)
    folds = sorted(members[0].fold_summaries)
    fold_sharpe = np.array(
        [[m.fold_summaries[f]["sharpe"] for f in folds] for m in members], dtype=np.float64
    )
    fold_return = np.array(
        [[m.fold_summaries[f]["total_return"] for f in folds] for m in members], dtype=np.float64
    )
    pooled = np.array([m.pooled_summary["sharpe"] for m in members], dtype=np.float64)
    seed = derive_seed(root_seed, "report", "seeds", algo)
    return SeedSpread(
        algo=algo,
        folds=folds,
        seeds=[m.seed_index or 0 for m in members],
        fold_sharpe=fold_sharpe,
        pooled_sharpe=pooled,
        fold_return=fold_return,
        per_fold_iqm=[seed_aggregate(fold_sharpe[:, k], n_boot, seed + k + 1) for k in range(len(folds))],
        across_folds_iqm=seed_aggregate(fold_sharpe, n_boot, seed),
        pooled_iqm=seed_aggregate(pooled, n_boot, seed),
        return_iqm=seed_aggregate(fold_return, n_boot, seed),
    )


def cost_sensitivity(strategies: Sequence[Strategy], multipliers: Sequence[float]) -> list[dict[str, Any]]:
    """Pooled net Sharpe (annualised) and total return at each cost multiplier: net = gross − m × cost.

    Agents: one row per algorithm with the IQM over seeds (per-seed values kept for the figure)."""
    rows: dict[str, dict[str, Any]] = {}
    for strategy in strategies:
        assert strategy.pooled is not None
        row = rows.setdefault(
            strategy.name,
            {"name": strategy.name, "is_agent": strategy.is_agent, "sharpe": [], "total_return": []},
        )
        sharpes, returns = [], []
        for m in multipliers:
            _, daily = strategy.pooled.daily(float(m))
            sharpes.append(annualized_sharpe(daily))
            returns.append(float(np.prod(1.0 + daily) - 1.0))
        row["sharpe"].append(sharpes)
        row["total_return"].append(returns)
    result = []
    for row in rows.values():
        sharpe = np.array(row["sharpe"])
        total = np.array(row["total_return"])
        result.append(
            {
                "name": row["name"],
                "is_agent": row["is_agent"],
                "n_seeds": sharpe.shape[0],
                "per_seed_sharpe": sharpe,
                "sharpe": [_iqm_or_nan(sharpe[:, j]) for j in range(sharpe.shape[1])],
                "total_return": [_iqm_or_nan(total[:, j]) for j in range(total.shape[1])],
            }
        )
    return result


def _iqm_or_nan(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(interquartile_mean(finite)) if finite.size == values.size and finite.size else math.nan


def position_profile(
    strategies: Sequence[Strategy], random_seeds: Sequence[Strategy]
) -> list[dict[str, Any]]:
    """Exposure, long/short shares, turnover, trades and costs per strategy (pooled; mean over seeds)."""
    groups: dict[str, list[Strategy]] = {}
    for strategy in strategies:
        if strategy.name == RANDOM_BASELINE and strategy.seed_index is None:
            continue  # the seed-averaged random portfolio has fractional positions; use its seeds instead
        groups.setdefault(strategy.name, []).append(strategy)
    if random_seeds:
        groups[RANDOM_BASELINE] = list(random_seeds)
    rows = []
    for name, members in groups.items():
        summaries = [m.pooled_summary for m in members]
        n_days = np.mean([s["n_days"] for s in summaries])
        rows.append(
            {
                "name": name,
                "is_agent": members[0].is_agent,
                "n_members": len(members),
                "exposure": float(np.mean([s["exposure"] for s in summaries])),
                "long_share": float(np.mean([m.long_share for m in members])),
                "short_share": float(np.mean([m.short_share for m in members])),
                "avg_daily_turnover": float(np.mean([s["avg_daily_turnover"] for s in summaries])),
                "trades_per_day": float(np.mean([s["n_trades"] for s in summaries]) / n_days),
                "total_cost": float(np.mean([s["total_cost"] for s in summaries])),
                "cost_drag": float(np.mean([s["gross_total_return"] - s["total_return"] for s in summaries])),
            }
        )
    return rows


def stored_metric_warnings(strategies: Sequence[Strategy]) -> list[str]:
    """Disagreements between metrics.json and the recomputation from bars.parquet (agents and deterministic
    baselines; the random baseline's stored summary may aggregate its seeds differently)."""
    warnings = []
    for strategy in strategies:
        if strategy.name == RANDOM_BASELINE:
            continue
        for fold, run in strategy.fold_runs.items():
            stored = run.stored_metrics
            if not stored:
                continue
            for key in ("total_return", "sharpe", "n_trades"):
                value, recomputed = stored.get(key), strategy.fold_summaries[fold][key]
                if value is None or not np.isfinite(recomputed):
                    continue
                if not math.isclose(
                    float(value), float(recomputed), rel_tol=_STORED_RTOL, abs_tol=_STORED_ATOL
                ):
                    warnings.append(
                        f"{run.source}: the evaluation's stored {key} = {value!r} differs from "
                        f"{recomputed!r} recomputed from these bars ({strategy.label})"
                    )
    return warnings


def baseline_order(strategies: Sequence[Strategy]) -> list[Strategy]:
    """The four baselines of the verdict, in the documented order."""
    by_name = {s.name: s for s in strategies if not s.is_agent and s.seed_index is None}
    return [by_name[name] for name in BASELINES if name in by_name]
