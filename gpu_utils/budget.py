"""How large a minibatch the training device's memory holds, for any torch model.

The caller describes its model by numbers only: the trained parameter count, frozen parameters (e.g. a target
copy), preallocated buffers, and what one sample costs (`sample_bytes`). Estimates are deliberately simple and
conservative (constants below, documented in docs/GPU.md): they bound a hyper-parameter search space, they do not
replace a real out-of-memory test.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

import torch

from gpu_utils.precision import PrecisionPlan

__all__ = [
    "ACTIVATION_SAFETY_FACTOR",
    "MEMORY_FRACTION",
    "BudgetError",
    "HardwareBudget",
    "mlp_parameter_count",
    "sample_bytes",
    "static_memory_bytes",
]

log = logging.getLogger(__name__)

FP32_BYTES = 4
TRAINED_COPIES = (
    4  # fp32 weights, their grads, Adam's exp_avg and exp_avg_sq (weights stay fp32 under autocast)
)
ACTIVATION_SAFETY_FACTOR = 4  # saved activations + their grads + pre-activation copies + autocast casts
MEMORY_FRACTION = {"cuda": 0.5, "cpu": 0.25}  # of free device memory / of available host RAM
_ACTIVATION_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


class BudgetError(ValueError):
    """Bad budget arguments, or a model that does not fit in memory at the smallest batch."""


def _non_negative(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BudgetError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def mlp_parameter_count(in_dim: int, hidden: Sequence[int], out_dim: int) -> int:
    """Weights plus biases of a fully connected stack ``in_dim -> hidden... -> out_dim``."""
    dims = [in_dim, *hidden, out_dim]
    return sum(a * b + b for a, b in pairwise(dims))


def static_memory_bytes(
    parameter_count: int, *, frozen_parameter_count: int = 0, buffer_bytes: int = 0
) -> int:
    """Batch-independent bytes: ``TRAINED_COPIES`` fp32 copies of the trained parameters, one fp32 copy of the
    frozen ones (e.g. a target network), plus any preallocated buffer (sample store, dataset cache...)."""
    trained = _non_negative("parameter_count", parameter_count)
    frozen = _non_negative("frozen_parameter_count", frozen_parameter_count)
    return (trained * TRAINED_COPIES + frozen) * FP32_BYTES + _non_negative("buffer_bytes", buffer_bytes)


def _precision_mode(precision: str | PrecisionPlan) -> str:
    mode = precision.mode if isinstance(precision, PrecisionPlan) else str(precision)
    if mode not in _ACTIVATION_BYTES:
        raise BudgetError(f"precision must be one of {sorted(_ACTIVATION_BYTES)}, got {mode!r}")
    return mode


def sample_bytes(activations: int, input_floats: int, precision: str | PrecisionPlan = "fp32") -> int:
    """Bytes one minibatch sample costs: its ``activations`` (output elements of every layer in every forward
    pass, in the autocast dtype) x ``ACTIVATION_SAFETY_FACTOR``, plus its ``input_floats`` fp32 input values."""
    element = _ACTIVATION_BYTES[_precision_mode(precision)]
    activations = _non_negative("activations", activations)
    return (
        activations * element * ACTIVATION_SAFETY_FACTOR
        + _non_negative("input_floats", input_floats) * FP32_BYTES
    )


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

    def batch_size_bounds(
        self,
        parameter_count: int,
        bytes_per_sample: int,
        *,
        limits: tuple[int, int],
        frozen_parameter_count: int = 0,
        buffer_bytes: int = 0,
        multiple: int = 8,
        what: str = "model",
    ) -> tuple[int, int]:
        """(min, max) batch size within ``limits``, max a multiple of ``multiple``, that fits in ``usable_bytes``
        next to `static_memory_bytes`.

        Raises ``BudgetError`` (naming ``what``) when even ``limits[0]`` samples do not fit.
        """
        low, high = limits
        if not 1 <= low <= high:
            raise BudgetError(f"limits must be (low, high) with 1 <= low <= high, got {limits!r}")
        if _non_negative("bytes_per_sample", bytes_per_sample) == 0 or multiple < 1:
            raise BudgetError(
                f"bytes_per_sample and multiple must be >= 1, got {bytes_per_sample}, {multiple}"
            )
        static = static_memory_bytes(
            parameter_count, frozen_parameter_count=frozen_parameter_count, buffer_bytes=buffer_bytes
        )
        room = self.usable_bytes - static
        fits = room // bytes_per_sample if room > 0 else 0
        if fits < low:
            raise BudgetError(
                f"{what} needs {static + low * bytes_per_sample} bytes for batch {low} but {self.device_type} "
                f"{self.device_name!r} offers {self.usable_bytes} usable bytes ({self.memory_fraction:.0%} of free)"
            )
        return low, max(low, min(high, fits // multiple * multiple))

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
