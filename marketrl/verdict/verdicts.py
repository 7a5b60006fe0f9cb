"""The verdict: the selection diagnostic (deflated Sharpe of the study's choice) and the family-wise
out-of-sample comparison of every model against the baselines (docs/METRICS.md)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
from scipy.stats import norm

from marketrl.calendars.annual import ANNUALIZER
from marketrl.scoring.inference import (
    BalancedTest,
    balanced_critical,
    balanced_intersection_union_stepdown,
    bonferroni_critical,
    bootstrap_t_intervals,
    intersection_union_detectable,
    minimum_detectable_sharpe_difference,
    romano_wolf_stepdown,
    sharpe_contrasts,
    studentized_sharpe_ci,
)
from marketrl.scoring.stats import (
    ConfidenceInterval,
    expected_max_sharpe,
    is_finite_number,
    probabilistic_sharpe_from_moments,
    probabilistic_sharpe_ratio,
)
from marketrl.settings.config import derive_seed
from marketrl.settings.registry import DETERMINISTIC
from marketrl.verdict.inputs import (
    MATCHED_RANDOM,
    RANDOM_BASELINE,
    ReportInputError,
    ReportInputs,
)
from marketrl.verdict.strategies import (
    BASELINE_LABELS,
    INTERRUPTED_ATTR,
    DailyReturns,
    DailySeries,
    ReturnSeries,
    Strategy,
    VerdictRules,
    annualized_ci,
    column_sharpes,
    matched_traders,
    model_trading_share,
    seed_aggregate,
)

# ------------------------------------------------------------------------------ selection diagnostic (DSR)


@dataclass(frozen=True)
class Deflation:
    """The DSR as the diagnostic of hyperparameter selection: the best trial's tuning-validation Sharpe,
    deflated for every trial tried on that same window (docs/METRICS.md, "Deflated Sharpe ratio")."""

    n_trials: int  # N: complete + pruned + failed-with-a-score; an interrupted, rerun trial counts once
    n_scored: int  # trials with a validation Sharpe, the sample of V
    counts: Mapping[str, int]
    trials_sr_variance: float  # V, daily Sharpe units²
    best_sharpe_daily: float
    n_validation_days: int
    expected_max_daily: float
    dsr: float
    note: str
    assumptions: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return is_finite_number(self.dsr)


def _trial_score(trial: Mapping[str, Any]) -> float | None:
    """The trial's validation Sharpe (annualised): its value if complete, else its last intermediate score."""
    value = trial.get("value")
    if trial.get("state") == "COMPLETE" and is_finite_number(value):
        return float(value)
    intermediate = trial.get("intermediate") or {}
    steps = sorted((int(k), v) for k, v in intermediate.items() if str(k).lstrip("-").isdigit())
    scores = [float(v) for _, v in steps if is_finite_number(v)]
    return scores[-1] if scores else None


def deflation_for(inputs: ReportInputs, model: str) -> Deflation:
    """N, V and the DSR of the selected trial from ``results/hyperopt/{model}.json`` and the tuning window.

    Under hyperopt.per_fold the summary pools every fold's study (`inputs.pooled_fold_studies`): N sums the folds'
    trials, V is over all their scores and the best is the highest of the folds' choices; every fold's tuning
    window has the same tuning_validation_days, so the validation length is the same."""
    n_validation = len(inputs.plan.tuning.validation_days)
    summary = inputs.hyperopt.get(model)
    if summary is None:
        return Deflation(
            0, 0, {}, math.nan, math.nan, n_validation, math.nan, math.nan, "no hyperopt summary"
        )
    counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0}
    scores: list[float] = []
    for trial in summary.trials:
        state = trial.get("state")
        attrs = trial.get("user_attrs") or {}
        if state not in counts or attrs.get(INTERRUPTED_ATTR):
            continue  # running/waiting, or interrupted and rerun in its slot (the rerun is the trial)
        score = _trial_score(trial)
        if state == "FAIL" and score is None:
            continue  # failed before any score: nothing was selected against
        counts[state] += 1
        if score is not None:
            scores.append(score / ANNUALIZER)
    n_trials = sum(counts.values())
    best_value = summary.data.get("best_value")
    if not counts["COMPLETE"] or not is_finite_number(best_value):
        return Deflation(
            n_trials,
            len(scores),
            counts,
            math.nan,
            math.nan,
            n_validation,
            math.nan,
            math.nan,
            "no completed hyperopt trials",
        )
    variance = float(np.var(scores, ddof=1)) if len(scores) >= 2 else 0.0
    best = float(best_value) / ANNUALIZER
    benchmark = expected_max_sharpe(n_trials, variance)
    assumptions = (
        "the hyperopt JSON does not store the best trial's daily validation returns, so skewness 0 and "
        "kurtosis 3 (normal returns) are assumed",
    )
    if n_trials > len(scores):
        assumptions += (f"{n_trials - len(scores)} pruned trial(s) without a score count in N but not in V",)
    dsr = probabilistic_sharpe_from_moments(best, n_validation, benchmark)
    note = "" if n_validation >= 3 else f"{n_validation} tuning-validation day(s): the DSR needs at least 3"
    return Deflation(
        n_trials, len(scores), counts, variance, best, n_validation, benchmark, dsr, note, assumptions
    )


