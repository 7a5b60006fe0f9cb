"""The model protocol every zoo model follows: its hyperparameter space, a `train` call, a checkpoint of plain
data and a trained model that turns a split's bars into target positions for the existing evaluation.

`ModelSpec` is the one spec type of every model: a forecaster is one (see `marketrl.models.MODELS`), an RL agent
its subclass `marketrl.agents.spec.AgentSpec`. A forecaster's:

    spec.search_space(trial) -> hparams dict      # trial: anything with suggest_int/_float/_categorical (optuna)
    spec.train_seeds(train_data, validation_data, settings, hparams, precision, device, seeds, hooks)
        -> [TrainedModel per seed]                # the only training entry: S seeds (one seed is a batch of one;
                                                  # torch: one vectorized computation)
    spec.load(checkpoint_dict, device) -> TrainedModel
    spec.save(path, model, *, hparams, precision, normalizer, feature_names, env, extra)   # every model's pair
    spec.load_path(path, device) -> (model, meta)                                          # by path

`TrainedRun` is the one result type (an agent's `TrainResult` and a forecaster's `TrainedModel` both have it).

``spec.deterministic``: the seeds cannot differ (ridge); ``train_seeds`` then trains once and returns one model.

`TrainedModel.predict(data)` gives one predicted forward return per row (0 where the model's lookback window is
not full); `TrainedModel.positions(data)` applies the cost-aware trading rule; the result goes to
`marketrl.env.evaluate_positions` / `position_results`, the same fills and costs the agents are scored with.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from marketrl.env import EnvConfig, FillMode, MarketData
from marketrl.loop.profile import ModelProfile
from marketrl.loop.resume import TrainingCheckpoint

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_VERSION",
    "FORECASTER_TRIAL_OVERHEAD",
    "CommonHParams",
    "ModelSpec",
    "NeuralHParams",
    "RunSettings",
    "SeedsValidationCallback",
    "TrainHooks",
    "TrainSeedsFn",
    "TrainedModel",
    "TrainedRun",
    "Trial",
    "check_checkpoint",
    "common_space",
    "distinct_seeds",
    "load_trained_model",
    "neural_space",
    "save_model",
    "save_trained_model",
    "sequence_space",
]

CHECKPOINT_FORMAT = "marketrl-model"
CHECKPOINT_VERSION = 1


class Trial(Protocol):
    """What a search space needs from a hyperopt trial (an `optuna.Trial` fits; no optuna import here)."""

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...


@dataclass(frozen=True)
class CommonHParams:
    """Hyperparameters every model has: its own lookback window (rows t-window+1..t of one segment, independent
    of env.window) and the trading rule's threshold multiplier and hold band (see `trading_rule`)."""

    window: int = 8
    threshold_multiplier: float = 1.0
    hold_band: float = 1.0

    def validate(self) -> None:
        """Raise `HParamError` for a value out of range (called by `parse_hparams`)."""
        from marketrl.loop.hparams import check_ranges

        check_ranges(self, at_least_one=("window",), non_negative=("threshold_multiplier",))
        check_ranges(self, unit_above_zero=("hold_band",))


@dataclass(frozen=True)
class NeuralHParams(CommonHParams):
    """Hyperparameters of every torch model trained by `supervised_trainer.train_torch_seeds`."""

    hidden_dim_base: int = 32
    learning_rate: float = 1e-3
    batch_size: int = 256
    weight_decay: float = 0.0
    dropout: float = 0.0
    max_grad_norm: float | None = 1.0

    def validate(self) -> None:
        """Ranges of the shared neural hyperparameters."""
        from marketrl.loop.hparams import check_ranges, require

        super().validate()
        check_ranges(self, positive=("learning_rate",), non_negative=("weight_decay",))
        check_ranges(self, at_least_one=("batch_size",), positive_or_null=("max_grad_norm",))
        require(self.hidden_dim_base >= 4, "hidden_dim_base", "an integer >= 4", self.hidden_dim_base)
        require(0 <= self.dropout < 1, "dropout", "a number in [0, 1)", self.dropout)


def zero_head(layer: torch.nn.Linear) -> torch.nn.Linear:
    """Zero an output layer: the untrained forecaster predicts the normalized target's mean (0), the untrained DQN's
    learned part is 0 (its cost prior keeps the position), so neither trades until the data move it, instead of
    turning its random features into trades; the head learns first, the layers below as soon as it is non-zero
    (docs/PERFORMANCE.md "Do no harm")."""
    torch.nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        torch.nn.init.zeros_(layer.bias)
    return layer


