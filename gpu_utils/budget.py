"""Memory budget of the training device and the batch sizes it can hold for the DQN and PPO networks.

Estimates are deliberately simple and conservative (constants below, documented in docs/GPU.md): they bound a
hyper-parameter search space, they do not replace a real out-of-memory test.
"""

from __future__ import annotations

import logging
import os
import platform
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any, Literal

import torch

from gpu_utils.precision import PrecisionPlan

__all__ = [
    "ACTIVATION_SAFETY_FACTOR",
    "BATCH_LIMITS",
    "MEMORY_FRACTION",
    "BudgetError",
    "HardwareBudget",
    "dqn_hidden_widths",
    "mlp_parameter_count",
    "parameter_count",
    "per_sample_bytes",
    "ppo_policy_widths",
    "ppo_value_widths",
    "static_memory_bytes",
]

log = logging.getLogger(__name__)

ModelKind = Literal["dqn", "ppo"]

N_ACTIONS = 3  # short / flat / long
FP32_BYTES = 4
ADAM_STATE_COPIES = 2  # exp_avg and exp_avg_sq, fp32 like the master weights
DQN_REPLAY_EXTRA_FIELDS = 3  # action, reward, done (besides obs and next_obs)
PPO_ROLLOUT_EXTRA_FIELDS = 7  # action, reward, done, old log-prob, value, advantage, return
DQN_FORWARD_PASSES = 3  # online(s) with grad, online(s') for the double-DQN argmax, target(s')
ACTIVATION_SAFETY_FACTOR = 4  # saved activations + their grads + pre-activation copies + autocast casts
MEMORY_FRACTION = {"cuda": 0.5, "cpu": 0.25}  # of free device memory / of available host RAM
BATCH_LIMITS: dict[str, tuple[int, int]] = {"dqn": (32, 8192), "ppo": (64, 65536)}  # PPO: minibatch size
_ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


class BudgetError(ValueError):
    """Bad budget arguments, or a configuration that does not fit in memory at the smallest batch."""


