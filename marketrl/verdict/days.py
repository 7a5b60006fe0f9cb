"""How many pooled test days would answer: the edge this run could detect, projected to other day counts.

A detectable edge is (c + z_power) x SE x sqrt(252): the family's critical value c, plus the normal quantile of the
power, times each comparison's standard error SE of a daily Sharpe difference. SE shrinks as 1/sqrt(n) with the
number n of pooled test days, for daily returns whose variance and serial dependence stay what this run measured.
So the edge d this run detects on its n days becomes d x sqrt(n / m) on m days, and an edge e needs

    m(e) = n x (d / e)^2 pooled test days            (rounded up; folds: m / folds.test_days, rounded up)

with the family's critical value held at this run's (it depends on the number of models and baselines, not on
n once n is past a few weeks: docs/METRICS.md "How many days would answer"). The same projection of the
one-comparison figure says what a single model against a single baseline would need. tests/test_days_to_answer.py
checks the projection against the family's own bootstrap on simulated returns at two day counts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["EDGES", "DaysToAnswer", "days_to_answer"]

#: the edges (annualised Sharpe over every baseline) the report asks about
EDGES = (1.0, 2.0, 3.0)


@dataclass(frozen=True)
class DaysToAnswer:
    """Pooled test days (and folds of the config's size) at which an edge is detected with the run's power: by
    the headline claim (every baseline, every model: the family) and by one comparison alone. None: the run's
    figure is undefined (no model's standard error, e.g. every run flat)."""

    edge: float
    days: int | None
    folds: int | None
    one_comparison_days: int | None

    def to_record(self) -> dict[str, Any]:
        return {
            "edge": self.edge,
            "days": self.days,
            "folds": self.folds,
            "one_comparison_days": self.one_comparison_days,
        }


def _days(detectable: float, n_days: int, edge: float) -> int | None:
    if not (math.isfinite(detectable) and detectable > 0 and n_days > 0 and edge > 0):
        return None
    # the tiny tolerance keeps an exact square (d = e: n days) from rounding up by float error
    return max(1, math.ceil(n_days * (detectable / edge) ** 2 - 1e-9))


def days_to_answer(
    detectable: float,
    one_comparison: float,
    n_days: int,
    test_days_per_fold: int,
    edges: Sequence[float] = EDGES,
) -> tuple[DaysToAnswer, ...]:
    """Per edge: the pooled test days (and folds of ``test_days_per_fold``) at which the headline claim detects
    it (``detectable``: the run's figure on its ``n_days``), and one comparison (``one_comparison``)."""
    rows = []
    for edge in edges:
        days = _days(detectable, n_days, edge)
        folds = None if days is None or test_days_per_fold <= 0 else math.ceil(days / test_days_per_fold)
        rows.append(DaysToAnswer(float(edge), days, folds, _days(one_comparison, n_days, edge)))
    return tuple(rows)