# ------------------------------------------------------------------------------------ out-of-sample verdict


@dataclass(frozen=True)
class SharpeStats:
    """Pooled out-of-sample statistics of one strategy, net of costs (Sharpe annualised, bootstrap-t CI)."""

    sharpe: ConfidenceInterval
    psr: float
    n_days: int
    total_return: float
    max_drawdown: float


def sharpe_stats(series: ReturnSeries, summary: Mapping[str, Any], n_boot: int, seed: int) -> SharpeStats:
    """Sharpe with its studentized stationary-bootstrap CI and the PSR (vs 0) of one pooled series."""
    _, daily = series.daily()
    ci = annualized_ci(studentized_sharpe_ci(daily, n_boot=n_boot, seed=seed))
    return SharpeStats(
        sharpe=ci,
        psr=probabilistic_sharpe_ratio(daily),
        n_days=int(daily.size),
        total_return=float(summary.get("total_return", math.nan)),
        max_drawdown=float(summary.get("max_drawdown", math.nan)),
    )


@dataclass(frozen=True)
class Comparison:
    """Model − baseline, annualised Sharpe difference (model = mean over its seeds) with the family test."""

    baseline: str
    diff: float
    lo: float  # marginal 95% bootstrap-t interval (display); the claim comes from the family test
    hi: float
    # Secondary families (per baseline, one direction each): Romano–Wolf adjusted p-values over every
    # model × baseline of "model > baseline" and, separately, of "model < baseline"
    p_beats: float
    p_worse: float
    beats: bool
    worse: bool
    detectable: (
        float  # annualised difference the per-baseline "better" family detects at the configured power
    )


@dataclass
class SeedRow:
    """One agent seed's pooled statistics (descriptive; the verdict is per model)."""

    seed_index: int
    stats: SharpeStats
    random_percentile: float
    matched_percentile: float = math.nan  # among this seed's own turnover-matched random traders


@dataclass
class ModelVerdict:
    """Headline result of one model: the family-wise claims against every baseline and the sentence."""

    model: str
    n_seeds: int
    seeds: list[SeedRow]
    deterministic: bool
    deflation: Deflation
    sharpe: ConfidenceInterval  # mean over seeds of the per-seed Sharpe, annualised, bootstrap-t CI
    iqm_sharpe: ConfidenceInterval  # across-seed IQM; NaN interval below evaluation.min_seeds
    random_percentile: float
    comparisons: list[Comparison]
    enough_data: bool
    beats: bool  # the primary family: "beats every baseline" claimed (intersection–union, family-wise over models)
    sentence: str
    matched_percentile: float = math.nan  # mean seed Sharpe among all of the model's matched random traders
    p_beats_every: float = math.nan  # the primary family's adjusted p-value of this model
    binding: str = ""  # the baseline its smallest studentized difference is against
    detectable: float = math.nan  # annualised edge over every baseline the primary claim detects at the power
    trading_share: float = math.nan  # mean over its seeds of the share of test days holding a position
    low_information: bool = False  # below VerdictRules.min_trading_share: outside the primary family
    critical: float = math.nan  # its own first-step critical value (t units) in the balanced stepdown


@dataclass(frozen=True)
class FamilySummary:
    """What the out-of-sample families tested and what this run could detect."""

    n_days: int
    n_hypotheses: int  # primary family: one "beats every baseline" hypothesis per model
    n_models: int
    n_random: int
    alpha: float
    power: float
    critical: float  # primary family's first step: median of the family's per-model critical values (t units)
    critical_source: str
    mean_block: float  # median per-comparison stationary-bootstrap block
    detectable: (
        float  # annualised headline: median over the models that trade of their figures (or the reference's)
    )
    sentence: str
    max_autocorrelation: float  # largest lag-1 autocorrelation of a model's seed-mean daily returns
    n_secondary: int = 0  # per-baseline hypotheses in each secondary family (models × baselines)
    secondary_critical: float = math.nan
    one_comparison_detectable: float = math.nan  # annualised (z_{1−α} + z_power)·√(2/n)·√252
    false_claim_note: str = ""  # the measured false-claim rate at this autocorrelation, when above 0.1
    power_note: str = ""  # the measured power of the headline figure at the nearest measured number of days
    headline_definition: str = ""  # what `detectable` is (HEADLINE_DEFINITION or REFERENCE_DEFINITION)
    headline_models: tuple[str, ...] = ()  # the models whose median it is (empty: the reference trader's)
    reference_note: str = ""  # non-empty when no model trades and the figure is the reference trader's
    min_trading_share: float = math.nan  # the rule: below it a model is low-information
    low_information: tuple[str, ...] = ()  # models left out of the primary family by that rule
    level: float = math.nan  # the balanced stepdown's first-step level of each model in the family
    max_t_critical: float = math.nan  # the max-t stepdown's first-step critical value over the same family


