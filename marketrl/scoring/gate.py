"""The validation gate: a trained run trades on the test days only where its own validation days show an edge
after costs; otherwise it is set flat.

With costs and no edge the best policy is flat, yet a model fitted to noise trades it and pays the costs every
bar (a churning agent's cost drag is ten times a real edge). Flat is always available and costs nothing, so a
run must earn the right to trade: at the end of training, its positions on the fold's validation tail (rows
inside the training window, never a test day) are scored net of costs, and the run keeps its policy only when
the t-statistic of its mean net bar return reaches ``min_t``:

    t = bar_sharpe x sqrt(n_bars)      (the portfolio's net return per bar, as `performance_summary` has it)

A net Sharpe S (annualised) over n validation days gives t ~ S x sqrt(n / 252) on average, whatever the bar
size: with ``min_t = 1`` a run that only pays costs (S < 0) passes rarely, one with a validation edge of
S = 2 x sqrt(252 / n) passes five times in six. A run flat on every validation bar has no evidence either way
(t is undefined) and is set flat too. The decision is made per run (seed) and recorded in its checkpoint, its
train log and its evaluation metrics (``flat_gate``), so the report says which runs were set flat and which
learned to stay flat by themselves.

Two days of validation are little evidence: a run that only pays costs still passes ``t >= 1`` about one time in
six, and its selection (early stopping, the tuning window) used the same days. So the validation gate decides only
where nothing better exists, the first fold (``training.gate_min_t``, 1.5 by default: no record, more evidence
asked). From the second fold on, a model trades a fold's test days only when its **walk-forward record** earns after
costs: the daily net returns its runs of every earlier fold made on their own test days, as they would have traded
ungated, the seeds' mean per day, all before this fold's first test day and never seen by any of its selection;
the model trades (every seed, each with its own policy) when that record's t-statistic

    t = mean(daily net) / sd(daily net) x sqrt(n_days)

reaches ``training.record_min_t`` (1.0), and is set flat otherwise (`record_gate`, basis "record"). The record is
ten times the validation tail's length after one fold of the demo, so it tells a real edge from cost-paying noise
far more often (docs/METRICS.md "The validation gate and the walk-forward record").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from marketrl.env import EnvConfig, MarketData
from marketrl.scoring.batched import BarLayout, bar_net_returns, score_positions

__all__ = [
    "POOLED",
    "RECORD",
    "VALIDATION",
    "FoldRecord",
    "GateDecision",
    "flat_gates",
    "gated_positions",
    "record_gate",
    "record_or_pooled",
]

#: what a decision was made on: the run's own validation tail, the seeds' mean portfolio on it, or the model's
#: walk-forward record
VALIDATION, POOLED, RECORD = "validation", "pooled", "record"


@dataclass(frozen=True)
class GateDecision:
    """One run's gate: ``set_flat`` when ``t_stat`` < ``min_t`` (or undefined); the statistics it was decided on
    (annualised net and gross Sharpe, contracts per day per instrument, bars, days) and their ``basis``:
    VALIDATION (the run's validation tail) or RECORD (the model's walk-forward record, `record_gate`)."""

    set_flat: bool
    t_stat: float
    min_t: float
    net_sharpe: float
    gross_sharpe: float
    turnover: float
    n_bars: int
    n_days: int
    basis: str = VALIDATION
    #: the t-statistic of the seeds' mean net bar return on the validation tail (every seed of the batch trading
    #: its own policy on 1/S of the capital): the same for every run of a batch; NaN where not computed
    pooled_t: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint or a JSON (NaN where a statistic is undefined)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, record: Any) -> GateDecision | None:
        """The decision a checkpoint or JSON recorded, or None where it has none (a run from before the gate)."""
        if not isinstance(record, dict) or "set_flat" not in record:
            return None
        return cls(**{key: record[key] for key in cls.__dataclass_fields__ if key in record})


def _number(value: Any) -> float:
    return float(value) if value is not None and math.isfinite(float(value)) else math.nan


def _bar_t(bar_returns: np.ndarray) -> float:
    """t = mean / sd x sqrt(n) of a bar return series (NaN when it never varies)."""
    sd = float(bar_returns.std(ddof=1)) if bar_returns.size > 1 else 0.0
    return float(bar_returns.mean() / sd * math.sqrt(bar_returns.size)) if sd > 0 else math.nan


def flat_gates(
    validation: MarketData,
    positions: torch.Tensor,
    env_config: EnvConfig,
    min_t: float,
    *,
    pooled: bool = False,
) -> list[GateDecision]:
    """The gate of K runs (the seeds of one batch) from their target positions [K, T] on the validation split,
    scored in one batch. Each decision records its run's own t and the seeds' pooled t (``pooled_t``); it is made
    on the run's own t, or with ``pooled`` on the pooled one (all seeds trade, or none: basis POOLED)."""
    positions = positions.to(torch.float32)
    layout = BarLayout.of(validation)
    scores = score_positions(validation, positions, env_config, layout=layout)
    assert scores.summaries is not None
    traded = [summary["avg_daily_turnover"] > 0 for summary in scores.summaries]
    pooled_t = (
        _bar_t(bar_net_returns(validation, positions, env_config, layout).mean(0))
        if any(traded)
        else math.nan
    )
    decisions = []
    for summary, trades in zip(scores.summaries, traded, strict=True):
        n_bars = int(summary["n_bars"])
        bar_sharpe = _number(summary["bar_sharpe"])
        t_stat = bar_sharpe * math.sqrt(n_bars) if trades else math.nan
        decided_on = pooled_t if pooled else t_stat
        decisions.append(
            GateDecision(
                set_flat=not (decided_on >= min_t),  # NaN (never traded, or no variation) sets it flat
                t_stat=t_stat,
                min_t=float(min_t),
                net_sharpe=_number(summary["sharpe"]),
                gross_sharpe=_number(summary["gross_sharpe"]),
                turnover=float(summary["avg_daily_turnover"]),
                n_bars=n_bars,
                n_days=int(summary["n_days"]),
                basis=POOLED if pooled else VALIDATION,
                pooled_t=pooled_t,
            )
        )
    return decisions


