"""End to end: the tiny config runs the whole pipeline and produces every expected file, consistently.

The run is the session's shared finished run (tests/conftest.py `shared_run`: tests/configs/tiny.yaml, 2 folds of
both agents), so these tests only read it. That a second run has nothing to do is checked on a copy of the same run
by tests/test_dag_cache.py::test_unchanged_config_plans_nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import torch
import yaml

from marketrl.features import FEATURE_NAMES
from marketrl.settings.config import load_config
from marketrl.splits.folds import FoldPlan
from marketrl.workflow import pipeline
from tests.conftest import REPO_ROOT
from tests.test_workflow import TINY


def expected_outputs(config: dict) -> list[str]:
    files = [*pipeline.demo_outputs(config), *pipeline.feature_files(config)]
    files += ["results/features/manifest.json", "results/folds.json", "results/eval_report.html"]
    files += [f"results/hyperopt/{model}.json" for model in config["training"]["models"]]
    files += pipeline.model_files(config) + pipeline.train_log_files(config)
    for path in pipeline.eval_files(config):
        files += [path, path.replace("metrics.json", "bars.parquet")]
    return files


def test_every_expected_file_exists(shared_run: Path) -> None:
    config = load_config(TINY)
    missing = [path for path in expected_outputs(config) if not (shared_run / path).is_file()]
    assert missing == []
    leftovers = [str(p) for p in (shared_run / "results").rglob("*.tmp*")]
    assert leftovers == []  # atomic writes leave no temp files behind
    # one log and one benchmark per job: a features batch's, every train and evaluate job's
    batches = list(pipeline.feature_batches(config))
    job_files = [f"features/{batch}" for batch in batches]
    job_files += [
        f"{stage}/{model}/fold_{fold}"
        for stage in ("train", "evaluate")
        for model in config["training"]["models"]
        for fold in pipeline.fold_indices(config)
    ]
    for name in job_files:
        assert (shared_run / "results" / "logs" / f"{name}.log").is_file(), name
        assert (shared_run / "results" / "benchmarks" / f"{name}.tsv").is_file(), name


def test_feature_tables_follow_the_contract(shared_run: Path) -> None:
    table = pl.read_parquet(next((shared_run / "results" / "features").glob("*.parquet")))
    assert [c for c in table.columns if c in FEATURE_NAMES] == list(FEATURE_NAMES)
    assert all(table.schema[name] == pl.Float32 for name in FEATURE_NAMES)
    assert set(table["symbol"].unique()) == {"ES.c.0", "NQ.c.0"}


def test_test_days_never_in_tuning_or_training(shared_run: Path) -> None:
    plan = FoldPlan.load(shared_run / "results" / "folds.json")
    test_days = {day for fold in plan.folds for day in fold.test_days}
    assert test_days and not test_days & set(plan.tuning.days)
    for fold in plan.folds:
        assert max(fold.train_days) < min(fold.test_days)
    for model in ("dqn", "ppo"):
        study = json.loads((shared_run / f"results/hyperopt/{model}.json").read_text())
        assert study["tuning_window"]["last_day"] < str(min(test_days))


def test_hidden_dim_base_reaches_the_trained_network(shared_run: Path) -> None:
    expected = {
        "dqn": lambda b: {"q": [b, b // 2, b // 4]},
        "ppo": lambda b: {"policy": [b, b // 2], "value": [2 * b, b, b // 2]},
    }
    for model, shapes in expected.items():
        study = json.loads((shared_run / f"results/hyperopt/{model}.json").read_text())
        base = study["best_params"]["hidden_dim_base"]
        assert study["n_trials"] == 2 and len(study["trials"]) == 2
        for model_path in (shared_run / "results" / "models" / model).rglob("model.pt"):
            checkpoint = torch.load(model_path, weights_only=True)
            assert checkpoint["architecture"]["hidden"] == shapes(base)
            log = json.loads((model_path.parent / "train_log.json").read_text())
            assert log["hidden_sizes"] == shapes(base)
            assert log["precision"]["mode"] == "fp32"
            # The report's training curves read history records keyed by "step" (docs/OUTPUTS.md).
            assert log["history"] and all(isinstance(entry["step"], int) for entry in log["history"])
            assert any("val_sharpe" in entry for entry in log["history"])
            assert any("loss" in entry or "policy_loss" in entry for entry in log["history"])


def test_evaluation_outputs_are_consistent(shared_run: Path) -> None:
    plan = FoldPlan.load(shared_run / "results" / "folds.json")
    for metrics_path in (shared_run / "results" / "eval").rglob("metrics.json"):
        metrics = json.loads(metrics_path.read_text())
        bars = pl.read_parquet(metrics_path.with_name("bars.parquet"))
        fold = plan.fold(metrics["fold"])
        days = set(bars["trading_day"].unique())
        assert days <= set(fold.test_days)
        assert (bars["net_return"] - (bars["gross_return"] - bars["cost"])).abs().max() < 1e-12
    baselines = json.loads((shared_run / "results/eval/baselines/fold_0/metrics.json").read_text())
    assert set(baselines["strategies"]) == {"buy_and_hold", "flat", "momentum", "random"}
    assert baselines["strategies"]["flat"]["total_return"] == 0.0


def test_report_is_self_contained(shared_run: Path) -> None:
    html = (shared_run / "results" / "eval_report.html").read_text()
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    assert "ES.c.0" in html and "hidden_dim_base" in html
    assert (shared_run / "results" / "eval_report.html").stat().st_size < 5 * 1024 * 1024


def test_tiny_config_is_valid() -> None:
    assert load_config(TINY)["training"]["device"] == "cpu"
    assert yaml.safe_load((REPO_ROOT / "tests/configs/tiny.yaml").read_text())["seed"] == 11