def _aligned_matrix(series: Sequence[ReturnSeries | DailySeries]) -> tuple[np.ndarray, np.ndarray]:
    """Daily net returns of every series on the union of their days (a missing day is a 0 return)."""
    dailies = [s.daily() for s in series]
    days = np.unique(np.concatenate([d for d, _ in dailies])) if dailies else np.array([])
    matrix = np.zeros((days.size, len(dailies)))
    for column, (d, r) in enumerate(dailies):
        matrix[np.searchsorted(days, d), column] = r
    return days, matrix


def _gross_series(strategy: Strategy) -> DailySeries:
    """A strategy's pooled daily returns before costs (its positions' returns at 0x costs)."""
    assert isinstance(strategy.pooled, ReturnSeries | DailyReturns)
    return DailySeries(*strategy.pooled.daily(0.0))


def lag1_autocorrelation(daily: np.ndarray) -> float:
    """Sample lag-1 autocorrelation (NaN below 3 days or for a constant series)."""
    if daily.size < 3:
        return math.nan
    centered = daily - daily.mean()
    denominator = float(np.dot(centered, centered))
    return float(np.dot(centered[1:], centered[:-1]) / denominator) if denominator > 0 else math.nan


def _percentile(value: float, reference: np.ndarray) -> float:
    """Share of ``reference`` strictly below ``value`` (NaN when undefined)."""
    reference = reference[np.isfinite(reference)]
    if not reference.size or not is_finite_number(value):
        return math.nan
    return float(np.mean(reference < value))


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def verdict_sentence(
    model: str,
    comparisons: Sequence[Comparison],
    enough: tuple[bool, str],
    detectable: float,
    beats_every: bool,
    low_information: str = "",
) -> tuple[bool, str]:
    """Plain-language verdict: "beats" only if the primary family (intersection–union over the baselines,
    balanced stepdown across models) claims it; per-baseline "better"/"worse" come from the secondary families;
    nothing at all without enough data. ``low_information``: why the model is outside the primary family (it
    trades on too few test days), empty when it is in it."""
    enough_data, why_not = enough
    limit = f"about {detectable:.2f}" if is_finite_number(detectable) else "an undetermined size"
    if not enough_data:
        return False, (
            f"{model}: not enough out-of-sample data for a verdict ({why_not}); no claim is made either way."
        )
    labels = {c.baseline: BASELINE_LABELS.get(c.baseline, c.baseline) for c in comparisons}
    if comparisons and beats_every and not low_information:
        return True, (
            f"{model} beats every baseline after costs: its smallest studentized Sharpe difference over "
            f"{_join(list(labels.values()))} clears the family-wise critical value (intersection–union test, "
            "balanced stepdown across the models of this run, 5%)."
        )
    better = [labels[c.baseline] for c in comparisons if c.beats]
    worse = [labels[c.baseline] for c in comparisons if c.worse]
    unclear = [labels[c.baseline] for c in comparisons if not (c.beats or c.worse)]
    if low_information:
        reasons = [
            f"{low_information}, too little information for the test of 'beats every baseline': it is left out "
            "of the primary family (no claim, and it does not raise the other models' critical values); at the "
            f"family's level it would detect an edge over every baseline of {limit} (annualised Sharpe, 80% power)"
        ]
    else:
        reasons = [
            "the test of 'beats every baseline' does not reject: this run would detect an edge over every "
            f"baseline of {limit} (annualised Sharpe, 80% power)"
        ]
    if worse:
        reasons.append(f"per baseline, it is significantly worse than {_join(worse)} (secondary family, 5%)")
    if better:
        reasons.append(
            f"per baseline, it is significantly better than {_join(better)} (secondary family, 5%)"
        )
    if unclear and (worse or better):
        reasons.append(f"against {_join(unclear)} the per-baseline test cannot tell")
    if low_information:
        return False, f"{model}: no verdict on 'beats every baseline': " + "; ".join(reasons) + "."
    return False, f"{model} does not beat the baselines after costs: " + "; ".join(reasons) + "."


@dataclass(frozen=True)
class FamilyResult:
    """Estimates, marginal intervals and the decisions of the three one-direction families: primary
    "beats every baseline" per model (balanced stepdown), secondary "better than" and "worse than" per
    model × baseline (max-t stepdown)."""

    estimate: np.ndarray  # [n_models + n_pairs], per-day units
    se: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    primary: BalancedTest  # [n_models]
    detectable: np.ndarray  # [n_models] per-day edge over every baseline the primary claim detects
    p_better: np.ndarray  # [n_pairs]
    better: np.ndarray
    p_worse: np.ndarray
    worse: np.ndarray
    critical: float  # primary family, first step: median over the family's models of their own critical value
    critical_source: str
    secondary_critical: float
    mean_block: float


