"""Did each model learn? Per model: whether its validation curves settled (convergence), its gross edge against
the cost drag, how often it is short, flat or long, and flags for degenerate policies (docs/METRICS.md, "Did each
model learn?"). Descriptive, beside the verdict: none of it changes a claim.

The rules, with their thresholds (module constants):

- **Convergence** of one training run (one seed in one fold): its validation Sharpe curve (`train_log.json`
  `validation`, else the `val_sharpe` of its `history`; EVALS_PER_RUN points) has a *tail*, the last half of its
  points and at least 3. The tail's *drift* is the change a least-squares line through the tail makes over it;
  its *swing* the largest distance of a tail point from that line. The *noise* is the model's: the root mean
  square over its runs of each curve's own noise (the standard deviation of its successive changes / √2, the
  noise of one point were the curve flat; a steady trend adds nothing to it). Not the spread between seeds:
  from the 3 to 5 seeds of a fold it is too rough an estimate, and seeds that end at different levels say
  nothing about whether each has stopped moving. With tolerance = max(CURVE_TOLERANCE × noise,
  MIN_CURVE_TOLERANCE): |drift| > tolerance is "still moving", else a swing > tolerance is "unstable", else
  "converged"; fewer than 3 finite points: "unknown". A model "converged" when at least CONVERGED_SHARE of its
  runs with a curve did, else it is "still moving" or "unstable", whichever more of its runs are (ties: still
  moving).
- **Gross edge, cost drag**: the leaderboard's gross and net Sharpe (annualised, pooled days, mean over seeds);
  cost drag = gross − net.
- **Flags**: "always_flat" when at least ALWAYS_FLAT_SHARE of the bars are flat (mean over seeds) or no seed
  trades at all; "always_in_market" when at most IN_MARKET_FLAT_SHARE are; "churns" when it is not always flat,
  its cost drag is at least MIN_CHURN_DRAG (the turnover is material: the costs take that much Sharpe) and
  larger than its gross edge, max(gross Sharpe, 0); "set_flat_by_validation" when the validation gate
  (metrics.json `flat_gate`, marketrl.scoring.gate) set at least one of its seed-folds flat, and
  "set_flat_by_record" when the walk-forward record (its basis "record") did.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from marketrl.verdict.inputs import ReportInputs, TrainLog
from marketrl.verdict.strategies import Strategy, gross_and_net_sharpe

ALWAYS_FLAT_SHARE = 0.99  # share of flat bars at or above which a model is "always flat"
IN_MARKET_FLAT_SHARE = 0.01  # share of flat bars at or below which it is "always in the market"
MIN_CHURN_DRAG = 0.1  # annualised Sharpe the costs must take before a model can "churn"
CURVE_TOLERANCE = 2.0  # a validation curve moves when its tail drifts by more than this × its noise
MIN_CURVE_TOLERANCE = 0.01  # annualised Sharpe: below this nothing moves (a constant curve, rounding)
CONVERGED_SHARE = 0.5  # a model converged when at least this share of its runs with a curve did
MIN_CURVE_POINTS = 3

CONVERGED, STILL_MOVING, UNSTABLE, UNKNOWN = "converged", "still moving", "unstable", "unknown"
NO_CURVE = "no validation curve"
ALWAYS_FLAT, IN_MARKET, CHURNS, SET_FLAT, SET_FLAT_RECORD = (
    "always_flat",
    "always_in_market",
    "churns",
    "set_flat_by_validation",
    "set_flat_by_record",
)
FLAG_LABELS = {
    ALWAYS_FLAT: "always flat",
    IN_MARKET: "always in the market",
    CHURNS: "churns",
    SET_FLAT: "set flat by its validation",
    SET_FLAT_RECORD: "set flat by its walk-forward record",
}


def mean_gross_and_net(members: Sequence[Strategy]) -> tuple[float, float]:
    """A model's gross and net annualised Sharpe on the pooled days: the mean over its seeds (the leaderboard's)."""
    pairs = [gross_and_net_sharpe(m.pooled) for m in members if m.pooled is not None]
    return float(np.mean([g for g, _ in pairs])), float(np.mean([n for _, n in pairs]))


# ---------------------------------------------------------------------------------------------- convergence


@dataclass(frozen=True)
class CurveCheck:
    """One training run's validation curve, judged (module docstring)."""

    fold: int
    seed_index: int
    label: str  # converged, still moving, unstable, unknown
    n_points: int
    last: float  # the last validation Sharpe (annualised)
    drift: float
    swing: float
    tolerance: float

    def to_record(self) -> dict[str, Any]:
        return {
            "fold": self.fold,
            "seed_index": self.seed_index,
            "label": self.label,
            "n_points": self.n_points,
            "last": _finite(self.last),
            "drift": _finite(self.drift),
            "swing": _finite(self.swing),
            "tolerance": _finite(self.tolerance),
        }


