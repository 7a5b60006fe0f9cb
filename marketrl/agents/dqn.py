"""Double DQN on the tensor-resident TradingEnv, in one readable file.

Everything stays on the training device: N envs step in one batched op, ε-greedy actions are drawn with torch
ops, all N transitions enter a preallocated ring buffer in ONE call, and gradient-step statistics (loss,
Q-values, grad norm, episode returns) accumulate on the device. The host reads them, and checks them for NaN/inf,
once every ``config.check_every`` gradient steps: the loop's only device→host sync in steady state.

Hyperparameters (``hparams`` dict, see `DQNHyperparams` and docs/AGENTS.md) follow Stable-Baselines3's names
where they exist.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gpu_utils import DeviceMetrics, OptimStep, PrecisionPlan
from marketrl.agents.common import GreedyPolicy, RunConfig, TrainResult, finish, set_up
from marketrl.agents.networks import QNetwork
from marketrl.agents.spec import (
    HIDDEN_DIM_BASES,
    REWARD_SCALES,
    AgentSpec,
    Architecture,
    MemoryModel,
    batch_choices,
)
from marketrl.env import N_ACTIONS, EnvConfig, MarketData
from marketrl.loop.hparams import check_ranges, check_run_setting, require
from marketrl.loop.resume import TrainingCheckpoint, resume_or_start, to_device
from marketrl.loop.schedule import EvalCallback, EvalSchedule

if TYPE_CHECKING:
    from marketrl.models.base import Trial

__all__ = ["SPEC", "DQNConfig", "DQNHyperparams", "ReplayBuffer", "search_space", "td_loss", "train"]

_RANDOM_POOL_STEPS = 64  # exploration draws are made for this many vector steps at once
_REPLAY_FIELDS = ("obs", "next_obs", "actions", "rewards", "discounts")
REPLAY_EXTRA_FIELDS = 3  # action, reward, bootstrap discount (besides obs and next obs)
FORWARD_PASSES = 3  # online(s) with grad, online(s') for the double-DQN argmax, target(s')


@dataclass(frozen=True)
class DQNHyperparams:
    """Tunable DQN settings (keys of the ``hparams`` dict). Units: env steps count transitions (N per vector
    step); ``train_freq`` counts vector steps; ``target_update`` counts gradient steps."""

    learning_rate: float = 1e-4
    gamma: float = 0.99
    batch_size: int = 256
    buffer_size: int = 100_000
    learning_starts: int = 1_000
    train_freq: int = 1
    gradient_steps: int = 1
    target_update: int = 1_000
    tau: float = 1.0
    exploration_fraction: float = 0.1
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    max_grad_norm: float | None = 10.0
    n_step_return: int = 1
    double_q: bool = True
    dueling: bool = False
    reward_scale: float = 1.0
    hidden_dim_base: int | None = None
    net_arch: list[int] | None = None

    def validate(self) -> None:
        """Range checks (types were checked by `parse_hparams`)."""
        check_ranges(
            self,
            positive=("learning_rate", "reward_scale"),
            positive_or_null=("max_grad_norm",),
            unit_above_zero=("gamma", "tau", "exploration_fraction"),
            unit=("exploration_initial_eps", "exploration_final_eps"),
            at_least_one=(
                "batch_size",
                "buffer_size",
                "train_freq",
                "gradient_steps",
                "target_update",
                "n_step_return",
            ),
            non_negative=("learning_starts",),
        )


@dataclass(frozen=True)
class DQNConfig(RunConfig):
    """Run settings (not tuned): those of every trainer, and the statistics cadence."""

    check_every: int = 100  # gradient steps between statistics reads (= NaN checks)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_run_setting("check_every", self.check_every, 1)


class Batch(NamedTuple):
    """A sampled minibatch of (n-step) transitions."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor
    discounts: torch.Tensor  # γ^k of the bootstrap term, 0 where the episode terminated within the k steps
    next_obs: torch.Tensor


