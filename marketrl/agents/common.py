"""Pieces shared by the DQN and PPO trainers: hyperparameter parsing, the common set-up (`set_up`) and ending
(`finish`) of a training run, the result object, the greedy policy and the evaluation schedule."""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from gpu_utils import PrecisionPlan, resolve_precision
from marketrl.agents.networks import build_networks, make_architecture
from marketrl.agents.resume import Run
from marketrl.env import EnvConfig, MarketData, TradingEnv

__all__ = [
    "AgentConfigError",
    "EvalCallback",
    "EvalSchedule",
    "GreedyPolicy",
    "HParamError",
    "RunConfig",
    "Setup",
    "TrainResult",
    "check_ranges",
    "env_settings",
    "finish",
    "parse_hparams",
    "seeded",
    "set_up",
]

#: Offset of the trainer's own generator seed (exploration, Gumbel noise, minibatch order) from the run seed.
GENERATOR_SEED_OFFSET = 7919

#: on_eval(env_steps, policy) -> validation score or None; may raise (e.g. optuna.TrialPruned) to stop training.
EvalCallback = Callable[[int, Callable[[torch.Tensor], torch.Tensor]], float | None]


class HParamError(ValueError):
    """A hyperparameter is unknown, of the wrong type or out of range."""


class AgentConfigError(ValueError):
    """A run setting (``training.*``) of a trainer config is invalid."""


