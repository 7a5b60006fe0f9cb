"""Honest statistics for strategy returns: PSR/DSR, stationary bootstrap CIs and rliable-style seed aggregation
(the verdict's small-sample inference builds on them in `marketrl.scoring.inference`).

All Sharpe ratios here are *per period* (daily when fed daily returns) and never annualised unless a function
says so; see docs/METRICS.md for formulas, conventions and references.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

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
