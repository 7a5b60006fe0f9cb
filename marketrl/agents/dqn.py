"""Double DQN on the tensor-resident TradingEnv, in one readable file; S seeds train as one batched computation.

Everything stays on the training device: N envs step in one batched op, ε-greedy actions are drawn with torch
ops, all N transitions enter a preallocated ring buffer in ONE call, and gradient-step statistics (loss,
Q-values, grad norm, episode returns) accumulate on the device. The host reads them, and checks them for NaN/inf,
once every ``config.check_every`` gradient steps: the loop's only device→host sync in steady state.

The seed axis (`train_seeds`): the S seeds' Q-networks are one `StackedQNetwork` (every weight [S, ...], batched
matmuls), their target networks a frozen copy of it, their Adam one `SeedOptimStep` (per-seed clipping); the env
holds S blocks of n_envs envs (block i draws its episode starts from seed i's RNG), the replay buffer is
[S, capacity, ...], and each seed draws its exploration noise and its minibatch indices from its own stream
(`gpu_utils.SeedStreams`: the same few operations for all seeds).
Nothing mixes seeds, so seed i ends as it would in a batch of other seeds.

Hyperparameters (``hparams`` dict, see `DQNHyperparams` and docs/AGENTS.md) follow Stable-Baselines3's names
where they exist.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from gpu_utils import CapturedCall, DeviceMetrics, NonFiniteError, PrecisionPlan, capturable_plan
from gpu_utils.seeds import SeedOptimStep
from gpu_utils.streams import SeedStreams
from marketrl.agents.checkpoint import load_agent, save_agent
from marketrl.agents.common import (
    GreedyPolicy,
    RunConfig,
    SeedStack,
    TrainResult,
    finish_seeds,
    set_up_seeds,
)
from marketrl.agents.networks import QNetwork, minus_cost_of_change
from marketrl.agents.spec import (
    AgentSpec,
    Architecture,
    MemoryModel,
    batch_choices,
)
from marketrl.env import ACTION_POSITIONS, N_ACTIONS, EnvConfig, MarketData, step_rewards
from marketrl.loop.hparams import check_ranges, check_run_setting, require
from marketrl.loop.profile import ModelProfile, TrialSizes, dense_weights
from marketrl.loop.resume import TrainingCheckpoint, resume_or_start, to_device
from marketrl.loop.schedule import EvalSchedule, SeedsEvalCallback

if TYPE_CHECKING:
    from marketrl.models.base import Trial

__all__ = [
    "PROFILE",
    "REWARD_MULTIPLIERS",
    "SPEC",
    "DQNConfig",
    "DQNHyperparams",
    "ReplayBuffer",
    "StackedQNetwork",
    "all_action_rewards",
    "reward_normalizer",
    "search_space",
    "td_loss",
    "td_loss_all_actions",
    "train_seeds",
    "typical_trade_cost",
]

_RANDOM_POOL_STEPS = 64  # exploration draws are made for this many vector steps at once
_REPLAY_FIELDS = ("obs", "next_obs", "actions", "rewards", "discounts")
REPLAY_EXTRA_FIELDS = (
    5  # action, a reward per action (all_actions), bootstrap discount (besides obs and next obs)
)
#: online(s) with grad, then for each of the 3 next states (all_actions) online(s') for the double-DQN argmax and
#: target(s')
FORWARD_PASSES = 7
_COLUMNS = ("loss", "q_mean", "q_low", "q_high", "grad_norm")  # per gradient step, per seed
_WATCHED = ("loss", "q_mean")  # a non-finite value in these stops the run
#: hidden_dim_base choices of the search: 512 is left out since every gradient step trains all three actions
#: (`all_actions`), which put its corner of the space above 4x the median trial (tests/test_search_space_bounds.py)
DQN_HIDDEN_DIM_BASES = (64, 128, 256)
#: reward_scale choices of the search: multipliers of the normalized rewards (`normalize_rewards`)
REWARD_MULTIPLIERS = (0.1, 0.3, 1.0)


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
    cost_prior: bool = True
    all_actions: bool = True
    normalize_rewards: bool = True
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
        require(
            not self.all_actions or self.n_step_return == 1,
            "n_step_return",
            "1 with all_actions: true (the other actions' rewards are known for one step only)",
            self.n_step_return,
        )


@dataclass(frozen=True)
class DQNConfig(RunConfig):
    """Run settings (not tuned): those of every trainer, and the statistics cadence."""

    check_every: int = 100  # gradient steps between statistics reads (= NaN checks)
    # on CUDA (no GradScaler): each gradient step one CUDA graph launch (gpu_utils.CapturedCall)
    capture: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_run_setting("check_every", self.check_every, 1)


class Batch(NamedTuple):
    """A sampled minibatch of (n-step) transitions, every field with the seed axis first: [S, batch, ...]."""

    obs: torch.Tensor
    actions: torch.Tensor
    rewards: torch.Tensor  # [S, batch], or [S, batch, 3] (one per action) with all_actions
    discounts: torch.Tensor  # γ^k of the bootstrap term, 0 where the episode terminated within the k steps
    next_obs: torch.Tensor


class ReplayBuffer:
    """Preallocated ring buffer on the device, one ring per seed: obs, next_obs, action, reward (or one reward per
    action, ``reward_width`` 3) and bootstrap discount per transition, every field [S, capacity, ...].

    ``add`` writes all seeds' N transitions at once (one ``index_copy_`` per field at ring indices computed on the
    device from a host-side cursor: every seed adds as many rows per step, so they share cursor and fill level);
    ``sample`` draws every minibatch of a training round with one ``randint`` per seed (from the seed's own
    generator) and one ``index_select`` per field, laid out so that each minibatch [S, batch, ...] is contiguous
    (strided views would slow the matmuls down). Neither call syncs.
    """

    def __init__(
        self, capacity: int, obs_dim: int, device: torch.device, n_seeds: int = 1, reward_width: int = 1
    ) -> None:
        self.capacity = capacity
        self.obs_dim = obs_dim
        self.n_seeds = n_seeds
        # empty, not zeros: rows are only read after being written, and untouched pages cost nothing
        self.obs = torch.empty(n_seeds, capacity, obs_dim, dtype=torch.float32, device=device)
        self.next_obs = torch.empty(n_seeds, capacity, obs_dim, dtype=torch.float32, device=device)
        self.actions = torch.empty(n_seeds, capacity, dtype=torch.int64, device=device)
        # one reward per transition, or one per action (reward_width = 3: all_actions)
        reward_shape = (n_seeds, capacity) if reward_width == 1 else (n_seeds, capacity, reward_width)
        self.rewards = torch.empty(reward_shape, dtype=torch.float32, device=device)
        self.discounts = torch.empty(n_seeds, capacity, dtype=torch.float32, device=device)
        self.cursor = 0
        self.size = 0
        self._offsets: torch.Tensor | None = None
        self._seed_rows = (
            torch.arange(n_seeds, device=device)[:, None] * capacity
        )  # row 0 of each seed's ring

    def add(
        self,
        obs: torch.Tensor,
        next_obs: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        discounts: torch.Tensor,
    ) -> None:
        """Insert one transition per env and seed (every tensor [S, n, ...]) in one call, without a loop."""
        n = obs.shape[1]
        if self._offsets is None or self._offsets.shape[0] != n:
            self._offsets = torch.arange(n, device=self.obs.device)
        index = torch.remainder(self._offsets + self.cursor, self.capacity)
        self.obs.index_copy_(1, index, obs)
        self.next_obs.index_copy_(1, index, next_obs)
        self.actions.index_copy_(1, index, actions)
        self.rewards.index_copy_(1, index, rewards)
        self.discounts.index_copy_(1, index, discounts)
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, n_batches: int, streams: SeedStreams) -> list[Batch]:
        """``n_batches`` minibatches drawn uniformly with replacement, seed i's indices from its own stream of
        ``streams`` (one gather per field for all of them)."""
        return self.gather(self.sample_rows(batch_size, n_batches, streams), batch_size, n_batches)

    def sample_rows(self, batch_size: int, n_batches: int, streams: SeedStreams) -> torch.Tensor:
        """The rows `sample` gathers: [n_batches · S · batch_size] indices into the flattened [S·capacity] rings,
        ordered [batch number, seed, sample]; the same few operations whatever S."""
        index = streams.integers(self.size, n_batches * batch_size)
        return (index + self._seed_rows).view(self.n_seeds, n_batches, batch_size).transpose(0, 1).reshape(-1)

    def gather(self, rows: torch.Tensor, batch_size: int, n_batches: int) -> list[Batch]:
        """The minibatches of ``rows`` (from `sample_rows`): one gather per field for all of them, no host sync."""
        fields = [
            tensor.flatten(0, 1)
            .index_select(0, rows)
            .view(n_batches, self.n_seeds, batch_size, *tensor.shape[2:])
            .unbind(0)
            for tensor in (self.obs, self.actions, self.rewards, self.discounts, self.next_obs)
        ]
        return [Batch(*parts) for parts in zip(*fields, strict=True)]

    def state_dict(self) -> dict[str, Any]:
        """The filled part of the buffer and its cursor, for resumable training checkpoints."""
        filled = {name: getattr(self, name)[:, : self.size] for name in _REPLAY_FIELDS}
        return {**filled, "cursor": self.cursor, "size": self.size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` into this (equally sized) buffer."""
        self.size, self.cursor = int(state["size"]), int(state["cursor"])
        for name in _REPLAY_FIELDS:
            getattr(self, name)[:, : self.size].copy_(state[name])


