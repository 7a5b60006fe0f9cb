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
from scipy.stats import norm

from marketrl.config import derive_seed
from marketrl.metrics import (
    daily_information_coefficients,
    daily_returns,
    performance_summary,
    portfolio_bars,
    summarize_information_coefficients,
)
from marketrl.report.inputs import (
    BASELINES,
    MATCHED_RANDOM,
    RANDOM_BASELINE,
    ReportInputError,
    ReportInputs,
    Run,
)
from marketrl.stats import (
    ANNUALIZER,
    ConfidenceInterval,
    SharpeContrasts,
    bonferroni_critical,
    bootstrap_t_intervals,
    expected_max_sharpe,
    familywise_test,
    interquartile_mean,
    is_finite_number,
    minimum_detectable_sharpe_difference,
    probabilistic_sharpe_from_moments,
    probabilistic_sharpe_ratio,
    sharpe_contrasts,
    sharpe_ratio,
    stratified_bootstrap_ci,
    studentized_sharpe_ci,
)

DSR_THRESHOLD = 0.95
FAMILY_ALPHA = 0.05
POWER = 0.8
# hyperopt's user attribute of a trial interrupted by a killed worker and rerun in its slot (marketrl.hyperopt).
INTERRUPTED_ATTR = "interrupted"
BASELINE_LABELS = {
    "buy_and_hold": "buy & hold",
    "flat": "flat",
    "momentum": "momentum",
    "random": "random",
    MATCHED_RANDOM: "turnover-matched random",
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
    return float(sharpe_ratio(daily)) * ANNUALIZER if daily.size >= 2 else math.nan


def _annualized_ci(ci: ConfidenceInterval) -> ConfidenceInterval:
    return ConfidenceInterval(ci.point * ANNUALIZER, ci.lo * ANNUALIZER, ci.hi * ANNUALIZER)


@dataclass(frozen=True)
class VerdictRules:
    """The config keys that decide whether a run may make a claim (docs/METRICS.md, "Verdict rules")."""

    n_boot: int
    min_test_days: int
    min_seeds: int
    alpha: float = FAMILY_ALPHA
    power: float = POWER

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> VerdictRules:
        return cls(
            n_boot=int(config_value(config, "evaluation.bootstrap_samples")),
            min_test_days=int(config_value(config, "evaluation.min_test_days")),
            min_seeds=int(config_value(config, "evaluation.min_seeds")),
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


def deflation_for(inputs: ReportInputs, algo: str) -> Deflation:
    """N, V and the DSR of the selected trial from ``results/hyperopt/{algo}.json`` and the tuning window."""
    n_validation = len(inputs.plan.tuning.validation_days)
    summary = inputs.hyperopt.get(algo)
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
    ci = _annualized_ci(studentized_sharpe_ci(daily, n_boot=n_boot, seed=seed))
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
    p_beats: float  # Romano–Wolf adjusted p-values of "model > baseline" and "model < baseline"
    p_worse: float
    beats: bool
    worse: bool
    detectable: float  # annualised difference detectable at the configured power with this comparison's SE


@dataclass
class SeedRow:
    """One agent seed's pooled statistics (descriptive; the verdict is per model)."""

    seed_index: int
    stats: SharpeStats
    random_percentile: float
    matched_percentile: float = math.nan  # among this seed's own turnover-matched random traders


@dataclass
class AgentVerdict:
    """Headline result of one algorithm: the family-wise claims against every baseline and the sentence."""

    algo: str
    n_seeds: int
    seeds: list[SeedRow]
    deflation: Deflation
    sharpe: ConfidenceInterval  # mean over seeds of the per-seed Sharpe, annualised, bootstrap-t CI
    iqm_sharpe: ConfidenceInterval  # across-seed IQM; NaN interval below evaluation.min_seeds
    random_percentile: float
    comparisons: list[Comparison]
    enough_data: bool
    beats: bool
    sentence: str
    matched_percentile: float = math.nan  # mean seed Sharpe among all of the model's matched random traders


@dataclass(frozen=True)
class FamilySummary:
    """What the whole out-of-sample family tested and what this run could detect."""

    n_days: int
    n_hypotheses: int
    n_models: int
    n_random: int
    alpha: float
    power: float
    critical: float
    critical_source: str
    mean_block: float
    detectable: float  # annualised, formula (c + z_power)·√(2/n)·√252
    sentence: str
    max_autocorrelation: float  # largest lag-1 autocorrelation of a model's seed-mean daily returns


def _aligned_matrix(series: Sequence[ReturnSeries | DailySeries]) -> tuple[np.ndarray, np.ndarray]:
    """Daily net returns of every series on the union of their days (a missing day is a 0 return)."""
    dailies = [s.daily() for s in series]
    days = np.unique(np.concatenate([d for d, _ in dailies])) if dailies else np.array([])
    matrix = np.zeros((days.size, len(dailies)))
    for column, (d, r) in enumerate(dailies):
        matrix[np.searchsorted(days, d), column] = r
    return days, matrix


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
    algo: str, comparisons: Sequence[Comparison], enough: tuple[bool, str], detectable: float
) -> tuple[bool, str]:
    """Plain-language verdict: "beats" only if the family-wise test rejects "no better" against every
    baseline; "worse" only where it rejects "no worse"; nothing at all without enough data."""
    enough_data, why_not = enough
    limit = f"about {detectable:.2f}" if is_finite_number(detectable) else "an undetermined size"
    if not enough_data:
        return False, (
            f"{algo}: not enough out-of-sample data for a verdict ({why_not}); no claim is made either way."
        )
    labels = {c.baseline: BASELINE_LABELS.get(c.baseline, c.baseline) for c in comparisons}
    better = [labels[c.baseline] for c in comparisons if c.beats]
    worse = [labels[c.baseline] for c in comparisons if c.worse]
    unclear = [labels[c.baseline] for c in comparisons if not (c.beats or c.worse)]
    if comparisons and len(better) == len(comparisons):
        return True, (
            f"{algo} beats every baseline after costs: the family-wise test (Romano–Wolf, 5%, over every model × "
            f"baseline × direction of this run) rejects 'no better than' {_join(better)}."
        )
    reasons = []
    if worse:
        reasons.append(f"it is significantly worse than {_join(worse)} (family-wise 5%)")
    if better:
        reasons.append(f"it is significantly better than {_join(better)} (family-wise 5%)")
    if unclear:
        reasons.append(
            f"against {_join(unclear)} the test cannot tell: this run could only detect annualised Sharpe "
            f"differences above {limit} (80% power)"
        )
    return False, f"{algo} does not beat the baselines after costs: " + "; ".join(reasons) + "."


@dataclass(frozen=True)
class _FamilyResult:
    """Estimates, marginal intervals and family-wise decisions of the model rows and the hypothesis rows."""

    estimate: np.ndarray  # [n_models + n_hypotheses], per-day units
    se: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p_adjusted: np.ndarray  # [n_hypotheses]
    reject: np.ndarray
    critical: float
    critical_source: str
    mean_block: float


def _family_result(
    matrix: np.ndarray,
    model_rows: list[np.ndarray],
    family_rows: list[np.ndarray],
    rules: VerdictRules,
    seed: int,
) -> _FamilyResult:
    """The studentized bootstrap of every row and the Romano–Wolf stepdown over the hypothesis rows; below 3
    days nothing is estimable and the critical value falls back to the Bonferroni bound (for the power line)."""
    n_rows, n_hypotheses = len(model_rows) + len(family_rows), len(family_rows)
    bonferroni = bonferroni_critical(n_hypotheses, rules.alpha)
    if matrix.shape[0] < 3 or not n_hypotheses:
        nan = np.full(n_rows, np.nan)
        return _FamilyResult(
            nan,
            nan,
            nan,
            nan,
            np.ones(n_hypotheses),
            np.zeros(n_hypotheses, bool),
            bonferroni,
            "Bonferroni bound",
            math.nan,
        )
    contrasts = sharpe_contrasts(matrix, np.array(model_rows + family_rows), rules.n_boot, seed=seed)
    lo, hi = bootstrap_t_intervals(contrasts, 0.05)
    hypotheses = slice(len(model_rows), None)
    family = familywise_test(
        SharpeContrasts(
            contrasts.estimate[hypotheses],
            contrasts.standard_error[hypotheses],
            contrasts.t_boot[:, hypotheses],
            contrasts.mean_block,
        ),
        rules.alpha,
    )
    critical, source = family.first_step_critical, "Romano–Wolf first step"
    if not is_finite_number(critical):
        critical, source = bonferroni, "Bonferroni bound"
    return _FamilyResult(
        contrasts.estimate,
        contrasts.standard_error,
        lo,
        hi,
        family.p_adjusted,
        family.reject,
        critical,
        source,
        contrasts.mean_block,
    )


def _family_sentence(verdicts: Sequence[AgentVerdict], detectable: float, power: float) -> str:
    winners = [v.algo for v in verdicts if v.beats]
    n = len(verdicts)
    if not all(v.enough_data for v in verdicts):
        return "Not enough out-of-sample data for a verdict on every model; see each model below."
    if winners:
        verb = "beats" if len(winners) == 1 else "beat"
        return f"At family-wise 5% over all {n} model(s) of this run: {_join(winners)} {verb} every baseline."
    return (
        f"No model beats every baseline at family-wise 5% over all {n} model(s). This run would have detected an "
        f"annualised Sharpe difference above about {detectable:.2f} with {100 * power:.0f}% power: no edge larger "
        "than that, smaller ones undetermined."
    )


def _shortfalls(n_days: int, n_seeds: int, rules: VerdictRules) -> list[str]:
    shortfalls = []
    if n_days < rules.min_test_days:
        shortfalls.append(f"{n_days} test day(s), evaluation.min_test_days = {rules.min_test_days}")
    if n_seeds < rules.min_seeds:
        shortfalls.append(f"{n_seeds} seed(s), evaluation.min_seeds = {rules.min_seeds}")
    return shortfalls


def agent_verdicts(
    inputs: ReportInputs,
    agents: Sequence[Strategy],
    baselines: Sequence[Strategy],
    random_seeds: Sequence[Strategy],
    rules: VerdictRules,
    root_seed: int,
) -> tuple[list[AgentVerdict], FamilySummary]:
    """One Romano–Wolf family over every model × baseline × direction on the pooled out-of-sample days.

    A model's series are its seeds; its statistic is the mean over seeds of the per-seed Sharpe (the expected
    Sharpe of one training run). The random baseline is the mean Sharpe of the independent random traders,
    each evaluated on its own, never the Sharpe of their averaged portfolio. The turnover-matched random
    baseline of a model is, likewise, the mean Sharpe of its seeds' matched traders (included when every agent
    run carries them).
    """
    algos = list(inputs.algos)
    fixed = [b for b in baselines if b.name != RANDOM_BASELINE]
    members = {
        algo: sorted((a for a in agents if a.name == algo), key=lambda a: a.seed_index or 0) for algo in algos
    }
    matched = {algo: matched_traders(members[algo]) for algo in algos}
    with_matched = bool(algos) and all(traders is not None for traders in matched.values())
    columns = [m for algo in algos for m in members[algo]] + fixed + list(random_seeds)
    pooled: list[ReturnSeries | DailySeries | None] = [c.pooled for c in columns]
    if any(p is None for p in pooled):
        raise ReportInputError(
            "report: a strategy has no pooled out-of-sample series (build_strategies first)"
        )
    matched_columns: dict[str, list[list[int]]] = {}  # algo -> per seed -> matrix columns of its traders
    if with_matched:
        for algo in algos:
            matched_columns[algo] = []
            for traders in matched[algo] or []:
                matched_columns[algo].append(list(range(len(pooled), len(pooled) + len(traders))))
                pooled += traders
    days, matrix = _aligned_matrix([p for p in pooled if p is not None])
    n_days = int(days.size)
    column_of = {id(c): j for j, c in enumerate(columns)}
    baseline_names = (
        [b.name for b in fixed]
        + ([RANDOM_BASELINE] if random_seeds else [])
        + ([MATCHED_RANDOM] if with_matched else [])
    )

    def weights_for(algo: str, baseline: str | None) -> np.ndarray:
        """Mean of the model's seed Sharpes minus the baseline's Sharpe (or the random traders' mean)."""
        row = np.zeros(len(pooled))
        for m in members[algo]:
            row[column_of[id(m)]] += 1.0 / len(members[algo])
        if baseline == RANDOM_BASELINE:
            for r in random_seeds:
                row[column_of[id(r)]] -= 1.0 / len(random_seeds)
        elif baseline == MATCHED_RANDOM:
            traders = [j for seed_columns in matched_columns[algo] for j in seed_columns]
            row[traders] -= 1.0 / len(traders)
        elif baseline is not None:
            row[column_of[id(next(b for b in fixed if b.name == baseline))]] -= 1.0
        return row

    model_rows = [weights_for(algo, None) for algo in algos]
    pairs = [(algo, name) for algo in algos for name in baseline_names]
    family_rows = [sign * weights_for(algo, name) for algo, name in pairs for sign in (1.0, -1.0)]
    result = _family_result(
        matrix, model_rows, family_rows, rules, derive_seed(root_seed, "report", "family")
    )
    z_power = float(norm.ppf(rules.power))
    random_sharpes = _sharpes(matrix, [column_of[id(r)] for r in random_seeds])

    verdicts = []
    for i, algo in enumerate(algos):
        shortfalls = _shortfalls(n_days, len(members[algo]), rules)
        enough = not shortfalls
        comparisons = []
        for name in baseline_names:
            k = 2 * pairs.index((algo, name))  # rows k ("beats") and k + 1 ("worse") of the family
            row = len(model_rows) + k
            comparisons.append(
                Comparison(
                    baseline=name,
                    diff=float(result.estimate[row]) * ANNUALIZER,
                    lo=float(result.lo[row]) * ANNUALIZER,
                    hi=float(result.hi[row]) * ANNUALIZER,
                    p_beats=float(result.p_adjusted[k]),
                    p_worse=float(result.p_adjusted[k + 1]),
                    beats=enough and bool(result.reject[k]),
                    worse=enough and bool(result.reject[k + 1]),
                    detectable=(result.critical + z_power) * float(result.se[row]) * ANNUALIZER,
                )
            )
        sharpe = _annualized_ci(
            ConfidenceInterval(float(result.estimate[i]), float(result.lo[i]), float(result.hi[i]))
        )
        seeds = []
        for m in members[algo]:
            assert m.pooled is not None and m.seed_index is not None
            boot_seed = derive_seed(root_seed, "report", "sharpe", algo, m.seed_index)
            stats = sharpe_stats(m.pooled, m.pooled_summary, rules.n_boot, boot_seed)
            seeds.append(SeedRow(m.seed_index, stats, _percentile(stats.sharpe.point, random_sharpes)))
        if with_matched:
            for row, seed_columns in zip(seeds, matched_columns[algo], strict=True):
                row.matched_percentile = _percentile(row.stats.sharpe.point, _sharpes(matrix, seed_columns))
        iqm = seed_aggregate(
            np.array([s.stats.sharpe.point for s in seeds]),
            rules.n_boot,
            derive_seed(root_seed, "report", "iqm", algo),
        )
        if len(members[algo]) < rules.min_seeds:
            iqm = ConfidenceInterval(iqm.point, math.nan, math.nan)  # measured coverage too low to print
        detectable = max(
            (c.detectable for c in comparisons if is_finite_number(c.detectable)), default=math.nan
        )
        beats, sentence = verdict_sentence(algo, comparisons, (enough, "; ".join(shortfalls)), detectable)
        verdicts.append(
            AgentVerdict(
                algo=algo,
                n_seeds=len(members[algo]),
                seeds=seeds,
                deflation=deflation_for(inputs, algo),
                sharpe=sharpe,
                iqm_sharpe=iqm,
                random_percentile=_percentile(sharpe.point, random_sharpes),
                comparisons=comparisons,
                matched_percentile=_percentile(
                    sharpe.point,
                    _sharpes(matrix, [j for cols in matched_columns.get(algo, []) for j in cols]),
                ),
                enough_data=enough,
                beats=beats,
                sentence=sentence,
            )
        )
    formula = minimum_detectable_sharpe_difference(n_days, result.critical, rules.power) * ANNUALIZER
    autocorrelations = [
        lag1_autocorrelation(matrix[:, [column_of[id(m)] for m in members[algo]]].mean(axis=1))
        for algo in algos
    ]
    summary = FamilySummary(
        n_days=n_days,
        n_hypotheses=len(family_rows),
        n_models=len(algos),
        n_random=len(random_seeds),
        alpha=rules.alpha,
        power=rules.power,
        critical=result.critical,
        critical_source=result.critical_source,
        mean_block=result.mean_block,
        detectable=formula,
        sentence=_family_sentence(verdicts, formula, rules.power),
        max_autocorrelation=max((a for a in autocorrelations if is_finite_number(a)), default=math.nan),
    )
    return verdicts, summary


def _sharpes(matrix: np.ndarray, columns: Sequence[int]) -> np.ndarray:
    """Annualised Sharpe of each of `columns` of the aligned daily-return matrix."""
    return np.array([annualized_sharpe(matrix[:, j]) for j in columns])


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


# ------------------------------------------------------------------------------ forecast quality (forecasters)

#: prediction bins of the calibration panel (equal-count bins of the pooled predictions: deciles)
CALIBRATION_BINS = 10


@dataclass
class ForecastQuality:
    """IC, Rank IC and ICIR of one forecaster by session day (docs/METRICS.md, "Forecast quality").

    Every summary is a dict ``{"ic", "rank_ic", "icir", "rank_icir", "n_days"}``: per seed per fold, per seed
    pooled over the folds (the daily ICs of all test days together), and their mean over seeds.
    """

    algo: str
    horizon: int | None
    folds: list[int]
    seeds: list[int]
    seed_fold: dict[int, dict[int, dict[str, float]]]  # seed -> fold -> summary
    seed_pooled: dict[int, dict[str, float]]
    fold_mean: dict[int, dict[str, float]]  # fold -> mean over seeds
    pooled_mean: dict[str, float]
    daily: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # seed -> (days, IC, Rank IC), pooled
    calibration_prediction: np.ndarray  # [CALIBRATION_BINS] mean prediction per bin, mean over seeds
    calibration_realized: np.ndarray  # [CALIBRATION_BINS] mean realized forward return per bin
    n_pairs: int  # (prediction, realized) pairs of one seed, pooled (the same bars for every seed)


_IC_KEYS = ("ic", "rank_ic", "icir", "rank_icir", "n_days")


def _mean_summary(summaries: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Mean over seeds of each IC statistic (NaN when any seed's is undefined: no seed is dropped silently)."""
    return {key: float(np.mean([s[key] for s in summaries])) if summaries else math.nan for key in _IC_KEYS}


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


def forecast_quality(algo: str, agents: Sequence[Strategy], horizon: int | None = None) -> ForecastQuality:
    """The forecast-quality statistics of one forecaster from its runs' ``prediction``/``forward_return``."""
    members = sorted((a for a in agents if a.name == algo), key=lambda a: a.seed_index or 0)
    if not members or any(run.forecasts is None for m in members for run in m.fold_runs.values()):
        raise ReportInputError(f"report: {algo} has runs without predictions (not a forecaster)")
    folds = sorted(members[0].fold_runs)
    seed_fold: dict[int, dict[int, dict[str, float]]] = {}
    seed_pooled: dict[int, dict[str, float]] = {}
    daily: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    bins_x, bins_y = [], []
    n_pairs = 0
    for member in members:
        seed = member.seed_index or 0
        seed_fold[seed] = {}
        parts = []
        for fold in folds:
            frame = member.fold_runs[fold].forecasts
            assert frame is not None
            days, ic, rank_ic = daily_information_coefficients(
                frame["trading_day"], frame["prediction"], frame["forward_return"]
            )
            seed_fold[seed][fold] = summarize_information_coefficients(ic, rank_ic)
            parts.append((days, ic, rank_ic, frame))
        # Test windows never overlap, so pooling the folds is concatenating their days.
        days = np.concatenate([p[0] for p in parts])
        ic = np.concatenate([p[1] for p in parts])
        rank_ic = np.concatenate([p[2] for p in parts])
        order = np.argsort(days, kind="stable")
        daily[seed] = (days[order], ic[order], rank_ic[order])
        seed_pooled[seed] = summarize_information_coefficients(ic, rank_ic)
        prediction = np.concatenate([p[3]["prediction"].to_numpy() for p in parts])
        realized = np.concatenate([p[3]["forward_return"].to_numpy() for p in parts])
        n_pairs = int((np.isfinite(prediction) & np.isfinite(realized)).sum())
        x, y = calibration_bins(prediction, realized)
        bins_x.append(x)
        bins_y.append(y)
    seeds = sorted(seed_fold)
    return ForecastQuality(
        algo=algo,
        horizon=horizon,
        folds=folds,
        seeds=seeds,
        seed_fold=seed_fold,
        seed_pooled=seed_pooled,
        fold_mean={f: _mean_summary([seed_fold[s][f] for s in seeds]) for f in folds},
        pooled_mean=_mean_summary([seed_pooled[s] for s in seeds]),
        daily=daily,
        calibration_prediction=np.mean(bins_x, axis=0),
        calibration_realized=np.mean(bins_y, axis=0),
        n_pairs=n_pairs,
    )


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


def _finite_median(values: Any) -> float:
    """Median of the finite values (NaN when none is: e.g. Sharpe ratios of a single test day)."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.median(values)) if values.size else math.nan


def _gross_and_net(series: ReturnSeries) -> tuple[float, float]:
    return annualized_sharpe(series.daily(0.0)[1]), annualized_sharpe(series.daily(1.0)[1])


def leaderboard(
    inputs: ReportInputs,
    verdicts: Sequence[AgentVerdict],
    agents: Sequence[Strategy],
    baselines: Sequence[Strategy],
    random_seeds: Sequence[Strategy],
    baseline_sharpes: Mapping[str, ConfidenceInterval],
    quality: Mapping[str, ForecastQuality],
) -> list[LeaderboardRow]:
    """Every model and every baseline in one table, sorted by net Sharpe (undefined last).

    Models: the verdict's mean-over-seeds Sharpe and CI, the DSR of their tuning, IC statistics (forecasters),
    turnover and cost drag as means over seeds. Random traders: the median trader of each statistic.
    """
    rows: list[LeaderboardRow] = []
    for verdict in verdicts:
        members = [a for a in agents if a.name == verdict.algo]
        pairs = [_gross_and_net(m.pooled) for m in members if m.pooled is not None]
        gross = float(np.mean([g for g, _ in pairs]))
        net = float(np.mean([n for _, n in pairs]))
        kind = inputs.kind_of(verdict.algo)
        ic = quality[verdict.algo].pooled_mean if verdict.algo in quality else {}
        claims = tuple(
            (_CLAIM_LABELS.get(c.baseline, c.baseline), "beats" if c.beats else "worse")
            for c in verdict.comparisons
            if c.beats or c.worse
        )
        rows.append(
            LeaderboardRow(
                name=verdict.algo,
                label=verdict.algo,
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
            )
        )
    for baseline in baselines:
        if baseline.name == RANDOM_BASELINE or baseline.pooled is None:
            continue
        gross, net = _gross_and_net(baseline.pooled)
        rows.append(
            LeaderboardRow(
                name=baseline.name,
                label=BASELINE_LABELS.get(baseline.name, baseline.name),
                kind="baseline",
                sharpe=baseline_sharpes.get(baseline.name, ConfidenceInterval(net, math.nan, math.nan)),
                gross_sharpe=gross,
                cost_drag=gross - net,
                turnover=float(baseline.pooled_summary["avg_daily_turnover"]),
            )
        )
    if random_seeds:
        pairs = np.array([_gross_and_net(r.pooled) for r in random_seeds if r.pooled is not None])
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
        matched_traders(sorted((a for a in agents if a.name == algo), key=lambda a: a.seed_index or 0))
        for algo in inputs.algos
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
