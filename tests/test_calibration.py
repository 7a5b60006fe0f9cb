"""The verdict's calibration: the exact binomial interval, the aggregation, the settings checks, and a tiny
end-to-end run of the Snakemake target (the machinery, not the rates: bench/studies/calibration.py measures those)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from scipy.stats import binomtest

from marketrl.calibration.plan import job_worlds, n_jobs
from marketrl.calibration.worlds import (
    OUTCOMES,
    CalibrationError,
    CalibrationSettings,
    calibration_result,
    checked_settings,
    clopper_pearson,
    render_html,
    run_job,
    summarize,
    world_specs,
)
from marketrl.settings import paths
from marketrl.settings.config import validate_config
from tests.test_workflow import TINY, job_counts, snakemake, workdir_with_config

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.mark.parametrize(("k", "n"), [(0, 60), (3, 60), (30, 60), (60, 60), (1, 2), (0, 1), (7, 180)])
def test_clopper_pearson_matches_scipy(k: int, n: int) -> None:
    expected = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    lo, hi = clopper_pearson(k, n)
    assert lo == pytest.approx(expected.low, abs=1e-12) and hi == pytest.approx(expected.high, abs=1e-12)
    assert 0.0 <= lo <= k / n <= hi <= 1.0


def test_clopper_pearson_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match="successes <= trials"):
        clopper_pearson(3, 2)


def _config(**calibration: Any) -> dict[str, Any]:
    """A config with these calibration keys; one edge kind (momentum) unless `edge_kinds` is given."""
    return validate_config({"calibration": {"edge_kinds": ["momentum"], **calibration}})


def test_settings_refuse_worlds_that_cannot_reach_a_verdict() -> None:
    with pytest.raises(
        CalibrationError, match=r"'calibration.test_days': 6 is below evaluation.min_test_days"
    ):
        CalibrationSettings.from_config(_config(test_days=[6]))
    with pytest.raises(CalibrationError, match=r"'calibration.test_days': 11 is not a multiple"):
        CalibrationSettings.from_config(_config(test_days=[11]))
    with pytest.raises(CalibrationError, match=r"'calibration.seeds': 2 is below evaluation.min_seeds"):
        CalibrationSettings.from_config(_config(seeds=2))
    with pytest.raises(CalibrationError, match=r"'calibration.models': unknown model 'xgboost'"):
        checked_settings(_config(models=["xgboost"]))


def test_worlds_are_split_into_jobs_without_loss_or_overlap() -> None:
    settings = CalibrationSettings.from_config(
        _config(worlds=5, edges=[0, 2.0], test_days=[10], worlds_per_job=3)
    )
    specs = world_specs(settings)
    assert n_jobs(settings) == 4 and len(specs) == 10
    assert [w for job in range(n_jobs(settings)) for w in job_worlds(settings, job)] == specs
    assert len({s.seed(1) for s in specs}) == len(specs)  # every world has its own data and models
    with pytest.raises(CalibrationError, match="calibration job 4 does not exist"):
        job_worlds(settings, 4)


def test_edge_kinds_share_one_no_edge_arm_and_keep_the_momentum_seeds() -> None:
    """Two kinds: one no-edge arm (its data do not depend on the kind), one arm per kind above 0; momentum and
    no-edge worlds keep the seeds they had with one kind (results recorded before stay comparable)."""
    one = world_specs(CalibrationSettings.from_config(_config(worlds=3, edges=[0, 5.0], test_days=[10])))
    two = world_specs(
        CalibrationSettings.from_config(
            _config(worlds=3, edges=[0, 5.0], test_days=[10], edge_kinds=["momentum", "reversion"])
        )
    )
    assert [(s.edge, s.kind) for s in two if s.index == 0] == [
        (0.0, "none"),
        (5.0, "momentum"),
        (5.0, "reversion"),
    ]
    assert [s.seed(7) for s in one] == [s.seed(7) for s in two if s.kind != "reversion"]
    assert len({s.seed(7) for s in two}) == len(two) == 9
    assert {s.demo_kind for s in two} == {"momentum", "reversion"}  # a no-edge world is generated unplanted
    with pytest.raises(Exception, match="edge_kinds"):
        _config(edge_kinds=["carry"])


def test_summary_reads_power_per_kind_and_old_worlds_as_momentum() -> None:
    settings = CalibrationSettings.from_config(
        _config(worlds=4, edges=[0, 10.0], test_days=[10], edge_kinds=["momentum", "reversion"])
    )
    beats = {"none": 0, "momentum": 1, "reversion": 4}
    worlds = []
    for spec in world_specs(settings):
        world = _world(spec.edge, 10, spec.index, "beats" if spec.index < beats[spec.kind] else "none", 1.0)
        if spec.kind == "reversion":
            world["kind"] = "reversion"  # momentum and no-edge worlds left without a kind, as recorded before
        worlds.append(world)
    summary = summarize(worlds, settings)
    assert [(a["edge"], a["kind"], a["beats"]["k"]) for a in summary["arms"]] == [
        (0.0, "none", 0),
        (10.0, "momentum", 1),
        (10.0, "reversion", 4),
    ]
    by_kind = {row["kind"]: row["edge_at_80_power"] for row in summary["detectable"]}
    assert by_kind["momentum"] is None and by_kind["reversion"] == pytest.approx(8.0)  # 0 -> 1.0 over 0..10
    page = render_html(
        calibration_result(
            worlds,
            validate_config(
                {
                    "calibration": {
                        "worlds": 4,
                        "edges": [0, 10.0],
                        "test_days": [10],
                        "edge_kinds": ["momentum", "reversion"],
                    }
                }
            ),
            "cmd",
        )
    )
    assert "<td>reversion</td>" in page and "<td>none</td>" in page


def _world(edge: float, days: int, index: int, outcome: str, sharpe: float) -> dict[str, Any]:
    model = {"sharpe": sharpe, "min_diff": sharpe - 1.0, "beats": outcome == "beats"}
    return {
        "edge": edge,
        "test_days": days,
        "index": index,
        "outcome": outcome,
        "detectable": 20.0,
        "models": {"linear": model, "lightgbm": model},
    }


def test_summary_counts_rates_and_reads_the_80_percent_crossing() -> None:
    settings = CalibrationSettings.from_config(_config(worlds=10, edges=[0, 4.0, 8.0], test_days=[10]))
    beats = {0.0: 1, 4.0: 6, 8.0: 10}  # power 0.6 at edge 4 and 1.0 at 8: 80% is reached at edge 6
    worlds = [
        _world(edge, 10, k, "beats" if k < beats[edge] else "none", sharpe=edge)
        for edge in settings.edges
        for k in range(10)
    ]
    summary = summarize(worlds, settings)
    fp = summary["false_positive"]
    assert (fp["k"], fp["n"], fp["rate"]) == (1, 10, 0.1)
    assert fp["ci"] == pytest.approx(list(clopper_pearson(1, 10)))
    assert [a["beats"]["k"] for a in summary["power"]] == [6, 10]
    assert all(set(a["outcomes"]) == set(OUTCOMES) for a in summary["arms"])
    assert all(a["better_than"] is None for a in summary["arms"])  # worlds without per-baseline claims
    (detect,) = summary["detectable"]
    assert detect["edge_at_80_power"] == pytest.approx(6.0)
    assert detect["sharpe_difference_at_80_power"] == pytest.approx(5.0)  # the min_diff curve at edge 6
    with pytest.raises(CalibrationError, match="the chunks hold 29 worlds, the config asks for 30"):
        summarize(worlds[:-1], settings)


def test_summary_says_when_power_never_reaches_80_percent() -> None:
    settings = CalibrationSettings.from_config(_config(worlds=2, edges=[0, 4.0], test_days=[10]))
    worlds = [_world(edge, 10, k, "none", 0.0) for edge in settings.edges for k in range(2)]
    (detect,) = summarize(worlds, settings)["detectable"]
    assert detect["edge_at_80_power"] is None and detect["sharpe_difference_at_80_power"] is None


def _world_with_claims(edge: float, index: int, baseline: str) -> dict[str, Any]:
    """A world whose models are better than `baseline` when it has an edge (per-baseline claims recorded)."""
    world = _world(edge, 10, index, "beats" if edge else "none", sharpe=edge)
    for model in world["models"].values():
        model["better_than"] = [baseline] if edge else []
        model["diffs"] = {baseline: edge - 0.5, "flat": -1.0}
    return world


def test_the_page_shows_the_rates_and_escapes_what_it_is_given() -> None:
    # Names and the command reach the page as text: a baseline name or a command line holding markup cannot
    # inject any (the page goes through the report's autoescaped jinja2 environment).
    hostile = "<script>alert(1)</script>&co"
    config = _config(worlds=2, edges=[0, 4.0], test_days=[10], models=["linear", "lightgbm"])
    worlds = [_world_with_claims(edge, k, hostile) for edge in (0.0, 4.0) for k in range(2)]
    page = render_html(calibration_result(worlds, config, "snakemake --config note='a < b & c'"))
    assert page.startswith("<!DOCTYPE html>")
    assert "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&amp;co" in page
    assert "note=&#39;a &lt; b &amp; c&#39;" in page
    assert "False 'beats' in no-edge worlds: <b>0.0% [0.0, 84.2] (0/2)</b> (target ≤ 5%)" in page
    assert "K = 2 worlds per arm" in page and "mean Sharpe lightgbm" in page
    assert '<td class="n">100.0% [15.8, 100.0] (2/2)</td>' in page  # the edge-4 arm and its baseline claim
    assert page.count("100.0% [15.8, 100.0] (2/2)") == 2
    assert '<td class="n">3.50</td>' in page  # mean Sharpe difference to the hostile baseline at edge 4
    assert "Detectable at 80% power" in page and '<td class="n">—</td>' not in page  # power 1.0 at edge 4


TINY_CALIBRATION = {
    "seed": 11,
    "costs": yaml.safe_load(TINY.read_text())["costs"],  # the demo worlds' ES and NQ, each with its own spec
    "evaluation": {"min_test_days": 4, "min_seeds": 2, "bootstrap_samples": 200},
    "calibration": {
        "worlds": 2,
        "edges": [0, 10.0],
        "edge_kinds": ["reversion"],  # the kind no baseline trades, end to end (momentum: the unit tests)
        "test_days": [4],
        "folds": 1,
        "train_days": 3,
        "validation_days": 1,
        "models": ["linear", "lightgbm"],
        "seeds": 2,
        "random_traders": 3,
        "worlds_per_job": 2,
    },
}


@pytest.mark.slow
def test_tiny_calibration_target_runs_end_to_end(tmp_path: Path) -> None:
    """K = 2 worlds per arm through Snakemake: 2 world jobs and the summary; JSON fields, CIs and the page."""
    workdir = workdir_with_config(tmp_path, TINY_CALIBRATION)
    dry = snakemake("-n", paths.CALIBRATION_HTML, "--quiet", "rules", cwd=workdir)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert job_counts(dry.stdout + dry.stderr) == {"calibration_worlds": 2, "calibration": 1}

    run = snakemake(paths.CALIBRATION_HTML, "--cores", "2", cwd=workdir, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((workdir / paths.CALIBRATION_JSON).read_text())
    assert result["format"] == "marketrl-calibration" and len(result["worlds"]) == 4
    for world in result["worlds"]:
        assert world["outcome"] in OUTCOMES and world["n_days"] == 4
        assert set(world["models"]) == {"linear", "lightgbm"}
        assert all(math.isfinite(m["sharpe"]) for m in world["models"].values())
    summary = result["summary"]
    assert [(a["edge"], a["kind"], a["test_days"], a["worlds"]) for a in summary["arms"]] == [
        (0.0, "none", 4, 2),
        (10.0, "reversion", 4, 2),
    ]
    assert {w["kind"] for w in result["worlds"]} == {"none", "reversion"}
    fp = summary["false_positive"]
    assert fp["n"] == 2 and fp["ci"] == pytest.approx(list(clopper_pearson(fp["k"], 2)))
    assert [(row["kind"], row["test_days"]) for row in summary["detectable"]] == [("reversion", 4)]
    for arm in summary["arms"]:
        assert set(arm["better_than"]) == {"buy_and_hold", "flat", "momentum", "random", "matched_random"}
        assert all(
            rate["n"] == 2 and 0 <= rate["ci"][0] <= rate["ci"][1] <= 1
            for rate in arm["better_than"].values()
        )
    page = (workdir / paths.CALIBRATION_HTML).read_text()
    assert "Verdict calibration" in page and "False 'beats' in no-edge worlds" in page and "K = 2" in page
    assert not list((workdir / "results" / "calibration").rglob("*.tmp*"))  # atomic writes leave no temp file
    config = yaml.safe_load((workdir / "config.yaml").read_text())
    assert config["calibration"]["worlds"] == 2


def test_nested_tuning_arm_runs_at_k2_and_counts_every_folds_trials(tmp_path: Path) -> None:
    """calibration.per_fold_trials: the no-edge worlds again, each model re-tuned per fold on the fold's own
    tuning window; the same verdict, the DSR's N = folds x trials, a false-positive rate of its own."""
    tiny = TINY_CALIBRATION["calibration"]
    config = validate_config(
        {
            **TINY_CALIBRATION,
            # linear alone (ridge, one run per fold) keeps it short; the arm's code is the same for every model
            "calibration": {
                **tiny,
                "edges": [0],
                "folds": 2,
                "test_days": [4],
                "models": ["linear"],
                "per_fold_trials": 2,
            },
        }
    )
    settings = checked_settings(config)
    specs = world_specs(settings)
    assert [(s.per_fold, s.index) for s in specs] == [(False, 0), (False, 1), (True, 0), (True, 1)]
    assert specs[0].seed(11) == specs[2].seed(11)  # paired: the nested arm reruns the same worlds
    worlds = [
        w for job in range(n_jobs(settings)) for w in run_job(config, job, tmp_path / f"{job}.json")["worlds"]
    ]
    nested = [w for w in worlds if w["per_fold"]]
    assert len(nested) == 2
    for world in nested:
        assert world["outcome"] in OUTCOMES
        for model in world["models"].values():
            assert model["dsr_n"] == settings.folds * settings.per_fold_trials
            assert len(model["fold_params"]) == settings.folds and all(model["fold_params"])
    assert all("dsr_n" not in m for w in worlds if not w["per_fold"] for m in w["models"].values())
    result = calibration_result(worlds, config, "pytest")
    summary = result["summary"]
    assert summary["false_positive"]["n"] == 2 and summary["false_positive_per_fold"]["n"] == 2
    assert [arm["dsr_n"] for arm in summary["per_fold_arms"]] == [[4]]
    page = render_html(result)
    assert "Nested tuning (per-fold re-tuning)" in page
    assert "every model re-tuned per fold" in page
