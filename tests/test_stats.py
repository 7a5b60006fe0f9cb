"""PSR/DSR, stationary and stratified bootstraps, IQM: checked against hand formulas and simulations."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy import stats as scipy_stats

from marketrl.calendars.annual import ANNUALIZER, SESSIONS_PER_YEAR
from marketrl.scoring.inference import (
    SE_FLOOR,
    SE_FLOOR_SHORT,
    SHORT_SAMPLE_DAYS,
    SharpeContrasts,
    ar1_block_floors,
    bonferroni_critical,
    bootstrap_t_intervals,
    contrast_mean_blocks,
    familywise_test,
    intersection_union_detectable,
    intersection_union_stepdown,
    minimum_detectable_sharpe_difference,
    romano_wolf_stepdown,
    se_floor_for,
    sharpe_contrasts,
    studentized_sharpe_ci,
)
from marketrl.scoring.stats import (
    StatsInputError,
    default_mean_block,
    deflated_sharpe_ratio,
    expected_max_sharpe,
    interquartile_mean,
    is_finite_number,
    optimal_mean_block,
    probabilistic_sharpe_from_moments,
    probabilistic_sharpe_ratio,
    sharpe_ratio,
    stationary_bootstrap_ci,
    stationary_bootstrap_indices,
    stratified_bootstrap_ci,
    stratified_bootstrap_indices,
)

SAMPLE = [0.02, -0.01, 0.03, 0.005, -0.015, 0.01, 0.025, -0.005, 0.04, -0.03]


def ar1_series(n: int, phi: float, mean: float, rng: np.random.Generator) -> np.ndarray:
    """Stationary Gaussian AR(1) with unit innovations, after a burn-in."""
    shocks = rng.normal(size=n + 100)
    y = np.zeros(n + 100)
    for t in range(1, n + 100):
        y[t] = phi * y[t - 1] + shocks[t]
    return mean + y[100:]


def test_sharpe_ratio_conventions():
    assert sharpe_ratio(SAMPLE) == pytest.approx(
        statistics.mean(SAMPLE) / statistics.stdev(SAMPLE), rel=1e-12
    )
    assert sharpe_ratio([0.0] * 5) == 0.0
    assert math.isnan(sharpe_ratio([0.01] * 7))  # zero risk with a non-zero mean: undefined, not inf
    assert math.isnan(sharpe_ratio([0.01]))
    matrix = np.array([SAMPLE, SAMPLE[::-1], [0.0] * len(SAMPLE)])
    np.testing.assert_allclose(sharpe_ratio(matrix), [sharpe_ratio(SAMPLE)] * 2 + [0.0], rtol=1e-12)


def test_annualizer_and_finite_number_check():
    assert ANNUALIZER == pytest.approx(math.sqrt(252)) and SESSIONS_PER_YEAR == 252
    assert all(is_finite_number(x) for x in (0, -3, 1.5, np.float32(2.0), np.int64(7)))
    assert not any(
        is_finite_number(x) for x in (True, None, "1", math.nan, -math.inf, np.float64("nan"), [1])
    )


def test_psr_matches_hand_formula():
    n = len(SAMPLE)
    sr = statistics.mean(SAMPLE) / statistics.stdev(SAMPLE)
    skew = scipy_stats.skew(SAMPLE, bias=True)
    raw_kurtosis = scipy_stats.kurtosis(SAMPLE, fisher=False, bias=True)
    for benchmark in (0.0, 0.1, -0.2):
        z = (sr - benchmark) * math.sqrt(n - 1) / math.sqrt(1 - skew * sr + (raw_kurtosis - 1) / 4 * sr**2)
        expected = 0.5 * (1 + math.erf(z / math.sqrt(2)))
        assert probabilistic_sharpe_ratio(SAMPLE, benchmark) == pytest.approx(expected, rel=1e-12)
    assert probabilistic_sharpe_ratio(SAMPLE, sr) == pytest.approx(0.5)


def test_psr_undefined_for_constant_or_tiny_series():
    assert math.isnan(probabilistic_sharpe_ratio([0.0] * 20))
    assert math.isnan(probabilistic_sharpe_ratio([0.01, 0.02]))


def test_expected_max_sharpe_close_to_exact_order_statistic():
    # Exact E[max of N standard normals] by quadrature; the closed form is within 2.5% for N ≥ 10.
    for n_trials in (10, 100, 1000):
        exact, _ = integrate.quad(
            lambda x, n=n_trials: x * n * scipy_stats.norm.pdf(x) * scipy_stats.norm.cdf(x) ** (n - 1),
            -10,
            10,
        )
        assert expected_max_sharpe(n_trials, 0.04) == pytest.approx(0.2 * exact, rel=0.03)


def test_dsr_equals_psr_at_one_trial_and_decreases_with_trials():
    rng = np.random.default_rng(7)
    noise = rng.normal(0.0, 1.0, size=500)
    returns = noise - noise.mean() + 0.12  # sample Sharpe ≈ 0.12 per day: PSR ≈ 0.99
    psr = probabilistic_sharpe_ratio(returns)
    assert deflated_sharpe_ratio(returns, 1, 0.01) == pytest.approx(psr)
    assert deflated_sharpe_ratio(returns, 50, 0.0) == pytest.approx(psr)
    dsr = [deflated_sharpe_ratio(returns, n, 0.003) for n in (1, 2, 5, 20, 100, 1000)]
    assert all(later < earlier for earlier, later in itertools.pairwise(dsr))
    assert dsr[-1] < 0.5 < psr


@pytest.mark.parametrize(("n_trials", "variance"), [(0, 0.01), (2.5, 0.01), (5, -0.1), (5, float("nan"))])
def test_dsr_rejects_bad_parameters(n_trials, variance):
    with pytest.raises(StatsInputError):
        deflated_sharpe_ratio(SAMPLE, n_trials, variance)


def test_stationary_bootstrap_indices_blocks_are_contiguous_with_requested_mean():
    n, mean_block = 1000, 10.0
    indices = stationary_bootstrap_indices(n, mean_block, 300, np.random.default_rng(1))
    assert indices.shape == (300, n) and indices.min() >= 0 and indices.max() < n
    breaks = indices[:, 1:] != (indices[:, :-1] + 1) % n
    # A block starts with probability 1/mean_block per position (a new block continuing by chance is 1/n).
    assert breaks.mean() == pytest.approx((1 / mean_block) * (1 - 1 / n), rel=0.03)
    block_counts = breaks.sum(axis=1) + 1
    complete_lengths = n / block_counts  # includes the truncated last block, so slightly below mean_block
    assert complete_lengths.mean() == pytest.approx(mean_block, rel=0.05)


def test_stationary_bootstrap_wraps_around_and_is_seeded():
    n = 5
    indices = stationary_bootstrap_indices(n, 50.0, 200, np.random.default_rng(3))
    successor = indices[:, 1:][indices[:, :-1] == n - 1]
    assert (successor == 0).mean() > 0.9  # within a block, the last element is followed by the first
    np.testing.assert_array_equal(
        indices, stationary_bootstrap_indices(n, 50.0, 200, np.random.default_rng(3))
    )
    iid = stationary_bootstrap_indices(50, 1.0, 400, np.random.default_rng(4))
    assert np.bincount(iid.ravel(), minlength=50).min() > 0.7 * iid.size / 50


def test_optimal_mean_block_grows_with_dependence():
    rng = np.random.default_rng(11)
    assert optimal_mean_block(rng.normal(size=1000)) <= 2.0
    weak = optimal_mean_block(ar1_series(1000, 0.3, 0.0, rng))
    strong = optimal_mean_block(ar1_series(1000, 0.8, 0.0, rng))
    assert 1.0 <= weak < strong <= 3 * math.sqrt(1000)
    assert optimal_mean_block(np.ones(100)) == 1.0
    assert default_mean_block(np.zeros(10)) == 1.0


def test_stationary_bootstrap_ci_covers_true_sharpe_of_ar1():
    phi, mean, n = 0.5, 0.15, 250
    true_sharpe = mean * math.sqrt(1 - phi**2)  # stationary std of the AR(1) is 1/√(1−φ²)
    rng = np.random.default_rng(2024)
    series = [ar1_series(n, phi, mean, rng) for _ in range(200)]
    auto = [stationary_bootstrap_ci(x, n_boot=400, seed=i) for i, x in enumerate(series)]
    iid = [stationary_bootstrap_ci(x, n_boot=400, mean_block=1.0, seed=i) for i, x in enumerate(series)]
    auto_coverage = np.mean([lo <= true_sharpe <= hi for _, lo, hi in auto])
    iid_coverage = np.mean([lo <= true_sharpe <= hi for _, lo, hi in iid])
    assert 0.80 <= auto_coverage <= 0.99
    assert iid_coverage < auto_coverage - 0.05  # ignoring dependence gives intervals that are too narrow


def test_stationary_bootstrap_ci_point_and_custom_statistic():
    rng = np.random.default_rng(5)
    returns = rng.normal(0.001, 0.01, size=300)
    point, lo, hi = stationary_bootstrap_ci(returns, statistic=np.mean, n_boot=500, mean_block=5.0, seed=1)
    assert point == pytest.approx(returns.mean())
    assert lo < point < hi
    assert stationary_bootstrap_ci(returns, n_boot=300, seed=9) == stationary_bootstrap_ci(
        returns, n_boot=300, seed=9
    )
    with pytest.raises(StatsInputError, match="finite"):
        stationary_bootstrap_ci([0.1, float("nan"), 0.2])


def test_interquartile_mean_known_values():
    assert interquartile_mean(np.arange(1, 9)) == pytest.approx(4.5)  # mean of 3, 4, 5, 6
    assert interquartile_mean([5, 1, 4, 2, 3]) == pytest.approx(0.3 * 2 + 0.4 * 3 + 0.3 * 4)
    # n = 6: weights 1/6, 1/3, 1/3, 1/6 on the 2nd..5th values (trim_mean would give 3.75).
    assert interquartile_mean([0, 1, 2, 4, 8, 16]) == pytest.approx(1 / 6 + 2 / 3 + 4 / 3 + 8 / 6)
    assert interquartile_mean([7.0]) == 7.0
    values = np.random.default_rng(0).normal(size=(3, 12))
    np.testing.assert_allclose(interquartile_mean(values), scipy_stats.trim_mean(values, 0.25, axis=1))
    with pytest.raises(StatsInputError):
        interquartile_mean([1.0, float("nan")])


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40), st.floats(-1e3, 1e3))
def test_interquartile_mean_properties(values, shift):
    iqm = interquartile_mean(values)
    assert min(values) - 1e-6 <= iqm <= max(values) + 1e-6
    assert interquartile_mean(values[::-1]) == pytest.approx(iqm, abs=1e-6)
    assert interquartile_mean(np.asarray(values) + shift) == pytest.approx(iqm + shift, abs=1e-5)


def test_stratified_bootstrap_keeps_seeds_within_their_fold():
    n_seeds, n_tasks = 5, 3
    scores = np.arange(n_seeds)[:, None] * 0.1 + 100.0 * np.arange(n_tasks)[None, :]
    seen = []

    def recording_mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
        seen.append(np.array(x))
        return np.mean(x, axis=axis)

    point, lo, hi = stratified_bootstrap_ci(scores, statistic=recording_mean, n_boot=200, seed=0)
    assert point == pytest.approx(scores.mean())
    resampled = seen[-1].reshape(-1, n_seeds, n_tasks)
    task_of_value = np.floor(resampled / 100.0 + 1e-9)
    np.testing.assert_array_equal(task_of_value, np.broadcast_to(np.arange(n_tasks), resampled.shape))
    # Seeds are redrawn independently per fold, not as whole rows.
    seed_of_value = np.round((resampled - 100.0 * np.arange(n_tasks)) / 0.1)
    assert (seed_of_value[:, :, 0] != seed_of_value[:, :, 1]).any()
    assert lo < point < hi


def test_stratified_bootstrap_degenerate_cases():
    one_seed = stratified_bootstrap_ci([[1.0, 2.0, 3.0]], n_boot=100, seed=0)
    assert one_seed.lo == one_seed.hi == one_seed.point
    constant_within_fold = np.tile([0.5, 1.5], (4, 1))
    ci = stratified_bootstrap_ci(constant_within_fold, n_boot=100, seed=0)
    assert ci.lo == pytest.approx(ci.point) and ci.hi == pytest.approx(ci.point)
    indices = stratified_bootstrap_indices(4, 3, 50, np.random.default_rng(0))
    assert indices.shape == (50, 4, 3) and indices.min() >= 0 and indices.max() < 4
    with pytest.raises(StatsInputError, match="finite"):
        stratified_bootstrap_ci([[1.0, float("nan")]])


# ------------------------------------------------------------------------- small-sample inference (bootstrap-t)


def test_influence_standard_error_matches_the_lo_mertens_formula():
    rng = np.random.default_rng(11)
    x = rng.standard_t(df=6, size=20_000) * 0.01 + 0.002
    contrasts = sharpe_contrasts(x[:, None], [[1.0]], n_boot=2, seed=0)
    sharpe = float(sharpe_ratio(x))
    skew, excess = scipy_stats.skew(x), scipy_stats.kurtosis(x)
    mertens = math.sqrt((1 + sharpe**2 / 2 - skew * sharpe + excess / 4 * sharpe**2) / x.size)
    assert contrasts.estimate[0] == pytest.approx(sharpe)
    # HAC never below the i.i.d. SE, and on i.i.d. data barely above it.
    assert mertens <= contrasts.standard_error[0] * 1.01
    assert contrasts.standard_error[0] == pytest.approx(mertens, rel=0.05)


def test_contrast_of_constant_series_is_degenerate_not_significant():
    flat = np.zeros(30)
    contrasts = sharpe_contrasts(np.column_stack([flat, flat]), [[1.0, -1.0]], n_boot=100, seed=1)
    assert contrasts.estimate[0] == 0.0 and contrasts.standard_error[0] == 0.0
    lo, hi = bootstrap_t_intervals(contrasts)
    assert np.isnan(lo[0]) and np.isnan(hi[0])  # a zero-width interval is never printed as evidence
    assert not familywise_test(contrasts).reject.any()
    ci = studentized_sharpe_ci(np.full(10, 0.01), n_boot=100)
    assert math.isnan(ci.lo) and math.isnan(ci.hi)
    for n in (1, 2):
        assert math.isnan(studentized_sharpe_ci(np.arange(n) * 0.01 + 0.01, n_boot=50).lo)
    with pytest.raises(StatsInputError, match="at least 3"):
        sharpe_contrasts(np.ones((2, 1)), [[1.0]])


@pytest.mark.parametrize("n_days", [9, 20])
def test_bootstrap_t_interval_covers_near_nominal_at_small_samples(n_days):
    """K = 80 seeded AR(1) worlds (phi 0.2): coverage of the 95% Sharpe interval stays near nominal where the
    percentile interval does not (docs/METRICS.md has the full table from bench/studies/coverage.py)."""
    phi, true_sharpe = 0.2, 0.1
    rng = np.random.default_rng(n_days)
    hits = []
    for k in range(80):
        x = ar1_series(n_days + 50, phi, 0.0, rng)[50:] * math.sqrt(1 - phi**2) + true_sharpe
        ci = studentized_sharpe_ci(x, n_boot=200, seed=k)
        hits.append(ci.lo <= true_sharpe <= ci.hi)
    assert 0.88 <= np.mean(hits) <= 1.0


def _stepdown_oracle(t, t_boot, alpha):
    """Romano–Wolf by its definition: repeat {critical value = (1−α) quantile of the max over the hypotheses
    still in play; reject every one above it} until nothing more is rejected. Written with plain loops."""
    active = [k for k in range(len(t)) if math.isfinite(t[k])]
    rejected = set()
    while active:
        maxima = [max(row[k] for k in active) for row in t_boot]
        newly = [k for k in active if (1 + sum(m >= t[k] for m in maxima)) / (len(maxima) + 1) <= alpha]
        if not newly:
            break
        rejected |= set(newly)
        active = [k for k in active if k not in rejected]
    return rejected


def _single_step(t, t_boot, alpha):
    maxima = t_boot.max(axis=1)
    return {k for k in range(len(t)) if (1 + np.sum(maxima >= t[k])) / (len(maxima) + 1) <= alpha}


def test_romano_wolf_matches_the_definition_and_contains_single_step_max_t():
    rng = np.random.default_rng(3)
    for trial in range(40):
        k = int(rng.integers(2, 9))
        t_boot = rng.standard_normal((300, k)) @ (np.eye(k) + 0.4 * rng.random((k, k)))
        t = rng.normal(1.5, 1.5, size=k)
        if trial % 5 == 0:
            t[0] = -np.inf  # untestable hypothesis (zero standard error)
        result = romano_wolf_stepdown(t, t_boot, 0.05)
        assert set(np.flatnonzero(result.reject)) == _stepdown_oracle(t, t_boot, 0.05)
        assert _single_step(np.where(np.isfinite(t), t, -np.inf), t_boot, 0.05) <= set(
            np.flatnonzero(result.reject)
        )
        assert np.all((result.p_adjusted >= 0) & (result.p_adjusted <= 1))
    with pytest.raises(StatsInputError, match="t_boot"):
        romano_wolf_stepdown(np.zeros(3), np.zeros((10, 2)))


def _family_weights(n_models: int, n_baselines: int) -> np.ndarray:
    rows = []
    for m in range(n_models):
        for b in range(n_baselines):
            row = np.zeros(n_models + n_baselines)
            row[m], row[n_models + b] = 1.0, -1.0
            rows += [row, -row]
    return np.array(rows)


def test_family_detects_one_huge_true_effect_and_nothing_else():
    rng = np.random.default_rng(8)
    x = rng.normal(0.0, 0.01, size=(40, 4))
    x[:, 0] += 0.012  # model 0: daily Sharpe ≈ 1.2 above everything else
    contrasts = sharpe_contrasts(x, _family_weights(2, 2), n_boot=400, seed=2)
    reject = familywise_test(contrasts).reject
    # rows: (model, baseline, direction) = (0,0,+), (0,0,−), (0,1,+), (0,1,−), (1,0,+), ...
    assert reject[0] and reject[2]
    assert not reject[[1, 3, 4, 5, 6, 7]].any()


def test_family_on_pure_noise_rejects_at_most_alpha():
    """K = 60 seeded no-edge worlds of 30 i.i.d. days, 2 models × 3 baselines × 2 directions: the share of
    worlds with any claim stays at the 5% level (binomial 3-sigma bound: 60 × 0.05 + 3·√(60·0.05·0.95))."""
    rng = np.random.default_rng(21)
    weights = _family_weights(2, 3)
    false_worlds = 0
    for k in range(60):
        contrasts = sharpe_contrasts(rng.normal(0.0, 0.01, size=(30, 5)), weights, n_boot=200, seed=k)
        false_worlds += bool(familywise_test(contrasts).reject.any())
    assert false_worlds <= 8


def _iut_oracle(t, t_boot, groups, alpha):
    """Intersection–union stepdown by its definition, with plain loops: each group's statistic is its smallest t
    and its null draws are those of the contrast attaining it; then Romano–Wolf across the groups."""
    stats, draws = [], []
    for rows in groups:
        k = min(rows, key=lambda r: t[r])
        stats.append(t[k])
        draws.append([row[k] for row in t_boot])
    return _stepdown_oracle(stats, np.array(draws).T, alpha)


def test_intersection_union_stepdown_matches_the_definition():
    rng = np.random.default_rng(12)
    for _ in range(30):
        n_groups, per_group = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        k = n_groups * per_group
        t_boot = rng.standard_normal((300, k)) @ (np.eye(k) + 0.3 * rng.random((k, k)))
        t = rng.normal(2.0, 1.5, size=k)
        contrasts = SharpeContrasts(t, np.ones(k), t_boot, np.ones(k))
        groups = [list(range(g * per_group, (g + 1) * per_group)) for g in range(n_groups)]
        result = intersection_union_stepdown(contrasts, groups, 0.05)
        assert set(np.flatnonzero(result.reject)) == _iut_oracle(t, t_boot, groups, 0.05)
        for g, rows in enumerate(groups):
            assert result.t_min[g] == pytest.approx(min(t[rows]))
            assert result.binding[g] == rows[int(np.argmin(t[rows]))]


def test_one_direction_repro_rejects_every_claim_the_mirrored_family_loses():
    """Issue 23's repro: t = [6, 6, 6, 6, 2] with independent null draws. In one direction the stepdown's last
    step tests 2 against one N(0, 1) (critical 1.64) and rejects all five; with the mirrored rows [W; −W] the
    last step still carries the five mirrored draws, so 2 is not rejected. The intersection–union claim "beats
    every baseline" over the five is rejected."""
    t_boot = np.random.default_rng(5).standard_normal((4000, 5))
    t = np.array([6.0, 6.0, 6.0, 6.0, 2.0])
    one_direction = romano_wolf_stepdown(t, t_boot, 0.05)
    assert one_direction.reject.all()
    mirrored = romano_wolf_stepdown(np.concatenate([t, -t]), np.hstack([t_boot, -t_boot]), 0.05)
    assert mirrored.reject[:4].all() and not mirrored.reject[4] and mirrored.p_adjusted[4] > 0.1
    beats_every = intersection_union_stepdown(SharpeContrasts(t, np.ones(5), t_boot, np.ones(5)), [range(5)])
    assert beats_every.reject[0] and beats_every.first_step_critical == pytest.approx(1.645, abs=0.08)