def common_space(trial: Trial, max_window: int = 32, min_window: int = 1) -> dict[str, Any]:
    """The shared part of every search space: lookback window, threshold multiplier, hold band."""
    return {
        "window": trial.suggest_int("window", min_window, max_window, log=True),
        "threshold_multiplier": trial.suggest_float("threshold_multiplier", 0.25, 4.0, log=True),
        "hold_band": trial.suggest_float("hold_band", 0.2, 1.0),
    }


NEURAL_WIDTHS = (16, 32, 64, 128)
#: Widths and windows of the models whose step costs window x width^2 (recurrent, attention, convolution): at
#: a fixed step budget a trial's cost grows with both, and the corner (window 32, width 128) cost more than 40x
#: the median trial (bench/speed/hyperopt_cost.py); these keep every corner within 4x of the median (docs/HYPEROPT.md).
SEQUENCE_WIDTHS = (16, 32)
SEQUENCE_WINDOW = (2, 8)


def neural_space(
    trial: Trial, max_window: int = 32, widths: tuple[int, ...] = NEURAL_WIDTHS, min_window: int = 1
) -> dict[str, Any]:
    """`common_space` plus the shared neural hyperparameters (width, optimizer, batch, regularization)."""
    return {
        **common_space(trial, max_window, min_window),
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", list(widths)),
        "learning_rate": trial.suggest_float("learning_rate", 1e-4, 3e-3, log=True),
        "batch_size": trial.suggest_categorical("batch_size", [128, 256, 512, 1024]),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        "dropout": trial.suggest_float("dropout", 0.0, 0.3),
    }


def sequence_space(trial: Trial) -> dict[str, Any]:
    """`neural_space` with the bounded windows and widths of the sequence models (`SEQUENCE_WIDTHS`)."""
    low, high = SEQUENCE_WINDOW
    return neural_space(trial, max_window=high, widths=SEQUENCE_WIDTHS, min_window=low)


