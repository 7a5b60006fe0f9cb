"""The zoo: every model the pipeline runs, the RL agents (`marketrl.agents`) and the forecasters
(`marketrl.models`), behind one protocol, so that hyperopt, training, export and evaluation dispatch by name and
no job tests a model's kind.

`ZOO` is built from the specs `marketrl.settings.registry.REGISTRY` names, each a `ModelSpec` (an `AgentSpec` is
one): its ``kind`` picks an `AgentEntry` or a `ForecasterEntry`, both a `ZooEntry` (the base holds what the kinds do
the same way, saving and loading by the spec's one pair by path, each kind only what differs); nothing here tests a
model's name. ``training.extra_models`` (a config's ``name: "module:SPEC"``
entries) adds models from outside marketrl the same way (`get_entry(name, extra)`).

    entry = ZOO[name]                               # or get_entry(name, extra): one-line error naming the known
    space = entry.search_space(budget, window, config)  # once per hyperopt worker; space(trial) -> hparams
    steps = entry.train_budget(config)              # or trial_budget: the run's length in the model's own steps
    runs = entry.train(request)                     # TrainRequest: splits, config slice, hparams, seeds, budget, hooks
    runs[i].save(path, window, extra)               # one Trained per seed; a checkpoint torch.load reads back
    runs[i].log_record(steps)                       # its part of train_log.json, one shape for both kinds
    loaded = entry.load(path, device)               # -> LoadedModel: positions(data, env_config), predictions
    entry.exportable(loaded, path)                  # -> Exportable: what the export job writes

The seeds of a request train through the spec's one training entry, ``train_seeds`` (the S copies one vectorized
computation with a seed axis where the model has one, docs/ARCHITECTURE.md; lightgbm runs them one after another).
A deterministic forecaster (``ModelSpec.deterministic``, ridge) trains once whatever the seeds: one `Trained`.

Both kinds report each periodic validation Sharpe (annualized, of daily net returns of the model's positions on
the validation split, the objective hyperopt maximizes), one per seed, to `TrainRequest.on_score`, which may raise
(`optuna.TrialPruned`) to stop the run; each statistics record goes to `TrainRequest.on_log` in one shape, one per
seed keyed by ``seed`` and ``step`` (an agent's env steps). Agents act through the env's observation
(`policy_positions`), forecasters through their trading rule (`TrainedModel.positions`); both are then scored by
`evaluate_positions` with the same fills and costs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch import nn

from gpu_utils import HardwareBudget, PrecisionPlan
from marketrl.agents.common import GreedyPolicies, GreedyPolicy, TrainResult, env_settings
from marketrl.agents.memory import batch_size_bounds, folds_per_batch
from marketrl.agents.results import AGENT_HOW_TO_USE, AgentPolicy
from marketrl.agents.spec import HIDDEN_DIM_BASES, AgentSpec
from marketrl.env import (
    EnvConfig,
    MarketData,
    evaluate_positions,
    policies_positions,
    tabulated_policies_positions,
)
from marketrl.env.config import ACTION_POSITIONS
from marketrl.loop.resume import TrainingCheckpoint
from marketrl.models import RunSettings, TrainedModel, TrainHooks
from marketrl.models.base import ModelSpec, TrainedRun, Trial
from marketrl.models.supervised_data import CPU_EVAL_PREDICT_CHUNK
from marketrl.models.trading_rule import FORECASTER_HOW_TO_USE
from marketrl.scoring.gate import GateDecision, flat_gates, gated_positions
from marketrl.scoring.metrics import performance_summary
from marketrl.settings.registry import DETERMINISTIC, REGISTRY, RegistryError, load_spec
from marketrl.splits.datasets import WindowData, env_config_from_config

__all__ = [
    "EVALS_PER_RUN",
    "ZOO",
    "AgentEntry",
    "Exportable",
    "FoldBlocks",
    "ForecasterEntry",
    "Kind",
    "LoadedModel",
    "TrainRequest",
    "Trained",
    "ZooEntry",
    "check_deterministic",
    "entry_from_spec",
    "get_entry",
    "positions_sharpe",
    "round_trip_cost",
    "run_settings",
    "seeds_positions",
]

Kind = Literal["agent", "forecaster"]
EVALS_PER_RUN = 5  # validation scores (and progress lines) per training run, for every model (each costs a
# full pass over the validation split per seed: about half of a demo run's training time at 10)

#: on_score(step, validation Sharpe per seed): progress logging and hyperopt pruning (may raise to stop the run)
ScoreHook = Callable[[int, list[float | None]], None]
#: trial -> hyperparameters
SearchSpace = Callable[[Trial], dict[str, Any]]


def positions_sharpe(data: MarketData, positions: torch.Tensor, env_config: EnvConfig) -> float:
    """Annualized Sharpe of daily net returns of `positions` on `data` (0 when flat): the validation objective."""
    sharpe = performance_summary(evaluate_positions(data, positions, env_config))["sharpe"]
    return 0.0 if sharpe is None or not math.isfinite(sharpe) else float(sharpe)


# ------------------------------------------------------------------------------------------------ the protocol


@dataclass(frozen=True)
class FoldBlocks:
    """Folds on the batch axis (training.batch_folds): the request's ``train_data`` stacks several folds'
    training rows (`marketrl.env.stack_market_data`, each fold normalized on its own rows), and seed i trains on
    rows ``train_rows[i]`` [start, stop) of it and is scored and gated on ``validation[i]``, its own fold's
    validation split. Agents and the torch forecasters (`ZooEntry.batches_folds`)."""

    train_rows: tuple[tuple[int, int], ...]
    validation: tuple[MarketData | None, ...]


@dataclass
class TrainRequest:
    """Everything one training run needs, whichever the model.

    config: a stage's config slice with `env`, `costs` and the `training` run settings (check_every, n_envs, and
      for forecasters horizon, epochs, patience).
    budget: the run's length in the model's own steps, as its entry reads it from the config slice
      (`ZooEntry.train_budget` / `ZooEntry.trial_budget`): an agent's env steps, a forecaster's cap on optimizer
      steps / boosting rounds.
    seeds: the training seeds, one run each (trained as one batch).
    on_score: each periodic validation Sharpe on a seed's validation split (`validation_data`, or its fold's with
      `blocks`), one per seed (EVALS_PER_RUN per run); on_log:
      each statistics record, one per seed with its ``seed`` and ``step``; checkpoint: the batch's resume file;
      memory: the device's memory budget (forecasters cap their batch by it).
    """

    train_data: MarketData
    validation_data: MarketData | None
    config: Mapping[str, Any]
    hparams: Mapping[str, Any]
    precision: PrecisionPlan
    device: torch.device
    seeds: tuple[int, ...]
    budget: int
    on_score: ScoreHook | None = None
    on_log: Callable[[dict[str, Any]], None] | None = None
    checkpoint: TrainingCheckpoint | None = None
    memory: HardwareBudget | None = None
    #: the validation gate's threshold (`marketrl.scoring.gate`, training.gate_min_t): each run's final positions
    #: on the validation split decide whether it may trade; None: no gate (hyperopt trials)
    gate_min_t: float | None = None
    #: folds on the batch axis: each seed's rows of ``train_data`` and its own validation split (None: every seed
    #: trains on all of ``train_data`` and is validated on ``validation_data``)
    blocks: FoldBlocks | None = None

    @property
    def validating(self) -> bool:
        """Whether the runs have validation splits to be scored on."""
        if self.blocks is not None:
            return all(data is not None for data in self.blocks.validation)
        return self.validation_data is not None

    def validation_of(self, index: int) -> MarketData:
        """Run ``index``'s validation split."""
        data = self.validation_data if self.blocks is None else self.blocks.validation[index]
        if data is None:
            raise ValueError("validation_data: this run has no validation split to score")
        return data

    def validation_groups(self, n_runs: int) -> list[tuple[MarketData, list[int]]]:
        """The runs grouped by the validation split they share (one group unless folds share the batch), in
        order: (split, run indices)."""
        groups: dict[int, tuple[MarketData, list[int]]] = {}
        for index in range(n_runs):
            data = self.validation_of(index)
            groups.setdefault(id(data), (data, []))[1].append(index)
        return list(groups.values())

    @functools.cached_property
    def env_config(self) -> EnvConfig:
        """The env settings of the run (evaluation and scoring use the same), parsed once per request."""
        return env_config_from_config(self.config)

    def score(self, positions: Callable[[MarketData], torch.Tensor], index: int = 0) -> float:
        """Validation Sharpe of a model's positions on run ``index``'s validation split."""
        data = self.validation_of(index)
        return positions_sharpe(data, positions(data), self.env_config)

    def report(self, step: int, scores: list[float | None]) -> list[float | None]:
        """Hand one validation round (a score per seed; None for a seed not validated at this step) to
        ``on_score``; return the scores."""
        if self.on_score is not None:
            self.on_score(step, scores)
        return scores