class ReplayBuffer:
    """Preallocated ring buffer on the device: obs, next_obs, action, reward and bootstrap discount per transition.

    ``add`` writes all N envs' transitions at once (one ``index_copy_`` per field at ring indices computed on the
    device from a host-side cursor); ``sample`` draws every minibatch of a training round with one ``randint`` and
    one ``index_select`` per field, so each minibatch is contiguous (strided views would slow the matmuls down).
    The cursor and the fill level are host integers known without reading the device: neither call syncs.
    """

    def __init__(self, capacity: int, obs_dim: int, device: torch.device) -> None:
        self.capacity = capacity
        self.obs_dim = obs_dim
        # empty, not zeros: rows are only read after being written, and untouched pages cost nothing
        self.obs = torch.empty(capacity, obs_dim, dtype=torch.float32, device=device)
        self.next_obs = torch.empty(capacity, obs_dim, dtype=torch.float32, device=device)
        self.actions = torch.empty(capacity, dtype=torch.int64, device=device)
        self.rewards = torch.empty(capacity, dtype=torch.float32, device=device)
        self.discounts = torch.empty(capacity, dtype=torch.float32, device=device)
        self.cursor = 0
        self.size = 0
        self._offsets: torch.Tensor | None = None

    def add(
        self,
        obs: torch.Tensor,
        next_obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        discounts: torch.Tensor,
    ) -> None:
        """Insert one transition per env (every tensor has N rows) in one call, without a per-sample loop."""
        n = obs.shape[0]
        if self._offsets is None or self._offsets.shape[0] != n:
            self._offsets = torch.arange(n, device=self.obs.device)
        index = torch.remainder(self._offsets + self.cursor, self.capacity)
        self.obs.index_copy_(0, index, obs)
        self.next_obs.index_copy_(0, index, next_obs)
        self.actions.index_copy_(0, index, actions)
        self.rewards.index_copy_(0, index, rewards)
        self.discounts.index_copy_(0, index, discounts)
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, n_batches: int, generator: torch.Generator) -> list[Batch]:
        """``n_batches`` minibatches drawn uniformly with replacement (one gather per field for all of them)."""
        index = torch.randint(
            0, self.size, (n_batches * batch_size,), generator=generator, device=self.obs.device
        )
        fields = [
            tensor.index_select(0, index).split(batch_size)
            for tensor in (self.obs, self.actions, self.rewards, self.discounts, self.next_obs)
        ]
        return [Batch(*parts) for parts in zip(*fields, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """The filled part of the buffer and its cursor, for resumable training checkpoints."""
        filled = {name: getattr(self, name)[: self.size] for name in _REPLAY_FIELDS}
        return {**filled, "cursor": self.cursor, "size": self.size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` into this (equally sized) buffer."""
        self.size, self.cursor = int(state["size"]), int(state["cursor"])
        for name in _REPLAY_FIELDS:
            getattr(self, name)[: self.size].copy_(state[name])


class NStepWindow:
    """Turns the last n vector steps into n-step transitions for the oldest one, per env, on the device.

    R = Σ_{k<m} γ^k r_{t+k} and the bootstrap discount γ^m·(1 − terminated), where m ≤ n stops at the first episode
    end; the bootstrap obs is the true next state at that end (the env's ``final_obs``, not the auto-reset obs).
    """

    def __init__(self, n: int, gamma: float, device: torch.device | str) -> None:
        self.n = n
        self.gamma = gamma
        self.device = torch.device(device)
        self.steps: deque[tuple[torch.Tensor, ...]] = deque()

    def state_dict(self) -> dict[str, Any]:
        """The held vector steps, for resumable training checkpoints."""
        return {"steps": list(self.steps)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` (tensors moved to this window's device)."""
        self.steps = deque(to_device(list(state["steps"]), self.device))

    def push(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_obs: torch.Tensor,
        terminated: torch.Tensor,
        done: torch.Tensor,
    ) -> tuple[torch.Tensor, ...] | None:
        """Add one vector step; once n are held return (obs, actions, next_obs, returns, discounts) of the oldest."""
        self.steps.append((obs, actions, rewards, next_obs, terminated, done))
        if len(self.steps) < self.n:
            return None
        first_obs, first_actions, returns, bootstrap_obs, first_terminated, first_done = self.steps.popleft()
        discounts = torch.where(first_terminated, 0.0, self.gamma)
        if not self.steps:  # n = 1
            return first_obs, first_actions, bootstrap_obs, returns, discounts
        alive = ~first_done
        for k, (_, _, reward, later_next_obs, later_terminated, later_done) in enumerate(self.steps, start=1):
            returns = returns + torch.where(alive, reward * self.gamma**k, 0.0)
            bootstrap_obs = torch.where(alive[:, None], later_next_obs, bootstrap_obs)
            discounts = torch.where(
                alive, self.gamma ** (k + 1) * (1.0 - later_terminated.float()), discounts
            )
            alive = alive & ~later_done
        return first_obs, first_actions, bootstrap_obs, returns, discounts


def td_loss(
    q_net: nn.Module, target_net: nn.Module, batch: Batch, plan: PrecisionPlan, *, double_q: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Huber TD loss (fp32) and the taken actions' Q-values; Double DQN picks a′ with the online network."""
    with torch.no_grad(), plan.autocast():
        next_target = target_net(batch.next_obs)
        best = q_net(batch.next_obs).argmax(dim=1, keepdim=True) if double_q else None
    next_target = next_target.float()
    next_q = next_target.gather(1, best).squeeze(1) if double_q else next_target.max(dim=1).values
    target = batch.rewards + batch.discounts * next_q
    with plan.autocast():
        q = q_net(batch.obs)
    q_taken = q.float().gather(1, batch.actions[:, None]).squeeze(1)
    return F.smooth_l1_loss(q_taken, target), q_taken


@dataclass
class LoopState:
    """The loop's own variables: what a resumed run continues from (with the components given to the `Run`)."""

    obs: torch.Tensor
    episode_return: torch.Tensor
    explore_draws: torch.Tensor | None = None  # pool of uniform draws for ε-greedy, refilled every 64 steps
    random_actions: torch.Tensor | None = None
    env_steps: int = 0
    grad_steps: int = 0
    epsilon: float = 1.0


def train(
    train_data: MarketData,
    config: DQNConfig,
    hparams: Mapping[str, Any] | None,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seed: int,
    on_eval: EvalCallback | None = None,
    checkpoint: TrainingCheckpoint | None = None,
) -> TrainResult:
    """Train a DQN agent on ``train_data`` for ``config.total_steps`` env steps; see the module docstring.

    With ``checkpoint``, the loop resumes from its saved state (if any) and saves its full state whenever the
    checkpoint is due; the result is the same as one uninterrupted run.
    """
    setup = set_up(SPEC, hparams, train_data, config.env, precision, device, seed)
    hp, device, plan, env, generator = setup.hp, setup.device, setup.plan, setup.env, setup.generator
    n_envs = env.n_envs
    require(hp.buffer_size >= n_envs, "buffer_size", f"an integer >= env.n_envs ({n_envs})", hp.buffer_size)
    q_net = setup.networks["q"]
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    stepper = OptimStep.adam(q_net.parameters(), hp.learning_rate, plan, hp.max_grad_norm)
    replay = ReplayBuffer(hp.buffer_size, env.obs_dim, device)
    n_step = NStepWindow(hp.n_step_return, hp.gamma, device)
    policy = GreedyPolicy(q_net, plan)
    evals = EvalSchedule(on_eval, config.eval_every)
    metrics = DeviceMetrics(
        ["loss", "q_mean", "q_low", "q_high", "grad_norm"],
        device,
        counters=("episode_return", "episodes"),
        watched=("loss", "q_mean"),
        capacity=config.check_every,
        counter_width=n_envs,
    )
    finished_returns, finished_episodes = metrics.counter("episode_return"), metrics.counter("episodes")
    n_vector_steps = max(1, math.ceil(config.total_steps / n_envs))
    exploration_steps = hp.exploration_fraction * n_vector_steps * n_envs
    state = LoopState(obs=env.reset(), episode_return=torch.zeros(n_envs, device=device))
    run = resume_or_start(
        checkpoint,
        {
            "q": q_net,
            "target": target_net,
            "optim": stepper,
            "replay": replay,
            "n_step": n_step,
            "generator": generator,
            "env": env,
            "metrics": metrics,
            "evals": evals,
        },
        state,
        total_steps=n_vector_steps * n_envs,
        device=device,
    )

    for vector_step in range(state.env_steps // n_envs, n_vector_steps):
        # ε-greedy on the device; uniform draws come from a pool refilled every _RANDOM_POOL_STEPS steps.
        if vector_step % _RANDOM_POOL_STEPS == 0:
            state.explore_draws = torch.rand(_RANDOM_POOL_STEPS, n_envs, generator=generator, device=device)
            state.random_actions = torch.randint(
                0, N_ACTIONS, (_RANDOM_POOL_STEPS, n_envs), generator=generator, device=device
            )
        progress = min(1.0, state.env_steps / exploration_steps)
        state.epsilon = hp.exploration_initial_eps + progress * (
            hp.exploration_final_eps - hp.exploration_initial_eps
        )
        with torch.no_grad(), plan.autocast():
            greedy = q_net(state.obs).argmax(dim=1)
        row = vector_step % _RANDOM_POOL_STEPS
        explore = state.explore_draws[row] < state.epsilon
        actions = torch.where(explore, state.random_actions[row], greedy)

        next_obs, rewards, terminated, truncated = env.step(actions)
        done = terminated | truncated
        transition = n_step.push(
            state.obs, actions, rewards * hp.reward_scale, env.final_obs, terminated, done
        )  # final_obs: the true next state, also where the env auto-reset
        if transition is not None:
            first_obs, first_actions, bootstrap_obs, returns, discounts = transition
            replay.add(first_obs, bootstrap_obs, first_actions, returns, discounts)
        state.episode_return.add_(rewards)
        finished_returns.add_(state.episode_return * done)
        finished_episodes.add_(done)
        state.episode_return.masked_fill_(done, 0.0)
        state.obs = next_obs
        state.env_steps += n_envs

        if state.env_steps >= hp.learning_starts and replay.size > 0 and vector_step % hp.train_freq == 0:
            for batch in replay.sample(hp.batch_size, hp.gradient_steps, generator):
                loss, q_taken = td_loss(q_net, target_net, batch, plan, double_q=hp.double_q)
                grad_norm = stepper.step(loss)
                q_low, q_high = torch.aminmax(q_taken.detach())
                metrics.record([loss.detach(), q_taken.detach().mean(), q_low, q_high, grad_norm.float()])
                state.grad_steps += 1
                if state.grad_steps % hp.target_update == 0:
                    _update_target(target_net, q_net, hp.tau)
                if state.grad_steps % config.check_every == 0:
                    run.log(_record(metrics.read(state.grad_steps), state))
        evals.maybe(state.env_steps, policy)
        run.maybe_save(state.env_steps)

    if metrics.pending > 0 or not run.history:  # the last partial window
        run.log(_record(metrics.read(state.grad_steps), state))
    return finish(
        setup,
        run,
        evals,
        policy,
        {"q": q_net, "target": target_net},
        latest=("loss", "q_mean", "q_min", "q_max", "grad_norm", "episode_return_mean"),
        env_steps=state.env_steps,
        grad_steps=state.grad_steps,
        host_syncs=metrics.host_reads,
        final_epsilon=state.epsilon,
    )


@torch.no_grad()
def _update_target(target_net: nn.Module, q_net: nn.Module, tau: float) -> None:
    """Hard copy (τ = 1) or Polyak averaging target ← τ·online + (1 − τ)·target."""
    for target_param, param in zip(target_net.parameters(), q_net.parameters(), strict=True):
        if tau == 1.0:
            target_param.copy_(param)
        else:
            target_param.lerp_(param, tau)


def _record(window: dict[str, Any], state: LoopState) -> dict[str, Any]:
    """One history record from a statistics read (episode mean over the episodes that ended in the window)."""
    episodes = int(window["episodes"])
    return {
        "env_steps": state.env_steps,
        "grad_steps": state.grad_steps,
        "epsilon": state.epsilon,
        "loss": window["loss"],
        "q_mean": window["q_mean"],
        "grad_norm": window["grad_norm"],
        "q_min": window["q_low_min"],
        "q_max": window["q_high_max"],
        "episodes": episodes,
        "episode_return_mean": window["episode_return"] / episodes if episodes else None,
    }


# ------------------------------------------------------------------------------------------------ the registry


def search_space(trial: Trial, batch_bounds: tuple[int, int]) -> dict[str, Any]:
    """DQN search space (docs/HYPEROPT.md); batch sizes within the device's bounds."""
    return {
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", HIDDEN_DIM_BASES),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 3e-3, log=True),
        "gamma": trial.suggest_float("gamma", 0.9, 0.999),
        "batch_size": trial.suggest_categorical(
            "batch_size", batch_choices(*batch_bounds, (64, 128, 256, 512))
        ),
        "exploration_fraction": trial.suggest_float("exploration_fraction", 0.05, 0.5),
        "exploration_final_eps": trial.suggest_float("exploration_final_eps", 0.01, 0.1),
        "target_update": trial.suggest_categorical("target_update", (250, 500, 1000, 2000)),
        "gradient_steps": trial.suggest_categorical("gradient_steps", (1, 2, 4)),
        "reward_scale": trial.suggest_categorical("reward_scale", REWARD_SCALES),
    }


def network_widths(base: int) -> dict[str, list[int]]:
    """The Q-network ``obs → b → b/2 → b/4 → 3``."""
    return {"q": [base, base // 2, base // 4]}


def build_networks(architecture: Architecture) -> dict[str, nn.Module]:
    """The Q-network (ReLU, optional dueling head), PyTorch default init."""
    dueling = bool(architecture.options.get("dueling"))
    q_net = QNetwork(
        architecture.obs_dim,
        architecture.hidden["q"],
        architecture.n_actions,
        architecture.activation,
        dueling,
    )
    return {"q": q_net}


def architecture_options(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """DQN's own entry of the architecture dict: whether the Q-network has a dueling head."""
    return {"dueling": bool(hparams.get("dueling", False))}


def run_config(*, total_steps: int, env: EnvConfig, eval_every: int, check_every: int) -> DQNConfig:
    """DQN's run settings: length, env, evaluation cadence and the statistics cadence."""
    return DQNConfig(total_steps=total_steps, env=env, eval_every=eval_every, check_every=check_every)


SPEC = AgentSpec(
    name="dqn",
    hparams_class=DQNHyperparams,
    search_space=search_space,
    networks={"q": N_ACTIONS},
    network_widths=network_widths,
    activation="relu",
    build_networks=build_networks,
    acting_network="q",
    batch_limits=(32, 8192),
    memory=MemoryModel(
        obs_per_row=2, extra_fields=REPLAY_EXTRA_FIELDS, forward_passes=FORWARD_PASSES, frozen_copy=True
    ),
    run_config=run_config,
    train=train,
    architecture_options=architecture_options,
)
