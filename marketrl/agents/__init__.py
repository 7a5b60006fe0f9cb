"""DQN and PPO agents on the tensor-resident TradingEnv (see docs/AGENTS.md).

``dqn.train_seeds`` and ``ppo.train_seeds`` share one signature and return one `TrainResult` per seed; each file
ends in its `SPEC`, an `AgentSpec` (a `marketrl.models.base.ModelSpec`, the registry entry: hparams, search space,
train_seeds, networks, acting network, batch limits, and its save/load pair by path, `SPEC.save` /
`SPEC.load_path`). `save_checkpoint` / `load_policy` store and rebuild a trained agent from plain data. Both loops use the same shared hooks — gpu_utils'
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