@dataclass(frozen=True)
class RunSettings:
    """Run settings (not tuned): what is predicted, the budget and the cadences.

    costs: the run's `costs` config slice (plain data, recorded in the checkpoint); the trading rule's threshold
      is its round-trip cost at the close price. Empty: the `MarketData`'s own per-row cost fractions.
    fill: env.fill, recorded with the model (evaluation must use the same fill).
    horizon: bars of the forward return the models predict, close_{t+h}/close_t - 1.
    epochs / max_steps: passes over the training rows; max_steps (optimizer steps or boosting rounds) caps them.
    max_train_rows: at most this many training rows, a uniform sample of the window's rows that is the same for every
      seed (`marketrl.models.supervised_data.training_rows`); None: all. Bounds memory and time per fold.
    check_every: optimizer steps between statistics reads (the loop's one host read, and the NaN guard).
    eval_every: steps between validations (0: only at the end); patience: validations without improvement of
      the validation loss before early stopping (0: never stop early).
    """

    costs: Mapping[str, Any] = field(default_factory=dict)
    fill: FillMode = "close"
    horizon: int = 1
    epochs: int = 10
    max_steps: int | None = None
    max_train_rows: int | None = None
    check_every: int = 100
    eval_every: int = 0
    patience: int = 0

    def __post_init__(self) -> None:
        from marketrl.loop.hparams import AgentConfigError, check_run_setting

        for key, minimum in (("horizon", 1), ("epochs", 1), ("check_every", 1), ("eval_every", 0)):
            check_run_setting(key, getattr(self, key), minimum)
        check_run_setting("patience", self.patience, 0)
        if self.max_steps is not None:
            check_run_setting("max_steps", self.max_steps, 1)
        if self.max_train_rows is not None:
            check_run_setting("max_train_rows", self.max_train_rows, 1)
        if self.fill not in ("close", "next_open"):
            raise AgentConfigError(f"training.fill: expected 'close' or 'next_open', got {self.fill!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data for checkpoints and logs."""
        return {**dataclasses.asdict(self), "costs": dict(self.costs)}


#: on_validation(step, models) -> one score per seed, or None; may raise to stop the whole batch. A model is None
#: where its seed is not validated at this step (folds on the batch axis: its fold's run is between validations
#: or over); its score is then None too.
SeedsValidationCallback = Callable[[int, list["TrainedModel | None"]], list[float | None] | None]


@dataclass
class TrainHooks:
    """What the caller plugs into a training run.

    log: receives each statistics record as it is read (progress logging); records also land in the result log.
      In a run of several seeds (``train_seeds``) it gets one record per seed, each with a ``"seed"`` key.
    on_validation: called at every periodic validation with the models as they stand; may raise to prune:
      ``on_validation(step, models) -> [score per seed] | None`` (`SeedsValidationCallback`):
      ``models`` holds one snapshot per seed, in the order of ``seeds``, and the scores come back in that order
      (None for a seed not validated at this step: folds on the batch axis validate each fold on its own
      schedule). A trainer that runs its seeds one after another (lightgbm) calls it per seed with a one-element list.
    checkpoint: the resume file of this run (`marketrl.loop.resume.TrainingCheckpoint`, cadence in steps); one
      file for a whole batch of seeds.
    budget: the device's `gpu_utils.HardwareBudget` (detected when None).
    """

    log: Callable[[dict[str, Any]], None] | None = None
    on_validation: SeedsValidationCallback | None = None
    checkpoint: TrainingCheckpoint | None = None
    budget: Any = None


#: windows [N, window, F] float32 -> predicted forward returns [N] float32 (same device)
Predictor = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class TrainedModel:
    """A trained model: its predictor, what its checkpoint holds and the run's log.

    state: the model-specific part of the checkpoint (torch: ``state_dict``; LightGBM: ``booster`` model string;
    ridge: ``weights``), plain data only.
    """

    name: str
    hparams: dict[str, Any]
    n_features: int
    predictor: Predictor
    state: dict[str, Any]
    settings: dict[str, Any]
    precision: dict[str, Any] = field(default_factory=dict)
    log: dict[str, Any] = field(default_factory=dict)
    #: the torch module behind ``predictor`` (windows [B, window, F] -> predictions [B] float32, fp32), for
    #: `marketrl.training.export`; None for a model that is not torch (LightGBM exports its booster instead)
    module: torch.nn.Module | None = None

    @property
    def window(self) -> int:
        """The model's lookback window in rows."""
        return int(self.hparams["window"])

    def predict(self, data: MarketData, chunk: int | None = None) -> torch.Tensor:
        """Predicted forward return per row [T] float32 on the data's device; 0 where the window is not full;
        `chunk` rows per forward (default `PREDICT_CHUNK`)."""
        from marketrl.models.supervised_data import PREDICT_CHUNK, predict_rows

        if data.n_features != self.n_features:
            raise ValueError(
                f"features: {self.name} was trained on {self.n_features} features, the data has {data.n_features}"
            )
        return predict_rows(self.predictor, data, self.window, chunk or PREDICT_CHUNK)

    def positions(self, data: MarketData, predictions: torch.Tensor | None = None) -> torch.Tensor:
        """Target positions [T] in {-1, 0, 1} by the cost-aware trading rule of this model's hyperparameters;
        ``predictions``: this model's `predict` of ``data``, when the caller has it already (one inference)."""
        from marketrl.models.trading_rule import TradingRule, cost_model

        rule = TradingRule(self.hparams["threshold_multiplier"], self.hparams["hold_band"])
        costs = self.settings.get("costs")
        predicted = self.predict(data) if predictions is None else predictions
        return rule.positions(predicted, data, cost_model(costs) if costs else None)

    @property
    def steps_run(self) -> int:
        """The optimizer steps (boosting rounds) the run made: its budget is only a cap (early stopping)."""
        return int(self.log.get("steps", 0))

    def run_positions(self, data: MarketData, env_config: EnvConfig) -> torch.Tensor:
        """`positions` (`TrainedRun`): the trading rule needs no env settings."""
        return self.positions(data)

    def evaluate(self, data: MarketData, env_config: EnvConfig | None = None) -> pl.DataFrame:
        """The per-bar evaluation frame of `marketrl.env.evaluate_positions` (same fills and costs as the agents'
        `evaluate`); the env's fill must be the one the model was trained for."""
        from marketrl.env import evaluate_positions

        config = env_config or EnvConfig(max_gap=data.max_gap, fill=self.settings.get("fill", "close"))
        if config.fill != self.settings.get("fill", config.fill):
            raise ValueError(
                f"env.fill: {self.name} was trained for fill {self.settings['fill']!r}, evaluation uses {config.fill!r}"
            )
        return evaluate_positions(data, self.positions(data), config)

    def checkpoint(self, **extra: Any) -> dict[str, Any]:
        """The checkpoint dict (plain data: `torch.load(weights_only=True)` reads it back); ``extra`` is the
        caller's plain data (fold, seed, normalizer state, feature names...)."""
        from marketrl.loop.resume import to_cpu

        return {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "model": self.name,
            "hparams": dict(self.hparams),
            "n_features": self.n_features,
            "settings": dict(self.settings),
            "precision": dict(self.precision),
            "state": to_cpu(self.state),
            "extra": dict(extra),
        }


#: train_seeds(train_data, validation_data, settings, hparams, precision, device, seeds: Sequence[int],
#:             hooks: TrainHooks | None = None) -> one TrainedModel per seed, in the order of ``seeds``
TrainSeedsFn = Callable[..., list[TrainedModel]]
LoadFn = Callable[[Mapping[str, Any], torch.device | str], TrainedModel]
#: save(spec, path, result, *, hparams, precision, normalizer, feature_names, env, extra): one trained run's
#: checkpoint file, written atomically in the model kind's own format
SaveFn = Callable[..., None]
#: load(spec, path, device) -> (result, meta): a checkpoint file read back (see `ModelSpec.load_path`)
LoadPathFn = Callable[["ModelSpec", "str | os.PathLike[str]", torch.device], tuple[Any, dict[str, Any]]]


class TrainedRun(Protocol):
    """The one result type the zoo sees, whichever the kind: an agent's `marketrl.agents.results.TrainResult`
    and a forecaster's `TrainedModel` both have it (trained or read back by `ModelSpec.load_path`).

    run_positions(data, env_config): target positions [T] in {-1, 0, 1} on ``data``; steps_run: the steps the
    run made where its budget is only a cap (a forecaster's early stopping), None where it always runs its budget.
    """

    hparams: dict[str, Any]
    log: dict[str, Any]

    @property
    def steps_run(self) -> int | None: ...

    def run_positions(self, data: MarketData, env_config: EnvConfig) -> torch.Tensor: ...


@dataclass(frozen=True)
class ModelSpec:
    """The one spec type of every model (`marketrl.settings.registry.REGISTRY`): name, hyperparameter dataclass,
    search space, train_seeds (S seeds in one call, the only training entry), one save/load pair by path
    (`save`, `load_path`), determinism and profile. A forecaster is a `ModelSpec` itself (``kind``
    "forecaster"); an RL agent is its subclass `marketrl.agents.spec.AgentSpec` (``kind`` "agent").

    train_seeds: a forecaster's ``train_seeds(train_data, validation_data, settings, hparams, precision, device,
    seeds, hooks)`` -> one TrainedModel per seed, in the order of ``seeds`` (a deterministic model: one model
    whatever the seeds); an agent's is in `AgentSpec`. load: a forecaster's checkpoint dict -> `TrainedModel`.
    saver / loader: the kind's checkpoint file format (`SaveFn`, `LoadPathFn`; None: the forecasters'
    `save_trained_model` / `load_trained_model`); an agent's file sets them to `marketrl.agents.checkpoint`'s.
    """

    #: "forecaster" | "agent": the model's kind, recorded in the logs and JSONs (the zoo's entry type)
    kind: ClassVar[str] = "forecaster"

    name: str
    hparams_class: type
    #: trial -> hyperparameters (an agent's also takes the device's batch bounds)
    search_space: Callable[..., dict[str, Any]]
    train_seeds: Callable[..., list[Any]]
    load: LoadFn | None = None
    neural: bool = False
    #: seeds cannot differ (a closed form): the pipeline trains and scores one run, not copies; its registry line
    #: says so too (`marketrl.settings.registry.deterministic`), for the workflow, which imports no spec
    deterministic: bool = False
    #: what tests, benchmarks and docs read of the model (`marketrl.loop.profile`): cost-driving bounds, trial
    #: cost, small test hyperparameters, its row of docs/MODELS.md; every registered model has one
    profile: ModelProfile | None = None
    #: a torch model's ``build(hparams, n_features)`` -> its bare module, windows [B, L, F] -> [B] (what
    #: `torch_model_spec` trains; bench/speed/models.py times it without the trainer); None for other models
    build_module: Callable[[Any, int], torch.nn.Module] | None = None
    saver: SaveFn | None = None
    loader: LoadPathFn | None = None
    #: a forecaster whose ``train_seeds`` takes folds on the batch axis (``block_rows``, ``block_validation``)
    #: says how many fit: ``folds_per_batch(budget, train_data, hparams, precision, seeds_per_fold, n_folds)``
    #: -> int >= 1; None: it trains one fold per call (an agent's kind decides for itself)
    folds_per_batch: Callable[..., int] | None = None

    def __post_init__(self) -> None:
        if self.kind == "forecaster" and self.loader is None and self.load is None:
            raise TypeError(
                f"{self.name}: a forecaster's ModelSpec needs load (checkpoint dict -> TrainedModel)"
            )

    def save(
        self,
        path: str | os.PathLike[str],
        result: Any,
        *,
        hparams: Mapping[str, Any],
        precision: Any,
        normalizer: Mapping[str, Any],
        feature_names: Sequence[str],
        env: Mapping[str, Any],
        extra: Mapping[str, Any],
    ) -> None:
        """Write ``result``'s checkpoint (from this spec's ``train_seeds``) atomically, with the training
        split's normalizer state and feature names, the run's hyperparameters, precision and env settings and
        ``extra`` (plain data: fold, seed, costs...); each kind writes the parts its format holds."""
        (self.saver or save_trained_model)(
            self,
            path,
            result,
            hparams=hparams,
            precision=precision,
            normalizer=normalizer,
            feature_names=feature_names,
            env=env,
            extra=extra,
        )

    def load_path(
        self, path: str | os.PathLike[str], device: torch.device | str = "cpu"
    ) -> tuple[Any, dict[str, Any]]:
        """A checkpoint file of this model read back on ``device``: (result, meta). result is a `TrainedRun`
        (empty ``log``); meta what `marketrl.evaluation.evaluate.trained_settings` checks and the evaluation
        records: ``env`` settings, ``extra`` (fold, seed, costs, flat_gate...), ``normalizer``, ``precision``,
        plus the kind's own entries."""
        return (self.loader or load_trained_model)(self, path, torch.device(device))


def check_checkpoint(checkpoint: Any, where: str = "checkpoint") -> None:
    """Raise ValueError unless ``checkpoint`` is a forecaster checkpoint dict of this format and version."""
    if (
        not isinstance(checkpoint, Mapping)
        or checkpoint.get("format") != CHECKPOINT_FORMAT
        or checkpoint.get("version") != CHECKPOINT_VERSION
    ):
        raise ValueError(f"{where}: expected format {CHECKPOINT_FORMAT!r} version {CHECKPOINT_VERSION}")


def save_model(path: str | os.PathLike[str], model: TrainedModel, **extra: Any) -> None:
    """Write the model's checkpoint dict atomically; ``extra`` is plain data (normalizer state, fold, seed...)."""
    from marketrl.runtime.io import atomic_write

    with atomic_write(path) as tmp:
        torch.save(model.checkpoint(**extra), tmp)


def save_trained_model(
    spec: ModelSpec,
    path: str | os.PathLike[str],
    model: TrainedModel,
    *,
    hparams: Mapping[str, Any],
    precision: Any,
    normalizer: Mapping[str, Any],
    feature_names: Sequence[str],
    env: Mapping[str, Any],
    extra: Mapping[str, Any],
) -> None:
    """A forecaster's `ModelSpec.save`: `save_model` with the normalizer, feature names and env settings (what
    evaluation checks against the config, as in an agent's checkpoint) first in ``extra``; the model records its
    own hyperparameters and precision."""
    save_model(
        path,
        model,
        normalizer=dict(normalizer),
        feature_names=list(feature_names),
        env=dict(env),
        **dict(extra),
    )


def load_trained_model(
    spec: ModelSpec, path: str | os.PathLike[str], device: torch.device
) -> tuple[TrainedModel, dict[str, Any]]:
    """A forecaster's `ModelSpec.load_path`: `torch.load(weights_only=True)`, checked to be this model's, rebuilt
    by ``spec.load``; meta: ``env``, ``extra``, ``normalizer`` (from the checkpoint's extra) and ``precision``."""
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(checkpoint, Mapping) and checkpoint.get("format") == CHECKPOINT_FORMAT:
        if checkpoint.get("model") != spec.name:
            raise ValueError(f"{path}: a {checkpoint.get('model')} checkpoint, expected {spec.name}")
    check_checkpoint(checkpoint)
    assert spec.load is not None
    model = spec.load(checkpoint, device)
    extra = dict(checkpoint["extra"])
    meta = {
        "env": extra.get("env"),
        "extra": extra,
        "normalizer": extra.get("normalizer"),
        "precision": model.precision,
    }
    return model, meta


#: A forecaster's hyperopt trial's fixed work in `ModelProfile.trial_cost` units (building the rows, scoring the
#: trading rule's positions: an LSTM at window 1, width 16 cost 0.4 CPU-s), fitted to bench/speed/hyperopt_cost.py
FORECASTER_TRIAL_OVERHEAD = 3e9


def distinct_seeds(seeds: Sequence[int]) -> list[int]:
    """``seeds`` as a list of ints; raises ValueError for none or a repeated one (each seed's outputs are its own)."""
    out = [int(seed) for seed in seeds]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"seeds: expected one or more distinct integers, got {list(seeds)!r}")
    return out