def _untested(n_models: int, level: float) -> BalancedTest:
    """The primary family when nothing is estimable (below 3 days, or no baseline)."""
    nan = np.full(n_models, np.nan)
    return BalancedTest(
        np.full(n_models, -np.inf),
        np.full(n_models, -1),
        np.ones(n_models),
        nan,
        np.zeros(n_models, bool),
        np.zeros(n_models, bool),
        level,
        nan,
        math.nan,
    )


def family_result(
    matrix: np.ndarray,
    model_rows: list[np.ndarray],
    pair_rows: list[np.ndarray],
    groups: list[list[int]],
    rules: VerdictRules,
    seed: int,
    eligible: Sequence[bool] | None = None,
) -> FamilyResult:
    """One studentized bootstrap of every row, then the primary intersection–union family across models
    (``groups``: per model, its pair rows) by the balanced (min-p) stepdown, and the two per-baseline Romano–Wolf
    families, each one-sided. ``eligible`` (per model; default all): the models that trade on enough test days to
    enter the primary family (`VerdictRules.min_trading_share`); the others are neither claimed nor counted in
    its critical values, and their figure is computed at the family's level. Below 3 days nothing is estimable
    and the critical values fall back to Bonferroni bounds (for the power line)."""
    n_models, n_pairs = len(model_rows), len(pair_rows)
    if matrix.shape[0] < 3 or not n_pairs:
        nan = np.full(n_models + n_pairs, np.nan)
        return FamilyResult(
            nan,
            nan,
            nan,
            nan,
            _untested(n_models, rules.alpha / max(1, n_models)),
            np.full(n_models, np.nan),
            np.ones(n_pairs),
            np.zeros(n_pairs, bool),
            np.ones(n_pairs),
            np.zeros(n_pairs, bool),
            bonferroni_critical(n_models, rules.alpha),
            "Bonferroni bound",
            bonferroni_critical(n_pairs, rules.alpha),
            math.nan,
        )
    # The block floors pool the eligible models' comparisons only: a low-information model moves nobody's block.
    in_family = [True] * n_models if eligible is None else [bool(e) for e in eligible]
    pooled = np.zeros(n_models + n_pairs, bool)
    for m, group in enumerate(groups):
        pooled[[m, *(n_models + k for k in group)]] = in_family[m]
    contrasts = sharpe_contrasts(
        matrix, np.array(model_rows + pair_rows), rules.n_boot, seed=seed, pooled=pooled
    )
    lo, hi = bootstrap_t_intervals(contrasts, 0.05)
    pairs = contrasts._replace(
        estimate=contrasts.estimate[n_models:],
        standard_error=contrasts.standard_error[n_models:],
        t_boot=contrasts.t_boot[:, n_models:],
        mean_block=contrasts.mean_block[n_models:],
    )
    primary = balanced_intersection_union_stepdown(pairs, groups, rules.alpha, eligible)
    in_family = primary.critical[primary.in_family]
    in_family = in_family[np.isfinite(in_family)]
    if in_family.size:
        critical = float(np.median(in_family))
        source = "balanced (min-p) stepdown, first step, median over the models in the family"
    else:
        critical, source = bonferroni_critical(n_models, rules.alpha), "Bonferroni bound"
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(pairs.standard_error > 0, pairs.estimate / pairs.standard_error, np.nan)
    better = romano_wolf_stepdown(t, pairs.t_boot, rules.alpha)
    worse = romano_wolf_stepdown(-t, -pairs.t_boot, rules.alpha)
    secondary = better.first_step_critical
    if not is_finite_number(secondary):
        secondary = bonferroni_critical(n_pairs, rules.alpha)
    detectable = np.array(
        [
            intersection_union_detectable(pairs, g, float(primary.critical[m]), rules.power)
            if np.isfinite(primary.critical[m])
            else math.nan
            for m, g in enumerate(groups)
        ]
    )
    return FamilyResult(
        contrasts.estimate,
        contrasts.standard_error,
        lo,
        hi,
        primary,
        detectable,
        better.p_adjusted,
        better.reject,
        worse.p_adjusted,
        worse.reject,
        critical,
        source,
        secondary,
        float(np.median(pairs.mean_block)),
    )


