"""Nested tuning (hyperopt.per_fold): each fold's own tuning window, its own study and trainings, and the DSR's
N summed over the folds' studies (docs/HYPEROPT.md, "Nested tuning")."""

from __future__ import annotations

import json
import re
from datetime import date
from pathlib import Path

import pytest

from marketrl.report.build import build_report
from marketrl.settings import paths
from marketrl.settings.config import load_config
from marketrl.splits.folds import FoldConfig, make_fold_plan
from marketrl.verdict.inputs import load_inputs
from marketrl.verdict.verdicts import deflation_for
from marketrl.workflow import pipeline
from tests.faults.pipeline import merged
from tests.report_fixtures import write_pipeline_outputs
from tests.test_workflow import TINY, job_counts, snakemake, workdir_with_config

COUNTED = ("COMPLETE", "PRUNED")  # the fixture's trials: completed, or pruned after a scored evaluation


def per_fold_config() -> dict:
    config = load_config(TINY)
    config["hyperopt"]["per_fold"] = True
    return config


# ------------------------------------------------------------------------------------------------ windows


def test_tiny_configs_fold_tuning_windows_hold_none_of_their_own_or_later_test_days() -> None:
    config = per_fold_config()
    cfg = FoldConfig.from_config(config, feature_lookback_bars=1)
    # the tiny demo's trading days (its 10 CME sessions); the windows depend only on their count and order
    days = pipeline.weekdays(date(2024, 3, 7), n_days=config["data"]["demo"]["days"])
    plan = make_fold_plan(days, cfg)
    assert len(plan.folds) == 2
    for fold in plan.folds:
        window = plan.tuning_for(fold.index)
        own_and_later = {day for later in plan.folds[fold.index :] for day in later.test_days}
        assert not set(window.days) & own_and_later
        assert window.last_day < fold.first_test_day
        assert set(window.validation_days) <= set(window.days)
        assert len(window.days) == cfg.tuning_days
    # fold 1 tunes on later days than fold 0 (its window may hold fold 0's test days: they are its past)
    assert plan.tuning_for(1).last_day > plan.tuning_for(0).last_day
    assert set(plan.tuning_for(1).days) & set(plan.folds[0].test_days)


# ---------------------------------------------------------------------------------------------------- DAG


def test_per_fold_studies_have_their_own_names_and_seeds() -> None:
    from marketrl.training.hyperopt import study_name, study_scope

    names = {study_name("ppo", "abc", fold) for fold in (None, 0, 1)}
    assert names == {"marketrl-ppo-abc", "marketrl-ppo-fold0-abc", "marketrl-ppo-fold1-abc"}
    assert study_scope("ppo") == ("ppo",)  # the single study keeps its seeds
    assert study_scope("ppo", 0) != study_scope("ppo", 1)


