"""Small-sample inference behind the report's verdict: studentized bootstrap-t intervals of Sharpe contrasts,
the Romano–Wolf stepdown family test, the intersection–union "beats every baseline" family and its detectable
edge, the minimum detectable Sharpe difference of one comparison.

Percentile intervals under-cover badly at 9-20 days (docs/METRICS.md, "Coverage"). Everything here is a
bootstrap-t (studentized) procedure: each resample's Sharpe contrast is divided by its own standard error, so the
bootstrap calibrates the shape of the t-statistic instead of the raw spread of the estimate. Sharpe ratios are per
period, as in `marketrl.scoring.stats`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from marketrl.scoring.stats import (
    _CONSTANT_RELATIVE_STD,
    _MAX_CHUNK_ELEMENTS,
    ConfidenceInterval,
    StatsInputError,
    _as_1d_finite,
    _check_block,
    _check_bootstrap_params,
    _normal_ppf,
    _stationary_indices,
    optimal_mean_block,
    sharpe_ratio,
)


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


def contrast_mean_blocks(returns: object, weights: object, pooled: object = None) -> np.ndarray:
    """Politis–White mean block of each contrast, from that contrast's own influence series u_k = IF·w_k.

    u_k is the first-order expansion of θ̂_k in the observations (means and variances of the series it
    weights), so its dependence is the dependence the bootstrap must keep for θ_k, and nothing more: a contrast
    is not handed the longest block of every other series of the matrix. Rounded to the nearest point of the
    grid 2^(j/2), j = 0, 1, … (1, 1.41, 2, 2.83, …). ``pooled``: the rows whose autocorrelations
    :func:`ar1_block_floors` pools (default all).
    """
    x = np.asarray(returns, dtype=np.float64)
    w = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    _, influence = _sharpe_and_influence(x)
    u = influence @ w.T
    blocks = np.array([optimal_mean_block(u[:, k]) for k in range(w.shape[0])])
    blocks = np.maximum(blocks, ar1_block_floors(u, pooled))
    steps = np.round(np.log2(blocks) / _BLOCK_GRID_STEP)
    return np.maximum(1.0, 2.0 ** (steps * _BLOCK_GRID_STEP))


def ar1_block_floors(series: object, pooled: object = None) -> np.ndarray:
    """Per column of ``series`` [n, k] (the contrasts' influence series) a floor on its mean block: the
    Politis–White block of an AR(1), (2ρ/(1 − ρ²))^(2/3)·n^(1/3), clamped like :func:`optimal_mean_block`, 1 where
    ρ is at most one sampling SD (≈ 1/√n), with ρ the column's lag-1 autocorrelation (Kendall's bias −(1 + 3ρ)/n
    removed) shrunk towards the columns' mean by the share of their spread that sampling noise does not explain.

    Why: at 20-40 days one contrast's own autocorrelation is too noisy for its Politis–White choice (threshold
    2·√(log10 n / n) ≈ 0.5 at 20 days), which then picks 1 under φ = 0.5 and the bootstrap drops the dependence.
    The contrasts of one report are measured on the same days: where they agree their pooled autocorrelation is
    precise enough to see φ = 0.5 and near 0 on independent days (blocks left at 1); where they truly differ the
    shrinkage keeps each its own. ``pooled`` [k] bool: the columns whose autocorrelations set the mean and the
    spread (default all; the verdict leaves out the low-information models', so they cannot move the others').
    """
    u = np.asarray(series, dtype=np.float64)
    if u.ndim != 2:
        raise StatsInputError(f"ar1_block_floors: expected a matrix [n, k], got shape {u.shape}")
    n, k = u.shape
    floors = np.ones(k)
    if n < 4:
        return floors
    centered = u - u.mean(axis=0)
    variance = np.sum(centered * centered, axis=0)
    usable = variance > 0
    if not usable.any():
        return floors
    lag1 = np.sum(centered[1:] * centered[:-1], axis=0)[usable] / variance[usable]
    rho = (n * lag1 + 1.0) / (n - 3.0)
    in_pool = np.ones(k, bool) if pooled is None else np.asarray(pooled, dtype=bool)
    if in_pool.shape != (k,):
        raise StatsInputError(f"ar1_block_floors: expected a pooled mask of {k} columns, got {in_pool.shape}")
    pool = rho[in_pool[usable]]
    if pool.size == 0:
        pool = rho
    noise = n / (n - 3.0) ** 2  # sampling variance of the corrected estimate under independence
    spread = float(np.var(pool, ddof=1)) if pool.size > 1 else 0.0
    signal = max(0.0, spread - noise)
    shrunk = pool.mean() + signal / (signal + noise) * (rho - pool.mean())
    # Only where the coefficient stands above one sampling SD of a single contrast's: below it the floor would
    # mostly lengthen independent days' blocks by chance (it cost the headline power 18 points at 20 days).
    shrunk = np.where(shrunk > math.sqrt(noise), np.minimum(shrunk, 0.9), 0.0)
    upper = max(1.0, min(3.0 * math.sqrt(n), n / 3.0))
    blocks = (2.0 * shrunk / (1.0 - shrunk * shrunk)) ** (2.0 / 3.0) * n ** (1.0 / 3.0)
    floors[usable] = np.clip(blocks, 1.0, upper)
    return floors


def sharpe_contrasts(
    returns: object,
    weights: object,
    n_boot: int = 2000,
    mean_block: float | None = None,
    seed: int = 0,
    se_floor: float | None = None,
    pooled: object = None,
) -> SharpeContrasts:
    """Studentized stationary bootstrap of linear Sharpe contrasts of aligned series ``returns`` [n, S].

    ``weights`` [k, S]: row k defines θ_k = Σ_s W_ks·SR_s (e.g. [1, −1] for a difference, [1/S…] for a mean).
    ``mean_block=None`` gives each contrast its own block (:func:`contrast_mean_blocks`); contrasts with different
    blocks are resampled from shared uniforms (coupled), and every series of a contrast with the same day indices,
    so cross-correlations are kept. ``se_floor``: see :data:`SE_FLOOR` (None: :func:`se_floor_for` the number of
    days). ``pooled``: the rows whose autocorrelations set the block floors (:func:`ar1_block_floors`; default
    all). NaN estimates (undefined Sharpes) give se = NaN. Needs n ≥ 3 days.
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
        blocks = contrast_mean_blocks(x, w, pooled)
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


