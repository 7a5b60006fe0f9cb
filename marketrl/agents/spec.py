"""What an RL agent registers: its `AgentSpec`, the `SPEC` at the end of its own file (`dqn.py`, `ppo.py`), as a
forecaster's file ends in a `marketrl.models.base.ModelSpec`; an `AgentSpec` is a `ModelSpec` (the one spec type)
with the agent's own parts.

The shared agent machinery (`networks`, `memory`, `checkpoint`, `common.set_up`) reads everything that differs
between agents from the spec — network names and widths, builder, acting network, batch limits, memory per
sample — so no file but the agent's own tests its name. `agent_spec(name)` finds a registered agent
(`marketrl.settings.registry`) for the callers that hold only a name (a checkpoint's ``algo``, a benchmark).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from marketrl.models.base import ModelSpec

if TYPE_CHECKING:
    from torch import nn

    from marketrl.agents.results import RunConfig, TrainResult
    from marketrl.env import EnvConfig

__all__ = [
    "HIDDEN_DIM_BASES",
    "PPO_HIDDEN_DIM_BASES",
    "REWARD_SCALES",
    "AgentSpec",
    "Architecture",
    "ArchitectureError",
    "MemoryModel",
    "agent_spec",
    "batch_choices",
]

#: hidden_dim_base choices of every agent's search space (the memory bounds are computed for the widest).
HIDDEN_DIM_BASES = (64, 128, 256, 512)
#: PPO's: its 512-wide corner (value net 1024-512-256, 8 epochs over every rollout) cost 6.7x its median trial
#: by bench/speed/hyperopt_cost.py's proxy; without 512 every corner stays within 4x (docs/HYPEROPT.md).
PPO_HIDDEN_DIM_BASES = (64, 128, 256)
#: Per-bar returns are ~1e-4: rewards are multiplied by this before the losses (the objective is unaffected).
REWARD_SCALES = (1.0, 10.0, 100.0, 1000.0)


class ArchitectureError(ValueError):
    """A network description (hyperparameters or checkpoint architecture) is invalid."""


def batch_choices(low: int, high: int, candidates: Sequence[int]) -> list[int]:
    """The candidate batch sizes within the device's bounds [low, high] (else the smallest one that fits)."""
    chosen = [size for size in candidates if low <= size <= high]
    return chosen or [max(low, min(candidates))]


@dataclass(frozen=True)
class Architecture:
    """A checked architecture dict, as an agent's network builder receives it.

    hidden: widths per network; options: the agent's own entries (`AgentSpec.architecture_options`, e.g. dueling).
    """

    obs_dim: int
    n_actions: int
    hidden: dict[str, list[int]]
    activation: str
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemoryModel:
    """What one training sample holds and costs, besides the networks (for `memory.footprint`).

    obs_per_row / extra_fields: observations and other floats per replay or rollout row; forward_passes: passes
    of the networks per sample in one gradient step; frozen_copy: the loop keeps a frozen copy of the networks
    (DQN's target network).
    """

    obs_per_row: int
    extra_fields: int
    forward_passes: int = 1
    frozen_copy: bool = False


def _no_options(hparams: Mapping[str, Any]) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, kw_only=True)
class AgentSpec(ModelSpec):
    """One RL agent: the one spec type (`marketrl.models.base.ModelSpec`: name, hparams_class, search_space,
    train_seeds, profile, and its save/load pair by path, ``saver`` / ``loader`` from
    `marketrl.agents.checkpoint`, set in the agent's own file) plus its networks, acting network, batch limits,
    memory and run settings.

    search_space(trial, batch_bounds): batch sizes within the device's (min, max) for the widest network.
    networks: the outputs of each network the agent builds and a checkpoint saves (action scores or a value);
    network_widths(hidden_dim_base): their hidden widths; build_networks(architecture): fresh modules for them
      (CPU, float32, torch's global RNG).
    run_config(total_steps, env, eval_every, check_every): the trainer's run settings.
    train_seeds: ``train_seeds(train_data, run_config, hparams, precision, device, seeds, on_eval=, checkpoint=,
      on_log=, block_rows=) -> list[TrainResult]``, the agent's only training entry: the S seeds trained as one
      batched computation (one seed is a batch of one); result i is seeds[i]'s; ``on_eval`` is a
      `loop.schedule.SeedsEvalCallback` and ``checkpoint`` one `loop.resume.TrainingCheckpoint` for the whole batch;
      ``block_rows`` (one [start, stop) per seed, or None) folds on the batch axis: seed i trains on those rows of
      a stacked ``train_data`` (`marketrl.env.stack_market_data`).
    """

    kind: ClassVar[str] = "agent"

    networks: Mapping[str, int]
    network_widths: Callable[[int], dict[str, list[int]]]
    activation: str
    build_networks: Callable[[Architecture], dict[str, nn.Module]]
    acting_network: str
    batch_limits: tuple[int, int]
    memory: MemoryModel
    run_config: Callable[..., RunConfig]
    #: ``train_seeds(train_data, run_config, hparams, precision, device, seeds, on_eval=, checkpoint=, on_log=,
    #: block_rows=)`` -> one TrainResult per seed, the seeds trained as one batch
    train_seeds: Callable[..., list[TrainResult]]
    architecture_options: Callable[[Mapping[str, Any]], dict[str, Any]] = _no_options
    neural: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.acting_network not in self.networks:
            raise ArchitectureError(
                f"{self.name}: acting network {self.acting_network!r} is none of {', '.join(self.networks)}"
            )
        if self.saver is None or self.loader is None:
            raise ArchitectureError(
                f"{self.name}: an agent's spec needs saver and loader (marketrl.agents.checkpoint's)"
            )

    def make_run_config(
        self, *, total_steps: int, env: EnvConfig, eval_every: int, check_every: int
    ) -> RunConfig:
        """The trainer's run settings from the pipeline's (each agent takes the ones it uses)."""
        return self.run_config(
            total_steps=total_steps, env=env, eval_every=eval_every, check_every=check_every
        )


def agent_spec(agent: AgentSpec | str) -> AgentSpec:
    """The spec itself, or the registered agent of that name (`ArchitectureError` naming the known agents)."""
    if isinstance(agent, AgentSpec):
        return agent
    from marketrl.settings.registry import REGISTRY, load_spec, names_under

    spec = load_spec(REGISTRY[agent]) if agent in REGISTRY else None
    if not isinstance(spec, AgentSpec):
        known = ", ".join(repr(name) for name in names_under("marketrl.agents"))
        raise ArchitectureError(f"algo: expected an agent ({known}), got {agent!r}")
    return spec