class StackedQNetwork(nn.Module):
    """S `QNetwork`s of one architecture as one module: the body and each dueling head a `SeedStack` (every weight
    [S, ...], one batched matmul a layer).

    ``forward(obs [S, B, obs_dim]) -> Q [S, B, n_actions]``: seed i's rows meet only seed i's weights. Chosen over
    ``vmap(functional_call)`` by measurement: on the CPU at hidden 64, S = 5, batch 256, a forward took 264 µs
    against 664 µs and forward+backward 837 µs against 1526 µs.
    """

    def __init__(self, networks: Sequence[QNetwork]) -> None:
        super().__init__()
        self.n_seeds = len(networks)
        self.dueling = networks[0].dueling
        self.body = SeedStack([network.net for network in networks])
        if self.dueling:  # registered after the body: the parameters keep a QNetwork's order
            self.value_head = SeedStack([nn.Sequential(network.value_head) for network in networks])
            self.advantage_head = SeedStack([nn.Sequential(network.advantage_head) for network in networks])
        self.cost_prior = networks[0].cost_prior
        if self.cost_prior:  # each seed's fixed trade cost [S, 1, 1] (`QNetwork`'s cost prior)
            costs = torch.stack([network.trade_cost for network in networks]).view(-1, 1, 1)
            self.register_buffer("trade_cost", costs.clone())
            self.register_buffer("action_positions", networks[0].action_positions.clone())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [S, B, n_actions]; dueling: ``V + A − mean_a A`` per seed; minus the cost prior's
        trade_cost · |Δposition| where the networks have one."""
        features = self.body(obs)
        if self.dueling:
            advantage = self.advantage_head(features)
            features = self.value_head(features) + advantage - advantage.mean(dim=2, keepdim=True)
        if not self.cost_prior:
            return features
        return minus_cost_of_change(features, obs, self.trade_cost, self.action_positions)

    @torch.no_grad()
    def copy_to(self, index: int, network: QNetwork) -> None:
        """Load seed ``index``'s weights into a plain `QNetwork` (for its evaluation and its checkpoint)."""
        self.body.copy_to(index, network.net)
        if self.cost_prior:
            network.trade_cost.copy_(self.trade_cost[index].reshape(()))
        if self.dueling:  # a Sequential around a head names its parameters as the stack does ("0.weight")
            self.value_head.copy_to(index, nn.Sequential(network.value_head))
            self.advantage_head.copy_to(index, nn.Sequential(network.advantage_head))


