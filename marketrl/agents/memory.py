"""Device memory of DQN and PPO training, described to `gpu_utils.HardwareBudget` for VRAM-aware batch bounds.

The widths come from `networks.hidden_sizes` (the networks that are really built); the rest is the agents' own
bookkeeping: what a replay or rollout row holds and how many forward passes one sample goes through.
"""

from __future__ import annotations

from gpu_utils import HardwareBudget, PrecisionPlan, mlp_parameter_count, sample_bytes
from marketrl.agents.networks import hidden_sizes
from marketrl.env import N_ACTIONS

__all__ = ["BATCH_LIMITS", "batch_size_bounds", "footprint"]

#: Allowed batch sizes per algorithm (PPO: the minibatch size).
BATCH_LIMITS: dict[str, tuple[int, int]] = {"dqn": (32, 8192), "ppo": (64, 65536)}
REPLAY_EXTRA_FIELDS = 3  # action, reward, bootstrap discount (besides obs and next obs)
ROLLOUT_EXTRA_FIELDS = 7  # action, reward, done, old log-prob, value, advantage, return
DQN_FORWARD_PASSES = 3  # online(s) with grad, online(s') for the double-DQN argmax, target(s')
_OUTPUTS = {"q": N_ACTIONS, "policy": N_ACTIONS, "value": 1}
_FLOAT_BYTES = 4


def footprint(
    algo: str,
    obs_dim: int,
    hidden_dim_base: int,
    buffer_rows: int = 0,
    precision: str | PrecisionPlan = "fp32",
) -> dict[str, int]:
    """``parameter_count``, ``frozen_parameter_count`` (the DQN target net), ``buffer_bytes`` (``buffer_rows`` of
    the DQN replay buffer or the PPO rollout) and ``bytes_per_sample``: the arguments of
    `gpu_utils.HardwareBudget.batch_size_bounds`."""
    widths = hidden_sizes(algo, {"hidden_dim_base": hidden_dim_base})
    params = sum(mlp_parameter_count(obs_dim, widths[name], _OUTPUTS[name]) for name in widths)
    activations = sum(sum(widths[name]) + _OUTPUTS[name] for name in widths)
    if algo == "dqn":
        row = 2 * obs_dim + REPLAY_EXTRA_FIELDS
        activations *= DQN_FORWARD_PASSES
    else:
        row = obs_dim + ROLLOUT_EXTRA_FIELDS
    return {
        "parameter_count": params,
        "frozen_parameter_count": params if algo == "dqn" else 0,
        "buffer_bytes": buffer_rows * row * _FLOAT_BYTES,
        "bytes_per_sample": sample_bytes(activations, row, precision),
    }


def batch_size_bounds(
    budget: HardwareBudget,
    algo: str,
    obs_dim: int,
    hidden_dim_base: int,
    buffer_rows: int = 0,
    precision: str | PrecisionPlan = "fp32",
) -> tuple[int, int]:
    """(min, max) batch size of ``algo`` within `BATCH_LIMITS` that ``budget`` holds (see `footprint`)."""
    what = f"{algo} with obs_dim={obs_dim}, hidden_dim_base={hidden_dim_base}, buffer_rows={buffer_rows}"
    return budget.batch_size_bounds(
        **footprint(algo, obs_dim, hidden_dim_base, buffer_rows, precision),
        limits=BATCH_LIMITS[algo],
        what=what,
    )