def test_each_contrast_gets_its_own_block():
    rng = np.random.default_rng(2)
    iid = rng.normal(size=(250, 2))
    persistent = np.column_stack([ar1_series(250, 0.8, 0.0, rng), ar1_series(250, 0.8, 0.0, rng)])
    x = np.hstack([iid, persistent]) * 0.01
    blocks = contrast_mean_blocks(x, [[1.0, -1.0, 0, 0], [0, 0, 1.0, -1.0]])
    # the AR(1) floor shrinks each pair's autocorrelation towards the pairs' mean only as far as noise explains
    # their spread: here they differ (0.09 vs 0.79), so the independent pair keeps a short block of its own
    assert blocks[0] <= 2.0 and blocks[1] >= 8.0
    assert default_mean_block(*x.T) >= 2.0  # the old choice handed the iid pair the persistent block
    contrasts = sharpe_contrasts(x, [[1.0, -1.0, 0, 0], [0, 0, 1.0, -1.0]], n_boot=50, seed=0)
    np.testing.assert_array_equal(contrasts.mean_block, blocks)


def test_ar1_block_floor_sees_shared_autocorrelation_that_one_short_contrast_cannot():
    rng = np.random.default_rng(5)
    n, k = 20, 40

    def influence(phi: float) -> np.ndarray:
        return np.column_stack([ar1_series(n, phi, 0.0, rng) for _ in range(k)])

    persistent, independent = influence(0.5), influence(0.0)
    # one contrast's own Politis–White choice mostly misses phi = 0.5 at 20 days ...
    assert np.mean([optimal_mean_block(persistent[:, j]) <= 1.5 for j in range(k)]) > 0.5
    # ... the contrasts measured on the same days see it together, and leave independent days alone
    assert np.all(ar1_block_floors(persistent) >= 2.0)
    assert np.all(ar1_block_floors(independent) <= 1.5)
    assert np.all(ar1_block_floors(np.zeros((n, 3))) == 1.0)