def validation_curve(log: TrainLog) -> np.ndarray:
    """The run's finite validation Sharpes in step order: the `validation` records, else the history's."""
    validation = log.data.get("validation")
    records = validation if isinstance(validation, list) and validation else log.history
    points = [
        (entry.get("step"), entry.get("val_sharpe"))
        for entry in records
        if isinstance(entry, Mapping)
        and _is_number(entry.get("step"))
        and _is_number(entry.get("val_sharpe"))
    ]
    points = sorted((float(s), float(v)) for s, v in points if math.isfinite(v))
    return np.array([v for _, v in points], dtype=np.float64)


def own_noise(values: np.ndarray) -> float:
    """The curve's own noise: std of its successive changes / √2 (NaN below MIN_CURVE_POINTS points)."""
    if values.size < MIN_CURVE_POINTS:
        return math.nan
    return float(np.std(np.diff(values), ddof=1) / math.sqrt(2.0))


def judge_curve(values: Sequence[float], noise: float = math.nan) -> tuple[str, float, float, float]:
    """(label, drift, swing, tolerance) of one validation curve against `noise` (the model's, `model_noise`;
    NaN: the curve's own)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size < MIN_CURVE_POINTS:
        return UNKNOWN, math.nan, math.nan, math.nan
    tail = values[-max(MIN_CURVE_POINTS, math.ceil(values.size / 2)) :]
    x = np.arange(tail.size, dtype=np.float64)
    slope, intercept = np.polyfit(x, tail, 1)
    drift = float(slope * (tail.size - 1))
    swing = float(np.max(np.abs(tail - (slope * x + intercept))))
    noise = noise if math.isfinite(noise) else own_noise(values)
    tolerance = max(CURVE_TOLERANCE * noise, MIN_CURVE_TOLERANCE)
    if abs(drift) > tolerance:
        return STILL_MOVING, drift, swing, tolerance
    if swing > tolerance:
        return UNSTABLE, drift, swing, tolerance
    return CONVERGED, drift, swing, tolerance


@dataclass(frozen=True)
class Convergence:
    """A model's runs judged; `label` the model's (module docstring)."""

    runs: tuple[CurveCheck, ...]

    @property
    def known(self) -> list[CurveCheck]:
        return [run for run in self.runs if run.label != UNKNOWN]

    @property
    def n_converged(self) -> int:
        return sum(run.label == CONVERGED for run in self.runs)

    @property
    def share(self) -> float:
        return self.n_converged / len(self.known) if self.known else math.nan

    @property
    def label(self) -> str:
        if not self.known:
            return NO_CURVE
        if self.share >= CONVERGED_SHARE:
            return CONVERGED
        counts = Counter(run.label for run in self.known)
        return UNSTABLE if counts[UNSTABLE] > counts[STILL_MOVING] else STILL_MOVING

    def to_record(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "converged": self.n_converged,
            "runs": len(self.known),
            "share": _finite(self.share),
            "per_run": [run.to_record() for run in self.runs],
        }


def model_noise(curves: Sequence[np.ndarray]) -> float:
    """The root mean square of the curves' own noise (those with MIN_CURVE_POINTS points; NaN if none has)."""
    noise = [own_noise(values) for values in curves if values.size >= MIN_CURVE_POINTS]
    return float(np.sqrt(np.mean(np.square(noise)))) if noise else math.nan