@dataclass
class Trained:
    """A trained model of either kind, as the stages use it.

    log: the trainer's log in the one shape of both kinds (`evals` [[step, score], ...], `history` of statistics
      records each keyed by ``step``, ``steps_per_second``, ...); steps_run: the steps the run made where its
      budget is only a cap (a forecaster's early stopping), None where it always runs its budget (an agent).
    """

    name: str
    kind: Kind
    hparams: dict[str, Any]
    log: dict[str, Any]
    _positions: Callable[[MarketData, EnvConfig], torch.Tensor]
    _save: Callable[[str, WindowData, Mapping[str, Any]], None]
    predictions: Callable[[MarketData], torch.Tensor] | None = None
    steps_run: int | None = None
    #: the validation gate's decision (None: no gate ran); a run set flat trades nothing
    gate: GateDecision | None = None

    def positions(self, data: MarketData, env_config: EnvConfig) -> torch.Tensor:
        """Target positions [T] on ``data``, as the validation gate lets the run trade them."""
        return gated_positions(self._positions(data, env_config), self.gate)

    def save(self, path: str, window: WindowData, extra: Mapping[str, Any]) -> None:
        """Write the checkpoint atomically with the window's normalizer and feature names and ``extra``
        (plain data: fold, seed, costs...) and the gate's decision (``flat_gate``)."""
        gate = {} if self.gate is None else {"flat_gate": self.gate.to_dict()}
        self._save(path, window, {**extra, **gate})

    def log_record(self, budget: int) -> dict[str, Any]:
        """The model-specific part of train_log.json: the trainer's log, ``total_steps`` (the steps run, and
        ``max_steps`` the ``budget``, where the budget is a cap; else the budget), ``steps_per_s`` and ``history``
        keyed by ``step`` with the validation scores merged in (docs/OUTPUTS.md)."""
        log = self.log
        evals = [{"step": int(step), "val_sharpe": score} for step, score in log.get("evals", [])]
        steps = (
            {"total_steps": budget}
            if self.steps_run is None
            else {"total_steps": self.steps_run, "max_steps": budget}
        )
        return {
            **log,
            **steps,
            "history": [dict(record) for record in log.get("history", [])] + evals,
            "steps_per_s": log.get("steps_per_second"),
            **({} if self.gate is None else {"flat_gate": self.gate.to_dict()}),
        }


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
    #: the model read back, the one result type (`marketrl.models.base.TrainedRun`: an agent's `TrainResult`, a
    #: forecaster's `TrainedModel`)
    result: TrainedRun | None = None

    @property
    def gate(self) -> GateDecision | None:
        """The validation gate's decision the checkpoint records (None: a run from before the gate)."""
        return GateDecision.from_dict((self.meta.get("extra") or {}).get("flat_gate"))