def test_se_floor_bounds_the_studentized_draws():
    x = np.random.default_rng(9).normal(0.001, 0.01, size=(9, 1))
    free = sharpe_contrasts(x, [[1.0]], n_boot=3000, seed=1, se_floor=0.0)
    floored = sharpe_contrasts(x, [[1.0]], n_boot=3000, seed=1, se_floor=0.5)
    tighter = sharpe_contrasts(x, [[1.0]], n_boot=3000, seed=1, se_floor=0.85)
    assert np.max(np.abs(tighter.t_boot)) < np.max(np.abs(floored.t_boot)) < np.max(np.abs(free.t_boot))
    # the default follows the number of days: 0.85 below SHORT_SAMPLE_DAYS, 0.5 from there on
    assert se_floor_for(9) == SE_FLOOR_SHORT == 0.85 and se_floor_for(SHORT_SAMPLE_DAYS) == SE_FLOOR == 0.5
    default = sharpe_contrasts(x, [[1.0]], n_boot=3000, seed=1)
    np.testing.assert_array_equal(default.t_boot, tighter.t_boot)
    long = np.random.default_rng(9).normal(0.001, 0.01, size=(SHORT_SAMPLE_DAYS, 1))
    np.testing.assert_array_equal(
        sharpe_contrasts(long, [[1.0]], n_boot=300, seed=1).t_boot,
        sharpe_contrasts(long, [[1.0]], n_boot=300, seed=1, se_floor=0.5).t_boot,
    )
    # |θ* − θ̂| / (0.5·ŝe) bounds every floored draw
    boot_shift = floored.t_boot[:, 0] * 0.0 + np.abs(free.t_boot[:, 0])
    assert np.all(np.abs(floored.t_boot[:, 0]) <= boot_shift + 1e-12)
    with pytest.raises(StatsInputError, match="se_floor"):
        sharpe_contrasts(x, [[1.0]], se_floor=2.0)