def convergence(logs: Sequence[TrainLog]) -> Convergence:
    """Every run of one model judged against the model's noise."""
    curves = {(log.fold, log.seed_index): validation_curve(log) for log in logs}
    noise = model_noise(list(curves.values()))
    checks = []
    for (fold, seed_index), values in sorted(curves.items()):
        label, drift, swing, tolerance = judge_curve(values, noise)
        last = float(values[-1]) if values.size else math.nan
        checks.append(CurveCheck(fold, seed_index, label, int(values.size), last, drift, swing, tolerance))
    return Convergence(tuple(checks))


# ---------------------------------------------------------------------------------------------------- flags


def policy_flags(
    *,
    gross: float,
    cost_drag: float,
    flat_share: float,
    turnover: float,
    n_set_flat: int = 0,
    n_set_flat_by_record: int = 0,
) -> list[str]:
    """The degenerate-policy flags of one model from its pooled numbers (module docstring)."""
    flags = []
    always_flat = flat_share >= ALWAYS_FLAT_SHARE or turnover == 0.0
    if always_flat:
        flags.append(ALWAYS_FLAT)
    elif flat_share <= IN_MARKET_FLAT_SHARE:
        flags.append(IN_MARKET)
    edge = max(gross, 0.0) if math.isfinite(gross) else 0.0
    if not always_flat and math.isfinite(cost_drag) and cost_drag >= MIN_CHURN_DRAG and cost_drag > edge:
        flags.append(CHURNS)
    if n_set_flat > n_set_flat_by_record:
        flags.append(SET_FLAT)
    if n_set_flat_by_record > 0:
        flags.append(SET_FLAT_RECORD)
    return flags


@dataclass(frozen=True)
class LearningDiagnostics:
    """One model: did it learn? (module docstring; verdict.json `models.{model}.diagnostics`)."""

    model: str
    gross_sharpe: float
    net_sharpe: float
    turnover: float  # contracts per instrument per day, mean over seeds
    short_share: float  # of the pooled bars, mean over seeds
    flat_share: float
    long_share: float
    n_runs: int  # seed-folds evaluated
    n_gate_recorded: int  # seed-folds whose metrics.json has a flat_gate record
    n_set_flat: int  # seed-folds the gate set flat
    n_set_flat_by_record: (
        int  # of them, those the walk-forward record set flat (the others: their validation)
    )
    gates: tuple[dict[str, Any], ...]  # per recorded seed-fold: fold, seed_index and the record
    convergence: Convergence
    flags: tuple[str, ...]

    @property
    def cost_drag(self) -> float:
        return self.gross_sharpe - self.net_sharpe

    @property
    def summary(self) -> str:
        return learning_summary(self)

    def to_record(self) -> dict[str, Any]:
        """Plain data for verdict.json (non-finite numbers as None)."""
        return {
            "summary": self.summary,
            "flags": list(self.flags),
            "gross_sharpe": _finite(self.gross_sharpe),
            "net_sharpe": _finite(self.net_sharpe),
            "cost_drag": _finite(self.cost_drag),
            "avg_daily_turnover": _finite(self.turnover),
            "positions": {
                "short": _finite(self.short_share),
                "flat": _finite(self.flat_share),
                "long": _finite(self.long_share),
            },
            "flat_gate": {
                "seed_folds": self.n_runs,
                "recorded": self.n_gate_recorded,
                "set_flat": self.n_set_flat,
                "set_flat_by_record": self.n_set_flat_by_record,
                "per_run": list(self.gates),
            },
            "convergence": self.convergence.to_record(),
        }


def _share_in_market(share: float) -> str:
    """A share of bars as a percentage, never "0.0%" for a share that is not zero."""
    return f"{100 * share:.1f}%" if share >= 0.0005 or share <= 0 else "< 0.1%"


