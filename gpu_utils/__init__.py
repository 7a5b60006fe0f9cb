"""Device-aware training utilities for any torch training loop: precision choice, sync-free optimisation steps,
device-side statistics with a NaN guard, sync accounting and memory budgets.

Nothing here knows what is trained or on which data: every training loop of the project, reinforcement learning
or supervised, calls the same pieces, so "use the device well" is decided in one place; see docs/GPU.md.
tests/test_gpu_utils_isolation.py keeps it that way.
"""

from gpu_utils.budget import (
    ACTIVATION_SAFETY_FACTOR,
    MEMORY_FRACTION,
    BudgetError,
    HardwareBudget,
    mlp_parameter_count,
    sample_bytes,
    static_memory_bytes,
)
from gpu_utils.capture import CapturedCall, capturable_plan
from gpu_utils.device import DeviceError, resolve_device
from gpu_utils.metrics import DeviceMetrics, NonFiniteError
from gpu_utils.precision import (
    OVERRIDE_KEY,
    PrecisionError,
    PrecisionPlan,
    detect_precision,
    lookup_gpu,
    resolve_precision,
    select_precision,
)
from gpu_utils.seeds import SeedOptimStep, per_seed_grad_norms, stack_modules, unstack_state
from gpu_utils.step import OptimStep, make_optimizer
from gpu_utils.streams import SeedStreams
from gpu_utils.sync import SyncCounter, disable_distribution_validation, distribution_validation

__all__ = [
    "ACTIVATION_SAFETY_FACTOR",
    "MEMORY_FRACTION",
    "OVERRIDE_KEY",
    "BudgetError",
    "CapturedCall",
    "DeviceError",
    "DeviceMetrics",
    "HardwareBudget",
    "NonFiniteError",
    "OptimStep",
    "PrecisionError",
    "PrecisionPlan",
    "SeedOptimStep",
    "SeedStreams",
    "SyncCounter",
    "capturable_plan",
    "detect_precision",
    "disable_distribution_validation",
    "distribution_validation",
    "lookup_gpu",
    "make_optimizer",
    "mlp_parameter_count",
    "per_seed_grad_norms",
    "resolve_device",
    "resolve_precision",
    "sample_bytes",
    "select_precision",
    "stack_modules",
    "static_memory_bytes",
    "unstack_state",
]
