"""Gradient-boosted trees (the LightGBM library, CPU) on the flattened lookback window.

One boosting round is one step: ``settings.max_steps`` caps ``n_estimators``; every ``check_every`` rounds the
training and validation l2 are logged; every ``eval_every`` rounds the validation hook runs and early stopping
looks at the validation l2 (``patience`` validations without improvement stop it; the best round is kept).
The resume checkpoint holds the booster's model string and continues boosting from the saved round (with
``bagging_fraction < 1`` the bagging draws after a resume may differ from an uninterrupted run). Threads: torch's
thread count (the caller's setting). The trained checkpoint stores the booster as its model string.

`train_seeds` trains its seeds one after another in the same process (each with its own bagging and
feature-fraction seed, as `train` does); the validation hook is called per seed with a one-element list.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from marketrl.env import MarketData
from marketrl.loop.hparams import check_ranges, parse_hparams, require
from marketrl.loop.profile import ModelProfile, TrialSizes
from marketrl.models.base import (
    FORECASTER_TRIAL_OVERHEAD,
    CommonHParams,
    ModelSpec,
    Predictor,
    RunSettings,
    TrainedModel,
    TrainHooks,
    Trial,
    common_space,
    distinct_seeds,
)
from marketrl.models.supervised_data import SupervisedRows, training_rows

__all__ = ["PROFILE", "SPEC", "LightGBMHParams", "search_space"]


@dataclass(frozen=True)
class LightGBMHParams(CommonHParams):
    """LightGBM's own names where it has them."""

    window: int = 4
    n_estimators: int = 200
    learning_rate: float = 0.05
    num_leaves: int = 31
    min_data_in_leaf: int = 20
    feature_fraction: float = 1.0
    bagging_fraction: float = 1.0
    lambda_l2: float = 0.0

    def validate(self) -> None:
        """Ranges."""
        super().validate()
        check_ranges(self, at_least_one=("n_estimators", "min_data_in_leaf"), positive=("learning_rate",))
        check_ranges(
            self, unit_above_zero=("feature_fraction", "bagging_fraction"), non_negative=("lambda_l2",)
        )
        require(self.num_leaves >= 2, "num_leaves", "an integer >= 2", self.num_leaves)


def search_space(trial: Trial) -> dict[str, Any]:
    """Window, trading rule and the usual tree knobs. Windows up to 8 rows and up to 32 leaves: a round's
    histograms cost rows x columns per split, and window 8 with 128 leaves cost 5.5x the median trial
    (bench/speed/hyperopt_cost.py); 32 leaves on the demo's ~21k tuning rows is no tight limit."""
    return {
        **common_space(trial, 8),
        "n_estimators": trial.suggest_int("n_estimators", 50, 1000, log=True),
        "learning_rate": trial.suggest_float("learning_rate", 0.01, 0.2, log=True),
        "num_leaves": trial.suggest_int("num_leaves", 4, 32, log=True),
        "min_data_in_leaf": trial.suggest_int("min_data_in_leaf", 10, 500, log=True),
        "feature_fraction": trial.suggest_float("feature_fraction", 0.3, 1.0),
        "bagging_fraction": trial.suggest_float("bagging_fraction", 0.5, 1.0),
        "lambda_l2": trial.suggest_float("lambda_l2", 1e-6, 10.0, log=True),
    }


def _matrix(rows: SupervisedRows) -> tuple[np.ndarray, np.ndarray]:
    """Flattened windows [N, window·F] and targets [N] on the host (LightGBM trains on the CPU)."""
    windows, target = rows.batch(rows.rows)
    return windows.reshape(rows.n_rows, -1).cpu().numpy(), target.cpu().numpy().astype(np.float64)


def _params(hp: LightGBMHParams, seed: int) -> dict[str, Any]:
    return {
        "objective": "regression",
        "learning_rate": hp.learning_rate,
        "num_leaves": hp.num_leaves,
        "min_data_in_leaf": hp.min_data_in_leaf,
        "feature_fraction": hp.feature_fraction,
        "bagging_fraction": hp.bagging_fraction,
        "bagging_freq": 1 if hp.bagging_fraction < 1 else 0,
        "lambda_l2": hp.lambda_l2,
        "seed": seed,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": torch.get_num_threads(),
        "verbosity": -1,
    }