def reference_detectable(
    matrix: np.ndarray,
    model_row: np.ndarray,
    pair_rows: Sequence[np.ndarray],
    level: float,
    rules: VerdictRules,
    seed: int,
) -> float:
    """The per-day edge over every one of ``pair_rows`` that a reference trader (``model_row``: the mean of its
    seeds' Sharpes) would be detected with at ``rules.power``, its binding comparison's critical value taken from
    its own null draws at the per-model ``level`` (as the balanced stepdown tests each model). NaN below 3 days."""
    if matrix.shape[0] < 3 or not len(pair_rows):
        return math.nan
    rows = np.array([model_row, *pair_rows])
    contrasts = sharpe_contrasts(matrix, rows, rules.n_boot, seed=seed)
    pairs = contrasts._replace(
        estimate=contrasts.estimate[1:],
        standard_error=contrasts.standard_error[1:],
        t_boot=contrasts.t_boot[:, 1:],
        mean_block=contrasts.mean_block[1:],
    )
    test = balanced_intersection_union_stepdown(pairs, [list(range(len(pair_rows)))], rules.alpha, [False])
    if test.binding[0] < 0:
        return math.nan
    critical = balanced_critical(pairs.t_boot[:, int(test.binding[0])], level)
    if not math.isfinite(critical):
        return math.nan
    return intersection_union_detectable(pairs, range(len(pair_rows)), critical, rules.power)


def _load_measured() -> dict[str, Any]:
    """The simulated figures the report quotes (measured.json beside this module: layout, command, tables)."""
    raw = json.loads(
        resources.files("marketrl.verdict").joinpath("measured.json").read_text(encoding="utf-8")
    )
    tables = {
        key: {
            int(days): (float(r), float(lo), float(hi), int(k)) for days, (r, lo, hi, k) in raw[key].items()
        }
        for key in ("false_claims_ar1_phi_0_5", "headline_power")
    }
    return {**raw, **tables}


_MEASURED = _load_measured()
#: The layout (models, seeds per model) the measured figures below were simulated for.
MEASURED_LAYOUT: tuple[int, int] = (int(_MEASURED["layout"]["models"]), int(_MEASURED["layout"]["seeds"]))
# The primary family's measured false-claim rate in no-edge worlds of that layout with AR(1) φ = 0.5 daily
# returns (five baselines, matched random traders): test days → (rate, 95% CI lo, hi, K). The per-baseline
# secondary families are more liberal there (31% at 20 days, 12% at 60; docs/PERFORMANCE.md).
MEASURED_FALSE_CLAIMS_PHI_05: dict[int, tuple[float, float, float, int]] = _MEASURED[
    "false_claims_ar1_phi_0_5"
]
# The headline figure's own check: in simulated worlds of that layout (independent days), model 0's seeds given an
# edge over every baseline equal to the median "could have detected" figure of the no-edge worlds, the share of
# worlds where the primary family claims it (nominal 80%): test days → (power, 95% CI lo, hi, K). Below 20 days
# the figure is optimistic (the local-alternative shift ignores how much the standard error itself varies).
MEASURED_HEADLINE_POWER: dict[int, tuple[float, float, float, int]] = _MEASURED["headline_power"]


#: the primary family's procedure now: "balanced" (min-p stepdown, headline = median over the models that trade);
#: measured.json's "procedure" names the one its figures were simulated with ("max-t": the Romano–Wolf max-t
#: stepdown with the largest per-model figure as the headline, before issue 37)
PROCEDURE = "balanced"
MEASURED_PROCEDURE: str = str(_MEASURED.get("procedure", PROCEDURE))


def layout_note(layout: tuple[int, int] | None) -> str:
    """Empty when the run's (models, most seeds of a model) is the measured layout and the figures were measured
    with the current procedure, else what differs."""
    procedure = (
        ""
        if MEASURED_PROCEDURE == PROCEDURE
        else "; measured with the earlier max-t stepdown and largest-model headline, not yet with the balanced "
        "stepdown and median headline this report uses"
    )
    if layout is None or tuple(layout) == MEASURED_LAYOUT:
        return f" ({procedure[2:]})" if procedure else ""
    models, seeds = MEASURED_LAYOUT
    return (
        f" (simulated for {models} models × {seeds} seeds; this run has {layout[0]} × {layout[1]}, so the figure "
        f"is indicative: bench/studies/verdict_size.py measures a layout{procedure})"
    )


def _measured_at(
    table: Mapping[int, tuple[float, float, float, int]], n_days: int
) -> tuple[int, float, float, float, int]:
    """(nearest measured number of test days, rate, CI lo, CI hi, K) of a measured table."""
    nearest = min(table, key=lambda d: abs(math.log(d / max(n_days, 1))))
    return (nearest, *table[nearest])


def false_claim_note(autocorrelation: float, n_days: int, layout: tuple[int, int] | None = None) -> str:
    """The measured false-claim rate of the primary family with autocorrelated returns at the nearest measured
    number of test days; empty when the autocorrelation is at most 0.1 or nothing was measured. `layout` (models,
    seeds) adds a caution when it is not the layout measured."""
    if not is_finite_number(autocorrelation) or autocorrelation <= 0.1 or not MEASURED_FALSE_CLAIMS_PHI_05:
        return ""
    nearest, rate, lo, hi, worlds = _measured_at(MEASURED_FALSE_CLAIMS_PHI_05, n_days)
    return (
        f"in simulated no-edge worlds of this layout with AR(1) φ = 0.5 daily returns, the headline claim was made "
        f"falsely in {100 * rate:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] of K = {worlds} worlds at {nearest} test days "
        "(nominal 5%)" + layout_note(layout)
    )


