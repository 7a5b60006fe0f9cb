"""Device-aware training utilities: precision choice, sync-free optimisation steps, sync accounting, budgets.

Every trainer goes through this package so that "use the device well" is decided in one place; see docs/GPU.md.
"""

from gpu_utils.budget import (
    ACTIVATION_SAFETY_FACTOR,
    BATCH_LIMITS,
    MEMORY_FRACTION,
    BudgetError,
    HardwareBudget,
    dqn_hidden_widths,
    mlp_parameter_count,
    parameter_count,
    per_sample_bytes,
    ppo_policy_widths,
    ppo_value_widths,
    static_memory_bytes,
)
from gpu_utils.device import DeviceError, resolve_device
from gpu_utils.precision import (
    OVERRIDE_KEY,
    PrecisionError,
    PrecisionPlan,
    detect_precision,
    lookup_gpu,
    select_precision,
)
from gpu_utils.step import OptimStep, make_optimizer
from gpu_utils.sync import (
    DeviceMetrics,
    NaNGuard,
    NonFiniteError,
    SyncCounter,
    disable_distribution_validation,
    distribution_validation,
)

__all__ = [
    "ACTIVATION_SAFETY_FACTOR",
    "BATCH_LIMITS",
    "MEMORY_FRACTION",
    "OVERRIDE_KEY",
    "BudgetError",
    "DeviceError",
    "DeviceMetrics",
    "HardwareBudget",
    "NaNGuard",
    "NonFiniteError",
    "OptimStep",
    "PrecisionError",
    "PrecisionPlan",
    "SyncCounter",
    "detect_precision",
    "disable_distribution_validation",
    "distribution_validation",
    "dqn_hidden_widths",
    "lookup_gpu",
    "make_optimizer",
    "mlp_parameter_count",
    "parameter_count",
    "per_sample_bytes",
    "ppo_policy_widths",
    "ppo_value_widths",
    "resolve_device",
    "select_precision",
    "static_memory_bytes",
]
