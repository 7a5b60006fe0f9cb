"""Cache correctness of the DAG: after a finished run, a change reruns exactly the stages that depend on it.

The finished run is the session's shared finished run of the tiny config (tests/conftest.py `shared_run`), copied
once with its mtimes and .snakemake metadata (the copy is changed; the shared run is not). Each test dry-runs one
change with Snakemake's default rerun triggers and compares the planned jobs, rule by rule.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from marketrl.settings import paths
from marketrl.settings.config import load_config, validate_config
from marketrl.workflow import pipeline, stages
from tests.conftest import REPO_ROOT
from tests.faults.pipeline import copy_of_shared_run, merged
from tests.test_workflow import job_counts

# What Snakemake needs of a checkout (plus tests/, to show that editing a test reruns nothing).
CHECKOUT_PARTS = (
    "Snakefile",
    "rules",
    "workflow_scripts",
    "marketrl",
    "gpu_utils",
    "schemas",
    "envs",
    "profiles",
)


def planned_jobs(
    workdir: Path,
    changes: dict[str, Any] | None = None,
    *,
    checkout: Path = REPO_ROOT,
    config_dir: Path | None = None,
) -> dict[str, int]:
    """{rule: jobs} that a dry-run of `workdir` would run, with `changes` merged into its config.yaml."""
    args = ["-n", "--quiet", "rules"]
    if changes:
        assert config_dir is not None
        changed = merged(yaml.safe_load((workdir / "config.yaml").read_text()), changes)
        config_file = config_dir / "changed.yaml"
        config_file.write_text(yaml.safe_dump(changed))
        args += ["--configfile", str(config_file)]
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "-s", str(checkout / "Snakefile"), *args],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(checkout)},
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    if "Job stats:" not in output:
        assert "Nothing to be done" in output, output[-3000:]
        return {}
    return {rule: n for rule, n in job_counts(output).items() if rule != "all"}


@pytest.fixture(scope="module")
def finished_run(shared_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_of_shared_run(tmp_path_factory.mktemp("dag_cache") / "run")


@pytest.fixture(scope="module")
def run_config(finished_run: Path) -> dict[str, Any]:
    return load_config(finished_run / "config.yaml")


def n_models(config: dict[str, Any]) -> int:
    """Train (and evaluate) jobs: one per model x fold, whatever the seeds."""
    return len(config["training"]["models"]) * config["folds"]["n"]


def n_evaluations(config: dict[str, Any]) -> int:
    """Evaluation jobs: one per model x fold (it scores every seed)."""
    return len(config["training"]["models"]) * config["folds"]["n"]


# ---------------------------------------------------------------------------------------------- config changes


def test_unchanged_config_plans_nothing(finished_run: Path) -> None:
    assert planned_jobs(finished_run) == {}


def test_report_only_key_reruns_only_the_report(finished_run: Path, tmp_path: Path) -> None:
    changes = {"evaluation": {"bootstrap_samples": 321}}
    assert planned_jobs(finished_run, changes, config_dir=tmp_path) == {"report": 1}


def test_training_steps_rerun_train_evaluate_report(
    finished_run: Path, run_config: dict[str, Any], tmp_path: Path
) -> None:
    changes = {"training": {"total_steps": run_config["training"]["total_steps"] + 512}}
    n = n_models(run_config)
    assert planned_jobs(finished_run, changes, config_dir=tmp_path) == {
        "train": n,
        "evaluate": n_evaluations(run_config),
        "report": 1,
    }


def test_batch_folds_switch_reruns_training_as_one_job_per_model(
    finished_run: Path, run_config: dict[str, Any], tmp_path: Path
) -> None:
    """training.batch_folds on: one train_folds job per model replaces its per-fold train jobs (their rule, inputs
    and params change), then evaluation and the report; nothing before training."""
    changes = {"training": {"batch_folds": True}}
    assert planned_jobs(finished_run, changes, config_dir=tmp_path) == {
        "train": len(run_config["training"]["models"]),  # train_folds, one per model
        "evaluate": n_evaluations(run_config),
        "report": 1,
    }


def test_costs_rerun_everything_after_the_folds(
    finished_run: Path, run_config: dict[str, Any], tmp_path: Path
) -> None:
    changes = {"costs": {"commission_per_contract": run_config["costs"]["commission_per_contract"] + 0.5}}
    models = run_config["training"]["models"]
    n_folds = run_config["folds"]["n"]
    assert planned_jobs(finished_run, changes, config_dir=tmp_path) == {
        "hyperopt_worker": len(models) * run_config["hyperopt"]["workers"],
        "hyperopt_best": len(models),
        "train": n_models(run_config),
        "evaluate": n_evaluations(run_config),
        "baselines": n_folds,
        "report": 1,
    }


def test_training_window_cap_reruns_the_folds_and_what_reads_them(
    finished_run: Path, run_config: dict[str, Any], tmp_path: Path
) -> None:
    """folds.max_train_days is read by the folds job alone (its slice), so its change reruns the plan and, through
    folds.json, everything that reads it; not the data, the features or the manifest. The tuning windows do not
    depend on it, yet hyperopt reruns: it reads folds.json (docs/FOLDS.md)."""
    changes = {"folds": {"max_train_days": run_config["folds"]["train_days"]}}
    models = run_config["training"]["models"]
    assert planned_jobs(finished_run, changes, config_dir=tmp_path) == {
        "folds": 1,
        "hyperopt_worker": len(models) * run_config["hyperopt"]["workers"],
        "hyperopt_best": len(models),
        "train": n_models(run_config),
        "evaluate": n_evaluations(run_config),
        "baselines": run_config["folds"]["n"],
        "report": 1,
    }


def test_stage_tables_name_real_config_keys() -> None:
    keys = set(stages.config_keys(validate_config({})))
    assert set(stages.DAG_KEYS) <= keys
    for stage, stage_keys in stages.STAGE_KEYS.items():
        assert stage_keys == stages.ALL_KEYS or set(stage_keys) <= keys, stage
    assert set(stages.STAGE_KEYS) == set(stages.STAGES)


# ------------------------------------------------------------------------------------------------ code changes


@pytest.fixture(scope="module")
def checkout_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout's workflow and library (mtimes kept), to edit without touching the repository."""
    root = tmp_path_factory.mktemp("checkout")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in (*CHECKOUT_PARTS, "tests"):
        source = REPO_ROOT / part
        if source.is_dir():
            shutil.copytree(source, root / part, ignore=ignore)
        else:
            shutil.copy2(source, root / part)
    return root


