"""Device memory of agent training, described to `gpu_utils.HardwareBudget` for VRAM-aware batch bounds.

The widths come from `networks.hidden_sizes` (the networks that are really built); the rest is the agent's own
bookkeeping, from its spec (`AgentSpec.memory`): what a replay or rollout row holds and how many forward passes
one sample goes through.
"""

from __future__ import annotations

from gpu_utils import HardwareBudget, PrecisionPlan, mlp_parameter_count, sample_bytes
from marketrl.agents.networks import hidden_sizes
from marketrl.agents.spec import AgentSpec, agent_spec

__all__ = ["batch_size_bounds", "footprint"]

_FLOAT_BYTES = 4


def footprint(
    agent: AgentSpec | str,
    obs_dim: int,
    hidden_dim_base: int,
    buffer_rows: int = 0,
    precision: str | PrecisionPlan = "fp32",
    n_seeds: int = 1,
) -> dict[str, int]:
    """``parameter_count``, ``frozen_parameter_count`` (the DQN target net), ``buffer_bytes`` (``buffer_rows`` of
    the DQN replay buffer or the PPO rollout) and ``bytes_per_sample``: the arguments of
    `gpu_utils.HardwareBudget.batch_size_bounds`. With ``n_seeds`` = S seeds trained as one batch every term is
    S times one seed's (S networks, S buffers, and each minibatch sample is drawn by every seed)."""
    spec = agent_spec(agent)
    memory = spec.memory
    widths = hidden_sizes(spec, {"hidden_dim_base": hidden_dim_base})
    params = sum(mlp_parameter_count(obs_dim, widths[name], spec.networks[name]) for name in widths)
    activations = memory.forward_passes * sum(sum(widths[name]) + spec.networks[name] for name in widths)
    row = memory.obs_per_row * obs_dim + memory.extra_fields
    return {
        "parameter_count": n_seeds * params,
        "frozen_parameter_count": n_seeds * params if memory.frozen_copy else 0,
        "buffer_bytes": n_seeds * buffer_rows * row * _FLOAT_BYTES,
        "bytes_per_sample": n_seeds * sample_bytes(activations, row, precision),
    }


def batch_size_bounds(
    budget: HardwareBudget,
    agent: AgentSpec | str,
    obs_dim: int,
    hidden_dim_base: int,
    buffer_rows: int = 0,
    precision: str | PrecisionPlan = "fp32",
    n_seeds: int = 1,
) -> tuple[int, int]:
    """(min, max) batch size (per seed) of the agent within its `AgentSpec.batch_limits` that ``budget`` holds
    for ``n_seeds`` seeds trained as one batch (see `footprint`)."""
    spec = agent_spec(agent)
    what = f"{spec.name} with obs_dim={obs_dim}, hidden_dim_base={hidden_dim_base}, buffer_rows={buffer_rows}"
    if n_seeds > 1:
        what += f", {n_seeds} seeds"
    return budget.batch_size_bounds(
        **footprint(spec, obs_dim, hidden_dim_base, buffer_rows, precision, n_seeds),
        limits=spec.batch_limits,
        what=what,
    )