def _set_flat_text(d: LearningDiagnostics) -> str:
    """ "set flat by its validation on v[ and by its walk-forward record on r] of n seed-folds" """
    by_validation = d.n_set_flat - d.n_set_flat_by_record
    parts = [f"by its validation on {by_validation}"] if by_validation else []
    if d.n_set_flat_by_record:
        parts.append(f"by its walk-forward record on {d.n_set_flat_by_record}")
    return f"set flat {' and '.join(parts)} of {d.n_runs} seed-fold{'s' if d.n_runs != 1 else ''}"


def learning_summary(d: LearningDiagnostics) -> str:
    """The one line a reader takes in at a glance: what the policy does, then whether its training settled."""
    gated = _set_flat_text(d)
    if d.n_set_flat and d.n_set_flat == d.n_runs:
        head = f"did not learn to trade: {gated}"
    elif ALWAYS_FLAT in d.flags and not d.turnover > 0:
        head = "did not learn to trade: it stays flat" + (f" ({gated})" if d.n_set_flat else "")
    else:
        numbers = f"gross {d.gross_sharpe:.1f}, cost drag {d.cost_drag:.1f}"
        if ALWAYS_FLAT in d.flags:  # flat on almost every bar, yet some runs trade: say what those earn
            head = f"trades rarely ({_share_in_market(1 - d.flat_share)} of bars in the market): {numbers}"
        elif CHURNS in d.flags:
            head = f"churns: cost drag {d.cost_drag:.1f} above gross edge {d.gross_sharpe:.1f}"
        elif IN_MARKET in d.flags:
            head = f"trades, always in the market: {numbers}"
        else:
            head = f"trades: {numbers}"
        if d.n_set_flat:
            head += f"; {gated}"
    runs = d.convergence
    if runs.label == NO_CURVE:
        return f"{head}; {NO_CURVE}"
    if runs.label == CONVERGED:
        return f"{head}; {CONVERGED} ({runs.n_converged} of {len(runs.known)} runs)"
    return f"{head}; {runs.label} (only {runs.n_converged} of {len(runs.known)} runs converged)"


def learning_diagnostics(inputs: ReportInputs, agents: Sequence[Strategy]) -> dict[str, LearningDiagnostics]:
    """Every model's diagnostics, by model name in the run's order (`agents`: the model runs' strategies)."""
    result = {}
    for model in inputs.models:
        members = sorted((a for a in agents if a.name == model), key=lambda a: a.seed_index or 0)
        gross, net = mean_gross_and_net(members)
        turnovers = [float(m.pooled_summary["avg_daily_turnover"]) for m in members]
        turnover = float(np.mean(turnovers))
        long_share = float(np.mean([m.long_share for m in members]))
        short_share = float(np.mean([m.short_share for m in members]))
        flat_share = 1.0 - long_share - short_share
        runs = [run for m in members for run in m.fold_runs.values()]
        gates = tuple(
            {"fold": run.fold, "seed_index": run.seed_index, **run.flat_gate}
            for run in sorted(runs, key=lambda r: (r.fold, r.seed_index or 0))
            if run.flat_gate is not None
        )
        n_set_flat = sum(bool(gate["set_flat"]) for gate in gates)
        by_record = sum(bool(gate["set_flat"]) and gate.get("basis") == "record" for gate in gates)
        flags = policy_flags(
            gross=gross,
            cost_drag=gross - net,
            flat_share=flat_share,
            turnover=0.0 if all(t == 0.0 for t in turnovers) else turnover,
            n_set_flat=n_set_flat,
            n_set_flat_by_record=by_record,
        )
        result[model] = LearningDiagnostics(
            model=model,
            gross_sharpe=gross,
            net_sharpe=net,
            turnover=turnover,
            short_share=short_share,
            flat_share=flat_share,
            long_share=long_share,
            n_runs=len(runs),
            n_gate_recorded=len(gates),
            n_set_flat=n_set_flat,
            n_set_flat_by_record=by_record,
            gates=gates,
            convergence=convergence([log for log in inputs.train_logs if log.model == model]),
            flags=tuple(flags),
        )
    return result


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