def _predictor(booster: Any, iterations: int | None) -> Predictor:
    def predict(windows: torch.Tensor) -> torch.Tensor:
        flat = windows.reshape(windows.shape[0], -1).cpu().numpy()
        values = booster.predict(flat, num_iteration=iterations)
        return torch.as_tensor(np.asarray(values, dtype=np.float32), device=windows.device)

    return predict


def _trained(
    hp: LightGBMHParams,
    n_features: int,
    booster: Any,
    iterations: int | None,
    settings: dict[str, Any],
    log: dict[str, Any],
) -> TrainedModel:
    return TrainedModel(
        name="lightgbm",
        hparams=dataclasses.asdict(hp),
        n_features=n_features,
        predictor=_predictor(booster, iterations),
        state={"booster": booster.model_to_string(num_iteration=iterations)},
        settings=settings,
        precision={"mode": "fp64"},
        log=log,
    )


def _train_one(
    train_data: MarketData,
    validation_data: MarketData | None,
    settings: RunSettings,
    hparams: Mapping[str, Any] | None,
    precision: Any = "fp32",
    device: torch.device | str = "cpu",
    seed: int = 0,
    hooks: TrainHooks | None = None,
) -> TrainedModel:
    """One seed of `train_seeds`: boost ``n_estimators`` rounds (capped by ``settings.max_steps``) on the CPU;
    ``precision`` does not apply; ``hooks.on_validation(step, [model]) -> [score]``."""
    import lightgbm

    hooks = hooks or TrainHooks()
    hp = parse_hparams(LightGBMHParams, hparams, "lightgbm")
    rows = training_rows(train_data, hp.window, settings.horizon)
    x, y = _matrix(rows)
    train_set = lightgbm.Dataset(x, y, free_raw_data=False)
    valid_sets, names = [train_set], ["train"]
    if validation_data is not None:
        val_rows = SupervisedRows.build(validation_data, hp.window, settings.horizon)
        if val_rows.n_rows:
            vx, vy = _matrix(val_rows)
            valid_sets.append(lightgbm.Dataset(vx, vy, reference=train_set))
            names.append("validation")
    rounds = min(hp.n_estimators, settings.max_steps or hp.n_estimators)
    n_features = train_data.n_features
    settings_dict = settings.to_dict()

    saved = hooks.checkpoint.load() if hooks.checkpoint is not None else None
    state: dict[str, Any] = {"best_loss": math.inf, "best_round": 0, "bad": 0, "history": [], "evals": []}
    init_model = None
    if saved is not None:
        state = {key: saved[key] for key in state}
        init_model = lightgbm.Booster(model_str=saved["booster"])
    done = init_model.current_iteration() if init_model is not None else 0

    def callback(env: Any) -> None:
        step = env.iteration + 1
        results = {f"{name}_{metric}": float(value) for name, metric, value, _ in env.evaluation_result_list}
        if step % settings.check_every == 0 or step == rounds:
            record = {"step": step, **results}
            state["history"].append(record)
            if hooks.log is not None:
                hooks.log(record)
        if (settings.eval_every and step % settings.eval_every == 0) or step == rounds:
            loss = results.get("validation_l2")
            if loss is not None and loss < state["best_loss"]:
                state.update(best_loss=loss, best_round=step, bad=0)
            elif loss is not None:
                state["bad"] += 1
            score = None
            if hooks.on_validation is not None:
                scores = hooks.on_validation(
                    step, [_trained(hp, n_features, env.model, step, settings_dict, {})]
                )
                score = None if scores is None else scores[0]
            state["evals"].append([step, score])
            if settings.patience and state["bad"] >= settings.patience:
                raise lightgbm.callback.EarlyStopException(
                    state["best_round"] - 1, env.evaluation_result_list
                )
        if hooks.checkpoint is not None and hooks.checkpoint.due(step) and step < rounds:
            hooks.checkpoint.save(step, {**state, "booster": env.model.model_to_string()}, [])

    booster = lightgbm.train(
        _params(hp, seed),
        train_set,
        num_boost_round=rounds - done,
        valid_sets=valid_sets,
        valid_names=names,
        init_model=init_model,
        callbacks=[callback],
        keep_training_booster=True,
    )
    best = state["best_round"] or None
    log = {
        "model": "lightgbm",
        "steps": booster.current_iteration(),
        "best_step": state["best_round"],
        "best_validation_loss": None if math.isinf(state["best_loss"]) else state["best_loss"],
        "train_rows": rows.n_rows,
        "evals": state["evals"],
        "history": state["history"],
    }
    return _trained(hp, n_features, booster, best, settings_dict, log)


