"""The zoo: every model the pipeline runs, the RL agents (`marketrl.agents`) and the forecasters
(`marketrl.models`), behind one protocol, so that hyperopt, training and evaluation dispatch by name.

`ZOO` is built from the specs `marketrl.settings.registry.REGISTRY` names: an `AgentSpec` becomes an `AgentEntry`,
a `ModelSpec` a `ForecasterEntry`; nothing here tests a model's name. ``training.extra_models`` (a config's
``name: "module:SPEC"`` entries) adds models from outside marketrl the same way (`get_entry(name, extra)`).

    entry = ZOO[name]                               # or get_entry(name, extra): one-line error naming the known
    space = entry.search_space(budget, window, config)  # once per hyperopt worker; space(trial) -> hparams
    runs = entry.train(request)                     # TrainRequest: splits, config slice, hparams, seeds, hooks
    runs[i].save(path, window, extra)               # one Trained per seed; a checkpoint torch.load reads back
    loaded = entry.load(path, device)               # -> LoadedModel: positions(data, env_config), predictions

The seeds of a request train as one batch where the model's spec has a batched loop (``train_seeds``: the S copies
are one vectorized computation with a seed axis; docs/ARCHITECTURE.md), else one after another in the same process.
A deterministic forecaster (``ModelSpec.deterministic``, ridge) trains once whatever the seeds: one `Trained`.

Both kinds report each periodic validation Sharpe (annualized, of daily net returns of the model's positions on
the validation split, the objective hyperopt maximizes), one per seed, to `TrainRequest.on_score`, which may raise
(`optuna.TrialPruned`) to stop the run. Agents act through the env's observation (`policy_positions`), forecasters
through their trading rule (`TrainedModel.positions`); both are then scored by `evaluate_positions` with the same
fills and costs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from gpu_utils import HardwareBudget, PrecisionPlan
from marketrl.agents.checkpoint import load_policy, save_checkpoint
from marketrl.agents.common import GreedyPolicies, GreedyPolicy, TrainResult, env_settings
from marketrl.agents.memory import batch_size_bounds
from marketrl.agents.spec import HIDDEN_DIM_BASES, AgentSpec
from marketrl.env import (
    EnvConfig,
    MarketData,
    evaluate_positions,
    policies_positions,
    policy_positions,
    tabulated_policies_positions,
)
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.models import RunSettings, TrainedModel, TrainHooks, model_from_checkpoint, save_model
from marketrl.models.base import CHECKPOINT_FORMAT, ModelSpec, Trial
from marketrl.models.supervised_data import CPU_EVAL_PREDICT_CHUNK
from marketrl.scoring.metrics import performance_summary
from marketrl.settings.registry import DETERMINISTIC, REGISTRY, RegistryError, load_spec
from marketrl.splits.datasets import WindowData, env_config_from_config

__all__ = [
    "EVALS_PER_RUN",
    "ZOO",
    "AgentEntry",
    "ForecasterEntry",
    "Kind",
    "LoadedModel",
    "TrainRequest",
    "Trained",
    "check_deterministic",
    "entry_from_spec",
    "get_entry",
    "positions_sharpe",
    "run_settings",
    "seeds_positions",
]

Kind = Literal["agent", "forecaster"]
EVALS_PER_RUN = 5  # validation scores (and progress lines) per training run, for every model (each costs a
# full pass over the validation split per seed: about half of a demo run's training time at 10)

#: on_score(step, validation Sharpe per seed): progress logging and hyperopt pruning (may raise to stop the run)
ScoreHook = Callable[[int, list[float]], None]
#: trial -> hyperparameters
SearchSpace = Callable[[Trial], dict[str, Any]]


def positions_sharpe(data: MarketData, positions: torch.Tensor, env_config: EnvConfig) -> float:
    """Annualized Sharpe of daily net returns of `positions` on `data` (0 when flat): the validation objective."""
    sharpe = performance_summary(evaluate_positions(data, positions, env_config))["sharpe"]
    return 0.0 if sharpe is None or not math.isfinite(sharpe) else float(sharpe)


# ------------------------------------------------------------------------------------------------ the protocol


@dataclass
class TrainRequest:
    """Everything one training run needs, whichever the model.

    config: a stage's config slice with `env`, `costs` and the `training` run settings (check_every, n_envs, and
      for forecasters horizon, epochs, patience). steps: env steps of an agent's run; updates: a forecaster's
      cap on optimizer steps / boosting rounds (each kind ignores the other's budget).
    seeds: the training seeds, one run each (trained as one batch where the model can).
    on_score: each periodic validation Sharpe on `validation_data`, one per seed (EVALS_PER_RUN per run); on_log:
      each statistics record of a forecaster; checkpoint: the batch's resume file; budget: the device's memory
      budget.
    """

    train_data: MarketData
    validation_data: MarketData | None
    config: Mapping[str, Any]
    hparams: Mapping[str, Any]
    precision: PrecisionPlan
    device: torch.device
    seeds: tuple[int, ...]
    steps: int
    updates: int
    on_score: ScoreHook | None = None
    on_log: Callable[[dict[str, Any]], None] | None = None
    checkpoint: TrainingCheckpoint | None = None
    budget: HardwareBudget | None = None

    @functools.cached_property
    def env_config(self) -> EnvConfig:
        """The env settings of the run (evaluation and scoring use the same), parsed once per request."""
        return env_config_from_config(self.config)

    def score(self, positions: Callable[[MarketData], torch.Tensor]) -> float:
        """Validation Sharpe of a model's positions on the validation split."""
        if self.validation_data is None:
            raise ValueError("validation_data: this run has no validation split to score")
        return positions_sharpe(self.validation_data, positions(self.validation_data), self.env_config)

    def report(self, step: int, scores: list[float]) -> list[float]:
        """Hand one validation round (a score per seed) to ``on_score``; return the scores."""
        if self.on_score is not None:
            self.on_score(step, scores)
        return scores

    def checkpoint_of(self, position: int) -> TrainingCheckpoint | None:
        """The resume file of seed ``position`` when the seeds train one after another (the batch's own file
        for a single seed)."""
        if self.checkpoint is None or len(self.seeds) == 1:
            return self.checkpoint
        return self.checkpoint.part(f"seed{position}")


@dataclass
class Trained:
    """A trained model of either kind, as the stages use it.

    log: the trainer's log (`evals` [[step, score], ...], `history` of statistics records, steps, ...).
    """

    name: str
    kind: Kind
    hparams: dict[str, Any]
    log: dict[str, Any]
    positions: Callable[[MarketData, EnvConfig], torch.Tensor]
    _save: Callable[[str, WindowData, Mapping[str, Any]], None]
    predictions: Callable[[MarketData], torch.Tensor] | None = None

    def save(self, path: str, window: WindowData, extra: Mapping[str, Any]) -> None:
        """Write the checkpoint atomically with the window's normalizer and feature names and ``extra``
        (plain data: fold, seed, costs...)."""
        self._save(path, window, extra)


@dataclass
class LoadedModel:
    """A checkpoint read back for evaluation.

    meta: what `marketrl.evaluation.evaluate.trained_settings` checks (``env`` settings, ``extra.costs``), the
      ``normalizer`` state and ``precision``; info: what the evaluation JSON records about the model.
    predictions: a forecaster's predicted forward return per row (None for agents); horizon: its target's.
    """

    name: str
    kind: Kind
    meta: dict[str, Any]
    positions: Callable[[MarketData, EnvConfig], torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)
    predictions: Callable[[MarketData], torch.Tensor] | None = None
    horizon: int | None = None
    #: a forecaster's positions from its own `predictions` of the same data (evaluation predicts once)
    positions_from_predictions: Callable[[MarketData, torch.Tensor], torch.Tensor] | None = None
    #: an agent's greedy policy (evaluation steps the seeds of a model x fold in lockstep together)
    policy: GreedyPolicy | None = None


def seeds_positions(
    runs: list[LoadedModel], data: MarketData, env_config: EnvConfig
) -> list[torch.Tensor] | None:
    """The positions of S loaded agents of one model on the same ``data``, all seeds at once from one table of
    their greedy actions (`tabulated_policies_positions`: batched stacked forwards, no forward per bar), or
    None when the runs are not all agents."""
    if not runs or any(run.policy is None for run in runs):
        return None
    stacked = GreedyPolicies([run.policy for run in runs])
    return list(tabulated_policies_positions(stacked, len(runs), data, env_config))


class _NamedBySpec:
    """The model name of a registry entry is its spec's name (training.models, the {model} wildcard)."""

    spec: AgentSpec | ModelSpec

    @property
    def name(self) -> str:
        """The model name (training.models, the {model} wildcard)."""
        return self.spec.name


# ------------------------------------------------------------------------------------------------------ agents


@dataclass(frozen=True)
class AgentEntry(_NamedBySpec):
    """An RL agent (`marketrl.agents.spec.AgentSpec`): trained on the TradingEnv for `TrainRequest.steps` env
    steps."""

    spec: AgentSpec
    kind: Kind = "agent"

    def search_space(
        self, budget: HardwareBudget, window: WindowData, config: Mapping[str, Any]
    ) -> SearchSpace:
        """The agent's space with batch sizes the device's memory holds (for the widest network)."""
        obs_dim = window.splits["train"].n_features * config["env"]["window"] + 1
        bounds = batch_size_bounds(budget, self.spec, obs_dim, max(HIDDEN_DIM_BASES))
        return lambda trial: self.spec.search_space(trial, bounds)

    def train(self, request: TrainRequest) -> list[Trained]:
        """Train one run per seed on the training split (one batch where the agent has ``train_seeds``);
        validation Sharpe EVALS_PER_RUN times (when there is a validation split)."""
        env_config = request.env_config

        def scores(policies: list[GreedyPolicy]) -> list[float]:
            # the seeds' greedy policies step the validation split in lockstep as one stacked forward
            positions = policies_positions(
                GreedyPolicies(policies), len(policies), request.validation_data, env_config
            )
            return [request.score(lambda data, row=row: row) for row in positions]

        validating = request.validation_data is not None
        eval_every = max(1, request.steps // EVALS_PER_RUN) if validating else 0
        run_config = self.spec.make_run_config(
            total_steps=request.steps,
            env=env_config,
            eval_every=eval_every,
            check_every=request.config["training"]["check_every"],
        )
        common = (request.train_data, run_config, dict(request.hparams), request.precision, request.device)
        if self.spec.train_seeds is not None:
            on_batch = (lambda step, policies: request.report(step, scores(policies))) if validating else None
            results: list[TrainResult] = self.spec.train_seeds(
                *common,
                request.seeds,
                on_eval=on_batch,
                checkpoint=request.checkpoint,
                on_log=_per_seed_records(request.seeds, request.on_log),
            )
        else:
            on_one = (lambda step, policy: request.report(step, scores([policy]))[0]) if validating else None
            results = [
                self.spec.train(*common, seed, on_eval=on_one, checkpoint=request.checkpoint_of(position))
                for position, seed in enumerate(request.seeds)
            ]
        return [self._trained(result, request) for result in results]

    def _trained(self, result: TrainResult, request: TrainRequest) -> Trained:
        def save(path: str, window: WindowData, extra: Mapping[str, Any]) -> None:
            save_checkpoint(
                path,
                result,
                algo=self.name,
                normalizer_state=window.normalizer.state_dict(),
                feature_names=window.feature_names,
                precision=request.precision.to_dict(),
                hparams=dict(request.hparams),
                extra=dict(extra),
                spec=self.spec,
            )

        return Trained(
            name=self.name,
            kind=self.kind,
            hparams=dict(request.hparams),
            log=dict(result.log),
            positions=lambda data, env: policy_positions(result.policy, data, env),
            _save=save,
        )

    def load(self, path: str, device: torch.device) -> LoadedModel:
        """The greedy policy of an agent checkpoint."""
        policy, meta = load_policy(path, device, spec=self.spec)
        return LoadedModel(
            name=self.name,
            kind=self.kind,
            meta=meta,
            positions=lambda data, env: policy_positions(policy, data, env),
            info={"precision": meta.get("precision"), "hidden": meta["architecture"]["hidden"]},
            policy=policy,
        )


def _per_seed_records(
    seeds: Sequence[int], on_log: Callable[[dict[str, Any]], None] | None
) -> Callable[[dict[str, Any]], None] | None:
    """An agent's batch statistics record (``{"seeds": [one record per seed]}``) handed to ``on_log`` as one
    record per seed with its ``seed`` and ``step`` (env steps), the shape a forecaster's loop logs."""
    if on_log is None:
        return None

    def split(record: dict[str, Any]) -> None:
        for seed, one in zip(seeds, record["seeds"], strict=True):
            on_log({**one, "seed": int(seed), "step": one["env_steps"]})

    return split


# ------------------------------------------------------------------------------------------------- forecasters


def run_settings(config: Mapping[str, Any], updates: int) -> RunSettings:
    """A forecaster's run settings from a config slice: horizon, epochs, patience, check_every, env.fill, with
    `updates` (training.max_updates or hyperopt.trial_updates) as the step cap and EVALS_PER_RUN validations.

    Costs stay empty: the trading rule then charges the `MarketData`'s own per-row cost fractions, which are
    built from the run's cost model per instrument (the checkpoint records that cost model in ``extra``).
    """
    training = config["training"]
    return RunSettings(
        fill=config["env"]["fill"],
        horizon=training["horizon"],
        epochs=training["epochs"],
        max_steps=updates,
        check_every=training["check_every"],
        eval_every=max(1, updates // EVALS_PER_RUN),
        patience=training["patience"],
    )


@dataclass(frozen=True)
class ForecasterEntry(_NamedBySpec):
    """A forecaster (`marketrl.models.base.ModelSpec`): it learns the forward return; its trading rule makes the
    positions."""

    spec: ModelSpec
    kind: Kind = "forecaster"

    def search_space(
        self, budget: HardwareBudget, window: WindowData, config: Mapping[str, Any]
    ) -> SearchSpace:
        """The model's own space (the trainer caps the batch size by the memory budget itself)."""
        return self.spec.search_space

    def train(self, request: TrainRequest) -> list[Trained]:
        """Train with the config's run settings, one run per seed (one batch where the model has
        ``train_seeds``; one run in all for a deterministic model); each validation's Sharpe goes to
        ``on_score``."""
        validating = request.validation_data is not None

        def scores(models: list[TrainedModel]) -> list[float]:
            return [request.score(model.positions) for model in models]

        def hooks(on_validation: Callable | None, checkpoint: TrainingCheckpoint | None) -> TrainHooks:
            return TrainHooks(
                log=request.on_log, on_validation=on_validation, checkpoint=checkpoint, budget=request.budget
            )

        common = (
            request.train_data,
            request.validation_data,
            run_settings(request.config, request.updates),
            dict(request.hparams),
            request.precision,
            request.device,
        )
        seeds = request.seeds[:1] if self.spec.deterministic else request.seeds
        if self.spec.train_seeds is not None:
            on_batch = (lambda step, models: request.report(step, scores(models))) if validating else None
            models = self.spec.train_seeds(*common, seeds, hooks(on_batch, request.checkpoint))
        else:
            on_one = (lambda step, model: request.report(step, scores([model]))[0]) if validating else None
            models = [
                self.spec.train(*common, seed, hooks(on_one, request.checkpoint_of(position)))
                for position, seed in enumerate(seeds)
            ]
        return [self._trained(model, request) for model in models]

    def _trained(self, model: TrainedModel, request: TrainRequest) -> Trained:
        def save(path: str, window: WindowData, extra: Mapping[str, Any]) -> None:
            save_model(
                path,
                model,
                normalizer=window.normalizer.state_dict(),
                feature_names=list(window.feature_names),
                # the env settings evaluation checks against the config, as in an agent's checkpoint
                env=env_settings(request.env_config),
                **dict(extra),
            )

        return Trained(
            name=self.name,
            kind=self.kind,
            hparams=dict(model.hparams),
            log=dict(model.log),
            positions=lambda data, env: model.positions(data),
            _save=save,
            predictions=model.predict,
        )

    def load(self, path: str, device: torch.device) -> LoadedModel:
        """The model and its trading rule from a `save_model` checkpoint."""
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        if checkpoint.get("format") == CHECKPOINT_FORMAT and checkpoint.get("model") != self.name:
            raise ValueError(f"{path}: a {checkpoint.get('model')} checkpoint, expected {self.name}")
        model = model_from_checkpoint(checkpoint, device, self.spec)
        extra = dict(checkpoint["extra"])
        meta = {
            "env": extra.get("env"),
            "extra": extra,
            "normalizer": extra.get("normalizer"),
            "precision": model.precision,
        }
        return LoadedModel(
            name=self.name,
            kind=self.kind,
            meta=meta,
            positions=lambda data, env: model.positions(data),
            info={"precision": model.precision, "hparams": dict(model.hparams)},
            positions_from_predictions=model.positions,
            # smaller forwards on the CPU (CPU_EVAL_PREDICT_CHUNK); a device keeps the training chunk
            predictions=functools.partial(
                model.predict, chunk=CPU_EVAL_PREDICT_CHUNK if device.type == "cpu" else None
            ),
            horizon=int(model.settings["horizon"]),
        )


Entry = AgentEntry | ForecasterEntry


def entry_from_spec(name: str, spec: Any) -> Entry:
    """The zoo entry of a registered spec; its type is the model's kind (`RegistryError` for anything else, or
    for a spec named other than its registry name)."""
    if isinstance(spec, AgentSpec):
        entry: Entry = AgentEntry(spec)
    elif isinstance(spec, ModelSpec):
        entry = ForecasterEntry(spec)
    else:
        raise RegistryError(f"{name}: {type(spec).__name__} is neither an AgentSpec nor a ModelSpec")
    if entry.name != name:
        raise RegistryError(f"{name}: the spec is named {entry.name!r}")
    return entry


def check_deterministic(entries: Mapping[str, Entry], marked: Sequence[str]) -> None:
    """The models whose registry line is marked deterministic (``marked``, `registry.DETERMINISTIC`: what the
    workflow plans by) are exactly those whose spec says ``deterministic=True`` (what the trainer does); a
    `RegistryError` naming the first that differs."""
    for name, entry in entries.items():
        said = bool(getattr(entry.spec, "deterministic", False))
        if said != (name in marked):
            raise RegistryError(
                f"{name}: the spec says deterministic={said} but its registry line "
                f"{'is not' if said else 'is'} marked deterministic(...); make the two agree"
            )


#: Every built-in model, in the registry's order (the default of training.models).
ZOO: dict[str, Entry] = {
    name: entry_from_spec(name, load_spec(location)) for name, location in REGISTRY.items()
}
check_deterministic(ZOO, DETERMINISTIC)


@functools.cache
def _extra_entry(name: str, location: str) -> Entry:
    try:
        return entry_from_spec(name, load_spec(location))
    except RegistryError as error:
        raise RegistryError(f"config key 'training.extra_models.{name}': {error}") from None


def get_entry(name: str, extra: Mapping[str, str] | None = None) -> Entry:
    """The zoo entry of a model: a built-in one, or one of ``extra`` (``training.extra_models``: name ->
    "module:SPEC", imported on first use); a one-line error naming the known ones."""
    if name in ZOO:
        return ZOO[name]
    if extra and name in extra:
        return _extra_entry(name, extra[name])
    known = ", ".join([*ZOO, *(extra or {})])
    raise KeyError(f"training.models: unknown model {name!r} (known: {known})")