def test_a_checkout_copy_plans_nothing(finished_run: Path, checkout_copy: Path) -> None:
    # The code hashes cover paths relative to the checkout and file contents, not where the checkout lives.
    assert planned_jobs(finished_run, checkout=checkout_copy) == {}


def test_comment_in_a_report_module_reruns_only_the_report(finished_run: Path, checkout_copy: Path) -> None:
    module = checkout_copy / "marketrl" / "report" / "figures.py"
    original = module.read_bytes()
    module.write_bytes(original + b"\n# an edit that changes no behaviour\n")
    try:
        assert planned_jobs(finished_run, checkout=checkout_copy) == {"report": 1}
    finally:
        module.write_bytes(original)


def test_editing_a_test_file_reruns_nothing(finished_run: Path, checkout_copy: Path) -> None:
    helper = checkout_copy / "tests" / "report_fixtures.py"
    original = helper.read_bytes()
    helper.write_bytes(original + b"\n# a test-only edit\n")
    try:
        assert planned_jobs(finished_run, checkout=checkout_copy) == {}
    finally:
        helper.write_bytes(original)


def test_code_hashes_follow_imports_only() -> None:
    relative = {
        stage: {p.relative_to(REPO_ROOT).as_posix() for p in stages.stage_sources(stage)}
        for stage in stages.STAGES
    }
    features_package = {f"marketrl/features/{m}.py" for m in ("__init__", "catalog", "engine", "build")}
    assert features_package <= relative["features"]
    assert not any(name.startswith("marketrl/report/") for name in relative["features"])
    assert "marketrl/report/templates/report.html" in relative["report"]  # package data counts as code
    assert "marketrl/training/train.py" in relative["train"] and "gpu_utils/device.py" in relative["train"]
    assert not any(name.startswith(("tests/", "bench/")) for names in relative.values() for name in names)
    assert (
        "marketrl/workflow/stages.py" not in relative["report"]
    )  # the slice tables only reach jobs through params
    assert len({stages.code_hash(stage) for stage in stages.STAGES}) == len(stages.STAGES)


