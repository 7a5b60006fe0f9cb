"""End to end with every model: all of the registry's (tests/configs/zoo.yaml's default) go through hyperopt, training, evaluation and
into the report (one fold, one seed, one trial per study and tiny budgets keep it cheap)."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch

from marketrl.models import MODELS
from marketrl.settings.config import MODEL_NAMES, load_config
from marketrl.training.zoo import ZOO
from marketrl.workflow import pipeline
from tests.conftest import REPO_ROOT
from tests.test_workflow import snakemake, workdir_with_config

pytestmark = pytest.mark.slow

ZOO_CONFIG = REPO_ROOT / "tests" / "configs" / "zoo.yaml"
AGENT_NAMES = {name for name, entry in ZOO.items() if entry.kind == "agent"}


@pytest.fixture(scope="module")
def zoo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = workdir_with_config(tmp_path_factory.mktemp("zoo_run"), ZOO_CONFIG)
    result = snakemake("--cores", "2", cwd=workdir, timeout=1500)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return workdir


def test_the_zoo_config_lists_every_model() -> None:
    assert tuple(load_config(ZOO_CONFIG)["training"]["models"]) == MODEL_NAMES


def test_every_model_reaches_every_output(zoo_run: Path) -> None:
    config = load_config(ZOO_CONFIG)
    files = [f"results/hyperopt/{name}.json" for name in MODEL_NAMES]
    files += pipeline.model_files(config) + pipeline.train_log_files(config)
    files += pipeline.eval_files(config) + pipeline.eval_bar_files(config) + ["results/eval_report.html"]
    assert [path for path in files if not (zoo_run / path).is_file()] == []
    assert len(pipeline.model_files(config)) == len(MODEL_NAMES)


def test_hyperopt_summaries_have_one_format_for_every_model(zoo_run: Path) -> None:
    for name in MODEL_NAMES:
        study = json.loads((zoo_run / f"results/hyperopt/{name}.json").read_text())
        assert study["algo"] == name and study["n_trials"] == len(study["trials"]) == 1
        assert {"n_complete", "n_pruned", "n_failed", "best_value", "trial_sharpe_daily"} <= set(study)
        neural = name in AGENT_NAMES or MODELS[name].neural
        assert ("hidden_dim_base" in study["best_params"]) == neural
        assert study["trials"][0]["user_attrs"]["seed_scores"] == [study["best_value"]]


def test_evaluations_say_their_kind_and_forecasters_carry_forecast_columns(zoo_run: Path) -> None:
    for name in MODEL_NAMES:
        run = zoo_run / "results" / "eval" / name / "fold_0" / "seed_0"
        metrics = json.loads((run / "metrics.json").read_text())
        bars = pl.read_parquet(run / "bars.parquet")
        forecaster = name not in AGENT_NAMES
        assert metrics["kind"] == ("forecaster" if forecaster else "agent")
        assert ({"prediction", "forward_return"} <= set(bars.columns)) == forecaster
        if forecaster:
            assert metrics["horizon"] == 1
            assert (
                bars["prediction"].dtype == pl.Float64 and bars["forward_return"].null_count() < bars.height
            )


def test_checkpoints_load_weights_only_and_train_logs_share_their_keys(zoo_run: Path) -> None:
    for name in MODEL_NAMES:
        run = zoo_run / "results" / "models" / name / "fold_0" / "seed_0"
        checkpoint = torch.load(run / "model.pt", weights_only=True)
        assert checkpoint["format"] == ("marketrl-agent" if name in AGENT_NAMES else "marketrl-model")
        log = json.loads((run / "train_log.json").read_text())
        shared = {"algo", "kind", "fold", "seed", "hparams", "total_steps", "wall_s", "validation", "history"}
        assert shared <= set(log) and log["algo"] == name
        assert log["history"] and any("val_sharpe" in record for record in log["history"])


def test_report_reads_every_model(zoo_run: Path) -> None:
    html = (zoo_run / "results" / "eval_report.html").read_text(encoding="utf-8")
    # the provenance section lists every file the report read
    read = [f"results/eval/{name}/fold_0/seed_0/metrics.json" for name in MODEL_NAMES]
    read += [f"results/models/{name}/fold_0/seed_0/train_log.json" for name in MODEL_NAMES]
    assert [path for path in read if path not in html] == []