def train_seeds(
    train_data: MarketData,
    validation_data: MarketData | None,
    settings: RunSettings,
    hparams: Mapping[str, Any] | None,
    precision: Any = "fp32",
    device: torch.device | str = "cpu",
    seeds: Sequence[int] = (0,),
    hooks: TrainHooks | None = None,
) -> list[TrainedModel]:
    """`_train_one` for each seed in turn (one process); ``hooks.on_validation(step, [model]) -> [score]`` per
    seed.

    The batch's resume checkpoint gets one part per seed next to it (`TrainingCheckpoint.part`,
    ``resume.seed{i}.pt``), removed once that seed is trained: a killed batch retrains its finished seeds and resumes
    the one it was training.
    """
    hooks = hooks or TrainHooks()
    models = []
    for position, seed in enumerate(distinct_seeds(seeds)):
        checkpoint = hooks.checkpoint.part(f"seed{position}") if hooks.checkpoint is not None else None
        one = dataclasses.replace(hooks, checkpoint=checkpoint)
        models.append(
            _train_one(train_data, validation_data, settings, hparams, precision, device, seed, one)
        )
        if checkpoint is not None:
            checkpoint.remove()
    return models


def load(checkpoint: Mapping[str, Any], device: torch.device | str = "cpu") -> TrainedModel:
    """Rebuild the booster from its model string."""
    import lightgbm

    hp = parse_hparams(LightGBMHParams, checkpoint["hparams"], "lightgbm")
    booster = lightgbm.Booster(model_str=checkpoint["state"]["booster"])
    return _trained(hp, int(checkpoint["n_features"]), booster, None, dict(checkpoint["settings"]), {})


def trial_cost(hp: Mapping[str, Any], s: TrialSizes) -> float:
    """A hyperopt trial's work (`ModelProfile.trial_cost`): each round builds histograms of rows x columns for
    each split; 4 -> 128 leaves cost 4.3x at window 8 (leaves^0.42: histogram subtraction and early stopping
    keep it far below linear)."""
    rounds = min(hp["n_estimators"], s.trial_updates)
    columns = hp["window"] * s.features * hp["feature_fraction"]
    work = rounds * s.train_rows * hp["bagging_fraction"] * columns * hp["num_leaves"] ** 0.42
    return FORECASTER_TRIAL_OVERHEAD + float(work)


#: Its cost-driving bounds and trial cost, small test sizes and docs row (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={
        "window": (1, 8),
        "n_estimators": (50, 1000),  # capped at hyperopt.trial_updates rounds in a trial
        "num_leaves": (4, 32),
        "feature_fraction": (0.3, 1.0),
        "bagging_fraction": (0.5, 1.0),
    },
    trial_cost=trial_cost,
    small={"window": 2, "n_estimators": 30, "min_data_in_leaf": 5, "num_leaves": 8},
    summary=(
        "LightGBM gradient-boosted trees (CPU, `deterministic`, `force_row_wise`, threads = torch's) on the "
        "flattened window"
    ),
    own_hyperparameters=(
        "`n_estimators` 50…1000, `learning_rate` 0.01…0.2, `num_leaves` 4…32, `min_data_in_leaf` 10…500, "
        "`feature_fraction` 0.3…1, `bagging_fraction` 0.5…1, `lambda_l2` 1e-6…10; window 1…8"
    ),
)
SPEC = ModelSpec(
    "lightgbm",
    LightGBMHParams,
    search_space,
    train_seeds,
    load,
    neural=False,
    profile=PROFILE,
)
