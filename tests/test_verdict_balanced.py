"""The primary family's balanced (min-p) stepdown, the low-information rule and the headline figure (issue 37):
the stepdown against its definition, its family-wise error on simulated nulls with a quiet model, a quiet model not
raising the others' critical values (against the max-t stepdown on the same data), the headline as the median of
the models that trade, and the reference trader when every model stays flat."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from marketrl.report import build_report
from marketrl.scoring.inference import (
    SharpeContrasts,
    balanced_critical,
    balanced_intersection_union_stepdown,
    intersection_union_stepdown,
    sidak_level,
)
from marketrl.verdict.strategies import MIN_TRADING_SHARE, VerdictRules
from marketrl.verdict.verdicts import (
    MEASURED_LAYOUT,
    MEASURED_PROCEDURE,
    PROCEDURE,
    Comparison,
    family_result,
    headline_power_note,
    verdict_sentence,
)
from tests.report_fixtures import write_pipeline_outputs

ALPHA = 0.05


def test_the_balanced_stepdown_follows_its_definition() -> None:
    """p_g is the share of the group's own binding draws at or above T_g; the first step tests each group at the
    level where (1 + #{b: min_g p*_bg <= p}) / (B + 1) <= alpha; a group's critical value is the t at which its p
    reaches that level; the max-t comparison is the max-t stepdown's own first step."""
    rng = np.random.default_rng(0)
    n_boot, k = 999, 4
    # contrast 0..3, one per group; group 3's draws are heavy-tailed (the quiet model)
    t_boot = rng.normal(size=(n_boot, k))
    t_boot[:, 3] = rng.standard_t(1.5, size=n_boot)
    estimate = np.array([3.5, 2.6, 0.4, 4.0])
    contrasts = SharpeContrasts(estimate, np.ones(k), t_boot, np.ones(k))
    groups = [[0], [1], [2], [3]]
    test = balanced_intersection_union_stepdown(contrasts, groups, ALPHA)
    for g in range(k):
        assert test.p_raw[g] == pytest.approx(np.mean(t_boot[:, g] >= estimate[g]))
    null_p = np.stack([(t_boot[:, g][None, :] >= t_boot[:, g][:, None]).mean(axis=1) for g in range(k)], 1)
    min_p = null_p.min(axis=1)
    first = [g for g in range(k) if (1 + np.sum(min_p <= test.p_raw[g])) / (n_boot + 1) <= ALPHA]
    assert first, "the example must reject something at the first step"
    for g in range(k):
        assert (test.p_raw[g] <= test.level + 1e-12) == (g in first)
        assert (estimate[g] > test.critical[g]) == (g in first)
        assert test.critical[g] == balanced_critical(t_boot[:, g], test.level)
    # the adjusted p-values are the Romano–Wolf stepdown on the prepivoted statistics: every rejection has p <= alpha
    assert set(np.flatnonzero(test.reject)) >= set(first)
    assert np.all(test.p_adjusted[test.reject] <= ALPHA)
    # the heavy-tailed group has the largest critical value of its own, but the others are tested at the same level
    assert test.critical[3] > max(test.critical[:3])
    old = intersection_union_stepdown(contrasts, groups, ALPHA)
    assert test.max_t_critical == old.first_step_critical
    assert max(test.critical[:3]) < old.first_step_critical


def test_a_group_left_out_is_never_claimed_and_not_in_the_min_p() -> None:
    rng = np.random.default_rng(1)
    t_boot = rng.normal(size=(500, 3))
    contrasts = SharpeContrasts(np.array([9.0, 1.0, 1.2]), np.ones(3), t_boot, np.ones(3))
    test = balanced_intersection_union_stepdown(
        contrasts, [[0], [1], [2]], ALPHA, eligible=[False, True, True]
    )
    assert not test.reject[0] and math.isnan(test.p_adjusted[0]) and test.p_raw[0] == 0.0
    assert list(test.in_family) == [False, True, True]
    alone = balanced_intersection_union_stepdown(
        SharpeContrasts(np.array([1.0, 1.2]), np.ones(2), t_boot[:, 1:], np.ones(2)), [[0], [1]], ALPHA
    )
    assert test.level == alone.level and np.array_equal(test.critical[1:], alone.critical)
    # with no eligible group, every group is held at Šidák's level over all of them
    none = balanced_intersection_union_stepdown(contrasts, [[0], [1], [2]], ALPHA, eligible=[False] * 3)
    assert none.level == pytest.approx(sidak_level(3, ALPHA)) and not none.reject.any()


N_MODELS = 5  # model 0 trades on 6 of the 60 days; one baseline (buy & hold), so each group is one comparison
RULES = VerdictRules(n_boot=200, min_test_days=1, min_seeds=1)


def _single_baseline_rows() -> tuple[list[np.ndarray], list[np.ndarray], list[list[int]]]:
    models, pairs, groups = [], [], []
    for m in range(N_MODELS):
        row = np.zeros(N_MODELS + 1)
        row[m] = 1.0
        models.append(row)
        pair = row.copy()
        pair[N_MODELS] -= 1.0
        groups.append([len(pairs)])
        pairs.append(pair)
    return models, pairs, groups


@pytest.mark.parametrize("flag_the_quiet_model", [True, False])
def test_family_wise_error_on_simulated_nulls_with_a_quiet_model(flag_the_quiet_model: bool) -> None:
    """Independent no-edge returns, one of five models trading on 10% of the days: the balanced stepdown claims
    some model in at most alpha of the worlds (within the one-sided 99% Monte Carlo bound at K = 300), with the
    quiet model flagged (the report's rule) or left in. Testing each model at alpha alone claims in ~20%."""
    models, pairs, groups = _single_baseline_rows()
    eligible = [not flag_the_quiet_model] + [True] * (N_MODELS - 1)
    rng = np.random.default_rng(5)
    worlds, false_claims, unadjusted = 300, 0, 0
    for k in range(worlds):
        x = rng.normal(0.0, 0.01, (60, N_MODELS + 1))
        off = np.ones(60, bool)
        off[rng.choice(60, 6, replace=False)] = False
        x[off, 0] = 0.0
        result = family_result(x, models, pairs, groups, RULES, seed=k, eligible=eligible)
        false_claims += bool(result.primary.reject.any())
        unadjusted += bool((result.primary.p_raw[result.primary.in_family] <= ALPHA).any())
    bound = ALPHA + 2.33 * math.sqrt(ALPHA * (1 - ALPHA) / worlds)
    assert false_claims / worlds <= bound
    assert (
        unadjusted / worlds > bound
    )  # the bound tells a multiplicity-corrected family from an uncorrected one


def test_a_quiet_model_no_longer_raises_the_others_critical_values() -> None:
    """Model 0 holds a heavy-tailed position on 6 of 60 days; its comparison with flat is its own Sharpe, whose t*
    is heavy-tailed. The max-t stepdown's first step (every model at one critical value) is set by it; flagged
    under the rule, it leaves the trading models' critical values exactly as they are without it in the data, and
    those are below the max-t value on the same draws."""
    n_models, buy_and_hold, flat = 4, 4, 5

    def rows(members: range) -> tuple[list[np.ndarray], list[np.ndarray], list[list[int]]]:
        models, pairs, groups = [], [], []
        for m in members:
            row = np.zeros(n_models + 2)
            row[m] = 1.0
            models.append(row)
            group = []
            for baseline in (buy_and_hold, flat):
                pair = row.copy()
                pair[baseline] -= 1.0
                group.append(len(pairs))
                pairs.append(pair)
            groups.append(group)
        return models, pairs, groups

    rules = VerdictRules(n_boot=400, min_test_days=1, min_seeds=1)
    rng = np.random.default_rng(3)
    old_values, old_without, balanced_values, quiet_values = [], [], [], []
    for k in range(12):
        x = rng.normal(0.0, 0.01, (60, n_models + 2))
        x[:, flat] = 0.0
        trading_days = np.zeros(60, bool)
        trading_days[rng.choice(60, 6, replace=False)] = True
        x[:, 0] = np.where(trading_days, 0.01 * rng.standard_t(2, 60), 0.0)
        everyone = family_result(x, *rows(range(n_models)), rules, seed=k)
        flagged = family_result(x, *rows(range(n_models)), rules, seed=k, eligible=[False, True, True, True])
        without = family_result(x, *rows(range(1, n_models)), rules, seed=k)
        assert np.array_equal(flagged.primary.critical[1:], without.primary.critical)
        assert flagged.primary.level == without.primary.level
        old_values.append(everyone.primary.max_t_critical)
        old_without.append(without.primary.max_t_critical)
        balanced_values.append(float(np.max(flagged.primary.critical[1:])))
        quiet_values.append(float(flagged.primary.critical[0]))
    # under max-t the quiet model raises everyone's critical value (measured: 2.07 -> 2.39 on average) ...
    assert np.mean(old_values) > np.mean(old_without) + 0.2
    # ... above the trading models' own balanced critical values (2.21), which it leaves as they are
    assert np.mean(old_values) > np.mean(balanced_values) + 0.1
    assert np.mean(quiet_values) > np.mean(balanced_values)  # the heavy tail is the quiet model's


def _comparison(name: str) -> Comparison:
    return Comparison(name, 0.1, -1.0, 1.0, 0.5, 0.5, False, False, 5.0)


def test_a_low_information_model_is_told_so_in_its_sentence() -> None:
    comparisons = [_comparison(name) for name in ("buy_and_hold", "flat")]
    reason = "it holds a position on 8% of its test days (mean over its seeds; the rule asks for 20%)"
    beats, sentence = verdict_sentence("linear", comparisons, (True, ""), 17.8, True, reason)
    assert not beats
    assert reason in sentence and "left out of the primary family" in sentence and "about 17.80" in sentence


def _report(tmp_path: Path, **kwargs: object) -> tuple[dict, str]:
    outputs = write_pipeline_outputs(tmp_path / "run", n_folds=2, n_seeds=5, test_days=5, seed=4, **kwargs)
    verdict = tmp_path / "verdict.json"
    build_report(**outputs.report_kwargs(tmp_path / "eval_report.html"), verdict_path=str(verdict))
    return json.loads(verdict.read_text(encoding="utf-8")), (tmp_path / "eval_report.html").read_text("utf-8")


def test_the_headline_is_the_median_of_the_models_that_trade(tmp_path: Path) -> None:
    record, html = _report(tmp_path, models=("dqn", "linear", "ppo", "a2c"), flat_models=("linear",))
    models = record["models"]
    assert record["low_information_models"] == ["linear"] and record["min_trading_share"] == MIN_TRADING_SHARE
    assert models["linear"]["low_information"] and models["linear"]["trading_share"] == 0.0
    assert not models["linear"]["beats_every_baseline"] and models["linear"]["p_beats_every"] is None
    trading = ["a2c", "dqn", "ppo"]
    assert sorted(record["headline"]["models"]) == trading
    assert record["headline"]["basis"] == "median_of_trading_models"
    figures = [models[m]["detectable"] for m in trading]
    assert all(f is not None and f > 0 for f in figures) and len(set(figures)) == 3
    assert record["detectable_sharpe_difference"] == pytest.approx(float(np.median(figures)))
    assert "median, over the models that trade" in record["headline"]["definition"]
    assert 'data-metric="low-information" data-value="linear"' in html
    assert '<tr data-algo="linear" data-low-information="true">' in html
    assert record["one_comparison_detectable"] > 0  # the one-comparison figure stays beside it


def test_an_all_flat_run_falls_back_to_the_reference_trader(tmp_path: Path) -> None:
    record, html = _report(tmp_path, models=("dqn", "ppo"), flat_models=("dqn", "ppo"), random_seeds=10)
    assert record["low_information_models"] == ["dqn", "ppo"] and record["headline"]["models"] == []
    assert record["headline"]["basis"] == "reference_trader"
    assert "reference trader" in record["headline"]["definition"]
    figure = record["detectable_sharpe_difference"]
    # finite and positive (seeds averaged, it may sit below the one-comparison figure of a single series)
    assert figure is not None and figure > 0 and record["one_comparison_detectable"] > 0
    assert all(row["days"] is not None for row in record["days_to_answer"])
    assert 'data-metric="reference-trader"' in html and 'data-headline="reference"' in html
    assert "a reference random trader on these test days, since no model trades" in record["sentence"]
    again, _ = _report(tmp_path / "again", models=("dqn", "ppo"), flat_models=("dqn", "ppo"), random_seeds=10)
    assert again["detectable_sharpe_difference"] == figure  # seeded: the same inputs give the same figure


def test_the_reference_trader_is_priced_before_costs(tmp_path: Path) -> None:
    """The random traders change position at most bars; at 1x costs their churn (and on real data the spread's
    outliers) would set the reference's figure, not the days. Before costs their figure is the days' own: the
    same however dear their trades."""
    flat = {"models": ("dqn", "ppo"), "flat_models": ("dqn", "ppo"), "random_seeds": 10}
    cheap, _ = _report(tmp_path / "cheap", **flat, random_cost_per_side=2e-5)
    dear, _ = _report(tmp_path / "dear", **flat, random_cost_per_side=3e-4)
    assert cheap["headline"]["basis"] == dear["headline"]["basis"] == "reference_trader"
    assert "before costs" in dear["headline"]["definition"]
    assert dear["detectable_sharpe_difference"] == pytest.approx(
        cheap["detectable_sharpe_difference"], rel=1e-9
    )


def test_the_measured_notes_say_which_procedure_they_were_measured_with() -> None:
    note = headline_power_note(60, 0.8, MEASURED_LAYOUT)
    assert ("earlier max-t stepdown" in note) == (MEASURED_PROCEDURE != PROCEDURE)