def test_per_fold_dag_has_one_study_per_model_and_fold(tmp_path: Path) -> None:
    config = per_fold_config()
    workdir = workdir_with_config(tmp_path, config)
    result = snakemake("-n", "--quiet", "rules", cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    counts = job_counts(result.stdout + result.stderr)
    n_studies = len(config["training"]["models"]) * config["folds"]["n"]
    assert counts["hyperopt_worker"] == n_studies * config["hyperopt"]["workers"]
    assert counts["hyperopt_best"] == n_studies
    assert counts["train"] == n_studies


def test_one_folds_model_target_plans_only_that_folds_study_and_training(tmp_path: Path) -> None:
    workdir = workdir_with_config(tmp_path, per_fold_config())
    target = "results/models/ppo/fold_1/seed_0/model.pt"
    result = snakemake("-n", "--cores", "1", target, cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = result.stdout + result.stderr
    counts = job_counts(listed)
    assert (counts["hyperopt_worker"], counts["hyperopt_best"], counts["train"]) == (1, 1, 1)
    assert paths.HYPEROPT_FOLD_BEST.format(model="ppo", fold=1) in listed
    assert "fold_0" not in listed and "results/hyperopt/ppo.json" not in listed
    assert "dqn" not in listed


@pytest.fixture(scope="module")
def finished_per_fold_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run of the tiny config with nested tuning, reduced to the cheap linear model (one run per fold)."""
    config = merged(
        per_fold_config(),
        {"hyperopt": {"trial_updates": 20}, "training": {"models": ["linear"], "max_updates": 40}},
    )
    workdir = workdir_with_config(tmp_path_factory.mktemp("per_fold_run"), config)
    result = snakemake("--cores", "1", cwd=workdir, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return workdir


def planned_outputs(workdir: Path, *args: str) -> list[str]:
    """The outputs of every job a dry-run of `workdir` plans (with `args`), in Snakemake's listing order."""
    result = snakemake("-n", *args, cwd=workdir)
    assert result.returncode == 0, result.stderr[-2000:]
    return re.findall(r"^\s+output: (.*)$", result.stdout + result.stderr, re.MULTILINE)


@pytest.mark.slow
def test_a_changed_fold_study_reruns_only_that_folds_study_and_trainings(finished_per_fold_run: Path) -> None:
    workdir = finished_per_fold_run
    assert planned_outputs(workdir) == []
    fold_1 = [
        "results/hyperopt/linear/fold_1.json",
        "results/models/linear/fold_1/",
        "results/eval/linear/fold_1/",
    ]
    worker_path = paths.HYPEROPT_FOLD_WORKER.format(model="linear", fold=1, worker=0)
    # fold 1's study rerun by target: its worker, its best parameters, its training and evaluation, the report
    forced = " ".join(planned_outputs(workdir, "--forcerun", worker_path))
    assert worker_path in forced and all(path in forced for path in fold_1) and paths.REPORT in forced
    assert "fold_0" not in forced
    # naming fold 1's model plans its study's summary and training only
    target = paths.MODEL.format(model="linear", fold=1, seed=0)
    assert len(planned_outputs(workdir, "--forcerun", worker_path, "--", target)) == 3
    # a changed fold-1 study (its worker summary rewritten): fold 1's summary, training, evaluation, the report
    # the folds' studies share the model's journal, under names that carry the fold
    workers = [
        json.loads(
            (workdir / paths.HYPEROPT_FOLD_WORKER.format(model="linear", fold=k, worker=0)).read_text()
        )
        for k in (0, 1)
    ]
    assert workers[0]["storage"] == workers[1]["storage"]
    assert [w["study"].split("-")[2] for w in workers] == ["fold0", "fold1"]
    worker = workdir / worker_path
    original = worker.read_bytes()
    worker.write_bytes(original.replace(b"{", b'{"changed": true, ', 1))
    try:
        changed = " ".join(planned_outputs(workdir))
        assert all(path in changed for path in fold_1) and paths.REPORT in changed
        assert "fold_0" not in changed and "worker_0.json" not in changed
    finally:
        worker.write_bytes(original)


# ---------------------------------------------------------------------------------------------- DSR, report


@pytest.fixture(scope="module")
def per_fold_run(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("per_fold_report")
    return write_pipeline_outputs(
        root / "run", n_folds=3, n_seeds=2, test_days=3, n_trials=6, seed=5, per_fold=True
    )


def test_dsr_n_is_the_sum_of_every_folds_trials(per_fold_run) -> None:
    outputs = per_fold_run
    assert len(outputs.hyperopt_files) == 2 * 3  # dqn, ppo x 3 folds
    inputs = load_inputs(
        outputs.eval_files, outputs.bar_files, outputs.hyperopt_files, outputs.folds_path, outputs.train_logs
    )
    for model in ("dqn", "ppo"):
        by_fold = inputs.hyperopt_folds[model]
        assert sorted(by_fold) == [0, 1, 2]
        per_fold_n = [sum(t["state"] in COUNTED for t in by_fold[k].trials) for k in by_fold]
        deflation = deflation_for(inputs, model)
        assert deflation.n_trials == sum(per_fold_n) == 3 * 6
        # the deflated choice is the best of the folds' choices
        best = max(by_fold[k].data["best_value"] for k in by_fold)
        assert deflation.best_sharpe_daily == pytest.approx(best / 252**0.5)


def test_report_shows_each_folds_choice(per_fold_run, tmp_path: Path) -> None:
    outputs = per_fold_run
    out = tmp_path / "eval_report.html"
    build_report(**outputs.report_kwargs(out))
    html = out.read_text(encoding="utf-8")
    tables = re.findall(r'<table class="per-fold-choices">(.*?)</table>', html, re.S)
    assert len(tables) == 2  # one per model
    header, body = tables[0].split("</thead>")
    assert header.index("hidden_dim_base") < header.index("learning_rate")  # hidden_dim_base first
    assert body.count("<tr>") == 3  # one row per fold
    for fold in outputs.plan.folds:
        window = fold.tuning
        assert f"{window.first_day}..{window.last_day}" in body
    assert "DSR uses N = 18" in html
    assert "nested tuning: one per fold" in html
