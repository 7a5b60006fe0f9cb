"""Device memory of agent training, described to `gpu_utils.HardwareBudget` for VRAM-aware batch bounds.

The widths come from `networks.hidden_sizes` (the networks that are really built); the rest is the agent's own
bookkeeping, from its spec (`AgentSpec.memory`): what a replay or rollout row holds and how many forward passes
one sample goes through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_utils import BudgetError, HardwareBudget, PrecisionPlan, mlp_parameter_count, sample_bytes
from marketrl.agents.networks import hidden_sizes
from marketrl.agents.spec import HIDDEN_DIM_BASES, AgentSpec, agent_spec
from marketrl.loop.hparams import parse_hparams

__all__ = ["batch_size_bounds", "folds_per_batch", "footprint"]

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


def folds_per_batch(
    budget: HardwareBudget,
    agent: AgentSpec | str,
    obs_dim: int,
    hparams: Mapping[str, Any],
    n_envs: int,
    precision: str | PrecisionPlan,
    seeds_per_fold: int,
    n_folds: int,
) -> int:
    """How many folds of ``seeds_per_fold`` seeds one batched computation of the agent holds in ``budget``
    (training.batch_folds): the most, up to ``n_folds``, whose networks, buffers (the DQN replay or the PPO
    rollout of ``n_envs`` envs per seed) and one minibatch of the hyperparameters' ``batch_size`` fit (`footprint`,
    S = folds x seeds); at least 1 (one fold trains as it always does, and fails there if it does not fit)."""
    spec = agent_spec(agent)
    hp = parse_hparams(spec.hparams_class, hparams, spec.name)
    # a DQN seed holds its replay buffer, a PPO seed its rollout (n_steps rows per env)
    buffer_rows = int(getattr(hp, "buffer_size", 0) or getattr(hp, "n_steps", 0) * n_envs)
    batch = int(hp.batch_size)
    hidden = int(hp.hidden_dim_base or max(HIDDEN_DIM_BASES))  # unset: the widest the search offers
    for n in range(n_folds, 1, -1):
        try:
            budget.batch_size_bounds(
                **footprint(spec, obs_dim, hidden, buffer_rows, precision, n * seeds_per_fold),
                limits=(batch, batch),
            )
        except BudgetError:
            continue
        return n
    return 1
