"""features.user through Snakemake: the audit job before the features jobs, a cheat failing there in one line,
a missing file failing at DAG parse, and (slow) the tiny config end to end with examples/my_features.py: the
features reach the tables, the manifest, training (observation width) and the report, and editing the file
reruns exactly the audit, the features and everything downstream."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from marketrl.features import CATALOG
from marketrl.settings.config import validate_config
from marketrl.workflow import pipeline
from tests.conftest import REPO_ROOT
from tests.test_dag_cache import planned_jobs
from tests.test_workflow import TINY, snakemake, workdir_with_config

EXAMPLE = REPO_ROOT / "examples" / "my_features.py"
NAMES = ["vwap_dev_session_atr", "overnight_gap", "spread_z_60"]


def _config(**features: Any) -> dict[str, Any]:
    config = yaml.safe_load(TINY.read_text())
    config["features"] = features
    config["training"]["models"] = ["dqn", "linear"]  # one agent, one forecaster
    return config


def test_a_cheating_file_fails_the_audit_job_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "cheat.py").write_text(
        "import polars as pl\nFEATURES = {'peek': pl.col('close').shift(-1) / pl.col('close')}\n"
    )
    workdir = workdir_with_config(tmp_path, _config(user="cheat.py"))
    result = snakemake("--cores", "1", "results/features/user_audit.json", cwd=workdir)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if "features.user:" in line]
    assert (
        lines
        and "UserFeatureError: features.user: feature 'peek' reads the future: its value at bar " in lines[0]
    )
    assert not (workdir / "results" / "features" / "user_audit.json").exists()


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    workdir = workdir_with_config(tmp_path, _config(user="nope.py"))
    result = snakemake("-n", cwd=workdir)
    assert result.returncode == 1
    assert "marketrl config error: config key 'features.user': nope.py: no such Python file" in result.stderr


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("user_features_run")
    shutil.copy(EXAMPLE, workdir / "my_features.py")  # relative to the working directory
    workdir_with_config(workdir, _config(user="my_features.py"))
    result = snakemake("--cores", "1", cwd=workdir, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.mark.slow
def test_example_features_run_end_to_end(finished: Path) -> None:
    audit = json.loads((finished / "results/features/user_audit.json").read_text())
    assert audit["passed"] and audit["features"] == NAMES
    manifest = json.loads((finished / "results/features/manifest.json").read_text())
    assert manifest["user_features"]["names"] == NAMES
    # the observation / input width grew by the three features (a forecaster keeps the names in `extra`)
    agent = torch.load(finished / "results/models/dqn/fold_0/seed_0/model.pt", weights_only=False)
    forecaster = torch.load(finished / "results/models/linear/fold_0/seed_0/model.pt", weights_only=False)
    assert agent["feature_names"][len(CATALOG) :] == NAMES
    assert forecaster["extra"]["feature_names"][len(CATALOG) :] == NAMES
    assert forecaster["n_features"] == len(CATALOG) + len(NAMES)
    report = (finished / "results/eval_report.html").read_text()
    assert 'data-metric="user-features" data-value="3"' in report
    assert all(f"<code>{name}</code>" in report for name in NAMES)


@pytest.mark.slow
def test_editing_the_file_reruns_the_features_and_everything_after(finished: Path, tmp_path: Path) -> None:
    assert planned_jobs(finished) == {}
    user = finished / "my_features.py"
    original = user.read_text()
    try:
        user.write_text(original + "\n# a comment changes the content, hence the hash\n")
        planned = planned_jobs(finished)
    finally:
        user.write_text(original)
    assert planned["user_features_audit"] == 1
    # every features batch (the user file only adds columns: the batches are those of the config without it)
    assert planned["features"] == len(pipeline.feature_batches(validate_config(_config())))
    assert {"feature_manifest", "folds", "train", "evaluate", "baselines", "report"} <= set(planned)