def dqn_hidden_widths(hidden_dim_base: int) -> list[int]:
    """Q-network hidden widths ``[b, b/2, b/4]`` (then ``N_ACTIONS`` outputs)."""
    return [hidden_dim_base, hidden_dim_base // 2, hidden_dim_base // 4]


def ppo_policy_widths(hidden_dim_base: int) -> list[int]:
    """Policy hidden widths ``[b, b/2]`` (then ``N_ACTIONS`` logits)."""
    return [hidden_dim_base, hidden_dim_base // 2]


def ppo_value_widths(hidden_dim_base: int) -> list[int]:
    """Value hidden widths ``[2b, b, b/2]`` (then one output)."""
    return [2 * hidden_dim_base, hidden_dim_base, hidden_dim_base // 2]


def mlp_parameter_count(in_dim: int, hidden: list[int], out_dim: int) -> int:
    """Weights plus biases of a fully connected stack ``in_dim -> hidden... -> out_dim``."""
    dims = [in_dim, *hidden, out_dim]
    return sum(a * b + b for a, b in pairwise(dims))


def _check(kind: str, obs_dim: int, hidden_dim_base: int) -> None:
    if kind not in BATCH_LIMITS:
        raise BudgetError(f"kind must be one of {sorted(BATCH_LIMITS)}, got {kind!r}")
    if obs_dim < 1:
        raise BudgetError(f"obs_dim must be >= 1, got {obs_dim}")
    if hidden_dim_base < 4:
        raise BudgetError(f"hidden_dim_base must be >= 4 (the narrowest layer is b/4), got {hidden_dim_base}")


def parameter_count(kind: ModelKind, obs_dim: int, hidden_dim_base: int) -> int:
    """Trainable parameters: the Q-network for DQN (target net not included), policy + value for PPO."""
    _check(kind, obs_dim, hidden_dim_base)
    if kind == "dqn":
        return mlp_parameter_count(obs_dim, dqn_hidden_widths(hidden_dim_base), N_ACTIONS)
    return mlp_parameter_count(obs_dim, ppo_policy_widths(hidden_dim_base), N_ACTIONS) + mlp_parameter_count(
        obs_dim, ppo_value_widths(hidden_dim_base), 1
    )


def _precision_mode(precision: str | PrecisionPlan) -> str:
    mode = precision.mode if isinstance(precision, PrecisionPlan) else str(precision)
    if mode not in _ACTIVATION_BYTES:
        raise BudgetError(f"precision must be one of {sorted(_ACTIVATION_BYTES)}, got {mode!r}")
    return mode


def static_memory_bytes(kind: ModelKind, obs_dim: int, hidden_dim_base: int, replay_capacity: int = 0) -> int:
    """Batch-independent bytes: fp32 weights, grads, Adam state (x2), DQN target net, replay/rollout buffer.

    Weights stay fp32 under autocast (only activations shrink), so precision does not change this figure.
    ``replay_capacity`` is the DQN replay capacity or the PPO rollout length (transitions).
    """
    params = parameter_count(kind, obs_dim, hidden_dim_base)
    if replay_capacity < 0:
        raise BudgetError(f"replay_capacity must be >= 0, got {replay_capacity}")
    copies = 1 + 1 + ADAM_STATE_COPIES + (1 if kind == "dqn" else 0)
    extra = DQN_REPLAY_EXTRA_FIELDS + obs_dim if kind == "dqn" else PPO_ROLLOUT_EXTRA_FIELDS
    buffer = int(replay_capacity) * (obs_dim + extra) * FP32_BYTES
    return params * copies * FP32_BYTES + buffer


def per_sample_bytes(
    kind: ModelKind, obs_dim: int, hidden_dim_base: int, precision: str | PrecisionPlan
) -> int:
    """Bytes one minibatch sample costs: its input copy plus activations x ``ACTIVATION_SAFETY_FACTOR``."""
    _check(kind, obs_dim, hidden_dim_base)
    element = _ACTIVATION_BYTES[_precision_mode(precision)]
    if kind == "dqn":
        widths = DQN_FORWARD_PASSES * (sum(dqn_hidden_widths(hidden_dim_base)) + N_ACTIONS)
        inputs = (2 * obs_dim + DQN_REPLAY_EXTRA_FIELDS) * FP32_BYTES
    else:
        widths = (
            sum(ppo_policy_widths(hidden_dim_base)) + N_ACTIONS + sum(ppo_value_widths(hidden_dim_base)) + 1
        )
        inputs = (obs_dim + PPO_ROLLOUT_EXTRA_FIELDS) * FP32_BYTES
    return widths * element * ACTIVATION_SAFETY_FACTOR + inputs


@dataclass(frozen=True)
class HardwareBudget:
    """Memory of the device training will run on (bytes), as seen when ``detect`` was called."""

    device_type: str
    device_name: str
    total_memory_bytes: int
    free_memory_bytes: int
    capability: tuple[int, int] | None = None

    @classmethod
    def detect(cls, device: torch.device | str | None = None) -> HardwareBudget:
        """Read the device's memory: ``torch.cuda.mem_get_info`` on CUDA, available RAM elsewhere."""
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dev = torch.device(device)
        if dev.type == "cuda":
            index = dev.index if dev.index is not None else torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(index)
            capability = tuple(torch.cuda.get_device_capability(index))
            budget = cls("cuda", torch.cuda.get_device_name(index), int(total), int(free), capability)  # type: ignore[arg-type]
        else:
            total, available = _host_memory()
            budget = cls(dev.type, platform.processor() or platform.machine() or "cpu", total, available)
        log.info("hardware budget: %s", budget.to_dict())
        return budget

    @property
    def memory_fraction(self) -> float:
        """Share of free memory the batch-size bound may use (``MEMORY_FRACTION``; CPU value off CUDA)."""
        return MEMORY_FRACTION.get(self.device_type, MEMORY_FRACTION["cpu"])

    @property
    def usable_bytes(self) -> int:
        """Free memory times ``memory_fraction``."""
        return int(self.free_memory_bytes * self.memory_fraction)

    def static_memory_bytes(
        self, kind: ModelKind, obs_dim: int, hidden_dim_base: int, replay_capacity: int = 0
    ) -> int:
        """See ``gpu_utils.budget.static_memory_bytes``."""
        return static_memory_bytes(kind, obs_dim, hidden_dim_base, replay_capacity)

    def per_sample_bytes(
        self, kind: ModelKind, obs_dim: int, hidden_dim_base: int, precision: str | PrecisionPlan = "fp32"
    ) -> int:
        """See ``gpu_utils.budget.per_sample_bytes``."""
        return per_sample_bytes(kind, obs_dim, hidden_dim_base, precision)

    def batch_size_bounds(
        self,
        kind: ModelKind,
        obs_dim: int,
        hidden_dim_base: int,
        replay_capacity: int = 0,
        precision: str | PrecisionPlan = "fp32",
    ) -> tuple[int, int]:
        """(min, max) batch size, multiples of 8 within ``BATCH_LIMITS[kind]``, that fit in ``usable_bytes``.

        Raises ``BudgetError`` when even the minimum batch does not fit next to the static memory.
        """
        _check(kind, obs_dim, hidden_dim_base)
        low, high = BATCH_LIMITS[kind]
        static = self.static_memory_bytes(kind, obs_dim, hidden_dim_base, replay_capacity)
        sample = self.per_sample_bytes(kind, obs_dim, hidden_dim_base, precision)
        room = self.usable_bytes - static
        fits = room // sample if room > 0 else 0
        if fits < low:
            raise BudgetError(
                f"{kind} with obs_dim={obs_dim}, hidden_dim_base={hidden_dim_base}, replay_capacity={replay_capacity} "
                f"needs {static + low * sample} bytes for batch {low} but {self.device_type} {self.device_name!r} "
                f"offers {self.usable_bytes} usable bytes ({self.memory_fraction:.0%} of free)"
            )
        return low, min(high, fits // 8 * 8)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary."""
        data = asdict(self)
        data["capability"] = list(self.capability) if self.capability is not None else None
        data["memory_fraction"] = self.memory_fraction
        return data


def _host_memory() -> tuple[int, int]:
    """(total, available) host RAM in bytes: psutil when installed, else sysconf."""
    try:
        import psutil
    except ImportError:
        page = os.sysconf("SC_PAGE_SIZE")
        return page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES")
    memory = psutil.virtual_memory()
    return int(memory.total), int(memory.available)