def headline_power_note(n_days: int, power: float, layout: tuple[int, int] | None = None) -> str:
    """How often the headline figure's edge was found in simulation, at the nearest measured number of test days
    (empty when nothing was measured or the run asks for another power than the one measured, 80%); `layout`
    as in `false_claim_note`."""
    if not MEASURED_HEADLINE_POWER or abs(power - 0.8) > 1e-9:
        return ""
    nearest, rate, lo, hi, worlds = _measured_at(MEASURED_HEADLINE_POWER, n_days)
    return (
        f"the figure's own check, in simulated worlds of this layout with independent days at {nearest} test days: "
        f"an edge equal to the figure computed there was claimed in {100 * rate:.0f}% [{100 * lo:.0f}, "
        f"{100 * hi:.0f}] of K = {worlds} worlds"
        + (" (the figure is optimistic at so few days)" if rate < 0.75 else "")
        + layout_note(layout)
    )


#: what the headline figure is when some model trades (FamilySummary.headline_definition, verdict.json)
HEADLINE_DEFINITION = (
    "the median, over the models that trade (a position on at least {share:.0f}% of their test days, mean over "
    "their seeds), of each model's edge over every baseline (annualised Sharpe) that the primary family detects "
    "with {power:.0f}% power at that model's own critical value"
)
#: ... and when no model trades: the same figure for a reference trader on the run's own test days
REFERENCE_DEFINITION = (
    "no model trades on {share:.0f}% of its test days, so the figure is that of a reference trader on this run's "
    "test days: {seeds} of the run's random-baseline traders, before costs (a trader with no skill and no cost "
    "drag), as the seeds of one model, compared with buy & hold, flat, momentum and the mean of the other {others} "
    "random traders before costs (which trade as often as it does, so that comparison is also its turnover-matched "
    "one), its critical value from its own bootstrap at the level the balanced stepdown gives each of this run's "
    "{models} model(s) ({level:.2f}%), {power:.0f}% power"
)


def _family_sentence(
    verdicts: Sequence[ModelVerdict],
    detectable: float,
    one_comparison: float,
    power: float,
    reference: bool = False,
) -> str:
    winners = [v.model for v in verdicts if v.beats]
    n = len(verdicts)
    if not all(v.enough_data for v in verdicts):
        return "Not enough out-of-sample data for a verdict on every model; see each model below."
    if winners:
        verb = "beats" if len(winners) == 1 else "beat"
        return f"At family-wise 5% over all {n} model(s) of this run: {_join(winners)} {verb} every baseline."
    of_what = (
        "a reference random trader on these test days, since no model trades"
        if reference
        else "the median over the models that trade"
    )
    return (
        f"No model beats every baseline at family-wise 5% over all {n} model(s). This run would have detected an "
        f"edge over every baseline of about {detectable:.2f} (annualised Sharpe; {of_what}) with "
        f"{100 * power:.0f}% power: no edge larger than that, smaller ones undetermined (one comparison alone, at "
        f"5% and the same days, would detect about {one_comparison:.2f})."
    )


def _shortfalls(n_days: int, n_seeds: int, rules: VerdictRules, deterministic: bool = False) -> list[str]:
    shortfalls = []
    if n_days < rules.min_test_days:
        shortfalls.append(f"{n_days} test day(s), evaluation.min_test_days = {rules.min_test_days}")
    # a deterministic model has one distinct run: copies of it would add no information
    if n_seeds < (1 if deterministic else rules.min_seeds):
        shortfalls.append(f"{n_seeds} seed(s), evaluation.min_seeds = {rules.min_seeds}")
    return shortfalls