def gated_positions(positions: torch.Tensor, gate: GateDecision | None) -> torch.Tensor:
    """A run's positions as the gate lets it trade them: all flat when it was set flat, else unchanged."""
    return torch.zeros_like(positions) if gate is not None and gate.set_flat else positions


@dataclass(frozen=True)
class FoldRecord:
    """What a model's runs made on one fold's test days as they would have traded without any gate: the days,
    the seeds' mean daily net and gross portfolio returns [n_days], their mean turnover (contracts per day per
    instrument) and the bars scored (metrics.json ``ungated``, written by the evaluate job)."""

    days: tuple[str, ...]
    daily_net: tuple[float, ...]
    daily_gross: tuple[float, ...]
    turnover: float
    n_bars: int

    @classmethod
    def of_seeds(
        cls, days: Sequence[Any], net: Any, gross: Any, turnovers: Sequence[float], n_bars: int
    ) -> FoldRecord:
        """The record of one fold from its seeds' daily net and gross returns [S, n_days] and turnovers [S]."""
        return cls(
            days=tuple(str(day) for day in days),
            daily_net=tuple(float(x) for x in np.atleast_1d(np.mean(net, axis=0))),
            daily_gross=tuple(float(x) for x in np.atleast_1d(np.mean(gross, axis=0))),
            turnover=float(np.mean(turnovers)),
            n_bars=int(n_bars),
        )


def _annualised(values: np.ndarray) -> float:
    sd = float(values.std(ddof=1)) if values.size > 1 else math.nan
    return float(values.mean() / sd * math.sqrt(252)) if sd > 0 else math.nan


def record_gate(records: Sequence[FoldRecord], min_t: float) -> GateDecision:
    """The walk-forward record's decision from the earlier folds' test records (in time order, none overlapping
    the fold it decides for): trade when t = mean / sd x sqrt(n) of the daily net returns reaches ``min_t``."""
    net = np.array([value for record in records for value in record.daily_net], dtype=np.float64)
    gross = np.array([value for record in records for value in record.daily_gross], dtype=np.float64)
    days = sum(len(record.days) for record in records)
    sd = float(net.std(ddof=1)) if net.size > 1 else math.nan
    t_stat = float(net.mean() / sd * math.sqrt(net.size)) if sd > 0 else math.nan
    turnover = float(np.mean([record.turnover for record in records])) if records else 0.0
    return GateDecision(
        set_flat=not (t_stat >= min_t),  # NaN (no record, or it never traded) sets the model flat
        t_stat=t_stat,
        min_t=float(min_t),
        net_sharpe=_annualised(net),
        gross_sharpe=_annualised(gross),
        turnover=turnover,
        n_bars=sum(record.n_bars for record in records),
        n_days=days,
        basis=RECORD,
    )


def record_or_pooled(
    record: GateDecision | None, run_gates: Sequence[GateDecision | None], pooled_min_t: float | None
) -> list[GateDecision | None]:
    """The decision each run of a model x fold trades under. Without a record (the first fold, or the record
    switched off) each run's own validation gate. With one: the record, unless it sets the model flat while the
    fold's own seeds, pooled, earn on its validation tail (``pooled_t >= pooled_min_t``, training.pooled_min_t):
    then every seed trades (basis POOLED). The record judges the earlier folds' models; a model retrained on a
    longer window can have learnt what they had not."""
    if record is None:
        return list(run_gates)
    pooled = [gate.pooled_t if gate is not None else math.nan for gate in run_gates]
    if record.set_flat and pooled_min_t is not None and pooled and all(t >= pooled_min_t for t in pooled):
        return [
            dataclasses.replace(gate, set_flat=False, min_t=float(pooled_min_t), basis=POOLED)
            for gate in run_gates
            if gate is not None
        ]
    return [record] * len(run_gates)
