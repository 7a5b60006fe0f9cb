"""DQN and PPO agents on the tensor-resident TradingEnv (see docs/AGENTS.md).

``dqn.train`` and ``ppo.train`` share one signature and return a `TrainResult`; `save_checkpoint` /
`load_policy` store and rebuild a trained agent from plain data. Both loops use the same shared hooks — gpu_utils'
`OptimStep` and `DeviceMetrics`, `common.EvalSchedule` and `resume.resume_or_start` — which know nothing of
environments, so a supervised trainer can use them too (docs/AGENTS.md, "Loop anatomy").
"""

from marketrl.agents.checkpoint import CheckpointError, load_checkpoint, load_policy, save_checkpoint
from marketrl.agents.common import GreedyPolicy, TrainResult
from marketrl.agents.networks import FALLBACK_HIDDEN, ArchitectureError, build_networks, hidden_sizes
from marketrl.loop.hparams import HParamError

__all__ = [
    "FALLBACK_HIDDEN",
    "ArchitectureError",
    "CheckpointError",
    "GreedyPolicy",
    "HParamError",
    "TrainResult",
    "build_networks",
    "hidden_sizes",
    "load_checkpoint",
    "load_policy",
    "save_checkpoint",
]
