"""Pieces shared by the DQN and PPO trainers: hyperparameter parsing, the result object, the greedy policy,
device-side statistics read back once per window, and small helpers for precision and seeding."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpu_utils import NonFiniteError, PrecisionPlan, detect_precision
from marketrl.env import EnvConfig

__all__ = [
    "AgentConfigError",
    "EvalCallback",
    "GreedyPolicy",
    "HParamError",
    "TrainResult",
    "WindowStats",
    "autocast",
    "env_settings",
    "parse_hparams",
    "resolve_precision",
    "seeded",
]

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


def resolve_precision(precision: PrecisionPlan | str, device: torch.device) -> PrecisionPlan:
    """A ready plan, or the ``training.precision`` override string (auto/bf16/fp16/fp32) for this device."""
    if isinstance(precision, PrecisionPlan):
        if precision.device_type != device.type:
            raise ValueError(
                f"training.precision: plan is for {precision.device_type!r}, training runs on {device.type!r}"
            )
        return precision
    return detect_precision(device, precision)


@contextlib.contextmanager
def autocast(plan: PrecisionPlan) -> Iterator[None]:
    """Forward-pass autocast for inference (no-op for fp32), matching ``OptimStep.autocast``."""
    if not plan.autocast_enabled:
        yield
        return
    with torch.autocast(device_type=plan.device_type, dtype=plan.dtype):
        yield


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
        with autocast(self.plan):
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


class WindowStats:
    """Training statistics kept on the device and read back with ONE transfer per window.

    * ``record(values)``: one row of per-step scalars (0-dim tensors, one per name in ``columns``) written into a
      preallocated device buffer with a single ``torch.stack(..., out=row)``; the window's sum, min and max of
      every column are reduced only when it is read (a full buffer is folded into running accumulators first).
    * ``counter(name)``: a device vector of ``counter_width`` running sums the caller updates in place (e.g. one
      slot per env for finished-episode returns); it is summed when read.

    ``read(step)`` copies everything to the host with one ``tolist()``, resets, and raises ``NonFiniteError`` if
    a ``watched`` column's sum is NaN/inf: a non-finite value anywhere makes the sum non-finite, so this is the
    NaN guard, sharing the statistics' read instead of adding a second one.
    """

    def __init__(
        self,
        columns: list[str],
        device: torch.device,
        *,
        counters: tuple[str, ...] = (),
        watched: tuple[str, ...] = (),
        capacity: int = 128,
        counter_width: int = 1,
    ) -> None:
        self.columns = list(columns)
        self.counters = list(counters)
        self.watched = list(watched)
        self.device = device
        self.host_reads = 0
        self.window_start = 1
        width = len(self.columns)
        self._rows = torch.zeros(max(1, capacity), width, dtype=torch.float32, device=device)
        self._next_row = 0
        self._folded = torch.tensor([[0.0] * width, [math.inf] * width, [-math.inf] * width], device=device)
        self._counts = torch.zeros(len(self.counters), counter_width, dtype=torch.float32, device=device)

    def record(self, values: list[torch.Tensor]) -> None:
        """Write one row of 0-dim float32 tensors (in ``columns`` order); no host sync."""
        if self._next_row == self._rows.shape[0]:
            self._fold()
        torch.stack(values, out=self._rows[self._next_row])
        self._next_row += 1

    def counter(self, name: str) -> torch.Tensor:
        """The running-sum vector of one counter (a view: update it in place, e.g. ``add_``)."""
        return self._counts[self.counters.index(name)]

    def _reduced(self) -> torch.Tensor:
        """[3, columns]: sum, min and max over the window (folded part and pending rows)."""
        rows = self._rows[: self._next_row]
        if rows.shape[0] == 0:
            return self._folded
        low, high = torch.aminmax(rows, dim=0)
        return torch.stack(
            [self._folded[0] + rows.sum(dim=0), self._folded[1].minimum(low), self._folded[2].maximum(high)]
        )

    def _fold(self) -> None:
        self._folded = self._reduced()
        self._next_row = 0

    def read(self, step: int) -> dict[str, float]:
        """One device→host copy of the window; reset; raise on non-finite watched sums.

        Keys: each column's sum under its name plus ``<name>_min`` / ``<name>_max``, and each counter's sum.
        ``step`` is the loop's step counter at the read (the NaN message names the window of steps).
        """
        packed = torch.cat([self._reduced().reshape(-1), self._counts.sum(dim=1)]).tolist()
        self.host_reads += 1
        width = len(self.columns)
        record: dict[str, float] = {}
        for index, name in enumerate(self.columns):
            record[name] = packed[index]
            record[f"{name}_min"] = packed[width + index]
            record[f"{name}_max"] = packed[2 * width + index]
        record.update(zip(self.counters, packed[3 * width :], strict=True))
        bad = [name for name in self.watched if not _finite(record[name])]
        first, self.window_start = self.window_start, step + 1
        self._next_row = 0
        self._folded = torch.tensor(
            [[0.0] * width, [math.inf] * width, [-math.inf] * width], device=self.device
        )
        self._counts.zero_()
        if bad:
            quoted = ", ".join(repr(name) for name in bad)
            raise NonFiniteError(f"non-finite {quoted} between steps {first} and {step}")
        return record

    def state_dict(self) -> dict[str, Any]:
        """The pending window (device tensors and counters), for resumable training checkpoints."""
        return {
            "rows": self._rows,
            "next_row": self._next_row,
            "folded": self._folded,
            "counts": self._counts,
            "host_reads": self.host_reads,
            "window_start": self.window_start,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` in place (counter views handed out by `counter` stay valid)."""
        self._rows.copy_(state["rows"])
        self._folded = state["folded"].to(self.device)
        self._counts.copy_(state["counts"])
        self._next_row = int(state["next_row"])
        self.host_reads = int(state["host_reads"])
        self.window_start = int(state["window_start"])


def _finite(value: float) -> bool:
    return value == value and value not in (float("inf"), float("-inf"))


class EvalSchedule:
    """Calls ``on_eval`` whenever the env-step count crosses a multiple of ``every`` (0: only at the end)."""

    def __init__(self, on_eval: EvalCallback | None, every: int) -> None:
        self.on_eval = on_eval
        self.every = int(every)
        self.next_at = self.every if self.every > 0 else None
        self.records: list[list[float | None]] = []
        self._last_step: int | None = None

    def maybe(self, env_steps: int, policy: GreedyPolicy) -> None:
        """Evaluate if a multiple of ``every`` was reached since the last call."""
        if self.on_eval is None or self.next_at is None or env_steps < self.next_at:
            return
        while self.next_at <= env_steps:
            self.next_at += self.every
        self._call(env_steps, policy)

    def final(self, env_steps: int, policy: GreedyPolicy) -> None:
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

    def _call(self, env_steps: int, policy: GreedyPolicy) -> None:
        self._last_step = env_steps
        score = self.on_eval(env_steps, policy)
        self.records.append([env_steps, None if score is None else float(score)])
