"""What an agent's training run takes and gives back: `RunConfig`, `TrainResult` and its `GreedyPolicy` (and
`AgentPolicy`, the acting network as a position function, what `marketrl.training.export` traces).

Apart from `marketrl.agents.common` so that `marketrl.agents.spec` can name them without importing the trainers'
machinery (the spec sits below it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gpu_utils import PrecisionPlan
from marketrl.env import EnvConfig, MarketData, policy_positions
from marketrl.env.config import ACTION_POSITIONS
from marketrl.loop.hparams import check_run_setting

__all__ = ["AGENT_HOW_TO_USE", "AgentPolicy", "GreedyPolicy", "RunConfig", "TrainResult", "env_settings"]


@dataclass(frozen=True)
class RunConfig:
    """Run settings every trainer takes (not tuned): length, environment and evaluation cadence."""

    total_steps: int = 60_000  # env steps (transitions, N per vector step)
    env: EnvConfig = field(default_factory=EnvConfig)
    eval_every: int = 0  # env steps between on_eval calls (0: only at the end)

    def __post_init__(self) -> None:
        check_run_setting("total_steps", self.total_steps, 1)
        check_run_setting("eval_every", self.eval_every, 0)


def env_settings(config: EnvConfig) -> dict[str, Any]:
    """The environment settings as plain data (``max_gap`` in seconds), for logs and checkpoints."""
    values = dataclasses.asdict(config)
    values["max_gap"] = None if config.max_gap is None else config.max_gap.total_seconds()
    return values


class GreedyPolicy:
    """Deterministic act function: ``obs [B, obs_dim] -> argmax actions [B]`` (LongTensor, obs's device).

    It acts in fp32 whatever the training precision (``plan``, kept for the record): an argmax over one small
    forward, from the fp32 master weights, with no casts to launch (bf16 autocast added a cast per weight, bias and
    input of every forward: bench/speed/launches.py --precision bf16), and the same action on any device.
    """

    def __init__(self, net: nn.Module, plan: PrecisionPlan) -> None:
        self.net = net
        self.plan = plan

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions (argmax of Q-values or logits)."""
        return self.net(obs).float().argmax(dim=1)


class AgentPolicy(nn.Module):
    """An agent's acting network as a position function: (windows [B, W, F] of normalized features, position [B]
    held into the bar in {-1, 0, 1}) -> target position [B] float32 in {-1, 0, 1}: the observation
    ``[window flattened oldest row first, position]`` the env builds, the greedy action (argmax), mapped through
    ``ACTION_POSITIONS``."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("action_positions", torch.tensor(ACTION_POSITIONS, dtype=torch.float32))

    def forward(self, windows: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """Target positions [B] float32."""
        obs = torch.cat([windows.reshape(windows.shape[0], -1), position.reshape(-1, 1).float()], dim=1)
        return self.action_positions[self.net(obs).float().argmax(dim=1)]


#: export.json's ``how_to_use`` of an agent's `AgentPolicy` (`marketrl.training.export`)
AGENT_HOW_TO_USE = (
    "Normalize each raw feature row with `normalizer` (columns in `feature_names` order). At the close of bar t "
    "build windows [1, window, F]: rows t-window+1..t of the same session (segment), oldest first; rows before the "
    "session's first row repeat that first row. Call the model with (windows, position), position [1] = the unit "
    "position held into bar t (start each session flat, 0; then the previous output). The output is the target "
    "unit position in {-1, 0, 1} to hold over bar t+1; multiply by `observation.contracts` for contracts. Step "
    "bar by bar: each output is the next call's position."
)


@dataclass
class TrainResult:
    """What a trainer returns: the trained networks (on the training device), a greedy act function and a log.

    ``log`` keys: algo, env_steps, grad_steps, steps_per_second, host_syncs (device→host reads made by the loop),
    nan_checks (statistics reads, each checked for NaN/inf),
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

    @property
    def steps_run(self) -> None:
        """None: an agent always runs its budget of env steps (`marketrl.models.base.TrainedRun`)."""
        return None

    def run_positions(self, data: MarketData, env_config: EnvConfig) -> torch.Tensor:
        """Target positions [T] the greedy policy chooses on ``data`` (`marketrl.env.policy_positions`), the
        one result type's positions (`marketrl.models.base.TrainedRun`)."""
        return policy_positions(self.policy, data, env_config)