# --------------------------------------------------------------------------------------------- config slices


def test_slices_hold_only_their_keys() -> None:
    config = validate_config({})
    train = stages.stage_config(config, "train")
    assert train["training"]["total_steps"] == config["training"]["total_steps"]
    assert "models" not in train["training"] and "evaluation" not in train and "hyperopt" not in train
    hyperopt = stages.stage_config(config, "hyperopt_worker")
    assert set(hyperopt["training"]) == {
        "check_every",
        "device",
        "epochs",
        "extra_models",
        "horizon",
        "max_train_rows",
        "n_envs",
        "patience",
        "precision",
    }
    assert "total_steps" not in hyperopt["training"]
    assert stages.stage_config(config, "feature_manifest") == {}
    # the report reads every key but the calibration's and predict's (separate targets it neither runs nor shows)
    separate = ("calibration", "predict")
    assert stages.stage_config(config, "report") == {k: v for k, v in config.items() if k not in separate}
    assert stages.readers("predict.files") == [] and stages.readers("predict.fold") == ["predict"]
    assert stages.readers("calibration.worlds") == ["calibration_worlds", "calibration"]
    with pytest.raises(stages.StageError, match="unknown stage 'nope'"):
        stages.stage_config(config, "nope")


def test_every_stage_runs_on_exactly_its_slice(
    finished_run: Path, run_config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each stage's library entry point, called as its job script calls it, with its slice as the only config:
    a key the stage reads but its slice lacks would raise KeyError here."""
    from marketrl.data.demo import generate_demo_files
    from marketrl.data.download import download_days
    from marketrl.evaluation.evaluate import baselines_job, evaluate_job
    from marketrl.features import build_feature_file
    from marketrl.splits.folds import write_fold_plan
    from marketrl.training.hyperopt import run_worker, write_study_summary
    from marketrl.training.train import train_job
    from tests.test_download import FakeClient

    monkeypatch.chdir(finished_run)  # the manifest lists feature tables relative to the run directory

    def sliced(stage: str, **overrides: Any) -> dict[str, Any]:
        return merged(stages.stage_config(run_config, stage), overrides)

    demo = sliced("demo_data")["data"]["demo"]
    written = generate_demo_files(tmp_path / "demo", demo["start"], demo["days"], demo["seed"])
    assert [p.name for p in written] == [Path(p).name for p in pipeline.demo_files(run_config)]

    monkeypatch.setenv("DATABENTO_API_KEY", "db-TESTKEY")
    request = sliced("download_databento")["data"]["databento"]
    targets = [tmp_path / Path(p).name for p in pipeline.databento_files(run_config)]
    download_days(request, targets, client_factory=lambda key: FakeClient(key, 0.0))

    raw = sorted(str(p) for p in (finished_run / paths.DEMO_DIR).glob("*.dbn.zst"))
    build_feature_file(
        Path(raw[1]),
        tmp_path / "features.parquet",
        bar_size=sliced("features")["data"]["bar_size"],
        prev_src=Path(raw[0]),
    )
    features = pipeline.feature_files(run_config)
    write_fold_plan(features, sliced("folds")["folds"], tmp_path / "folds.json")

    manifest, folds = paths.FEATURE_MANIFEST, paths.FOLDS
    study_root = tmp_path / "results"
    worker_out = study_root / "hyperopt" / "dqn" / "worker_0.json"
    run_worker(
        model="dqn",
        worker=0,
        manifest_path=manifest,
        folds_path=folds,
        config=sliced("hyperopt_worker", hyperopt={"n_trials": 1, "trial_steps": 256}),
        out_path=str(worker_out),
        results_dir=study_root,
    )
    write_study_summary(
        model="dqn",
        worker_summaries=[str(worker_out)],
        folds_path=folds,
        config=sliced("hyperopt_best", hyperopt={"n_trials": 1}),
        out_path=str(tmp_path / "dqn.json"),
        results_dir=study_root,
    )

    model = tmp_path / "model.pt"
    train_job(
        model="dqn",
        fold=0,
        seed_indices=[0],
        manifest_path=manifest,
        folds_path=folds,
        hparams_path=paths.HYPEROPT_BEST.format(model="dqn"),
        config=sliced("train", training={"total_steps": 256, "checkpoint_every": 128}),
        model_paths=[str(model)],
        log_paths=[str(tmp_path / "train_log.json")],
        resume_path=str(tmp_path / "resume.pt"),
    )[0]
    assert model.is_file() and not (tmp_path / "resume.pt").exists()
    evaluate_job(
        model="dqn",
        fold=0,
        seed_indices=[0],
        manifest_path=manifest,
        folds_path=folds,
        model_paths=[str(model)],
        config=sliced("evaluate"),
        metrics_paths=[str(tmp_path / "metrics.json")],
        bars_paths=[str(tmp_path / "bars.parquet")],
    )
    # A forecaster reads its own run settings (horizon, epochs, patience, max_updates, trial_updates...).
    linear_worker = study_root / "hyperopt" / "linear" / "worker_0.json"
    run_worker(
        model="linear",
        worker=0,
        manifest_path=manifest,
        folds_path=folds,
        config=sliced("hyperopt_worker", hyperopt={"n_trials": 1}),
        out_path=str(linear_worker),
        results_dir=study_root,
    )
    write_study_summary(
        model="linear",
        worker_summaries=[str(linear_worker)],
        folds_path=folds,
        config=sliced("hyperopt_best", hyperopt={"n_trials": 1}),
        out_path=str(tmp_path / "linear.json"),
        results_dir=study_root,
    )
    train_job(
        model="linear",
        fold=0,
        seed_indices=[0],
        manifest_path=manifest,
        folds_path=folds,
        hparams_path=str(tmp_path / "linear.json"),
        config=sliced("train"),
        model_paths=[str(tmp_path / "linear.pt")],
        log_paths=[str(tmp_path / "linear_log.json")],
        resume_path=str(tmp_path / "linear_resume.pt"),
    )[0]
    evaluate_job(
        model="linear",
        fold=0,
        seed_indices=[0],
        manifest_path=manifest,
        folds_path=folds,
        model_paths=[str(tmp_path / "linear.pt")],
        config=sliced("evaluate"),
        metrics_paths=[str(tmp_path / "linear_metrics.json")],
        bars_paths=[str(tmp_path / "linear_bars.parquet")],
    )
    from marketrl.training.export import export_job

    export_job(
        model="dqn", model_paths=[str(model)], config=sliced("export"), out_dirs=[str(tmp_path / "export")]
    )
    baselines_job(
        fold=0,
        manifest_path=manifest,
        folds_path=folds,
        config=sliced("baselines"),
        metrics_path=str(tmp_path / "baselines.json"),
        bars_path=str(tmp_path / "baselines.parquet"),
    )


# ------------------------------------------------------------------------------------- DAG and documentation


def test_downstream_table_matches_snakemakes_rulegraph(tmp_path: Path) -> None:
    # Run in a temp working directory: even a --rulegraph writes a log under the workdir's .snakemake/.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO_ROOT / "Snakefile"),
            "--configfile",
            str(REPO_ROOT / "config.yaml"),
            "--directory",
            str(tmp_path),
            "--rulegraph",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    # a `*_once` rule (one run of a deterministic model) is its stage's rule for those models, a batch's features
    # rule the features stage's
    names = {
        node: pipeline.rule_stage(rule)
        for node, rule in re.findall(r'^\s*(\d+)\[label = "(\w+)"', result.stdout, re.MULTILINE)
    }
    edges = {(names[a], names[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", result.stdout, re.MULTILINE)}
    in_dag = set(names.values()) - {"all"}
    assert in_dag <= set(stages.STAGES)
    expected = {(a, b) for a in in_dag for b in stages.DOWNSTREAM[a] if b in in_dag}
    assert {(a, b) for a, b in edges if b != "all"} == expected


def test_architecture_doc_table_matches_the_stage_slices() -> None:
    text = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    table = (
        text.split("<!-- config-key-table:begin")[1].split("\n", 1)[1].split("<!-- config-key-table:end")[0]
    )
    assert table.strip() == stages.config_key_table(validate_config({})), (
        "docs/ARCHITECTURE.md: regenerate the table with marketrl.workflow.stages.config_key_table"
    )