def model_verdicts(
    inputs: ReportInputs,
    agents: Sequence[Strategy],
    baselines: Sequence[Strategy],
    random_seeds: Sequence[Strategy],
    rules: VerdictRules,
    root_seed: int,
) -> tuple[list[ModelVerdict], FamilySummary]:
    """The primary family ("which models beat every baseline after costs?": intersection–union over the
    baselines, balanced stepdown across the models that trade) and the secondary per-baseline families, one
    direction each, on the pooled out-of-sample days.

    A model's series are its seeds; its statistic is the mean over seeds of the per-seed Sharpe (the expected
    Sharpe of one training run). The random baseline is the mean Sharpe of the independent random traders,
    each evaluated on its own, never the Sharpe of their averaged portfolio. The turnover-matched random
    baseline of a model is, likewise, the mean Sharpe of its seeds' matched traders (included when every agent
    run carries them).
    """
    models = list(inputs.models)
    fixed = [b for b in baselines if b.name != RANDOM_BASELINE]
    members = {
        model: sorted((a for a in agents if a.name == model), key=lambda a: a.seed_index or 0)
        for model in models
    }
    matched = {model: matched_traders(members[model]) for model in models}
    with_matched = bool(models) and all(traders is not None for traders in matched.values())
    columns = [m for model in models for m in members[model]] + fixed + list(random_seeds)
    pooled: list[ReturnSeries | DailySeries | None] = [c.pooled for c in columns]
    if any(p is None for p in pooled):
        raise ReportInputError(
            "report: a strategy has no pooled out-of-sample series (build_strategies first)"
        )
    matched_columns: dict[str, list[list[int]]] = {}  # model -> per seed -> matrix columns of its traders
    if with_matched:
        for model in models:
            matched_columns[model] = []
            for traders in matched[model] or []:
                matched_columns[model].append(list(range(len(pooled), len(pooled) + len(traders))))
                pooled += traders
    days, matrix = _aligned_matrix([p for p in pooled if p is not None])
    n_days = int(days.size)
    column_of = {id(c): j for j, c in enumerate(columns)}
    baseline_names = (
        [b.name for b in fixed]
        + ([RANDOM_BASELINE] if random_seeds else [])
        + ([MATCHED_RANDOM] if with_matched else [])
    )

    def weights_for(model: str, baseline: str | None) -> np.ndarray:
        """Mean of the model's seed Sharpes minus the baseline's Sharpe (or the random traders' mean)."""
        row = np.zeros(len(pooled))
        for m in members[model]:
            row[column_of[id(m)]] += 1.0 / len(members[model])
        if baseline == RANDOM_BASELINE:
            for r in random_seeds:
                row[column_of[id(r)]] -= 1.0 / len(random_seeds)
        elif baseline == MATCHED_RANDOM:
            traders = [j for seed_columns in matched_columns[model] for j in seed_columns]
            row[traders] -= 1.0 / len(traders)
        elif baseline is not None:
            row[column_of[id(next(b for b in fixed if b.name == baseline))]] -= 1.0
        return row

    model_rows = [weights_for(model, None) for model in models]
    pairs = [(model, name) for model in models for name in baseline_names]
    pair_rows = [weights_for(model, name) for model, name in pairs]
    groups = [[k for k, (a, _) in enumerate(pairs) if a == model] for model in models]
    shares = {model: model_trading_share(members[model]) for model in models}
    eligible = [not (math.isfinite(shares[m]) and shares[m] < rules.min_trading_share) for m in models]
    result = family_result(
        matrix, model_rows, pair_rows, groups, rules, derive_seed(root_seed, "report", "family"), eligible
    )
    z_power = float(norm.ppf(rules.power))
    random_sharpes = column_sharpes(matrix, [column_of[id(r)] for r in random_seeds])

    verdicts = []
    for i, model in enumerate(models):
        shortfalls = _shortfalls(n_days, len(members[model]), rules, model in DETERMINISTIC)
        enough = not shortfalls
        comparisons = []
        for name in baseline_names:
            k = pairs.index((model, name))
            row = len(model_rows) + k
            comparisons.append(
                Comparison(
                    baseline=name,
                    diff=float(result.estimate[row]) * ANNUALIZER,
                    lo=float(result.lo[row]) * ANNUALIZER,
                    hi=float(result.hi[row]) * ANNUALIZER,
                    p_beats=float(result.p_better[k]),
                    p_worse=float(result.p_worse[k]),
                    beats=enough and bool(result.better[k]),
                    worse=enough and bool(result.worse[k]),
                    detectable=(result.secondary_critical + z_power) * float(result.se[row]) * ANNUALIZER,
                )
            )
        sharpe = annualized_ci(
            ConfidenceInterval(float(result.estimate[i]), float(result.lo[i]), float(result.hi[i]))
        )
        seeds = []
        for m in members[model]:
            assert m.pooled is not None and m.seed_index is not None
            boot_seed = derive_seed(root_seed, "report", "sharpe", model, m.seed_index)
            stats = sharpe_stats(m.pooled, m.pooled_summary, rules.n_boot, boot_seed)
            seeds.append(SeedRow(m.seed_index, stats, _percentile(stats.sharpe.point, random_sharpes)))
        if with_matched:
            for row, seed_columns in zip(seeds, matched_columns[model], strict=True):
                row.matched_percentile = _percentile(
                    row.stats.sharpe.point, column_sharpes(matrix, seed_columns)
                )
        iqm = seed_aggregate(
            np.array([s.stats.sharpe.point for s in seeds]),
            rules.n_boot,
            derive_seed(root_seed, "report", "iqm", model),
        )
        if len(members[model]) < rules.min_seeds:
            iqm = ConfidenceInterval(iqm.point, math.nan, math.nan)  # measured coverage too low to print
        detectable = float(result.detectable[i]) * ANNUALIZER
        binding = int(result.primary.binding[i])
        low_information = (
            ""
            if eligible[i]
            else f"it holds a position on {100 * shares[model]:.0f}% of its test days (mean over its seeds; "
            f"the rule asks for {100 * rules.min_trading_share:.0f}%)"
        )
        beats, sentence = verdict_sentence(
            model,
            comparisons,
            (enough, "; ".join(shortfalls)),
            detectable,
            enough and bool(result.primary.reject[i]),
            low_information,
        )
        verdicts.append(
            ModelVerdict(
                model=model,
                n_seeds=len(members[model]),
                seeds=seeds,
                deterministic=model in DETERMINISTIC,
                deflation=deflation_for(inputs, model),
                sharpe=sharpe,
                iqm_sharpe=iqm,
                random_percentile=_percentile(sharpe.point, random_sharpes),
                comparisons=comparisons,
                matched_percentile=_percentile(
                    sharpe.point,
                    column_sharpes(matrix, [j for cols in matched_columns.get(model, []) for j in cols]),
                ),
                enough_data=enough,
                beats=beats,
                sentence=sentence,
                p_beats_every=float(result.primary.p_adjusted[i]),
                binding=pairs[binding][1] if binding >= 0 else "",
                detectable=detectable,
                trading_share=shares[model],
                low_information=not eligible[i],
                critical=float(result.primary.critical[i]),
            )
        )
    trading = [v for v in verdicts if not v.low_information and is_finite_number(v.detectable)]
    percent = {"share": 100 * rules.min_trading_share, "power": 100 * rules.power}
    reference_note = ""
    if trading:
        headline = float(np.median([v.detectable for v in trading]))
        definition = HEADLINE_DEFINITION.format(**percent)
    else:
        # as many seeds as the run's largest model, at most half the random traders (the rest are its baseline)
        n_reference = min(max((len(members[m]) for m in models), default=1), len(random_seeds) // 2)
        headline = math.nan
        if n_reference >= 1 and n_days >= 3:
            # the random traders before costs: a trader with no skill and no cost drag (at 1x costs their churn at
            # nearly every bar makes their Sharpe so negative that its spread, not the days', would set the figure)
            gross = [_gross_series(r) for r in random_seeds]
            _, reference_matrix = _aligned_matrix([*(b.pooled for b in fixed), *gross])
            n_fixed = len(fixed)
            reference_row = np.zeros(reference_matrix.shape[1])
            reference_row[n_fixed : n_fixed + n_reference] = 1.0 / n_reference
            reference_pairs = []
            for k in range(n_fixed + 1):
                row = reference_row.copy()
                if k == n_fixed:  # the mean of the other random traders, also before costs
                    row[n_fixed + n_reference :] -= 1.0 / (len(random_seeds) - n_reference)
                else:
                    row[k] -= 1.0
                reference_pairs.append(row)
            headline = (
                reference_detectable(
                    reference_matrix,
                    reference_row,
                    reference_pairs,
                    result.primary.level,
                    rules,
                    derive_seed(root_seed, "report", "reference"),
                )
                * ANNUALIZER
            )
        definition = REFERENCE_DEFINITION.format(
            **percent,
            seeds=n_reference,
            others=len(random_seeds) - n_reference,
            models=len(models),
            level=100 * result.primary.level,
        )
        reference_note = (
            "no model of this run trades on enough test days, so the figure is computed for a reference trader: "
            + definition
        )
    one_comparison = (
        minimum_detectable_sharpe_difference(n_days, float(norm.ppf(1.0 - rules.alpha)), rules.power)
        * ANNUALIZER
    )
    autocorrelations = [
        lag1_autocorrelation(matrix[:, [column_of[id(m)] for m in members[model]]].mean(axis=1))
        for model in models
    ]
    max_autocorrelation = max((a for a in autocorrelations if is_finite_number(a)), default=math.nan)
    layout = (len(models), max((len(members[model]) for model in models), default=0))
    summary = FamilySummary(
        n_days=n_days,
        n_hypotheses=len(models),
        n_models=len(models),
        n_random=len(random_seeds),
        alpha=rules.alpha,
        power=rules.power,
        critical=result.critical,
        critical_source=result.critical_source,
        mean_block=result.mean_block,
        detectable=headline,
        sentence=_family_sentence(verdicts, headline, one_comparison, rules.power, bool(reference_note)),
        max_autocorrelation=max_autocorrelation,
        n_secondary=len(pairs),
        secondary_critical=result.secondary_critical,
        one_comparison_detectable=one_comparison,
        false_claim_note=false_claim_note(max_autocorrelation, n_days, layout),
        power_note=headline_power_note(n_days, rules.power, layout),
        headline_definition=definition,
        headline_models=tuple(v.model for v in trading),
        reference_note=reference_note,
        min_trading_share=rules.min_trading_share,
        low_information=tuple(v.model for v in verdicts if v.low_information),
        level=result.primary.level,
        max_t_critical=result.primary.max_t_critical,
    )
    return verdicts, summary
