"""DQN and PPO agents on the tensor-resident TradingEnv (see docs/AGENTS.md).

``dqn.train`` and ``ppo.train`` share one signature and return a `TrainResult`; each file ends in its `SPEC`, an
`AgentSpec` (the registry entry: hparams, search space, networks, acting network, batch limits, train, load).
`save_checkpoint` / `load_policy` store and rebuild a trained agent from plain data. Both loops use the same shared hooks — gpu_utils'
`OptimStep` and `DeviceMetrics`, `common.EvalSchedule` and `resume.resume_or_start` — which know nothing of
environments, so a supervised trainer can use them too (docs/AGENTS.md, "Loop anatomy").
"""

from marketrl.agents.checkpoint import CheckpointError, load_checkpoint, load_policy, save_checkpoint
from marketrl.agents.common import GreedyPolicy, TrainResult
from marketrl.agents.networks import FALLBACK_HIDDEN, ArchitectureError, build_networks, hidden_sizes
from marketrl.agents.spec import AgentSpec, agent_spec
from marketrl.loop.hparams import HParamError

__all__ = [
    "FALLBACK_HIDDEN",
    "AgentSpec",
    "ArchitectureError",
    "CheckpointError",
    "GreedyPolicy",
    "HParamError",
    "TrainResult",
    "agent_spec",
    "build_networks",
    "hidden_sizes",
    "load_checkpoint",
    "load_policy",
    "save_checkpoint",
]
