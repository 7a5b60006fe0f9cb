"""Gradient-boosted trees (the LightGBM library, CPU) on the flattened lookback window.

One boosting round is one step: ``settings.max_steps`` caps ``n_estimators``; every ``check_every`` rounds the
training and validation l2 are logged; every ``eval_every`` rounds the validation hook runs and early stopping
looks at the validation l2 (``patience`` validations without improvement stop it; the best round is kept).
The resume checkpoint holds the booster's model string and continues boosting from the saved round (with
``bagging_fraction < 1`` the bagging draws after a resume may differ from an uninterrupted run). Threads: torch's
thread count (the caller's setting). The trained checkpoint stores the booster as its model string.

`train_seeds` trains its seeds one after another in the same process (each with its own bagging and
feature-fraction seed) on one binned Dataset built once for them all; the validation hook is called per seed with
a one-element list. ``settings.max_train_rows`` caps the rows of the flattened matrix (a uniform sample of the
window), which bounds the job's memory: rows x window x features float32 cells, held once.
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


def _params(hp: LightGBMHParams, seed: int, data_seed: int) -> dict[str, Any]:
    """A seed's parameters. ``data_seed`` (LightGBM's bin-sampling seed) is the same for every seed of a batch:
    they share one binned Dataset, which refuses parameters that would bin it differently."""
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
        "data_random_seed": data_seed,
        "deterministic": True,
        "force_row_wise": True,
        "num_threads": torch.get_num_threads(),
        "verbosity": -1,
    }


@dataclass
class _Matrices:
    """A batch's training (and validation) rows as host matrices and as the one binned Dataset pair every seed
    trains on: the rows are gathered and binned once, not once a seed, and a finished seed's booster keeps no
    training data (``keep_training_booster=False``), so the job's memory does not grow with its seeds."""

    x: np.ndarray
    y: np.ndarray
    validation: tuple[np.ndarray, np.ndarray] | None
    params: dict[str, Any]  # the Datasets' construction parameters
    n_rows: int
    shared: tuple[Any, Any | None] | None = None

    @classmethod
    def build(
        cls,
        train_data: MarketData,
        validation_data: MarketData | None,
        hp: LightGBMHParams,
        settings: RunSettings,
        params: dict[str, Any],
    ) -> _Matrices:
        """The training rows (``settings.max_train_rows`` caps them) and the validation split's rows, flattened."""
        rows = training_rows(train_data, hp.window, settings.horizon, settings.max_train_rows)
        x, y = _matrix(rows)
        validation = None
        if validation_data is not None:
            val_rows = SupervisedRows.build(validation_data, hp.window, settings.horizon)
            validation = _matrix(val_rows) if val_rows.n_rows else None
        return cls(x, y, validation, params, rows.n_rows)

    def datasets(self, private: bool = False) -> tuple[Any, Any | None]:
        """(train, validation or None) Datasets, binned on the training rows: the shared pair, built once and
        without LightGBM's copy of the raw rows; ``private``: a fresh pair that keeps them (a resumed booster sets
        its initial scores from the raw rows)."""
        import lightgbm

        if not private and self.shared is not None:
            return self.shared
        train_set = lightgbm.Dataset(
            self.x, self.y, params=self.params, free_raw_data=not private
        ).construct()
        valid_set = None
        if self.validation is not None:
            vx, vy = self.validation
            valid_set = lightgbm.Dataset(
                vx, vy, params=self.params, reference=train_set, free_raw_data=not private
            ).construct()
        if not private:
            self.shared = (train_set, valid_set)
        return train_set, valid_set


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
    matrices: _Matrices,
    n_features: int,
    settings: RunSettings,
    hp: LightGBMHParams,
    seed: int,
    hooks: TrainHooks,
) -> TrainedModel:
    """One seed of `train_seeds`: boost ``n_estimators`` rounds (capped by ``settings.max_steps``) on the batch's
    shared Datasets (a resumed seed on its own pair); ``hooks.on_validation(step, [model]) -> [score]``."""
    import lightgbm

    rounds = min(hp.n_estimators, settings.max_steps or hp.n_estimators)
    settings_dict = settings.to_dict()
    saved = hooks.checkpoint.load() if hooks.checkpoint is not None else None
    state: dict[str, Any] = {"best_loss": math.inf, "best_round": 0, "bad": 0, "history": [], "evals": []}
    init_model = None
    if saved is not None:
        state = {key: saved[key] for key in state}
        init_model = lightgbm.Booster(model_str=saved["booster"])
    done = init_model.current_iteration() if init_model is not None else 0
    train_set, valid_set = matrices.datasets(private=init_model is not None)
    valid_sets, names = [train_set], ["train"]
    if valid_set is not None:
        valid_sets.append(valid_set)
        names.append("validation")

    boosted = [done]  # rounds boosted so far (the returned booster holds only those up to the best round)

    def callback(env: Any) -> None:
        step = env.iteration + 1
        boosted[0] = step
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
        _params(hp, seed, matrices.params["data_random_seed"]),
        train_set,
        num_boost_round=rounds - done,
        valid_sets=valid_sets,
        valid_names=names,
        init_model=init_model,
        callbacks=[callback],
        keep_training_booster=False,
    )
    best = state["best_round"] or None
    log = {
        "model": "lightgbm",
        "steps": boosted[0],
        "best_step": state["best_round"],
        "best_validation_loss": None if math.isinf(state["best_loss"]) else state["best_loss"],
        "train_rows": matrices.n_rows,
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
    """Boost one booster per seed, one after another in this process, on one shared binned Dataset (each seed
    with its own bagging and feature-fraction seed; ``precision`` does not apply: the CPU library's float64);
    ``hooks.on_validation(step, [model]) -> [score]`` per seed.

    The batch's resume checkpoint gets one part per seed next to it (`TrainingCheckpoint.part`,
    ``resume.seed{i}.pt``), removed once that seed is trained: a killed batch retrains its finished seeds and resumes
    the one it was training.
    """
    hooks = hooks or TrainHooks()
    seeds = distinct_seeds(seeds)
    hp = parse_hparams(LightGBMHParams, hparams, "lightgbm")
    params = _params(hp, seeds[0], seeds[0])
    matrices = _Matrices.build(train_data, validation_data, hp, settings, params)
    models = []
    for position, seed in enumerate(seeds):
        checkpoint = hooks.checkpoint.part(f"seed{position}") if hooks.checkpoint is not None else None
        one = dataclasses.replace(hooks, checkpoint=checkpoint)
        models.append(_train_one(matrices, train_data.n_features, settings, hp, seed, one))
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