def _iut_world(rng: np.random.Generator, n: int, edge: float) -> np.ndarray:
    """2 models and 3 baselines (the second flat) of n i.i.d. days; model 0's daily Sharpe is ``edge``."""
    x = rng.normal(0.0, 1.0, size=(n, 5))
    x[:, 3] = 0.0
    x[:, 0] += edge
    return x * 0.01


IUT_WEIGHTS = np.array(
    [[1.0 if s == m else (-1.0 if s == 2 + b else 0.0) for s in range(5)] for m in range(2) for b in range(3)]
)


def test_intersection_union_detectable_edge_has_the_stated_power_in_simulation():
    """The edge the headline claim detects with 80% power, from the bootstrap draws, against K = 150 simulated
    worlds with that edge planted over every baseline (binomial sd at 0.8: 0.033)."""
    n, groups = 60, [[0, 1, 2], [3, 4, 5]]
    rng = np.random.default_rng(31)
    pilots = []
    for k in range(15):
        contrasts = sharpe_contrasts(_iut_world(rng, n, 0.0), IUT_WEIGHTS, n_boot=400, seed=k)
        critical = intersection_union_stepdown(contrasts, groups).first_step_critical
        pilots.append(intersection_union_detectable(contrasts, groups[0], critical, 0.8))
    edge = float(np.median(pilots))
    one_comparison = minimum_detectable_sharpe_difference(n, float(scipy_stats.norm.ppf(0.95)))
    assert edge > one_comparison  # the claim needs all three comparisons and the step over two models
    hits = []
    for k in range(150):
        contrasts = sharpe_contrasts(_iut_world(rng, n, edge), IUT_WEIGHTS, n_boot=300, seed=100 + k)
        hits.append(bool(intersection_union_stepdown(contrasts, groups).reject[0]))
    assert 0.68 <= np.mean(hits) <= 0.92


