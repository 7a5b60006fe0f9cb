"""One registry over every model: train, evaluate and hyperopt dispatch by name, for agents and forecasters alike.

The train and evaluate jobs run on a tiny random feature table (as in tests/test_evaluation.py) with tiny budgets;
the forecasters' evaluation contract (kind, horizon, prediction and forward_return columns) is checked against
values computed here from the test rows.
"""

from __future__ import annotations

import copy
import json
import statistics

import numpy as np
import optuna
import polars as pl
import pytest
import torch

from gpu_utils import HardwareBudget, detect_precision
from marketrl.evaluation.evaluate import evaluate_job
from marketrl.features import FEATURE_NAMES
from marketrl.models import MODELS, load_model
from marketrl.settings.registry import MODEL_NAMES
from marketrl.splits.datasets import fold_window, load_features, tuning_window
from marketrl.splits.folds import FoldPlan
from marketrl.splits.normalize import FeatureNormalizer
from marketrl.training.hyperopt import run_trial
from marketrl.training.train import train_job
from marketrl.training.zoo import ZOO, get_entry
from tests.support.runs import TINY_DQN_HPARAMS, synthetic_job_inputs

HPARAMS = {
    "dqn": TINY_DQN_HPARAMS,
    "linear": {"window": 3, "alpha": 0.1},
    "mlp": {"window": 3, "hidden_dim_base": 8, "batch_size": 32},
    "lightgbm": {"window": 2, "n_estimators": 30, "min_data_in_leaf": 5, "num_leaves": 4},
}
HORIZON = 3
# what the report's training section reads from every train_log.json, whatever the model
TRAIN_LOG_KEYS = {
    "algo",
    "kind",
    "fold",
    "seed_index",
    "seed",
    "hparams",
    "precision",
    "device",
    "total_steps",
    "wall_s",
    "validation",
    "history",
    "steps_per_s",
    "provenance",
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny feature table, its fold plan and a config with tiny budgets for both kinds of model."""
    root = tmp_path_factory.mktemp("zoo")
    _, manifest, folds, config = synthetic_job_inputs(root, n_instruments=2)
    config["env"].update(window=2, episode_length=16)
    config["training"].update(
        total_steps=256, n_envs=4, checkpoint_every=10_000, horizon=HORIZON, max_updates=20, check_every=5
    )
    config["hyperopt"].update(trial_steps=256, trial_updates=10)
    return {"root": root, "config": config, "manifest_path": str(manifest), "folds_path": str(folds)}


def run_jobs(inputs: dict, model: str) -> dict:
    """The train job, then the evaluate job, of `model` on fold 0; their outputs."""
    out = inputs["root"] / model
    out.mkdir(exist_ok=True)
    hparams = out / "hparams.json"
    hparams.write_text(json.dumps({"algo": model, "best_params": HPARAMS[model]}), encoding="utf-8")
    paths = {"manifest_path": inputs["manifest_path"], "folds_path": inputs["folds_path"]}
    train_log = train_job(
        model=model,
        fold=0,
        seed_indices=[0],
        hparams_path=str(hparams),
        config=inputs["config"],
        model_paths=[str(out / "model.pt")],
        log_paths=[str(out / "train_log.json")],
        resume_path=str(out / "resume.pt"),
        **paths,
    )[0]
    (metrics,) = evaluate_job(
        model=model,
        fold=0,
        seed_indices=[0],
        model_paths=[str(out / "model.pt")],
        config=inputs["config"],
        metrics_paths=[str(out / "metrics.json")],
        bars_paths=[str(out / "bars.parquet")],
        **paths,
    )
    return {
        "train_log": train_log,
        "metrics": metrics,
        "bars": pl.read_parquet(out / "bars.parquet"),
        "model": out / "model.pt",
    }


@pytest.fixture(scope="module")
def runs(inputs: dict) -> dict:
    return {model: run_jobs(inputs, model) for model in HPARAMS}


def test_registry_holds_every_config_model_in_config_order() -> None:
    assert tuple(ZOO) == MODEL_NAMES  # tests/test_registry.py checks every other list of names
    assert {name for name, entry in ZOO.items() if entry.kind == "forecaster"} == set(MODELS)
    assert get_entry("lstm").kind == "forecaster" and get_entry("ppo").kind == "agent"
    with pytest.raises(KeyError, match="unknown model 'a2c' \\(known: dqn, ppo, linear, lightgbm"):
        get_entry("a2c")


@pytest.mark.parametrize("model", list(HPARAMS))
def test_train_log_has_the_same_top_level_keys_for_every_model(runs: dict, model: str) -> None:
    log = runs[model]["train_log"]
    assert TRAIN_LOG_KEYS <= set(log)
    assert log["kind"] == get_entry(model).kind
    assert log["history"] and all(isinstance(record["step"], int) for record in log["history"])
    assert log["validation"] and all({"step", "val_sharpe"} <= set(r) for r in log["validation"])
    assert any("val_sharpe" in record for record in log["history"])
    if model in ("dqn", "mlp"):
        assert any("loss" in record for record in log["history"])


@pytest.mark.parametrize("model", ["linear", "mlp", "lightgbm"])
def test_forecaster_checkpoint_is_weights_only_and_carries_what_evaluation_needs(
    runs: dict, model: str
) -> None:
    checkpoint = torch.load(runs[model]["model"], weights_only=True)
    assert checkpoint["format"] == "marketrl-model" and checkpoint["model"] == model
    extra = checkpoint["extra"]
    assert {"normalizer", "feature_names", "fold", "seed_index", "seed", "costs", "env"} <= set(extra)
    assert extra["feature_names"] == list(FEATURE_NAMES) and extra["fold"] == 0
    assert checkpoint["settings"]["horizon"] == HORIZON


@pytest.mark.parametrize("model", ["linear", "mlp", "lightgbm"])
def test_forecaster_evaluation_carries_predictions_and_realized_forward_returns(
    inputs: dict, runs: dict, model: str
) -> None:
    metrics, bars = runs[model]["metrics"], runs[model]["bars"]
    assert metrics["kind"] == "forecaster" and metrics["horizon"] == HORIZON
    assert bars.schema["prediction"] == pl.Float64 and bars.schema["forward_return"] == pl.Float64
    # Recompute both columns from the test rows: the decision bar's close and the close h bars later.
    forecaster = load_model(runs[model]["model"])
    checkpoint = torch.load(runs[model]["model"], weights_only=True)
    normalizer = FeatureNormalizer.from_state_dict(checkpoint["extra"]["normalizer"])
    plan = FoldPlan.load(inputs["folds_path"])
    window = fold_window(
        load_features(inputs["manifest_path"]), plan, 0, inputs["config"], "cpu", splits=("test",)
    )
    data = window.splits["test"]
    assert normalizer.feature_names == window.feature_names
    decision = np.flatnonzero(data.is_decision.numpy())
    assert bars.height == decision.size
    np.testing.assert_allclose(
        bars["prediction"].to_numpy(), forecaster.predict(data).numpy()[decision], rtol=1e-6
    )
    close = data.close.double().numpy()
    segment = data.segment_id.numpy()
    expected = [
        close[t + HORIZON] / close[t] - 1.0
        if t + HORIZON < close.size and segment[t + HORIZON] == segment[t]
        else None
        for t in decision
    ]
    realized = bars["forward_return"].to_list()
    assert [value is None for value in realized] == [value is None for value in expected]
    assert sum(value is None for value in realized) >= HORIZON - 1  # each segment's last bars have no target
    pairs = [(r, e) for r, e in zip(realized, expected, strict=True) if e is not None]
    np.testing.assert_allclose([r for r, _ in pairs], [e for _, e in pairs], rtol=1e-9)
    # the same matched random traders and summary as an agent's metrics
    assert (
        len(metrics["matched_random"]["per_seed"]) == inputs["config"]["evaluation"]["random_baseline_seeds"]
    )


def test_agent_evaluation_keeps_its_bars_and_says_agent(runs: dict) -> None:
    metrics, bars = runs["dqn"]["metrics"], runs["dqn"]["bars"]
    assert metrics["kind"] == "agent" and "horizon" not in metrics
    assert "prediction" not in bars.columns and "forward_return" not in bars.columns
    assert metrics["model"]["hidden"] == {"q": [8, 4, 2]}


def test_forecaster_evaluation_refuses_a_config_that_charges_differently(inputs: dict, runs: dict) -> None:
    config = copy.deepcopy(inputs["config"])
    config["env"]["fill"] = "next_open" if config["env"]["fill"] == "close" else "close"
    with pytest.raises(ValueError, match=r"config key 'env\.fill'"):
        evaluate_job(
            model="linear",
            fold=0,
            seed_indices=[0],
            model_paths=[str(runs["linear"]["model"])],
            config=config,
            metrics_paths=[str(inputs["root"] / "bad" / "metrics.json")],
            bars_paths=[str(inputs["root"] / "bad" / "bars.parquet")],
            manifest_path=inputs["manifest_path"],
            folds_path=inputs["folds_path"],
        )
    assert not (inputs["root"] / "bad").exists()


# ------------------------------------------------------------------------------------------------------ hyperopt


def trial_value(inputs: dict, model: str, seeds: int, pruner: optuna.pruners.BasePruner | None = None):
    """One hyperopt trial of `model` with `seeds` seeds on the tuning window; (study, frozen trial)."""
    config = copy.deepcopy(inputs["config"])
    config["hyperopt"]["seeds_per_trial"] = seeds
    device = torch.device("cpu")
    plan = FoldPlan.load(inputs["folds_path"])
    window = tuning_window(load_features(inputs["manifest_path"]), plan, config, device)
    budget = HardwareBudget.detect(device)
    space = get_entry(model).search_space(budget, window, config)
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=1), pruner=pruner
    )
    trial = study.ask()
    try:
        value = run_trial(
            trial, model, window, config, device, detect_precision(device, "fp32"), space, budget
        )
    except optuna.TrialPruned:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, value)
    return study.trials[0]


def test_seeds_per_trial_scores_the_median_and_records_every_seed(inputs: dict) -> None:
    one = trial_value(inputs, "mlp", 1)
    three = trial_value(inputs, "mlp", 3)
    assert one.params == three.params  # same sampler seed, same space
    scores = three.user_attrs["seed_scores"]
    assert len(scores) == 3 and three.value == pytest.approx(statistics.median(scores))
    assert one.user_attrs["seed_scores"] == [one.value]
    # seed 0 of a three-seed trial is the one-seed trial's run; the seeds train as one batch, so each validation
    # round reports once: the median of the seeds' scores
    assert scores[0] == pytest.approx(one.value)
    assert len(three.intermediate_values) == len(one.intermediate_values)


@pytest.mark.parametrize("model", ["mlp", "lightgbm", "dqn"])
def test_periodic_validation_scores_reach_the_pruner(inputs: dict, model: str) -> None:
    # A threshold no Sharpe reaches: the first report after the warm-up prunes the trial.
    pruned = trial_value(inputs, model, 1, optuna.pruners.ThresholdPruner(lower=1e9))
    assert pruned.state == optuna.trial.TrialState.PRUNED
    assert len(pruned.intermediate_values) == 1


@pytest.mark.parametrize("model", ["mlp", "lightgbm"])
def test_forecaster_train_job_saves_and_removes_its_resume_file(inputs: dict, model: str) -> None:
    config = copy.deepcopy(inputs["config"])
    config["training"]["checkpoint_every"] = 4  # in the model's own steps: optimizer steps / boosting rounds
    out = inputs["root"] / f"resume_{model}"
    out.mkdir()
    hparams = out / "hparams.json"
    hparams.write_text(json.dumps({"algo": model, "best_params": HPARAMS[model]}), encoding="utf-8")
    log = train_job(
        model=model,
        fold=0,
        seed_indices=[0],
        manifest_path=inputs["manifest_path"],
        folds_path=inputs["folds_path"],
        hparams_path=str(hparams),
        config=config,
        model_paths=[str(out / "model.pt")],
        log_paths=[str(out / "train_log.json")],
        resume_path=str(out / "resume.pt"),
    )[0]
    assert log["checkpoints_saved"] >= 1 and log["resumed_from_step"] is None
    assert (out / "model.pt").is_file() and not (out / "resume.pt").exists()