class NStepWindow:
    """Turns the last n vector steps into n-step transitions for the oldest one, per env, on the device.

    R = Σ_{k<m} γ^k r_{t+k} and the bootstrap discount γ^m·(1 − terminated), where m ≤ n stops at the first episode
    end; the bootstrap obs is the true next state at that end (the env's ``final_obs``, not the auto-reset obs).
    Envs are independent, so a batch of seeds is simply S·n_envs envs here (seed-major, as the env lays them out).
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
    """Per-seed Huber TD losses [S] (fp32) and the taken actions' Q-values [S, B]; Double DQN picks a′ with the
    online network."""
    with torch.no_grad(), plan.autocast():
        next_target = target_net(batch.next_obs)
        best = q_net(batch.next_obs).argmax(dim=2, keepdim=True) if double_q else None
    next_target = next_target.float()
    next_q = next_target.gather(2, best).squeeze(2) if double_q else next_target.max(dim=2).values
    target = batch.rewards + batch.discounts * next_q
    with plan.autocast():
        q = q_net(batch.obs)
    q_taken = q.float().gather(2, batch.actions[..., None]).squeeze(2)
    return F.smooth_l1_loss(q_taken, target, reduction="none").mean(dim=1), q_taken


def _row_parameters(data: MarketData, env: EnvConfig, rows: tuple[int, int] | None) -> torch.Tensor:
    """The step parameters [5, T] of ``data`` (of its rows [start, stop) with ``rows``)."""
    params = data.step_parameters(env.fill)
    return params if rows is None else params[:, rows[0] : rows[1]]


def typical_trade_cost(data: MarketData, env: EnvConfig, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """The median cost fraction of one contract's position change over the training rows that charge one
    (`MarketData.step_parameters`' trade cost: half-spread and commission as a fraction of notional), 0 where none
    does: the cost prior's ``trade_cost`` before the reward scale and contracts. Known before any trade, from
    prices alone. A 0-dim tensor on the data's device (computed there: no host sync). ``rows``: [start, stop)
    only."""
    trade = _row_parameters(data, env, rows)[2]
    return torch.where(trade > 0, trade, torch.nan).nanmedian().nan_to_num(0.0)


def td_loss_all_actions(
    q_net: nn.Module,
    target_net: nn.Module,
    batch: Batch,
    plan: PrecisionPlan,
    action_positions: torch.Tensor,
    *,
    double_q: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`td_loss` over every action of each sampled state (``all_actions``): a transition's market move gives the
    reward of each of the three target positions (``batch.rewards`` [S, B, 3]), and the next state of action a is
    the stored next obs holding position(a). Per-seed Huber losses [S] (mean over samples and actions) and the
    taken actions' Q-values [S, B]."""
    n_actions = action_positions.numel()
    with torch.no_grad():
        # [S, B, 3, obs_dim]: the next obs with each action's position, flattened to [S, 3B, obs_dim]
        variants = batch.next_obs.unsqueeze(2).repeat(1, 1, n_actions, 1)
        variants[..., -1] = action_positions
        variants = variants.flatten(1, 2)
        with plan.autocast():
            next_target = target_net(variants)
            best = q_net(variants).argmax(dim=2, keepdim=True) if double_q else None
        next_target = next_target.float()
        next_q = next_target.gather(2, best).squeeze(2) if double_q else next_target.max(dim=2).values
        target = batch.rewards + batch.discounts[..., None] * next_q.view_as(batch.rewards)
    with plan.autocast():
        q = q_net(batch.obs).float()
    loss = F.smooth_l1_loss(q, target, reduction="none").mean(dim=(1, 2))
    return loss, q.gather(2, batch.actions[..., None]).squeeze(2)


def all_action_rewards(
    params: torch.Tensor, held: torch.Tensor, action_positions: torch.Tensor
) -> torch.Tensor:
    """Rewards [N, 3] of each target position from the positions ``held`` [N] into the step, for the rows whose
    `TradingEnv` step parameters are ``params`` [5, N] (`step_rewards` broadcast over the actions): the reward
    the env paid is the taken action's column."""
    gross, cost = step_rewards(params[:, :, None], held[:, None], action_positions[None, :])
    return gross - cost


def reward_normalizer(data: MarketData, env: EnvConfig, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """1 / (contracts x the standard deviation of one contract's per-bar holding return over the training rows):
    the scale that makes a held position's reward about unit-sized. Adam moves the weights by about the learning
    rate whatever the rewards' size, so unscaled per-bar returns (~1e-4) leave the Q-values' step-to-step jitter
    far above the cost of a trade and the greedy policy churns (docs/PERFORMANCE.md "Do no harm"). A 0-dim
    tensor on the data's device (no host sync); 1 where the returns do not vary. ``rows``: [start, stop) only."""
    spread = _row_parameters(data, env, rows)[1].std() * env.contracts
    return torch.where(spread > 0, 1.0 / spread, torch.ones_like(spread))


@dataclass
class LoopState:
    """The loop's own variables: what a resumed run continues from (with the components given to the `Run`)."""

    obs: torch.Tensor  # [S·n_envs, obs_dim], seed-major
    episode_return: torch.Tensor
    explore_draws: torch.Tensor | None = None  # pool of uniform draws for ε-greedy, refilled every 64 steps
    random_actions: torch.Tensor | None = None
    env_steps: int = 0  # per seed (each seed's n_envs envs), as in a single-seed run
    grad_steps: int = 0  # per seed: one batched step moves every seed once
    epsilon: float = 1.0


def train_seeds(
    train_data: MarketData,
    config: DQNConfig,
    hparams: Mapping[str, Any] | None,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seeds: Sequence[int],
    on_eval: SeedsEvalCallback | None = None,
    checkpoint: TrainingCheckpoint | None = None,
    on_log: Callable[[dict[str, Any]], None] | None = None,
    block_rows: Sequence[tuple[int, int]] | None = None,
) -> list[TrainResult]:
    """Train one DQN agent per seed on ``train_data`` for ``config.total_steps`` env steps each, all S as one
    batched computation (see the module docstring); result i is seeds[i]'s. ``block_rows``: seed i trains on rows
    [start, stop) of ``train_data`` only (folds on the batch axis: `stack_market_data`), its reward scale and cost
    prior from those rows.

    With ``checkpoint`` (one for the batch), the loop resumes from its saved state (if any) and saves its full
    state whenever the checkpoint is due; the results are the same as one uninterrupted run's.
    """
    setup = set_up_seeds(SPEC, hparams, train_data, config.env, precision, device, seeds, block_rows)
    hp, device, plan, env, generators = setup.hp, setup.device, setup.plan, setup.env, setup.generators
    n_seeds, n_envs, obs_dim = len(setup.seeds), config.env.n_envs, env.obs_dim  # n_envs: per seed
    require(hp.buffer_size >= n_envs, "buffer_size", f"an integer >= env.n_envs ({n_envs})", hp.buffer_size)
    # rewards as learnt: x reward_scale, and with normalize_rewards in units of the per-bar return spread of the
    # seed's own training rows ([S]; one value per seed, the same for all unless folds share the batch)
    # each distinct row range once (one for all seeds unless folds share the batch)
    ranges = list(dict.fromkeys(env.block_rows))
    scales = {
        rows: hp.reward_scale
        * (
            reward_normalizer(env.data, config.env, rows)
            if hp.normalize_rewards
            else torch.ones((), device=device)
        )
        for rows in ranges
    }
    seed_scales = torch.stack([scales[rows] for rows in env.block_rows])
    if hp.cost_prior:
        costs = {rows: typical_trade_cost(env.data, config.env, rows) for rows in ranges}
        for nets, rows in zip(setup.networks, env.block_rows, strict=True):
            nets["q"].trade_cost.copy_(scales[rows] * config.env.contracts * costs[rows])
    reward_scale = seed_scales.repeat_interleave(n_envs)  # [S·n_envs], seed-major like the envs
    if hp.all_actions:  # the rewards of every action: [S·n_envs, 3]
        reward_scale = reward_scale[:, None]
    q_net = StackedQNetwork([nets["q"] for nets in setup.networks])
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    capture = config.capture and capturable_plan(plan, device)
    stepper = SeedOptimStep.adam(
        q_net.parameters(), hp.learning_rate, plan, hp.max_grad_norm, n_seeds=n_seeds, capturable=capture
    )
    replay = ReplayBuffer(hp.buffer_size, obs_dim, device, n_seeds, N_ACTIONS if hp.all_actions else 1)
    streams = SeedStreams.from_generators(generators, device)  # exploration, replay: a few ops whatever S
    action_positions = torch.tensor(ACTION_POSITIONS, dtype=torch.float32, device=device)
    # The gradient step's static buffers (the same addresses every step, as a captured graph needs): the replay
    # rows of its minibatch (every seed's) in, its statistics row [S × (loss, q_mean, q_low, q_high, grad_norm)] out.
    step_rows = torch.zeros(n_seeds * hp.batch_size, dtype=torch.long, device=device)
    step_terms = torch.empty(1, n_seeds * len(_COLUMNS), device=device)

    def learn() -> None:
        """One gradient step of every seed on the replay rows in ``step_rows``; no host sync, no host state."""
        (batch,) = replay.gather(step_rows, hp.batch_size, 1)
        if hp.all_actions:
            loss, q_taken = td_loss_all_actions(
                q_net, target_net, batch, plan, action_positions, double_q=hp.double_q
            )
        else:
            loss, q_taken = td_loss(q_net, target_net, batch, plan, double_q=hp.double_q)
        grad_norm = stepper.step(loss)  # [S]: each seed clipped by its own norm
        q_taken = q_taken.detach()
        q_low, q_high = torch.aminmax(q_taken, dim=1)
        # seed-major, as the columns
        torch.stack(
            [loss.detach(), q_taken.mean(dim=1), q_low, q_high, grad_norm.float()],
            1,
            out=step_terms.view(n_seeds, -1),
        )

    gradient_step = CapturedCall(learn, device, capture=capture)
    n_step = NStepWindow(hp.n_step_return, hp.gamma, device)
    # Each seed's plain networks: what its evaluations act with and its result holds, refreshed from the stacked
    # weights when an evaluation is due and at the end.
    networks = [
        {"q": nets["q"], "target": copy.deepcopy(nets["q"]).requires_grad_(False)} for nets in setup.networks
    ]
    policies = [GreedyPolicy(nets["q"], plan) for nets in networks]
    evals = EvalSchedule(on_eval, config.eval_every)
    seed_names = [f"seed_{index}" for index in range(n_seeds)]
    metrics = DeviceMetrics(
        [f"{column}/{name}" for name in seed_names for column in _COLUMNS],
        device,
        counters=[f"{counter}/{name}" for counter in ("episode_return", "episodes") for name in seed_names],
        capacity=config.check_every,
        counter_width=n_envs,
    )
    finished_returns = metrics.counter_block([f"episode_return/{name}" for name in seed_names])  # [S, n_envs]
    finished_episodes = metrics.counter_block([f"episodes/{name}" for name in seed_names])
    n_vector_steps = max(1, math.ceil(config.total_steps / n_envs))
    exploration_steps = hp.exploration_fraction * n_vector_steps * n_envs
    state = LoopState(obs=env.reset(), episode_return=torch.zeros(n_seeds * n_envs, device=device))
    run = resume_or_start(
        checkpoint,
        {
            "q": q_net,
            "target": target_net,
            "optim": stepper,
            "replay": replay,
            "streams": streams,
            "n_step": n_step,
            **{f"generator_{index}": generator for index, generator in enumerate(generators)},
            "env": env,
            "metrics": metrics,
            "evals": evals,
        },
        state,
        total_steps=n_vector_steps * n_envs,
        device=device,
        on_log=on_log,
    )

    def by_step(draws: torch.Tensor) -> torch.Tensor:
        """[S, pool steps · n_envs] stream draws -> [pool steps, S·n_envs] (seed-major like the envs)."""
        return draws.view(n_seeds, _RANDOM_POOL_STEPS, n_envs).movedim(0, 1).reshape(_RANDOM_POOL_STEPS, -1)

    for vector_step in range(state.env_steps // n_envs, n_vector_steps):
        # ε-greedy on the device; each seed's uniform draws come from its own stream, in a pool refilled every
        # _RANDOM_POOL_STEPS steps ([pool steps, S·n_envs], seed-major like the envs).
        if vector_step % _RANDOM_POOL_STEPS == 0:
            state.explore_draws = by_step(streams.uniform(_RANDOM_POOL_STEPS * n_envs))
            state.random_actions = by_step(streams.integers(N_ACTIONS, _RANDOM_POOL_STEPS * n_envs))
        progress = min(1.0, state.env_steps / exploration_steps)
        state.epsilon = hp.exploration_initial_eps + progress * (
            hp.exploration_final_eps - hp.exploration_initial_eps
        )
        # acting in fp32, as `GreedyPolicy`: no casts on this uncaptured, host-issued path
        with torch.no_grad():
            greedy = q_net(state.obs.view(n_seeds, n_envs, obs_dim)).argmax(dim=2).view(-1)
        row = vector_step % _RANDOM_POOL_STEPS
        explore = state.explore_draws[row] < state.epsilon
        actions = torch.where(explore, state.random_actions[row], greedy)

        held = state.obs[:, -1]  # the position held into the step (the obs' last entry)
        next_obs, rewards, terminated, truncated = env.step(actions)  # all seeds' envs in one step
        done = terminated | truncated
        # all_actions: every action's reward from the same market move (n_step_return is then 1)
        learned = all_action_rewards(env.last_params, held, action_positions) if hp.all_actions else rewards
        transition = n_step.push(
            state.obs, actions, learned * reward_scale, env.final_obs, terminated, done
        )  # final_obs: the true next state, also where the env auto-reset
        if transition is not None:
            first_obs, first_actions, bootstrap_obs, returns, discounts = transition
            replay.add(
                first_obs.view(n_seeds, n_envs, obs_dim),
                bootstrap_obs.view(n_seeds, n_envs, obs_dim),
                first_actions.view(n_seeds, n_envs),
                returns.view(n_seeds, n_envs, *returns.shape[1:]),
                discounts.view(n_seeds, n_envs),
            )
        state.episode_return.add_(rewards)
        finished_returns.add_((state.episode_return * done).view(n_seeds, n_envs))
        finished_episodes.add_(done.view(n_seeds, n_envs))
        state.episode_return.masked_fill_(done, 0.0)
        state.obs = next_obs
        state.env_steps += n_envs

        if state.env_steps >= hp.learning_starts and replay.size > 0 and vector_step % hp.train_freq == 0:
            rows = replay.sample_rows(hp.batch_size, hp.gradient_steps, streams).view(hp.gradient_steps, -1)
            for batch_rows in rows:
                step_rows.copy_(batch_rows)
                gradient_step()  # one graph launch where captured
                metrics.record_rows(step_terms)
                state.grad_steps += 1
                if state.grad_steps % hp.target_update == 0:
                    _update_target(target_net, q_net, hp.tau)
                if state.grad_steps % config.check_every == 0:
                    run.log(_record(metrics, state, setup.seeds))
        if evals.due(state.env_steps):
            _copy_to_plain(q_net, target_net, networks)
            evals.maybe(state.env_steps, policies)
        run.maybe_save(state.env_steps)

    if metrics.pending > 0 or not run.history:  # the last partial window
        run.log(_record(metrics, state, setup.seeds))
    _copy_to_plain(q_net, target_net, networks)
    return finish_seeds(
        setup,
        run,
        evals,
        policies,
        networks=networks,
        latest=("loss", "q_mean", "q_min", "q_max", "grad_norm", "episode_return_mean"),
        seed_fields=[{} for _ in setup.seeds],
        env_steps=state.env_steps,
        grad_steps=state.grad_steps,
        host_syncs=metrics.host_reads,
        nan_checks=metrics.host_reads,  # every statistics read is the NaN/inf check
        final_epsilon=state.epsilon,
        captured=gradient_step.captured,  # the gradient steps ran as CUDA graph launches
    )


@torch.no_grad()
def _update_target(target_net: nn.Module, q_net: nn.Module, tau: float) -> None:
    """Hard copy (τ = 1) or Polyak averaging target ← τ·online + (1 − τ)·target (elementwise: per seed)."""
    for target_param, param in zip(target_net.parameters(), q_net.parameters(), strict=True):
        if tau == 1.0:
            target_param.copy_(param)
        else:
            target_param.lerp_(param, tau)


def _copy_to_plain(
    q_net: StackedQNetwork, target_net: StackedQNetwork, networks: list[dict[str, nn.Module]]
) -> None:
    for index, nets in enumerate(networks):
        q_net.copy_to(index, nets["q"])
        target_net.copy_to(index, nets["target"])


def _record(metrics: DeviceMetrics, state: LoopState, seeds: Sequence[int]) -> dict[str, Any]:
    """One batch history record ``{"seeds": [one record per seed]}`` from a statistics read (the loop's one
    device→host copy); raises `NonFiniteError` naming every seed whose loss or Q-values went non-finite."""
    first = metrics.window_start
    window = metrics.read(state.grad_steps)
    records, bad = [], []
    for index, seed in enumerate(seeds):
        name = f"seed_{index}"
        nonfinite = [c for c in _WATCHED if window["count"] and not math.isfinite(window[f"{c}/{name}"])]
        if nonfinite:
            quoted = ", ".join(repr(column) for column in nonfinite)
            bad.append(f"seed {seed} (batch index {index}): non-finite {quoted}")
        episodes = int(window[f"episodes/{name}"])
        records.append(
            {
                "env_steps": state.env_steps,
                "grad_steps": state.grad_steps,
                "epsilon": state.epsilon,
                "loss": window[f"loss/{name}"],
                "q_mean": window[f"q_mean/{name}"],
                "grad_norm": window[f"grad_norm/{name}"],
                "q_min": window[f"q_low/{name}_min"],
                "q_max": window[f"q_high/{name}_max"],
                "episodes": episodes,
                "episode_return_mean": window[f"episode_return/{name}"] / episodes if episodes else None,
            }
        )
    if bad:
        raise NonFiniteError(f"{'; '.join(bad)} between steps {first} and {state.grad_steps}")
    return {"seeds": records}


# ------------------------------------------------------------------------------------------------ the registry


def search_space(trial: Trial, batch_bounds: tuple[int, int]) -> dict[str, Any]:
    """DQN search space (docs/HYPEROPT.md); batch sizes within the device's bounds."""
    return {
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", DQN_HIDDEN_DIM_BASES),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 1e-4, log=True),
        "gamma": trial.suggest_float("gamma", 0.5, 0.99),
        "batch_size": trial.suggest_categorical(
            "batch_size", batch_choices(*batch_bounds, (64, 128, 256, 512))
        ),
        "exploration_fraction": trial.suggest_float("exploration_fraction", 0.05, 0.5),
        "exploration_final_eps": trial.suggest_float("exploration_final_eps", 0.01, 0.1),
        "target_update": trial.suggest_categorical("target_update", (250, 500, 1000, 2000)),
        "gradient_steps": trial.suggest_categorical("gradient_steps", (1, 2, 4)),
        "reward_scale": trial.suggest_categorical("reward_scale", REWARD_MULTIPLIERS),
    }


def network_widths(base: int) -> dict[str, list[int]]:
    """The Q-network ``obs → b → b/2 → b/4 → 3``."""
    return {"q": [base, base // 2, base // 4]}


def build_networks(architecture: Architecture) -> dict[str, nn.Module]:
    """The Q-network (ReLU, optional dueling head), PyTorch default init (output layer zero with the cost prior)."""
    dueling = bool(architecture.options.get("dueling"))
    q_net = QNetwork(
        architecture.obs_dim,
        architecture.hidden["q"],
        architecture.n_actions,
        architecture.activation,
        dueling,
        cost_prior=bool(architecture.options.get("cost_prior", False)),
    )
    return {"q": q_net}


def architecture_options(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """DQN's own entries of the architecture dict: whether the Q-network has a dueling head and the cost prior."""
    return {
        "dueling": bool(hparams.get("dueling", False)),
        "cost_prior": bool(hparams.get("cost_prior", DQNHyperparams.cost_prior)),
    }


def run_config(*, total_steps: int, env: EnvConfig, eval_every: int, check_every: int) -> DQNConfig:
    """DQN's run settings: length, env, evaluation cadence and the statistics cadence."""
    return DQNConfig(total_steps=total_steps, env=env, eval_every=eval_every, check_every=check_every)


#: A trial's fixed work in `ModelProfile.trial_cost` units: the env steps trial_steps times and validates ten
#: times whatever the network (hidden_dim_base=64, batch 64, one gradient step per vector step: 8.4 CPU-s, of which
#: ~0.2 s of training work; bench/speed/hyperopt_cost.py)
TRIAL_OVERHEAD = 3.5e11


def trial_cost(hp: Mapping[str, Any], s: TrialSizes) -> float:
    """A hyperopt trial's work (`ModelProfile.trial_cost`): gradient samples (gradient steps x batch; passes of
    the networks: online(s), and online(s') and target(s') for each next state, 3 of them with all_actions;
    forward and backward ~3x) plus the acting passes, x the Q-network's weights."""
    weights = dense_weights([s.obs_dim, *network_widths(hp["hidden_dim_base"])["q"], N_ACTIONS])
    vector_steps = s.trial_steps // s.n_envs
    learning = max(0, (s.trial_steps - s.learning_starts) // s.n_envs)
    next_states = N_ACTIONS if hp.get("all_actions", DQNHyperparams.all_actions) else 1
    samples = learning * hp["gradient_steps"] * hp["batch_size"] * 3 * (1 + 2 * next_states)
    return TRIAL_OVERHEAD + float((samples + vector_steps * s.n_envs) * weights)


#: Its cost-driving bounds and trial cost (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={"hidden_dim_base": (64, 256), "batch_size": (64, 512), "gradient_steps": (1, 4)},
    trial_cost=trial_cost,
)
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
    architecture_options=architecture_options,
    train_seeds=train_seeds,
    profile=PROFILE,
    saver=save_agent,
    loader=load_agent,
)