@dataclass
class Exportable:
    """What `marketrl.training.export` writes of one checkpoint, as the model's entry describes it.

    window: rows per input window; module: the torch module to trace (inputs named by ``inputs``, in order:
      ``windows`` [B, window, F], then any [B] input), or None; booster: a LightGBM model string instead;
    observation: entries added to export.json's ``observation``; fields: export.json's ``inputs``, ``output`` and
      the model's own entries (``trading_rule``, ``how_to_use``), in order.
    """

    window: int
    module: nn.Module | None
    booster: str | None
    observation: dict[str, Any]
    fields: dict[str, Any]

    @property
    def input_names(self) -> list[str]:
        """The traced module's input names, in order."""
        return list(self.fields["inputs"])


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


@dataclass(frozen=True)
class ZooEntry:
    """What every zoo entry does the same way, whichever its kind: its name and determinism, its budget and
    resume settings read from the config slice, and a training run (the seeds as one ``train_seeds`` batch, each
    validation scored and reported, one `Trained` per run, saved by ``spec.save``) and a checkpoint read back by
    ``spec.load_path``, both through the one result type (`TrainedRun`). A kind supplies what differs: its class
    attributes and `_train_seeds`, `_validation_positions`, `_recorded_hparams`, `_loaded`, `exportable`,
    `search_space` (and `_log`, `_predictions`)."""

    spec: ModelSpec
    #: "agent" | "forecaster", recorded in the logs and JSONs
    kind: ClassVar[Kind]
    #: the ``training`` key of a train job's budget, and the ``hyperopt`` key of a trial's
    budget_key: ClassVar[str]
    trial_budget_key: ClassVar[str]
    #: the ``training`` keys of the run settings a resume file's fingerprint holds (besides check_every)
    run_keys: ClassVar[tuple[str, ...]]
    #: whether one request may put several folds on the batch axis (`FoldBlocks`); otherwise a fold-batched job
    #: trains its folds one request after another
    batches_folds: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """The model name (training.models, the {model} wildcard)."""
        return self.spec.name

    @property
    def deterministic(self) -> bool:
        """Whether the seeds cannot differ (one run trains, whatever the seeds)."""
        return self.spec.deterministic

    def train_budget(self, config: Mapping[str, Any]) -> int:
        """A train job's budget in the model's own steps (training.total_steps or training.max_updates)."""
        return int(config["training"][self.budget_key])

    def trial_budget(self, config: Mapping[str, Any]) -> int:
        """A hyperopt trial's budget in the model's own steps (hyperopt.trial_steps or hyperopt.trial_updates)."""
        return int(config["hyperopt"][self.trial_budget_key])

    def run_settings(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The run settings of ``config["training"]`` a resume file's fingerprint records."""
        return {key: config["training"][key] for key in self.run_keys}

    def train(self, request: TrainRequest) -> list[Trained]:
        """Train one run per seed on the training split, the seeds as one ``train_seeds`` batch (one run in all
        for a deterministic model); each validation's Sharpe, one per seed, goes to ``on_score`` (when there is a
        validation split)."""
        if request.blocks is not None and not self.batches_folds:
            raise ValueError(
                f"{self.name}: a {self.kind} trains one fold per request (no folds on the batch axis)"
            )
        validating = request.validating

        def on_batch(step: int, runs: list[Any]) -> list[float]:
            return request.report(step, self._scores(request, runs))

        results = self._train_seeds(request, on_batch if validating else None)
        trained = [self._trained(result, request) for result in results]
        if request.gate_min_t is None or not validating:
            return trained
        positions = self._validation_positions(request, results)
        gates: list[GateDecision | None] = [None] * len(results)
        for data, indices in request.validation_groups(len(results)):
            group = torch.stack([positions[index] for index in indices])
            for index, gate in zip(
                indices, flat_gates(data, group, request.env_config, request.gate_min_t), strict=True
            ):
                gates[index] = gate
        return [dataclasses.replace(run, gate=gate) for run, gate in zip(trained, gates, strict=True)]

    def search_space(
        self, budget: HardwareBudget, window: WindowData, config: Mapping[str, Any]
    ) -> SearchSpace:
        """The model's search space on this device and window."""
        raise NotImplementedError

    def folds_per_batch(
        self,
        budget: HardwareBudget,
        window: WindowData,
        config: Mapping[str, Any],
        hparams: Mapping[str, Any],
        precision: PrecisionPlan,
        n_seeds: int,
        n_folds: int,
    ) -> int:
        """How many of ``n_folds`` folds (of ``n_seeds`` seeds each) one request may put on the batch axis on
        this device (training.batch_folds): 1 unless the kind batches folds."""
        return 1

    def load(self, path: str, device: torch.device) -> LoadedModel:
        """A checkpoint read back for evaluation, by the spec's ``load_path``; positions by the result's
        ``run_positions`` (`marketrl.models.base.TrainedRun`), the rest as the kind describes it (`_loaded`)."""
        result, meta = self.spec.load_path(path, device)
        return LoadedModel(
            name=self.name,
            kind=self.kind,
            meta=meta,
            positions=result.run_positions,
            result=result,
            **self._loaded(result, meta, device),
        )

    def exportable(self, loaded: LoadedModel, path: str) -> Exportable:
        """What the export job writes of the checkpoint at ``path`` (``loaded`` from it on the CPU)."""
        raise NotImplementedError

    def _train_seeds(self, request: TrainRequest, on_batch: Callable | None) -> list[Any]:
        raise NotImplementedError

    def _scores(self, request: TrainRequest, runs: list[Any]) -> list[float | None]:
        """Validation Sharpe of each run as a periodic validation hands them (an agent's greedy policies, a
        forecaster's models; None for a run not validated at this step, whose score is None)."""
        return [
            None if row is None else request.score(lambda data, row=row: row, index)
            for index, row in enumerate(self._validation_positions(request, runs))
        ]

    def _validation_positions(self, request: TrainRequest, runs: list[Any]) -> list[torch.Tensor]:
        """Each run's positions on the validation split (runs as `_scores` gets them, or `_train_seeds`'s
        results)."""
        raise NotImplementedError

    def _trained(self, result: TrainedRun, request: TrainRequest) -> Trained:
        """One run's `Trained`: its positions (``run_positions``) and steps run from the one result type, its
        checkpoint written by the spec's ``save``."""
        hparams = self._recorded_hparams(result, request)

        def save(path: str, window: WindowData, extra: Mapping[str, Any]) -> None:
            self.spec.save(
                path,
                result,
                hparams=hparams,
                precision=request.precision,
                normalizer=window.normalizer.state_dict(),
                feature_names=window.feature_names,
                env=env_settings(request.env_config),
                extra=extra,
            )

        return Trained(
            name=self.name,
            kind=self.kind,
            hparams=hparams,
            log=self._log(result),
            _positions=result.run_positions,
            _save=save,
            predictions=self._predictions(result),
            steps_run=result.steps_run,
        )

    def _recorded_hparams(self, result: Any, request: TrainRequest) -> dict[str, Any]:
        """The hyperparameters the run's logs and checkpoint record."""
        raise NotImplementedError

    def _log(self, result: Any) -> dict[str, Any]:
        """The trainer's log in the one log shape."""
        return dict(result.log)

    def _predictions(self, result: Any) -> Callable[[MarketData], torch.Tensor] | None:
        """A forecaster's predicted forward return per row (None: the model predicts none)."""
        return None

    def _loaded(self, result: Any, meta: dict[str, Any], device: torch.device) -> dict[str, Any]:
        """The kind's `LoadedModel` fields besides name, kind, meta and positions."""
        raise NotImplementedError


# ------------------------------------------------------------------------------------------------------ agents


def _stepped(record: Mapping[str, Any]) -> dict[str, Any]:
    """An agent's statistics record in the one log shape: keyed by ``step``, its env steps."""
    return {**record, "step": record["env_steps"]}


@dataclass(frozen=True)
class AgentEntry(ZooEntry):
    """An RL agent (`marketrl.agents.spec.AgentSpec`): trained on the TradingEnv for `TrainRequest.budget` env
    steps."""

    spec: AgentSpec
    kind: ClassVar[Kind] = "agent"
    budget_key: ClassVar[str] = "total_steps"
    trial_budget_key: ClassVar[str] = "trial_steps"
    run_keys: ClassVar[tuple[str, ...]] = ("total_steps",)
    batches_folds: ClassVar[bool] = True

    def search_space(
        self, budget: HardwareBudget, window: WindowData, config: Mapping[str, Any]
    ) -> SearchSpace:
        """The agent's space with batch sizes the device's memory holds (for the widest network)."""
        obs_dim = window.splits["train"].n_features * config["env"]["window"] + 1
        bounds = batch_size_bounds(budget, self.spec, obs_dim, max(HIDDEN_DIM_BASES))
        return lambda trial: self.spec.search_space(trial, bounds)

    def folds_per_batch(
        self,
        budget: HardwareBudget,
        window: WindowData,
        config: Mapping[str, Any],
        hparams: Mapping[str, Any],
        precision: PrecisionPlan,
        n_seeds: int,
        n_folds: int,
    ) -> int:
        """As many folds as the device's memory holds with every seed's networks, buffers and a minibatch
        (`marketrl.agents.memory.folds_per_batch`)."""
        obs_dim = window.splits["train"].n_features * config["env"]["window"] + 1
        return folds_per_batch(
            budget,
            self.spec,
            obs_dim,
            hparams,
            config["training"]["n_envs"],
            precision,
            n_seeds,
            n_folds,
        )

    def _validation_positions(
        self, request: TrainRequest, runs: list[GreedyPolicy] | list[TrainResult]
    ) -> list[torch.Tensor]:
        # the seeds of one validation split (one fold) step it in lockstep as one stacked forward
        policies = [run.policy if isinstance(run, TrainResult) else run for run in runs]
        positions: list[torch.Tensor] = [torch.empty(0)] * len(policies)
        for data, indices in request.validation_groups(len(policies)):
            group = GreedyPolicies([policies[index] for index in indices])
            for index, row in zip(
                indices, policies_positions(group, len(indices), data, request.env_config), strict=True
            ):
                positions[index] = row
        return positions

    def _train_seeds(self, request: TrainRequest, on_batch: Callable | None) -> list[TrainResult]:
        eval_every = max(1, request.budget // EVALS_PER_RUN) if on_batch is not None else 0
        run_config = self.spec.make_run_config(
            total_steps=request.budget,
            env=request.env_config,
            eval_every=eval_every,
            check_every=request.config["training"]["check_every"],
        )
        return self.spec.train_seeds(
            request.train_data,
            run_config,
            dict(request.hparams),
            request.precision,
            request.device,
            request.seeds,
            on_eval=on_batch,
            checkpoint=request.checkpoint,
            on_log=_per_seed_records(request.seeds, request.on_log),
            block_rows=None if request.blocks is None else request.blocks.train_rows,
        )

    def _recorded_hparams(self, result: TrainResult, request: TrainRequest) -> dict[str, Any]:
        return dict(request.hparams)

    def _log(self, result: TrainResult) -> dict[str, Any]:
        return {**result.log, "history": [_stepped(record) for record in result.log["history"]]}

    def _loaded(self, result: TrainResult, meta: dict[str, Any], device: torch.device) -> dict[str, Any]:
        """The greedy policy of an agent checkpoint."""
        return {
            "info": {"precision": meta.get("precision"), "hidden": meta["architecture"]["hidden"]},
            "policy": result.policy,
        }

    def exportable(self, loaded: LoadedModel, path: str) -> Exportable:
        """The acting network as a position function (`AgentPolicy`) over the env's observation."""
        assert loaded.policy is not None
        return Exportable(
            window=int(loaded.meta["env"]["window"]),
            module=AgentPolicy(loaded.policy.net),
            booster=None,
            observation={
                "layout": "[window * F normalized features (oldest row first), unit position held into the bar]",
                "window_padding": "rows before the session's first row repeat that first row",
                "action_positions": list(ACTION_POSITIONS),
            },
            fields={
                "inputs": {
                    "windows": "[batch, window, F] float32",
                    "position": "[batch] float32 in {-1, 0, 1}",
                },
                "output": "target unit position [batch] float32 in {-1, 0, 1}",
                "how_to_use": AGENT_HOW_TO_USE,
            },
        )


def _per_seed_records(
    seeds: Sequence[int], on_log: Callable[[dict[str, Any]], None] | None
) -> Callable[[dict[str, Any]], None] | None:
    """An agent's batch statistics record (``{"seeds": [one record per seed]}``) handed to ``on_log`` as one
    record per seed with its ``seed``, in the one log shape (`_stepped`: keyed by ``step``, its env steps)."""
    if on_log is None:
        return None

    def split(record: dict[str, Any]) -> None:
        for seed, one in zip(seeds, record["seeds"], strict=True):
            on_log(_stepped({**one, "seed": int(seed)}))

    return split


# ------------------------------------------------------------------------------------------------- forecasters


def round_trip_cost(costs: Mapping[str, Any]) -> dict[str, Any]:
    """A cost record (`CostModel.to_config` or `InstrumentCosts.to_config`) as the numbers of the round-trip
    cost fraction at a close price: futures 2·cost_per_contract / (close·point_value), bps 2·fraction."""

    def one(spec: Mapping[str, Any]) -> dict[str, Any]:
        if spec["kind"] == "bps":
            return {"kind": "bps", "fraction_per_side": float(spec["bps"]) * 1e-4}
        per_contract = spec["commission_per_contract"] + spec["half_spread_ticks"] * spec["tick_value"]
        return {
            "kind": "futures",
            "cost_per_contract": float(per_contract),
            "point_value": float(spec["tick_value"] / spec["tick_size"]),
        }

    if "instruments" in costs:
        return {"per_symbol_root": {root: one(spec) for root, spec in costs["instruments"].items()}}
    return one(costs)


def run_settings(config: Mapping[str, Any], updates: int) -> RunSettings:
    """A forecaster's run settings from a config slice: horizon, epochs, patience, check_every, max_train_rows,
    env.fill, with
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
        max_train_rows=training["max_train_rows"],
        check_every=training["check_every"],
        eval_every=max(1, updates // EVALS_PER_RUN),
        patience=training["patience"],
    )


@dataclass(frozen=True)
class ForecasterEntry(ZooEntry):
    """A forecaster (`marketrl.models.base.ModelSpec`): it learns the forward return; its trading rule makes the
    positions; `TrainRequest.budget` caps its optimizer steps (boosting rounds)."""

    spec: ModelSpec
    kind: ClassVar[Kind] = "forecaster"
    budget_key: ClassVar[str] = "max_updates"
    trial_budget_key: ClassVar[str] = "trial_updates"
    run_keys: ClassVar[tuple[str, ...]] = ("horizon", "epochs", "max_updates", "max_train_rows", "patience")

    def search_space(
        self, budget: HardwareBudget, window: WindowData, config: Mapping[str, Any]
    ) -> SearchSpace:
        """The model's own space (the trainer caps the batch size by the memory budget itself)."""
        return self.spec.search_space

    @property
    def batches_folds(self) -> bool:  # type: ignore[override]
        """Whether the model's trainer takes folds on the batch axis (the torch forecasters; not lightgbm)."""
        return self.spec.folds_per_batch is not None

    def folds_per_batch(
        self,
        budget: HardwareBudget,
        window: WindowData,
        config: Mapping[str, Any],
        hparams: Mapping[str, Any],
        precision: PrecisionPlan,
        n_seeds: int,
        n_folds: int,
    ) -> int:
        """As many folds as the device's memory holds with every seed's copy, the folds' tables and each seed's
        own batch size (`marketrl.models.supervised_trainer.torch_folds_per_batch`); 1 if the trainer takes one
        fold per call."""
        if self.spec.folds_per_batch is None:
            return 1
        return self.spec.folds_per_batch(budget, window.splits["train"], hparams, precision, n_seeds, n_folds)

    def _validation_positions(
        self, request: TrainRequest, runs: list[TrainedModel | None]
    ) -> list[torch.Tensor | None]:
        return [
            None if model is None else model.positions(request.validation_of(index))
            for index, model in enumerate(runs)
        ]

    def _train_seeds(self, request: TrainRequest, on_batch: Callable | None) -> list[TrainedModel]:
        hooks = TrainHooks(
            log=request.on_log, on_validation=on_batch, checkpoint=request.checkpoint, budget=request.memory
        )
        blocks = request.blocks
        return self.spec.train_seeds(
            request.train_data,
            request.validation_data,
            run_settings(request.config, request.budget),
            dict(request.hparams),
            request.precision,
            request.device,
            request.seeds[:1] if self.deterministic else request.seeds,
            hooks,
            **(
                {}
                if blocks is None
                else {"block_rows": blocks.train_rows, "block_validation": blocks.validation}
            ),
        )

    def _recorded_hparams(self, model: TrainedModel, request: TrainRequest) -> dict[str, Any]:
        return dict(model.hparams)

    def _predictions(self, model: TrainedModel) -> Callable[[MarketData], torch.Tensor]:
        return model.predict

    def _loaded(self, model: TrainedModel, meta: dict[str, Any], device: torch.device) -> dict[str, Any]:
        """The model and its trading rule."""
        return {
            "info": {"precision": model.precision, "hparams": dict(model.hparams)},
            "positions_from_predictions": model.positions,
            # smaller forwards on the CPU (CPU_EVAL_PREDICT_CHUNK); a device keeps the training chunk
            "predictions": functools.partial(
                model.predict, chunk=CPU_EVAL_PREDICT_CHUNK if device.type == "cpu" else None
            ),
            "horizon": int(model.settings["horizon"]),
        }

    def exportable(self, loaded: LoadedModel, path: str) -> Exportable:
        """The predictor (its torch module, or LightGBM's booster) and the trading rule as plain numbers."""
        forecaster = loaded.result
        assert isinstance(forecaster, TrainedModel)
        module = forecaster.module
        booster = forecaster.state.get("booster") if module is None else None
        if module is None and booster is None:
            raise ValueError(
                f"{path}: {self.name} has neither a torch module nor a LightGBM booster to export"
            )
        hparams = loaded.info["hparams"]
        extra = loaded.meta.get("extra") or {}
        return Exportable(
            window=forecaster.window,
            module=module,
            booster=booster,
            observation={"window_padding": "none: a bar without a full window predicts 0 (flat)"},
            fields={
                "inputs": {"windows": "[batch, window, F] float32"},
                "output": "predicted forward return [batch] float32",
                "trading_rule": {
                    "threshold_multiplier": float(hparams["threshold_multiplier"]),
                    "hold_band": float(hparams["hold_band"]),
                    "horizon": int(loaded.horizon or forecaster.settings["horizon"]),
                    "round_trip_cost": round_trip_cost(extra["costs"]),
                    "round_trip_cost_formula": (
                        "futures: 2 * cost_per_contract / (close * point_value) in float64, then float32; "
                        "bps: 2 * fraction_per_side"
                    ),
                },
                "how_to_use": FORECASTER_HOW_TO_USE,
            },
        )


Entry = ZooEntry
#: the zoo entry type of each kind of spec (`ModelSpec.kind`)
ENTRY_TYPES: dict[str, type[ZooEntry]] = {"agent": AgentEntry, "forecaster": ForecasterEntry}


def entry_from_spec(name: str, spec: Any) -> Entry:
    """The zoo entry of a registered spec (a `ModelSpec`); its type is the spec's ``kind`` (`RegistryError` for
    anything else, for a spec named other than its registry name, or for one without a callable ``train_seeds``)."""
    if not isinstance(spec, ModelSpec) or spec.kind not in ENTRY_TYPES:
        raise RegistryError(f"{name}: {type(spec).__name__} is neither an AgentSpec nor a ModelSpec")
    entry: Entry = ENTRY_TYPES[spec.kind](spec)
    if entry.name != name:
        raise RegistryError(f"{name}: the spec is named {entry.name!r}")
    if not callable(spec.train_seeds):
        raise RegistryError(f"{name}: the spec's train_seeds (its only training entry) is not callable")
    return entry


def check_deterministic(entries: Mapping[str, Entry], marked: Sequence[str]) -> None:
    """The models whose registry line is marked deterministic (``marked``, `registry.DETERMINISTIC`: what the
    workflow plans by) are exactly those whose spec says ``deterministic=True`` (what the trainer does); a
    `RegistryError` naming the first that differs."""
    for name, entry in entries.items():
        said = entry.spec.deterministic
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