def check_run_setting(key: str, value: Any, minimum: int) -> None:
    """Raise ``AgentConfigError`` unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise AgentConfigError(f"training.{key}: expected an integer >= {minimum}, got {value!r}")


_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "positive": (lambda v: v > 0, "a number > 0"),
    "positive_or_null": (lambda v: v is None or v > 0, "> 0 or null"),
    "non_negative": (lambda v: v >= 0, "a number >= 0"),
    "at_least_one": (lambda v: v >= 1, "an integer >= 1"),
    "unit": (lambda v: 0 <= v <= 1, "a number in [0, 1]"),
    "unit_above_zero": (lambda v: 0 < v <= 1, "a number in (0, 1]"),
}


def check_ranges(hp: Any, **groups: tuple[str, ...]) -> None:
    """Raise ``HParamError`` for the first field of ``hp`` outside its group's range; groups are the keys of
    ``_RANGES`` (``positive=("learning_rate",), unit=("gamma",), ...``)."""
    for group, keys in groups.items():
        holds, expectation = _RANGES[group]
        for key in keys:
            require(holds(getattr(hp, key)), key, expectation, getattr(hp, key))


@dataclass(frozen=True)
class RunConfig:
    """Run settings every trainer takes (not tuned): length, environment and evaluation cadence."""

    total_steps: int = 60_000  # env steps (transitions, N per vector step)
    env: EnvConfig = field(default_factory=EnvConfig)
    eval_every: int = 0  # env steps between on_eval calls (0: only at the end)

    def __post_init__(self) -> None:
        check_run_setting("total_steps", self.total_steps, 1)
        check_run_setting("eval_every", self.eval_every, 0)


def parse_hparams(cls: type, hparams: Mapping[str, Any] | None, algo: str) -> Any:
    """Build the frozen hyperparameter dataclass ``cls`` from a plain dict (e.g. hyperopt JSON).

    Unknown keys and wrong types raise ``HParamError`` naming ``hparams.<key>``; an int is accepted where a float
    is expected, a bool never counts as a number.
    """
    hparams = dict(hparams or {})
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    for key, value in hparams.items():
        if key not in hints:
            raise HParamError(f"hparams.{key}: unknown {algo} hyperparameter (known: {', '.join(known)})")
        hparams[key] = _coerce(key, value, hints[key])
    result = cls(**hparams)
    check = getattr(result, "validate", None)
    if check is not None:
        check()
    return result


def _coerce(key: str, value: Any, hint: Any) -> Any:
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None:
        if type(None) in allowed:
            return None
        raise HParamError(f"hparams.{key}: expected {_describe(allowed)}, got None")
    for kind in allowed:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if typing.get_origin(kind) is list and isinstance(value, list | tuple):
            return [_coerce(key, item, typing.get_args(kind)[0]) for item in value]
    raise HParamError(f"hparams.{key}: expected {_describe(allowed)}, got {type(value).__name__} {value!r}")


def _describe(allowed: tuple[Any, ...]) -> str:
    names = ["null" if kind is type(None) else getattr(kind, "__name__", str(kind)) for kind in allowed]
    return " or ".join(names)


def require(condition: bool, key: str, expectation: str, value: Any) -> None:
    """Raise ``HParamError`` for ``hparams.<key>`` unless ``condition`` holds."""
    if not condition:
        raise HParamError(f"hparams.{key}: expected {expectation}, got {value!r}")


def env_settings(config: EnvConfig) -> dict[str, Any]:
    """The environment settings as plain data (``max_gap`` in seconds), for logs and checkpoints."""
    values = dataclasses.asdict(config)
    values["max_gap"] = None if config.max_gap is None else config.max_gap.total_seconds()
    return values


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block (network initialization) under a fixed seed without disturbing the caller's global RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class GreedyPolicy:
    """Deterministic act function: ``obs [B, obs_dim] -> argmax actions [B]`` (LongTensor, obs's device)."""

    def __init__(self, net: nn.Module, plan: PrecisionPlan) -> None:
        self.net = net
        self.plan = plan

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions (argmax of Q-values or logits)."""
        with self.plan.autocast():
            scores = self.net(obs)
        return scores.float().argmax(dim=1)


@dataclass
class TrainResult:
    """What a trainer returns: the trained networks (on the training device), a greedy act function and a log.

    ``log`` keys: algo, env_steps, grad_steps, steps_per_second, host_syncs (device→host reads made by the loop),
    precision (plan dict), hidden_sizes, architecture, hparams (resolved, defaults included), the last window's
    statistics (loss, q_mean/value_mean, entropy, episode_return_mean, ...), evals [[env_steps, score], ...] and
    history (one record per statistics read).
    """

    algo: str
    networks: dict[str, nn.Module]
    policy: GreedyPolicy
    architecture: dict[str, Any]
    hparams: dict[str, Any]
    precision: PrecisionPlan
    log: dict[str, Any] = field(default_factory=dict)


class EvalSchedule:
    """Calls ``on_eval`` whenever the step count crosses a multiple of ``every`` (0: only at the end); the
    scores are kept in ``records`` and in the resumable state. ``on_eval`` may raise to stop training (pruning)."""

    def __init__(self, on_eval: EvalCallback | None, every: int) -> None:
        self.on_eval = on_eval
        self.every = int(every)
        self.next_at = self.every if self.every > 0 else None
        self.records: list[list[float | None]] = []
        self._last_step: int | None = None

    def maybe(self, env_steps: int, policy: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Evaluate if a multiple of ``every`` was reached since the last call."""
        if self.on_eval is None or self.next_at is None or env_steps < self.next_at:
            return
        while self.next_at <= env_steps:
            self.next_at += self.every
        self._call(env_steps, policy)

    def final(self, env_steps: int, policy: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Evaluate at the end of training (unless the last evaluation was at this very step)."""
        if self.on_eval is not None and self._last_step != env_steps:
            self._call(env_steps, policy)

    def state_dict(self) -> dict[str, Any]:
        """Schedule position and the scores so far, for resumable training checkpoints."""
        return {"next_at": self.next_at, "records": self.records, "last_step": self._last_step}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict`."""
        self.next_at = state["next_at"]
        self.records = [list(record) for record in state["records"]]
        self._last_step = state["last_step"]

    def _call(self, env_steps: int, policy: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self._last_step = env_steps
        score = self.on_eval(env_steps, policy)
        self.records.append([env_steps, None if score is None else float(score)])


class Setup(NamedTuple):
    """What every agent's ``train`` starts from (see `set_up`)."""

    hp: Any
    device: torch.device
    plan: PrecisionPlan
    env: TradingEnv
    architecture: dict[str, Any]
    networks: dict[str, nn.Module]
    generator: torch.Generator


def set_up(
    algo: str,
    hparams_class: type,
    hparams: Mapping[str, Any] | None,
    train_data: MarketData,
    env_config: EnvConfig,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seed: int,
) -> Setup:
    """Parse the hyperparameters, choose the precision, build the env and the seeded networks (on the device)
    and the trainer's generator (``seed + GENERATOR_SEED_OFFSET``)."""
    hp = parse_hparams(hparams_class, hparams, algo)
    device = torch.device(device)
    plan = resolve_precision(precision, device)
    env = TradingEnv(train_data, env_config, seed=seed, device=device)
    architecture = make_architecture(algo, env.obs_dim, dataclasses.asdict(hp))
    with seeded(seed):
        networks = {name: net.to(device) for name, net in build_networks(architecture).items()}
    generator = torch.Generator(device=device).manual_seed(seed + GENERATOR_SEED_OFFSET)
    return Setup(hp, device, plan, env, architecture, networks, generator)


def finish(
    setup: Setup,
    run: Run,
    evals: EvalSchedule,
    policy: GreedyPolicy,
    networks: dict[str, nn.Module],
    latest: tuple[str, ...],
    **log_fields: Any,
) -> TrainResult:
    """Time the run, make the final evaluation and assemble the `TrainResult`.

    Its log holds ``log_fields``, the most recent non-None value of each ``latest`` statistic in the history
    (None if never recorded), and the fields every trainer logs (see `TrainResult`).
    """
    env_steps = log_fields["env_steps"]
    summary = run.finish(env_steps)
    evals.final(env_steps, policy)
    algo = setup.architecture["algo"]
    hparams = dataclasses.asdict(setup.hp)
    values: dict[str, Any] = dict.fromkeys(latest)
    for record in summary["history"]:
        values.update({name: record[name] for name in latest if record.get(name) is not None})
    log = {
        "algo": algo,
        **log_fields,
        **values,
        "steps_per_second": summary["steps_per_second"],
        "precision": setup.plan.to_dict(),
        "env": env_settings(setup.env.config),
        "hidden_sizes": setup.architecture["hidden"],
        "architecture": setup.architecture,
        "hparams": hparams,
        "evals": evals.records,
        "history": summary["history"],
    }
    return TrainResult(algo, networks, policy, setup.architecture, hparams, setup.plan, log)