def _binding_draws(contrasts: SharpeContrasts, groups: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: T_g = min_k t_k, the binding contrast's index and its null draws [n_boot, n_groups]
    (−inf, −1 and −inf draws for a group with an untestable contrast)."""
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
    return t_min, binding, draws


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
    t_min, binding, draws = _binding_draws(contrasts, groups)
    family = romano_wolf_stepdown(t_min, draws, alpha)
    return IntersectionUnionTest(
        family.t_stat, binding, family.p_adjusted, family.reject, family.first_step_critical
    )


class BalancedTest(NamedTuple):
    """Balanced (prepivoted, min-p) stepdown across groups on the intersection–union statistic: each group's T_g
    turned into a p-value by its own bootstrap null law, the stepdown on min-p over the groups still in play."""

    t_min: np.ndarray  # [n_groups] min_k t_k over the group; −inf where any contrast is untestable
    binding: np.ndarray  # [n_groups] contrast index attaining the min (−1 where untestable)
    p_raw: np.ndarray  # [n_groups] share of the group's own null draws ≥ T_g (1 where untestable)
    p_adjusted: np.ndarray  # [n_groups] family-wise adjusted p-values; NaN for a group left out of the family
    reject: np.ndarray  # [n_groups] bool: "every θ_k of the group > 0" claimed at family-wise level alpha
    in_family: np.ndarray  # [n_groups] bool: testable and eligible, so it enters the min-p and can be claimed
    level: float  # first step: each group's own p-value level (its marginal critical value's tail share)
    # [n_groups] t critical value at `level` from the group's own draws (NaN: untestable)
    critical: np.ndarray
    max_t_critical: float  # the max-t stepdown's first-step critical value over the same family (comparison)


def sidak_level(n_hypotheses: int, alpha: float = 0.05) -> float:
    """1 − (1 − alpha)^(1/m): the per-hypothesis level that holds the family-wise error at alpha for m
    independent tests (what a balanced stepdown gives each of m independent hypotheses at its first step)."""
    return 1.0 - (1.0 - alpha) ** (1.0 / max(1, n_hypotheses))


def balanced_critical(draws: object, level: float) -> float:
    """The t value a statistic with these null draws must exceed to have a bootstrap p-value (share of draws
    ≥ it) at most ``level``: the ⌊level·B⌋+1-th largest draw (−inf when every draw may exceed it)."""
    column = np.sort(np.where(np.isnan(np.asarray(draws, dtype=np.float64)), -np.inf, draws))[::-1]
    allowed = math.floor(level * column.size + 1e-9)
    return -math.inf if allowed >= column.size else float(column[max(0, allowed)])


def _survival(ordered: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Share of the (ascending) draws ``ordered`` that are ≥ each of ``values``."""
    return (ordered.size - np.searchsorted(ordered, values, side="left")) / ordered.size


def balanced_intersection_union_stepdown(
    contrasts: SharpeContrasts, groups: object, alpha: float = 0.05, eligible: object = None
) -> BalancedTest:
    """Which groups beat every contrast of the group, at family-wise level ``alpha`` across the eligible groups,
    with balanced control (Romano & Wolf 2010): each group's statistic T_g (the intersection–union min, as
    `intersection_union_stepdown`) is prepivoted into p_g = share of its own null draws ≥ T_g, each draw likewise
    (p*_{b,g}), and the Romano–Wolf stepdown runs on min-p: at each step the groups still in play are tested at the
    α quantile of min_g p*_{b,g} over them. Every group thus has the same chance of a false rejection, whatever the
    tails of its own t*, and a heavy-tailed group no longer sets everyone's critical value as it does under max-t.

    ``eligible`` (bool per group, default all): groups outside it are left out of the family (never claimed, not in
    the min-p); their ``critical`` is still given, at the family's first-step level, for display. With no testable
    eligible group the level is Šidák's over all groups (`sidak_level`)."""
    t_min, binding, draws = _binding_draws(contrasts, groups)
    n_groups, n_boot = t_min.size, draws.shape[0]
    if not 0 < alpha < 1:
        raise StatsInputError(f"alpha: expected 0 < alpha < 1, got {alpha}")
    mask = np.ones(n_groups, bool) if eligible is None else np.asarray(eligible, dtype=bool)
    if mask.shape != (n_groups,):
        raise StatsInputError(f"eligible: expected {n_groups} booleans, got shape {mask.shape}")
    testable = np.isfinite(t_min)
    in_family = testable & mask
    draws = np.where(np.isnan(draws), -np.inf, draws)
    ordered = np.sort(draws, axis=0)
    p_raw = np.ones(n_groups)
    null_p = np.ones((n_boot, n_groups))
    for g in np.flatnonzero(testable):
        p_raw[g] = float(_survival(ordered[:, g], np.array([t_min[g]]))[0])
        null_p[:, g] = _survival(ordered[:, g], draws[:, g])
    p_adjusted = np.full(n_groups, np.nan)
    reject = np.zeros(n_groups, bool)
    members = np.flatnonzero(in_family)
    max_t_critical = math.nan
    too_few_draws = False  # fewer than 1/alpha − 1 resamples: no p-value can reach the family's level
    if members.size:
        # min-p is max of 1 − p: the Romano–Wolf stepdown on the prepivoted statistics
        family = romano_wolf_stepdown(1.0 - p_raw[members], 1.0 - null_p[:, members], alpha)
        p_adjusted[members] = family.p_adjusted
        reject[members] = family.reject
        # first step: p_g is rejected iff (1 + #{b: min p*_b ≤ p_g}) / (B + 1) ≤ alpha
        min_p = np.sort(null_p[:, members].min(axis=1))
        allowed = math.floor(alpha * (n_boot + 1) + 1e-9) - 1
        too_few_draws = allowed < 0
        level = 1.0 if allowed >= n_boot else (0.0 if too_few_draws else float(min_p[allowed]) - 1.0 / n_boot)
        max_t_critical = float(np.quantile(draws[:, members].max(axis=1), 1.0 - alpha, method="higher"))
    else:
        level = sidak_level(n_groups, alpha)
    critical = np.full(n_groups, np.nan)
    for g in np.flatnonzero(testable):
        critical[g] = math.inf if too_few_draws else balanced_critical(draws[:, g], level)
    return BalancedTest(
        np.where(testable, t_min, -np.inf),
        binding,
        p_raw,
        p_adjusted,
        reject,
        in_family,
        max(0.0, level),
        critical,
        max_t_critical,
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
