"""Honest statistics for strategy returns: PSR/DSR, stationary bootstrap CIs, rliable-style seed aggregation, and
the small-sample inference behind the report's verdict (studentized bootstrap-t intervals of Sharpe contrasts,
the Romano–Wolf stepdown family test, the intersection–union "beats every baseline" family and its detectable
edge, the minimum detectable Sharpe difference of one comparison).

All Sharpe ratios here are *per period* (daily when fed daily returns) and never annualised unless a function
says so; see docs/METRICS.md for formulas, conventions and references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

SESSIONS_PER_YEAR = 252
# Daily Sharpe × ANNUALIZER = annualised Sharpe (i.i.d. scaling convention); divide to go back to daily units.
ANNUALIZER = math.sqrt(SESSIONS_PER_YEAR)

# A series whose sample std is below this fraction of its root-mean-square is treated as constant: rounding in
# the mean of a constant series leaves a std of ~1e-18 that would otherwise produce a Sharpe of ~1e16.
_CONSTANT_RELATIVE_STD = 1e-9

# Upper bound on elements of one chunk of resampled data, to keep bootstrap memory bounded (~16 MB per array).
_MAX_CHUNK_ELEMENTS = 2_000_000

# The standard normal from the standard library: scipy.stats costs every evaluation job ~0.6 s of import.
_STANDARD_NORMAL = NormalDist()


def _normal_cdf(z: float) -> float:
    """Φ(z); NaN for NaN."""
    return math.nan if math.isnan(z) else _STANDARD_NORMAL.cdf(z)


def _normal_ppf(p: float) -> float:
    """Φ⁻¹(p): ±inf at p = 1 and p = 0, NaN outside [0, 1] (as scipy's ``norm.ppf``)."""
    if not 0.0 < p < 1.0:
        return math.inf if p == 1.0 else -math.inf if p == 0.0 else math.nan
    return _STANDARD_NORMAL.inv_cdf(p)


def is_finite_number(value: object) -> bool:
    """True for a finite real number (Python or numpy); False for bools, None, NaN, ±inf and anything else."""
    return isinstance(value, int | float | np.number) and not isinstance(value, bool) and math.isfinite(value)


class StatsInputError(ValueError):
    """Raised when a statistic receives input it cannot use (wrong shape, NaN, bad parameter)."""


class ConfidenceInterval(NamedTuple):
    """Point estimate with a two-sided percentile interval; unpacks as ``point, lo, hi``."""

    point: float
    lo: float
    hi: float


StatisticFn = Callable[..., np.ndarray | float]


def _as_1d_finite(values: object, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise StatsInputError(f"{name}: expected a 1-D array of returns, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise StatsInputError(f"{name}: expected finite values, found NaN or inf")
    return array


def _scalar_or_array(value: np.ndarray) -> np.ndarray | float:
    return float(value) if np.ndim(value) == 0 else value


def ratio_or_convention(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, with the documented convention for a zero denominator.

    0/0 → 0 (no return and no risk: no edge); x/0 with x ≠ 0 → NaN (undefined, never ±inf).
    """
    numerator = np.asarray(numerator, dtype=np.float64)
    denominator = np.asarray(denominator, dtype=np.float64)
    zero_denominator = denominator == 0
    safe_denominator = np.where(zero_denominator, 1.0, denominator)
    quotient = numerator / safe_denominator
    return np.where(zero_denominator, np.where(numerator == 0, 0.0, np.nan), quotient)


def sharpe_ratio(returns: object, axis: int = -1) -> np.ndarray | float:
    """Per-period Sharpe ratio mean/std (sample std, ddof=1, risk-free 0), NOT annualised.

    Constant series: 0 if all returns are zero, NaN otherwise. Fewer than 2 observations: NaN.
    Works along ``axis`` so it can be evaluated on a whole matrix of bootstrap resamples at once.
    """
    x = np.asarray(returns, dtype=np.float64)
    if x.shape[axis] < 2:
        return _scalar_or_array(np.full(np.delete(x.shape, axis if axis >= 0 else x.ndim + axis), np.nan))
    mean = x.mean(axis=axis)
    std = x.std(axis=axis, ddof=1)
    rms = np.sqrt(np.mean(x * x, axis=axis))
    is_constant = std <= _CONSTANT_RELATIVE_STD * rms
    sharpe = np.where(is_constant, np.where(rms == 0, 0.0, np.nan), ratio_or_convention(mean, std))
    return _scalar_or_array(sharpe)


def probabilistic_sharpe_from_moments(
    sharpe: float, n_obs: int, sr_benchmark: float = 0.0, skewness: float = 0.0, raw_kurtosis: float = 3.0
) -> float:
    """PSR from summary moments: Φ((SR − SR*)·√(n−1) / √(1 − γ₃·SR + (γ₄ − 1)/4·SR²)).

    ``sharpe`` and ``sr_benchmark`` are per period; ``raw_kurtosis`` is non-excess (normal = 3). The defaults
    assume normal returns, for when only a Sharpe and a sample length are known. NaN when n < 3 or undefined.
    """
    if n_obs < 3 or not all(map(math.isfinite, (sharpe, sr_benchmark, skewness, raw_kurtosis))):
        return math.nan
    variance_factor = 1.0 - skewness * sharpe + (raw_kurtosis - 1.0) / 4.0 * sharpe**2
    if variance_factor <= 0:
        # Only reachable in degenerate two-point distributions (kurtosis = 1 + skew²): no usable estimate.
        return math.nan
    z_score = (sharpe - sr_benchmark) * math.sqrt(n_obs - 1) / math.sqrt(variance_factor)
    return float(_normal_cdf(z_score))


def probabilistic_sharpe_ratio(returns: object, sr_benchmark: float = 0.0) -> float:
    """Probability that the true per-period Sharpe exceeds ``sr_benchmark`` (Bailey & López de Prado 2012).

    Uses the sample Sharpe (ddof=1), the moment skewness and the RAW (non-excess, normal = 3) kurtosis of
    ``returns``. ``sr_benchmark`` is in the same per-period units as ``returns`` (daily for daily returns).
    NaN for fewer than 3 observations or a constant series (the sampling variance is undefined).
    """
    x = _as_1d_finite(returns, "returns")
    n = x.size
    if n < 3:
        return math.nan
    sharpe = sharpe_ratio(x)
    centered = x - x.mean()
    second_moment = float(np.mean(centered**2))
    if not np.isfinite(sharpe) or second_moment <= _CONSTANT_RELATIVE_STD**2 * float(np.mean(x * x)):
        return math.nan
    skewness = float(np.mean(centered**3)) / second_moment**1.5
    raw_kurtosis = float(np.mean(centered**4)) / second_moment**2
    return probabilistic_sharpe_from_moments(float(sharpe), n, sr_benchmark, skewness, raw_kurtosis)


def expected_max_sharpe(n_trials: int, trials_sr_variance: float) -> float:
    """Expected maximum of ``n_trials`` Sharpe estimates with zero true Sharpe (Bailey & López de Prado 2014).

    E[max] ≈ √V · ((1 − γ) Φ⁻¹(1 − 1/N) + γ Φ⁻¹(1 − 1/(N·e))), γ = Euler–Mascheroni. 0 when N = 1 or V = 0.
    ``trials_sr_variance`` must be in per-period (daily) Sharpe units squared.
    """
    if isinstance(n_trials, bool) or not float(n_trials).is_integer() or n_trials < 1:
        raise StatsInputError(f"n_trials: expected an integer ≥ 1, got {n_trials!r}")
    if not np.isfinite(trials_sr_variance) or trials_sr_variance < 0:
        raise StatsInputError(f"trials_sr_variance: expected a finite value ≥ 0, got {trials_sr_variance!r}")
    n_trials = int(n_trials)
    if n_trials == 1 or trials_sr_variance == 0:
        return 0.0
    gamma = np.euler_gamma
    quantile_term = (1.0 - gamma) * _normal_ppf(1.0 - 1.0 / n_trials) + gamma * _normal_ppf(
        1.0 - 1.0 / (n_trials * math.e)
    )
    return float(math.sqrt(trials_sr_variance) * quantile_term)


def deflated_sharpe_ratio(returns: object, n_trials: int, trials_sr_variance: float) -> float:
    """PSR against the Sharpe expected from the best of ``n_trials`` skill-less trials (selection-bias aware).

    ``trials_sr_variance``: variance across trials of their per-period (daily, non-annualised) Sharpe ratios;
    divide annualised trial Sharpes by ``ANNUALIZER`` first. N = 1 gives PSR vs 0.
    """
    return probabilistic_sharpe_ratio(returns, expected_max_sharpe(n_trials, trials_sr_variance))


def _autocovariances(centered: np.ndarray, max_lag: int) -> np.ndarray:
    n = centered.size
    return np.array([np.dot(centered[: n - lag], centered[lag:]) / n for lag in range(max_lag + 1)])


def _flat_top_window(t: np.ndarray) -> np.ndarray:
    t = np.abs(t)
    return np.where(t <= 0.5, 1.0, np.where(t <= 1.0, 2.0 * (1.0 - t), 0.0))


def optimal_mean_block(series: object) -> float:
    """Politis–White (2004, with the 2009 correction) automatic mean block length for the stationary bootstrap.

    Clamped to [1, min(3√n, n/3)]; 1 (i.i.d. resampling) for an uncorrelated or constant series.
    """
    x = _as_1d_finite(series, "series")
    n = x.size
    if n < 4:
        return 1.0
    centered = x - x.mean()
    significant_run = max(5, math.ceil(math.sqrt(math.log10(n))))
    max_lag = min(n - 1, math.ceil(math.sqrt(n)) + significant_run)
    autocov = _autocovariances(centered, max_lag)
    if autocov[0] <= 0:
        return 1.0
    autocorr = autocov / autocov[0]
    threshold = 2.0 * math.sqrt(math.log10(n) / n)
    insignificant = np.abs(autocorr[1:]) < threshold  # element j is lag j + 1
    # Smallest m after which `significant_run` consecutive autocorrelations are all insignificant.
    chosen_lag = max_lag - significant_run
    for m in range(0, max(0, max_lag - significant_run) + 1):
        if insignificant[m : m + significant_run].all():
            chosen_lag = m
            break
    bandwidth = min(2 * max(chosen_lag, 0), max_lag)
    if bandwidth == 0:
        return 1.0
    lags = np.arange(-bandwidth, bandwidth + 1)
    weights = _flat_top_window(lags / bandwidth)
    cov_at_lags = autocov[np.abs(lags)]
    g_hat = float(np.sum(weights * np.abs(lags) * cov_at_lags))
    spectral_zero = float(np.sum(weights * cov_at_lags))
    d_stationary = 2.0 * spectral_zero**2
    upper = max(1.0, min(3.0 * math.sqrt(n), n / 3.0))
    if d_stationary <= 0 or not np.isfinite(g_hat):
        return float(min(upper, max(1.0, n ** (1.0 / 3.0))))
    block = (2.0 * g_hat**2 / d_stationary) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return float(min(upper, max(1.0, block)))


def default_mean_block(*series: object) -> float:
    """Default mean block for Sharpe-type statistics: the largest Politis–White choice over each series and
    its square (a Sharpe depends on the mean and on the variance, so volatility clustering matters too)."""
    candidates = [1.0]
    for values in series:
        x = _as_1d_finite(values, "series")
        candidates += [optimal_mean_block(x), optimal_mean_block(x * x)]
    return max(candidates)


def stationary_bootstrap_indices(
    n: int, mean_block: float, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Index matrix [n_boot, n] of Politis–Romano stationary-bootstrap resamples of a length-n series.

    Each resample is a chain of blocks with geometric lengths (mean ``mean_block``), each starting at a
    uniform position and wrapping around the end of the series (circular). Built without a loop over resamples.
    """
    if n < 1 or n_boot < 1:
        raise StatsInputError(
            f"stationary_bootstrap_indices: expected n ≥ 1 and n_boot ≥ 1, got {n}, {n_boot}"
        )
    _check_block(mean_block)
    uniforms = rng.random((n_boot, n))
    origins = rng.integers(0, n, size=(n_boot, n))
    return _stationary_indices(uniforms, origins, mean_block)


def _check_block(mean_block: float) -> None:
    if not np.isfinite(mean_block) or mean_block < 1:
        raise StatsInputError(f"mean_block: expected a finite value ≥ 1, got {mean_block!r}")


def _stationary_indices(uniforms: np.ndarray, origins: np.ndarray, mean_block: float) -> np.ndarray:
    """Stationary-bootstrap indices from given uniforms (a block starts where u < 1/mean_block) and block
    origins [n_boot, n]. Sharing them across block lengths couples the resamples: a longer block's starts are a
    subset of a shorter one's and a block starting at the same day starts at the same origin, so resamples of
    different contrasts with different blocks still move together (the joint law a stepdown's max needs)."""
    n = uniforms.shape[1]
    positions = np.arange(n)
    starts_new_block = uniforms < 1.0 / mean_block
    starts_new_block[:, 0] = True
    block_first_position = np.where(starts_new_block, positions, 0)
    np.maximum.accumulate(block_first_position, axis=1, out=block_first_position)
    origin_of_block = np.take_along_axis(origins, block_first_position, axis=1)
    return (origin_of_block + (positions - block_first_position)) % n


def _percentile_interval(samples: np.ndarray, alpha: float) -> tuple[float, float]:
    finite = samples[np.isfinite(samples)]
    if finite.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(finite, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def _check_bootstrap_params(n_boot: int, alpha: float) -> None:
    if n_boot < 1:
        raise StatsInputError(f"n_boot: expected ≥ 1, got {n_boot}")
    if not 0 < alpha < 1:
        raise StatsInputError(f"alpha: expected 0 < alpha < 1, got {alpha}")


def _chunk_sizes(n_boot: int, n: int) -> list[int]:
    rows = max(1, _MAX_CHUNK_ELEMENTS // max(n, 1))
    return [min(rows, n_boot - start) for start in range(0, n_boot, rows)]


def stationary_bootstrap_ci(
    returns: object,
    statistic: StatisticFn = sharpe_ratio,
    n_boot: int = 2000,
    mean_block: float | None = None,
    alpha: float = 0.05,
    seed: int = 0,
) -> ConfidenceInterval:
    """Percentile CI of ``statistic`` under the stationary bootstrap of a (daily) return series.

    ``statistic(x, axis=-1)`` must reduce along the last axis (numpy style). ``mean_block=None`` uses
    :func:`default_mean_block`. Resamples whose statistic is NaN are ignored in the quantiles.
    """
    x = _as_1d_finite(returns, "returns")
    _check_bootstrap_params(n_boot, alpha)
    point = float(statistic(x, axis=-1))
    if x.size < 2:
        return ConfidenceInterval(point, math.nan, math.nan)
    block = default_mean_block(x) if mean_block is None else mean_block
    rng = np.random.default_rng(seed)
    boot = np.concatenate(
        [
            np.asarray(statistic(x[stationary_bootstrap_indices(x.size, block, rows, rng)], axis=-1))
            for rows in _chunk_sizes(n_boot, x.size)
        ]
    )
    return ConfidenceInterval(point, *_percentile_interval(boot, alpha))


def _iqm_weights(n: int) -> np.ndarray:
    # Sorted sample i owns the probability interval [i/n, (i+1)/n]; its weight is twice its overlap with
    # [1/4, 3/4], i.e. the integral of the empirical quantile function over the middle half.
    edges = np.arange(n + 1) / n
    overlap = np.clip(np.minimum(edges[1:], 0.75) - np.maximum(edges[:-1], 0.25), 0.0, None)
    return 2.0 * overlap


def interquartile_mean(x: object, axis: int = -1) -> np.ndarray | float:
    """Mean of the middle 50% of the values along ``axis``, with fractional weights at the quartile boundaries.

    Equals the mean of the middle n/2 sorted values when n is divisible by 4; otherwise the two boundary
    values contribute the fraction of their 1/n probability mass that falls inside [25%, 75%].
    """
    values = np.asarray(x, dtype=np.float64)
    if values.size == 0 or values.shape[axis] == 0:
        raise StatsInputError("interquartile_mean: expected at least one value")
    if not np.all(np.isfinite(values)):
        raise StatsInputError("interquartile_mean: expected finite values, found NaN or inf")
    ordered = np.moveaxis(np.sort(values, axis=axis), axis, -1)
    return _scalar_or_array(ordered @ _iqm_weights(ordered.shape[-1]))


def stratified_bootstrap_indices(
    n_seeds: int, n_tasks: int, n_boot: int, rng: np.random.Generator
) -> np.ndarray:
    """Seed indices [n_boot, n_seeds, n_tasks]: seeds drawn with replacement independently within each task."""
    if n_seeds < 1 or n_tasks < 1 or n_boot < 1:
        raise StatsInputError(
            f"stratified bootstrap: expected positive sizes, got {n_seeds}, {n_tasks}, {n_boot}"
        )
    return rng.integers(0, n_seeds, size=(n_boot, n_seeds, n_tasks))


def stratified_bootstrap_ci(
    scores: object,
    statistic: StatisticFn = interquartile_mean,
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> ConfidenceInterval:
    """rliable-style CI of an aggregate over runs: ``scores`` is [n_seeds, n_tasks] (tasks = folds).

    Each resample redraws the seeds with replacement separately within every task (fold), then applies
    ``statistic(x, axis=-1)`` to the pooled n_seeds × n_tasks scores. A 1-D input is one task.
    """
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim == 1:
        matrix = matrix[:, None]
    if matrix.ndim != 2 or matrix.size == 0:
        raise StatsInputError(f"scores: expected a [n_seeds, n_tasks] matrix, got shape {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise StatsInputError("scores: expected finite values for every (seed, fold), found NaN or inf")
    _check_bootstrap_params(n_boot, alpha)
    n_seeds, n_tasks = matrix.shape
    point = float(statistic(matrix.reshape(-1), axis=-1))
    rng = np.random.default_rng(seed)
    task_columns = np.arange(n_tasks)
    boot = []
    for rows in _chunk_sizes(n_boot, matrix.size):
        seed_indices = stratified_bootstrap_indices(n_seeds, n_tasks, rows, rng)
        resampled = matrix[seed_indices, task_columns]
        boot.append(np.asarray(statistic(resampled.reshape(rows, -1), axis=-1)))
    return ConfidenceInterval(point, *_percentile_interval(np.concatenate(boot), alpha))


# ------------------------------------------------------------------------------------ small-sample inference
# Percentile intervals under-cover badly at 9-20 days (docs/METRICS.md, "Coverage"). Everything below is a
# bootstrap-t (studentized) procedure: each resample's Sharpe contrast is divided by its own standard error,
# so the bootstrap calibrates the shape of the t-statistic instead of the raw spread of the estimate.


class SharpeContrasts(NamedTuple):
    """Linear combinations θ = W·SR of the per-period Sharpe ratios of aligned series, studentized."""

    estimate: np.ndarray  # θ̂ [k], per-period units
    standard_error: np.ndarray  # influence-function SE [k]; 0 for a contrast of constant series
    t_boot: np.ndarray  # bootstrap-t draws (θ* − θ̂) / max(se*, floor·se) [n_boot, k]
    mean_block: np.ndarray  # stationary-bootstrap mean block of each contrast [k]


class FamilyTest(NamedTuple):
    """Romano–Wolf stepdown over one-sided hypotheses θ_k ≤ 0."""

    t_stat: np.ndarray  # θ̂_k / se_k; −inf where untestable (se = 0 or undefined)
    p_adjusted: np.ndarray  # family-wise adjusted p-values (1 where untestable)
    reject: np.ndarray  # bool: θ_k > 0 claimed at family-wise level alpha
    first_step_critical: float  # (1 − alpha) quantile of max_k t*_k over all testable hypotheses


class IntersectionUnionTest(NamedTuple):
    """Romano–Wolf stepdown across groups on the intersection–union statistic "θ_k > 0 for every k of the
    group" (a model beats every baseline): per group the smallest t over its contrasts."""

    t_min: np.ndarray  # [n_groups] min_k t_k over the group; −inf where any contrast is untestable
    binding: np.ndarray  # [n_groups] contrast index attaining the min (−1 where untestable)
    p_adjusted: np.ndarray  # [n_groups] family-wise adjusted p-values across groups
    reject: np.ndarray  # [n_groups] bool: "every θ_k of the group > 0" claimed at family-wise level alpha
    first_step_critical: float  # (1 − alpha) quantile of the max over groups of the binding contrasts' t*


def _sharpe_and_influence(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sharpe along axis −2 of [..., n, S] and its influence values [..., n, S] (0 for a constant series).

    IF(r) = z − SR/2 · (z² − 1), z = (r − μ)/σ: the first-order effect of one observation on μ/σ. Its mean
    square over n gives the Lo (2002) / Mertens (2002) variance (1 + SR²/2 − γ₃·SR + (γ₄ − 3)/4·SR²) / n.
    """
    sharpe = np.asarray(sharpe_ratio(x, axis=-2))
    mean = x.mean(axis=-2, keepdims=True)
    std = x.std(axis=-2, ddof=1, keepdims=True)
    rms = np.sqrt(np.mean(x * x, axis=-2, keepdims=True))
    constant = std <= _CONSTANT_RELATIVE_STD * rms
    z = (x - mean) / np.where(constant, 1.0, std)
    influence = np.where(constant, 0.0, z - sharpe[..., None, :] / 2.0 * (z * z - 1.0))
    return sharpe, influence


def newey_west_lags(n: int) -> int:
    """Bartlett-kernel bandwidth ⌊4·(n/100)^(2/9)⌋ (Newey & West 1994), at least 1 and below n/2."""
    return max(1, min(int(4.0 * (n / 100.0) ** (2.0 / 9.0)), (n - 1) // 2))


def _contrast_and_se(x: np.ndarray, weights: np.ndarray, lags: int) -> tuple[np.ndarray, np.ndarray]:
    """Contrasts and their HAC standard errors: Bartlett-weighted autocovariances of the influence values.

    Never below the i.i.d. standard error: at 9-40 days negative sample autocovariances are mostly noise, and
    letting them shrink the SE produced false claims in the coverage simulation (docs/METRICS.md).
    """
    sharpe, influence = _sharpe_and_influence(x)
    n = x.shape[-2]
    u = influence @ weights.T  # [..., n, k]
    iid = np.sum(u * u, axis=-2)
    long_run = iid.copy()
    for lag in range(1, lags + 1):
        long_run += 2.0 * (1.0 - lag / (lags + 1.0)) * np.sum(u[..., lag:, :] * u[..., :-lag, :], axis=-2)
    se = np.sqrt(np.maximum(iid, long_run) / (n * (n - 1)))
    return sharpe @ weights.T, se


def contrast_estimates(returns: object, weights: object) -> tuple[np.ndarray, np.ndarray]:
    """θ̂ = W·SR and its HAC standard error for returns [..., n, S] and weights [k, S] (batched over leading axes).

    The same estimate and SE the bootstrap studentizes with (`sharpe_contrasts`), for simulations of the true
    sampling law of t = (θ̂ − θ)/ŝe.
    """
    x = np.asarray(returns, dtype=np.float64)
    return _contrast_and_se(
        x, np.atleast_2d(np.asarray(weights, dtype=np.float64)), newey_west_lags(x.shape[-2])
    )


def _studentized(diff: np.ndarray, se: np.ndarray) -> np.ndarray:
    # A resample whose contrast has zero spread (e.g. one day drawn n times) is a legitimate, extreme draw.
    with np.errstate(divide="ignore", invalid="ignore"):
        t = diff / se
    return np.where(se > 0, t, np.where(diff > 0, np.inf, np.where(diff < 0, -np.inf, 0.0)))


# Studentized resamples are divided by max(se*, floor · ŝe), ŝe the full-sample SE of the same contrast. A
# resample that draws few distinct days has a near-zero se* and an extreme t*; at 9 days those resamples made
# q0.999 of t* 32% heavier than the true statistic's without a floor. Chosen by measurement (docs/PERFORMANCE.md,
# "Bootstrap-t tails" and "Verdict size"): below SHORT_SAMPLE_DAYS the floor is 0.85 of ŝe (q0.95-q0.999 within 15%
# at 9 days); from there on 0.5, because on independent days no floor binds any more, while on autocorrelated
# days 0.85 lightened the tails further and doubled the false claims at 20 days (3.7% -> 6.7%).
SE_FLOOR = 0.5
SE_FLOOR_SHORT = 0.85
SHORT_SAMPLE_DAYS = 20


def se_floor_for(n_days: int) -> float:
    """The SE floor (a fraction of the full-sample SE) of a bootstrap over `n_days` observations."""
    return SE_FLOOR_SHORT if n_days < SHORT_SAMPLE_DAYS else SE_FLOOR


# Per-contrast blocks are rounded to this geometric grid (log2 steps of 1/2) so that contrasts share resamples.
_BLOCK_GRID_STEP = 0.5


def contrast_mean_blocks(returns: object, weights: object) -> np.ndarray:
    """Politis–White mean block of each contrast, from that contrast's own influence series u_k = IF·w_k.

    u_k is the first-order expansion of θ̂_k in the observations (means and variances of the series it
    weights), so its dependence is the dependence the bootstrap must keep for θ_k, and nothing more: a contrast
    is not handed the longest block of every other series of the matrix. Rounded to the nearest point of the
    grid 2^(j/2), j = 0, 1, … (1, 1.41, 2, 2.83, …).
    """
    x = np.asarray(returns, dtype=np.float64)
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    _, influence = _sharpe_and_influence(x)
    u = influence @ w.T
    blocks = np.array([optimal_mean_block(u[:, k]) for k in range(w.shape[0])])
    steps = np.round(np.log2(blocks) / _BLOCK_GRID_STEP)
    return np.maximum(1.0, 2.0 ** (steps * _BLOCK_GRID_STEP))


def sharpe_contrasts(
    returns: object,
    weights: object,
    n_boot: int = 2000,
    mean_block: float | None = None,
    seed: int = 0,
    se_floor: float | None = None,
) -> SharpeContrasts:
    """Studentized stationary bootstrap of linear Sharpe contrasts of aligned series ``returns`` [n, S].

    ``weights`` [k, S]: row k defines θ_k = Σ_s W_ks·SR_s (e.g. [1, −1] for a difference, [1/S…] for a mean).
    ``mean_block=None`` gives each contrast its own block (:func:`contrast_mean_blocks`); contrasts with
    different blocks are resampled from shared uniforms (coupled), and every series of a contrast with the same
    day indices, so cross-correlations are kept. ``se_floor``: see :data:`SE_FLOOR` (None: :func:`se_floor_for` the
    number of days). NaN estimates (undefined
    Sharpes) give se = NaN. Needs n ≥ 3 days.
    """
    x = np.asarray(returns, dtype=np.float64)
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    if x.ndim != 2 or w.ndim != 2 or w.shape[1] != x.shape[1]:
        raise StatsInputError(
            f"sharpe_contrasts: expected returns [n, S] and weights [k, S], got {x.shape}, {w.shape}"
        )
    if x.shape[0] < 3:
        raise StatsInputError(f"sharpe_contrasts: expected at least 3 observations, got {x.shape[0]}")
    if not np.all(np.isfinite(x)) or not np.all(np.isfinite(w)):
        raise StatsInputError("sharpe_contrasts: expected finite returns and weights")
    if se_floor is None:
        se_floor = se_floor_for(x.shape[0])
    if not 0 <= se_floor <= 1:
        raise StatsInputError(f"se_floor: expected a fraction in [0, 1], got {se_floor!r}")
    _check_bootstrap_params(n_boot, 0.05)
    n = x.shape[0]
    if mean_block is None:
        blocks = contrast_mean_blocks(x, w)
    else:
        _check_block(mean_block)
        blocks = np.full(w.shape[0], float(mean_block))
    lags = newey_west_lags(n)
    estimate, se = _contrast_and_se(x, w, lags)
    floor = se_floor * np.where(np.isfinite(se), se, 0.0)
    groups = []  # (contrast rows, the series they use [n, c], their weights [rows, c], block)
    for block in np.unique(blocks):
        rows = np.flatnonzero(blocks == block)
        columns = np.flatnonzero(np.any(w[rows] != 0, axis=0))
        if columns.size == 0:
            columns = np.array([0])
        groups.append((rows, x[:, columns], w[np.ix_(rows, columns)], float(block)))
    rng = np.random.default_rng(seed)
    t_boot = np.empty((n_boot, w.shape[0]))
    widest = max(g[1].shape[1] for g in groups)
    rows_per_chunk = max(1, _MAX_CHUNK_ELEMENTS // (n * widest))
    for start in range(0, n_boot, rows_per_chunk):
        count = min(rows_per_chunk, n_boot - start)
        uniforms = rng.random((count, n))
        origins = rng.integers(0, n, size=(count, n))
        for rows, series, group_weights, block in groups:
            indices = _stationary_indices(uniforms, origins, block)
            boot_estimate, boot_se = _contrast_and_se(series[indices], group_weights, lags)
            boot_se = np.maximum(boot_se, floor[rows])
            t_boot[start : start + count, rows] = _studentized(boot_estimate - estimate[rows], boot_se)
    return SharpeContrasts(estimate, se, t_boot, blocks)


def _testable(contrasts: SharpeContrasts) -> np.ndarray:
    return (
        np.isfinite(contrasts.estimate)
        & np.isfinite(contrasts.standard_error)
        & (contrasts.standard_error > 0)
    )


def bootstrap_t_intervals(contrasts: SharpeContrasts, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided (1 − alpha) bootstrap-t intervals [θ̂ − q_{1−α/2}·se, θ̂ − q_{α/2}·se] per contrast.

    NaN where the interval is degenerate (se = 0 or undefined): a zero-width interval is no evidence.
    Quantiles are taken conservatively (outward), which also handles the ±inf draws of zero-spread resamples.
    """
    testable = _testable(contrasts)
    lo = np.full(contrasts.estimate.shape, np.nan)
    hi = np.full(contrasts.estimate.shape, np.nan)
    for k in np.flatnonzero(testable):
        draws = contrasts.t_boot[:, k]
        draws = draws[~np.isnan(draws)]
        q_hi = np.quantile(draws, 1.0 - alpha / 2.0, method="higher")
        q_lo = np.quantile(draws, alpha / 2.0, method="lower")
        lo[k] = contrasts.estimate[k] - q_hi * contrasts.standard_error[k]
        hi[k] = contrasts.estimate[k] - q_lo * contrasts.standard_error[k]
    return np.where(np.isfinite(lo), lo, np.nan), np.where(np.isfinite(hi), hi, np.nan)


def studentized_sharpe_ci(
    returns: object, n_boot: int = 2000, mean_block: float | None = None, alpha: float = 0.05, seed: int = 0
) -> ConfidenceInterval:
    """Bootstrap-t CI of one per-period Sharpe ratio (NaN bounds below 3 observations or for no spread)."""
    x = _as_1d_finite(returns, "returns")
    point = float(sharpe_ratio(x)) if x.size >= 2 else math.nan
    if x.size < 3:
        return ConfidenceInterval(point, math.nan, math.nan)
    contrasts = sharpe_contrasts(x[:, None], [[1.0]], n_boot, mean_block, seed)
    lo, hi = bootstrap_t_intervals(contrasts, alpha)
    return ConfidenceInterval(point, float(lo[0]), float(hi[0]))


def romano_wolf_stepdown(t_stat: object, t_boot: object, alpha: float = 0.05) -> FamilyTest:
    """Romano & Wolf (2005) stepdown for one-sided hypotheses θ_k ≤ 0 from studentized bootstrap draws.

    ``t_boot`` [n_boot, k] are centred draws (θ*_k − θ̂_k)/se*_k from ONE joint resampling of all hypotheses.
    Ordered by decreasing t, p_(j) = max(p_(j−1), (1 + #{b: max_{i ≥ j} t*_{b,(i)} ≥ t_(j)}) / (n_boot + 1)):
    the max is over the hypotheses not yet rejected, which is what makes the stepdown more powerful than the
    single-step max-t while keeping the family-wise error rate at ``alpha``. Non-finite t are untestable.
    """
    t = np.asarray(t_stat, dtype=np.float64)
    boot = np.asarray(t_boot, dtype=np.float64)
    if boot.ndim != 2 or boot.shape[1] != t.size:
        raise StatsInputError(f"romano_wolf_stepdown: expected t_boot [n_boot, {t.size}], got {boot.shape}")
    if not 0 < alpha < 1:
        raise StatsInputError(f"alpha: expected 0 < alpha < 1, got {alpha}")
    testable = np.isfinite(t)
    boot = np.where(np.isnan(boot) | ~testable, -np.inf, boot)
    p_adjusted = np.ones(t.size)
    critical = math.nan
    order = [k for k in np.argsort(-np.where(testable, t, -np.inf), kind="stable") if testable[k]]
    if order:
        # Running max from the least significant hypothesis upwards: column j = max over order[j:].
        ordered = boot[:, order]
        tail_max = np.maximum.accumulate(ordered[:, ::-1], axis=1)[:, ::-1]
        exceed = (tail_max >= t[order]).sum(axis=0)
        p_raw = (1.0 + exceed) / (boot.shape[0] + 1.0)
        p_adjusted[order] = np.maximum.accumulate(p_raw)
        critical = float(np.quantile(tail_max[:, 0], 1.0 - alpha, method="higher"))
    t_out = np.where(testable, t, -np.inf)
    return FamilyTest(t_out, p_adjusted, testable & (p_adjusted <= alpha), critical)


def familywise_test(contrasts: SharpeContrasts, alpha: float = 0.05) -> FamilyTest:
    """Romano–Wolf stepdown on every contrast of ``contrasts`` (each a one-sided 'θ_k > 0' claim)."""
    testable = _testable(contrasts)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(testable, contrasts.estimate / contrasts.standard_error, np.nan)
    return romano_wolf_stepdown(t, contrasts.t_boot, alpha)


def intersection_union_stepdown(
    contrasts: SharpeContrasts, groups: object, alpha: float = 0.05
) -> IntersectionUnionTest:
    """Which groups have θ_k > 0 for *every* contrast k of the group, at family-wise level ``alpha`` across groups.

    Per group g the null is the union "θ_k ≤ 0 for some k ∈ g" and the statistic is T_g = min_k t_k (Berger
    1982: an intersection–union test needs no correction within the group; each comparison at level α controls
    the claim). Across groups, a Romano–Wolf (2005) stepdown on T_g. Its null draws for group g are the t* of the
    binding contrast k̂_g = argmin_k t_k: under the least favourable null one θ_k = 0 and the others are far
    positive, and there T_g ≈ t_k; where several θ_k are 0 the min is smaller still, so the test is
    conservative there. (The min of the t* of every contrast would be anti-conservative.) ``groups``: a sequence
    of sequences of contrast indices. A group with an untestable contrast is untestable (never claimed).
    """
    group_rows = [np.asarray(g, dtype=int) for g in groups]  # type: ignore[union-attr]
    testable = _testable(contrasts)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(testable, contrasts.estimate / contrasts.standard_error, np.nan)
    t_min = np.full(len(group_rows), -np.inf)
    binding = np.full(len(group_rows), -1)
    draws = np.full((contrasts.t_boot.shape[0], len(group_rows)), -np.inf)
    for g, rows in enumerate(group_rows):
        if rows.size == 0 or not testable[rows].all():
            continue
        k = int(rows[np.argmin(t[rows])])
        t_min[g], binding[g], draws[:, g] = t[k], k, contrasts.t_boot[:, k]
    family = romano_wolf_stepdown(t_min, draws, alpha)
    return IntersectionUnionTest(
        family.t_stat, binding, family.p_adjusted, family.reject, family.first_step_critical
    )


def intersection_union_detectable(
    contrasts: SharpeContrasts, rows: object, critical: float, power: float = 0.8
) -> float:
    """Smallest common per-period edge δ (θ_k = δ for every contrast k of ``rows``) that the intersection–union
    claim "every t_k > critical" detects with probability ``power``, from the same bootstrap draws.

    Under θ_k = δ, t_k ≈ δ/se_k + τ_k with τ the studentized null draws (local alternatives), so draw b passes
    iff δ > δ_b = max_k (critical − τ*_bk)·se_k, and the power at δ is the share of draws with δ_b < δ: the
    answer is the ``power`` quantile of δ_b (exact given the draws; no normal approximation, the correlation of
    the comparisons and the heavier small-sample tails included). NaN if a contrast is untestable.
    """
    indices = np.asarray(rows, dtype=int)
    if indices.size == 0 or not _testable(contrasts)[indices].all() or not math.isfinite(critical):
        return math.nan
    if not 0 < power < 1:
        raise StatsInputError(f"power: expected 0 < power < 1, got {power}")
    tau = np.where(np.isnan(contrasts.t_boot[:, indices]), -np.inf, contrasts.t_boot[:, indices])
    thresholds = np.max((critical - tau) * contrasts.standard_error[indices], axis=1)
    value = float(np.quantile(thresholds, power, method="higher"))
    return max(0.0, value) if math.isfinite(value) else math.nan


def minimum_detectable_sharpe_difference(
    n_obs: int, critical: float, power: float = 0.8, standard_error: float | None = None
) -> float:
    """Smallest per-period Sharpe difference a one-sided test at ``critical`` detects with ``power``.

    MDE = (c + Φ⁻¹(power)) · SE. Default SE = √(2/n): two uncorrelated zero-Sharpe normal series, each with the
    Lo (2002) variance (1 + SR²/2)/n at SR = 0. NaN below 2 observations or for an undefined critical value.
    """
    if n_obs < 2 or not math.isfinite(critical) or not 0 < power < 1:
        return math.nan
    se = math.sqrt(2.0 / n_obs) if standard_error is None else float(standard_error)
    return float((critical + _normal_ppf(power)) * se) if math.isfinite(se) else math.nan


def bonferroni_critical(n_hypotheses: int, alpha: float = 0.05) -> float:
    """One-sided normal critical value Φ⁻¹(1 − alpha/m): an upper bound on the Romano–Wolf first step."""
    return float(_normal_ppf(1.0 - alpha / max(1, n_hypotheses)))