def test_unstudentized_stepdown_agrees_with_arch_stepm_and_spa():
    """Cross-check of the stepdown against arch 8 (`StepM`, `SPA`, unstudentized: arch's statistic is the max of
    mean loss differences). Same matrices, same stationary block; the resamples differ, so decisions are
    compared where the evidence is clear and the single-step p-value within Monte Carlo error."""
    arch_bootstrap = pytest.importorskip("arch.bootstrap")
    rng = np.random.default_rng(17)
    for trial in range(6):
        n = 200
        benchmark = rng.normal(0.0, 1.0, n)
        edges = np.array([0.7, 0.6, -0.3, -0.5]) if trial % 2 == 0 else np.array([0.6, 0.7, 0.5, 0.8])
        models = rng.normal(0.0, 1.0, (n, 4)) - edges  # losses: lower is better, edge = benchmark − model
        diff = benchmark[:, None] - models
        indices = stationary_bootstrap_indices(n, 2.0, 3000, np.random.default_rng(trial))
        means = diff.mean(axis=0)
        draws = diff[indices].mean(axis=1) - means
        ours = romano_wolf_stepdown(means, draws, 0.05)
        stepm = arch_bootstrap.StepM(
            benchmark, models, size=0.05, block_size=2, reps=3000, studentize=False, seed=trial
        )
        try:
            stepm.compute()
            selected = set(int(m) for m in stepm.superior_models)
        except (
            IndexError,
            ValueError,
            KeyError,
        ):  # arch issue #862: StepM can raise when every model is selected
            selected = set(range(4))
        assert set(np.flatnonzero(ours.reject)) == selected == set(np.flatnonzero(edges >= 0.5))
        # SPA's "upper" p-value (no recentring) is the single-step max p-value; near-null models keep it mid-range
        weak = models + edges - np.array([0.1, 0.0, -0.1, 0.05])
        weak_diff = benchmark[:, None] - weak
        weak_means = weak_diff.mean(axis=0)
        weak_draws = weak_diff[indices].mean(axis=1) - weak_means
        spa = arch_bootstrap.SPA(benchmark, weak, block_size=2, reps=3000, studentize=False, seed=trial)
        spa.compute()
        single_step = (1 + np.sum(weak_draws.max(axis=1) >= weak_means.max())) / (weak_draws.shape[0] + 1)
        assert single_step == pytest.approx(float(spa.pvalues["upper"]), abs=0.04)


