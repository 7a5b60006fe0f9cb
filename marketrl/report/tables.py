"""The report's tables beside the verdict: seed spread, cost sensitivity, position profile, stored-metric
checks, baseline order and the leaderboard."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marketrl.report.forecast import ForecastQuality
from marketrl.scoring.stats import ConfidenceInterval, interquartile_mean, is_finite_number
from marketrl.settings.config import derive_seed
from marketrl.verdict.break_even import BreakEven, break_even
from marketrl.verdict.diagnostics import mean_gross_and_net
from marketrl.verdict.inputs import (
    BASELINES,
    MATCHED_RANDOM,
    RANDOM_BASELINE,
    ReportInputs,
)
from marketrl.verdict.strategies import (
    BASELINE_LABELS,
    Strategy,
    annualized_sharpe,
    gross_and_net_sharpe,
    matched_traders,
    seed_aggregate,
)
from marketrl.verdict.verdicts import ModelVerdict

# Relative tolerance for the stored metrics.json values against the recomputation from bars.parquet.
_STORED_RTOL = 1e-6
_STORED_ATOL = 1e-9


@dataclass
class SeedSpread:
    """Per-fold and pooled net Sharpe (annualised) of every seed of one model, with IQM and CIs."""

    model: str
    folds: list[int]
    seeds: list[int]
    fold_sharpe: np.ndarray  # [n_seeds, n_folds]
    pooled_sharpe: np.ndarray  # [n_seeds]
    fold_return: np.ndarray  # [n_seeds, n_folds]
    per_fold_iqm: list[ConfidenceInterval]
    across_folds_iqm: ConfidenceInterval
    pooled_iqm: ConfidenceInterval
    return_iqm: ConfidenceInterval


def seed_spread(model: str, agents: Sequence[Strategy], n_boot: int, root_seed: int) -> SeedSpread:
    """rliable-style aggregation of one model's seeds: seeds resampled within folds."""
    members = sorted((a for a in agents if a.name == model), key=lambda a: a.seed_index or 0)
    folds = sorted(members[0].fold_summaries)
    fold_sharpe = np.array(
        [[m.fold_summaries[f]["sharpe"] for f in folds] for m in members], dtype=np.float64
    )
    fold_return = np.array(
        [[m.fold_summaries[f]["total_return"] for f in folds] for m in members], dtype=np.float64
    )
    pooled = np.array([m.pooled_summary["sharpe"] for m in members], dtype=np.float64)
    seed = derive_seed(root_seed, "report", "seeds", model)
    return SeedSpread(
        model=model,
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


#: A fill "at a wide spread": its half-spread is over half a tick, i.e. the quoted spread is over one tick.
WIDE_HALF_SPREAD_TICKS = 0.5


def fills_paid(strategies: Sequence[Strategy]) -> list[dict[str, Any]]:
    """Per model (its seeds pooled) and per baseline (the random one over its seeds): the half-spread its fills
    paid, in ticks, weighted by the contracts traded (mean, 95th percentile), the share of those contracts
    filled at a wide spread (> ``WIDE_HALF_SPREAD_TICKS``), the fills whose quote was missing, zero or crossed
    (paid the configured half-spread instead; None where the data had no quotes) and the contracts traded.
    Strategies whose bars predate the fill columns, and those that never trade, have no row."""
    pooled: dict[str, list[Any]] = {}
    for strategy in strategies:
        for run in strategy.fold_runs.values():
            fills = run.fills_paid()
            if fills is not None:
                pooled.setdefault(strategy.name, [strategy.is_agent]).append(fills)
    rows = []
    for name, (is_agent, *runs) in pooled.items():
        if not any(fills.traded.size for fills in runs):
            continue
        weight = np.concatenate([fills.traded for fills in runs])
        paid = np.concatenate([fills.ticks for fills in runs])
        order = np.argsort(paid, kind="stable")
        cumulative = np.cumsum(weight[order]) / weight.sum()
        quoted = all(fills.quoted for fills in runs)
        rows.append(
            {
                "name": name,
                "is_agent": is_agent,
                "contracts": float(weight.sum()),
                "mean_ticks": float(np.average(paid, weights=weight)),
                "p95_ticks": float(paid[order][np.searchsorted(cumulative, 0.95)]),
                "wide_share": float(weight[paid > WIDE_HALF_SPREAD_TICKS].sum() / weight.sum()),
                "fallback_fills": (sum(fills.fallback for fills in runs) if quoted else None),
            }
        )
    return rows


def cost_sensitivity(strategies: Sequence[Strategy], multipliers: Sequence[float]) -> list[dict[str, Any]]:
    """Pooled net Sharpe (annualised) and total return at each cost multiplier: net = gross − m × cost.

    Agents: one row per model with the IQM over seeds (per-seed values kept for the figure)."""
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
    """Disagreements between metrics.json and the recomputation from bars.parquet (agents and baselines)."""
    warnings = []
    for strategy in strategies:
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


# ------------------------------------------------------------------------------------------------ leaderboard

_CLAIM_LABELS = {
    "buy_and_hold": "B&H",
    "flat": "flat",
    "momentum": "mom",
    "random": "rand",
    MATCHED_RANDOM: "TMR",
}


@dataclass(frozen=True)
class LeaderboardRow:
    """One model or baseline on the pooled test days, net of costs (docs/METRICS.md, "Leaderboard")."""

    name: str
    label: str
    kind: str  # "agent", "forecaster" or "baseline"
    sharpe: ConfidenceInterval  # annualised net Sharpe; CI NaN where the row is a distribution's median
    gross_sharpe: float
    cost_drag: float  # gross − net annualised Sharpe
    turnover: float  # average daily turnover, contracts per instrument
    dsr: float = math.nan
    ic: float = math.nan
    rank_ic: float = math.nan
    icir: float = math.nan
    verdict: str = ""  # "beats", "does-not-beat", "not-enough-data"; "" for baselines
    claims: tuple[tuple[str, str], ...] = ()  # (short baseline label, "beats" | "worse") of the family test
    note: str = ""
    break_even: BreakEven | None = None  # cost multiple at which the pooled net return over flat is 0


def _finite_median(values: Any) -> float:
    """Median of the finite values (NaN when none is: e.g. Sharpe ratios of a single test day)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


def leaderboard(
    inputs: ReportInputs,
    verdicts: Sequence[ModelVerdict],
    agents: Sequence[Strategy],
    baselines: Sequence[Strategy],
    random_seeds: Sequence[Strategy],
    baseline_sharpes: Mapping[str, ConfidenceInterval],
    quality: Mapping[str, ForecastQuality],
    n_boot: int = 0,
    seed: int = 0,
) -> list[LeaderboardRow]:
    """Every model and every baseline in one table, sorted by net Sharpe (undefined last).

    Models: the verdict's mean-over-seeds Sharpe and CI, the DSR of their tuning, IC statistics (forecasters),
    turnover and cost drag as means over seeds, the break-even cost (`break_even`, its interval from ``n_boot``
    resamples). Random traders: the median trader of each statistic.
    """
    rows: list[LeaderboardRow] = []
    for verdict in verdicts:
        members = [a for a in agents if a.name == verdict.model]
        gross, net = mean_gross_and_net(members)
        kind = inputs.kind_of(verdict.model)
        ic = quality[verdict.model].pooled_mean if verdict.model in quality else {}
        claims = tuple(
            (_CLAIM_LABELS.get(c.baseline, c.baseline), "beats" if c.beats else "worse")
            for c in verdict.comparisons
            if c.beats or c.worse
        )
        rows.append(
            LeaderboardRow(
                name=verdict.model,
                label=verdict.model,
                kind=kind,
                # below 3 days the family bootstrap estimates nothing; the mean seed Sharpe is still defined
                sharpe=verdict.sharpe
                if is_finite_number(verdict.sharpe.point)
                else ConfidenceInterval(net, math.nan, math.nan),
                gross_sharpe=gross,
                cost_drag=gross - net,
                turnover=float(np.mean([m.pooled_summary["avg_daily_turnover"] for m in members])),
                dsr=verdict.deflation.dsr,
                ic=float(ic.get("ic", math.nan)),
                rank_ic=float(ic.get("rank_ic", math.nan)),
                icir=float(ic.get("icir", math.nan)),
                verdict="beats"
                if verdict.beats
                else ("does-not-beat" if verdict.enough_data else "not-enough-data"),
                claims=claims,
                break_even=break_even(
                    members, n_boot, derive_seed(seed, "report", "break_even", verdict.model)
                ),
            )
        )
    for baseline in baselines:
        if baseline.name == RANDOM_BASELINE or baseline.pooled is None:
            continue
        gross, net = gross_and_net_sharpe(baseline.pooled)
        rows.append(
            LeaderboardRow(
                name=baseline.name,
                label=BASELINE_LABELS.get(baseline.name, baseline.name),
                kind="baseline",
                sharpe=baseline_sharpes.get(baseline.name, ConfidenceInterval(net, math.nan, math.nan)),
                gross_sharpe=gross,
                cost_drag=gross - net,
                turnover=float(baseline.pooled_summary["avg_daily_turnover"]),
                break_even=break_even(
                    [baseline], n_boot, derive_seed(seed, "report", "break_even", baseline.name)
                ),
            )
        )
    if random_seeds:
        pairs = np.array([gross_and_net_sharpe(r.pooled) for r in random_seeds if r.pooled is not None])
        turnover = np.array([r.pooled_summary["avg_daily_turnover"] for r in random_seeds])
        rows.append(
            LeaderboardRow(
                name=RANDOM_BASELINE,
                label="random (median trader)",
                kind="baseline",
                sharpe=ConfidenceInterval(_finite_median(pairs[:, 1]), math.nan, math.nan),
                gross_sharpe=_finite_median(pairs[:, 0]),
                cost_drag=_finite_median(pairs[:, 0] - pairs[:, 1]),
                turnover=_finite_median(turnover),
                note=f"median of {len(random_seeds)} independent random traders",
            )
        )
    matched = [
        matched_traders(sorted((a for a in agents if a.name == model), key=lambda a: a.seed_index or 0))
        for model in inputs.models
    ]
    if matched and all(m is not None for m in matched):
        sharpes = [
            annualized_sharpe(t.returns) for per_model in matched for seed in per_model or [] for t in seed
        ]
        rows.append(
            LeaderboardRow(
                name=MATCHED_RANDOM,
                label="turnover-matched random (median trader)",
                kind="baseline",
                sharpe=ConfidenceInterval(_finite_median(sharpes), math.nan, math.nan),
                gross_sharpe=math.nan,
                cost_drag=math.nan,
                turnover=math.nan,
                note=(
                    f"median of the {len(sharpes)} traders of all model runs; each model is tested against its own"
                ),
            )
        )
    return sorted(
        rows,
        key=lambda r: (
            not is_finite_number(r.sharpe.point),
            -r.sharpe.point if is_finite_number(r.sharpe.point) else 0.0,
        ),
    )
