"""The break-even cost of a strategy: the multiple of the run's costs at which its pooled net return over flat is 0.

"After costs" depends on the costs; the number a desk asks first is the cost at which an edge vanishes. For a
model (its seeds as one equal-weight portfolio, as their mean daily return) or a baseline, on the pooled test
days d: the day's gross return G_d (the positions' return at 0 x costs) and the costs it paid C_d = G_d − N_d (N_d
the net return at 1x). At m x costs a day nets G_d − m·C_d (exact at 0 and 1x; the compounding of a day's bars
makes it linear to first order), so the pooled mean net return, and the Sharpe ratio over flat with it, reaches 0 at

    m* = sum_d G_d / sum_d C_d

(m* = 2: the edge survives twice the configured costs, and no more). A strategy with no gross edge (sum G <= 0)
has m* = 0; one that never traded (sum C = 0) has none. The 95% interval is the percentile interval of m* over a
stationary block bootstrap of the days (G and C resampled together; mean block from both series), clipped at 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marketrl.scoring.stats import default_mean_block, stationary_bootstrap_indices
from marketrl.verdict.strategies import Strategy

__all__ = ["BreakEven", "break_even"]


@dataclass(frozen=True)
class BreakEven:
    """Cost multiple m* (NaN: never traded) and its 95% interval; ``no_gross_edge`` when gross <= 0 (m* = 0)."""

    point: float
    lo: float
    hi: float
    no_gross_edge: bool = False

    def to_record(self) -> dict[str, Any]:
        finite = {key: getattr(self, key) for key in ("point", "lo", "hi")}
        return {
            **{key: (float(value) if math.isfinite(value) else None) for key, value in finite.items()},
            "no_gross_edge": self.no_gross_edge,
        }


NEVER_TRADED = BreakEven(math.nan, math.nan, math.nan)


def _gross_and_cost(members: Sequence[Strategy]) -> tuple[np.ndarray, np.ndarray]:
    """The members' mean daily gross return and mean daily cost on their pooled days."""
    gross, cost = [], []
    for member in members:
        assert member.pooled is not None
        _, at_zero = member.pooled.daily(0.0)
        _, net = member.pooled.daily(1.0)
        gross.append(at_zero)
        cost.append(at_zero - net)
    return np.mean(gross, axis=0), np.mean(cost, axis=0)


def break_even(members: Sequence[Strategy], n_boot: int, seed: int) -> BreakEven:
    """The break-even cost multiple of a model's seeds (or one baseline) on their pooled test days."""
    members = [m for m in members if m.pooled is not None]
    if not members:
        return NEVER_TRADED
    gross, cost = _gross_and_cost(members)
    total_cost = float(cost.sum())
    if not total_cost > 0:
        return NEVER_TRADED
    point = float(gross.sum()) / total_cost
    if point <= 0:
        return BreakEven(0.0, 0.0, 0.0, no_gross_edge=True)
    if gross.size < 3 or n_boot < 1:
        return BreakEven(point, math.nan, math.nan)
    rng = np.random.default_rng(seed)
    index = stationary_bootstrap_indices(gross.size, default_mean_block(gross, cost), n_boot, rng)
    boot_cost = cost[index].sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(boot_cost > 0, gross[index].sum(axis=1) / boot_cost, np.nan)
    ratios = np.clip(ratios[np.isfinite(ratios)], 0.0, None)
    if not ratios.size:
        return BreakEven(point, math.nan, math.nan)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return BreakEven(point, float(lo), float(hi))