def test_minimum_detectable_difference_formula():
    c = bonferroni_critical(8)
    assert c == pytest.approx(scipy_stats.norm.ppf(1 - 0.05 / 8))
    mde = minimum_detectable_sharpe_difference(40, c, power=0.8)
    assert mde == pytest.approx((c + scipy_stats.norm.ppf(0.8)) * math.sqrt(2 / 40))
    assert minimum_detectable_sharpe_difference(160, c) == pytest.approx(mde / 2)  # halves with 4× the days
    assert minimum_detectable_sharpe_difference(40, c, standard_error=0.1) == pytest.approx(
        (c + scipy_stats.norm.ppf(0.8)) * 0.1
    )
    assert math.isnan(minimum_detectable_sharpe_difference(1, c))


def test_psr_from_moments_agrees_with_psr_of_returns():
    rng = np.random.default_rng(4)
    x = rng.normal(0.001, 0.01, size=50)
    centered = x - x.mean()
    m2 = np.mean(centered**2)
    skew, kurt = np.mean(centered**3) / m2**1.5, np.mean(centered**4) / m2**2
    assert probabilistic_sharpe_from_moments(float(sharpe_ratio(x)), 50, 0.05, skew, kurt) == pytest.approx(
        probabilistic_sharpe_ratio(x, 0.05)
    )
    assert math.isnan(probabilistic_sharpe_from_moments(0.1, 2))
