"""PPO (clipped surrogate, separate policy and value networks) on the tensor-resident TradingEnv, in one file.

`train_seeds` trains S seeds as ONE batched computation (issue 24): the S seeds' networks are stacked on a
leading seed axis (`SeedStack`: one batched matmul per layer), the env holds S blocks of ``n_envs`` envs, one
optimizer steps the stacked weights (`SeedOptimStep`: per-seed clipping, per-seed masks), and every tensor of the
loop below carries the seed on dim 0 (rollout tables [S, T·N, ...]). Each seed keeps what it would have alone: its
initial weights, its random stream (Gumbel noise, minibatch order), its env blocks' episode starts, its advantage
normalization, losses, gradient clipping, KL stop and statistics.

Per update:
1. rollout: T vector steps of S·N envs on the device; actions by Gumbel-max on the policy logits (each seed's
   noise for the whole rollout drawn at once from its stream, `gpu_utils.SeedStreams`; no distribution objects);
2. values V(s_t) and V(s′_t) (s′ = the true next state, the env's ``final_obs`` where it auto-reset) and old
   log-probs in batched passes over the whole rollout;
3. GAE over all S·N envs (loop over time only), where it is cheapest (`gpu_utils.gae_place`): for a small batch
   on an accelerator, on the host after exactly ONE device→host copy of rewards, values, next values, terminated
   and truncated stacked in one tensor (advantages and returns go back in a host→device copy, which does not
   stall); otherwise on the device, with the per-seed statistics (value range, explained variance, finished
   episodes, the finite check) reduced there and read in ONE small copy of [S, 8];
4. the rollout statistics per seed, from whichever side computed them;
5. ``n_epochs`` of shuffled minibatches (each seed its own permutation, drawn on the device). An epoch is one
   function over static buffers (the rollout's tables, the permutation, the active seeds, the per-step loss
   terms), so on CUDA it is captured once as a CUDA graph and each later epoch is one graph launch, whatever the
   minibatch count or S (`gpu_utils.CapturedCall`; eager on the CPU). The per-seed loss terms accumulate on the
   device and are read once per update (once per epoch with ``target_kl``: a seed whose epoch KL exceeds it stops
   its epochs, masked out of the optimizer step, while the others go on).

So a rollout costs a fixed number of host syncs, independent of T, N and S. Hyperparameters follow
Stable-Baselines3's names (``n_steps`` = T, ``batch_size`` = minibatch size per seed); see `PPOHyperparams` and
docs/AGENTS.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gpu_utils import (
    CapturedCall,
    DeviceMetrics,
    NonFiniteError,
    PrecisionPlan,
    SeedOptimStep,
    capturable_plan,
)
from gpu_utils.advantages import GaePlace, episode_sums, gae_device, gae_host, gae_place
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
from marketrl.agents.networks import mlp, orthogonal_init
from marketrl.agents.spec import (
    PPO_HIDDEN_DIM_BASES,
    REWARD_SCALES,
    AgentSpec,
    Architecture,
    MemoryModel,
    batch_choices,
)
from marketrl.env import N_ACTIONS, EnvConfig, MarketData
from marketrl.loop.hparams import check_ranges
from marketrl.loop.profile import ModelProfile, TrialSizes, dense_weights
from marketrl.loop.resume import TrainingCheckpoint, resume_or_start
from marketrl.loop.schedule import EvalSchedule, SeedsEvalCallback

if TYPE_CHECKING:
    from marketrl.models.base import Trial

__all__ = [
    "PROFILE",
    "SPEC",
    "GaeInputs",
    "PPOConfig",
    "PPOHyperparams",
    "SeedStats",
    "gae_on_device",
    "gae_on_host",
    "ppo_loss",
    "search_space",
    "train_seeds",
]

_LOSS_TERMS = ["policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"]
_WATCHED = ("policy_loss", "value_loss", "entropy")
ROLLOUT_EXTRA_FIELDS = 7  # action, reward, done, old log-prob, value, advantage, return


@dataclass(frozen=True)
class PPOHyperparams:
    """Tunable PPO settings (keys of the ``hparams`` dict)."""

    learning_rate: float = 3e-4
    n_steps: int = 128  # rollout length T per env
    batch_size: int = 1024  # minibatch size
    n_epochs: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    clip_range_vf: float | None = None  # None: no value clipping
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float | None = 0.5
    normalize_advantage: bool = True
    target_kl: float | None = None  # stop the update's epochs once an epoch's mean approx. KL exceeds this
    anneal_lr: bool = False  # linear decay of the learning rate to 0 over training
    reward_scale: float = 1.0
    hidden_dim_base: int | None = None
    net_arch: list[int] | None = None

    def validate(self) -> None:
        """Range checks (types were checked by `parse_hparams`)."""
        check_ranges(
            self,
            positive=("learning_rate", "clip_range", "reward_scale"),
            positive_or_null=("clip_range_vf", "max_grad_norm", "target_kl"),
            unit=("gamma", "gae_lambda"),
            at_least_one=("n_steps", "batch_size", "n_epochs"),
            non_negative=("ent_coef", "vf_coef"),
        )


@dataclass(frozen=True)
class PPOConfig(RunConfig):
    """Run settings (not tuned), those of every trainer. ``total_steps`` (per seed) is rounded up to whole
    rollouts of n_steps × n_envs; ``eval_every`` is checked after each update. ``gae``: where GAE runs
    ("auto": `gpu_utils.gae_place` by the batch's size and device; the two places give the same advantages).
    ``capture``: on CUDA (without fp16's GradScaler), record an epoch of minibatch steps as one CUDA graph
    (`gpu_utils.CapturedCall`); elsewhere the same epoch function runs eagerly."""

    gae: GaePlace = "auto"
    capture: bool = True


class Minibatch(NamedTuple):
    """Columns of one minibatch, [S, B, ...] (or [B, ...] for one unbatched network pair)."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor


def ppo_loss(
    policy_net: nn.Module, value_net: nn.Module, batch: Minibatch, hp: PPOHyperparams, plan: PrecisionPlan
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-seed total losses [S] (fp32) and the detached [S] terms [policy_loss, value_loss, entropy, approx_kl,
    clip_fraction]; every mean (and the advantage normalization) is over a seed's own minibatch (the last dim)."""
    with plan.autocast():
        logits = policy_net(batch.obs)
        values = value_net(batch.obs)
    log_probs_all = F.log_softmax(logits.float(), dim=-1)
    entropy = -(log_probs_all.exp() * log_probs_all).sum(dim=-1).mean(dim=-1)
    log_ratio = log_probs_all.gather(-1, batch.actions[..., None]).squeeze(-1) - batch.old_log_probs
    ratio = log_ratio.exp()
    advantages = batch.advantages
    if hp.normalize_advantage:
        advantages = (advantages - advantages.mean(dim=-1, keepdim=True)) / (
            advantages.std(dim=-1, keepdim=True) + 1e-8
        )
    surrogate = torch.minimum(
        advantages * ratio, advantages * ratio.clamp(1 - hp.clip_range, 1 + hp.clip_range)
    )
    policy_loss = -surrogate.mean(dim=-1)

    values = values.float().squeeze(-1)
    value_error = (values - batch.returns).square()
    if hp.clip_range_vf is not None:
        clipped = batch.old_values + (values - batch.old_values).clamp(-hp.clip_range_vf, hp.clip_range_vf)
        value_error = torch.maximum(value_error, (clipped - batch.returns).square())
    value_loss = value_error.mean(dim=-1)

    loss = policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss
    with torch.no_grad():
        approx_kl = (ratio - 1 - log_ratio).mean(dim=-1)
        clip_fraction = ((ratio - 1).abs() > hp.clip_range).float().mean(dim=-1)
    return loss, [policy_loss.detach(), value_loss.detach(), entropy.detach(), approx_kl, clip_fraction]


@dataclass
class LoopState:
    """The loop's own variables: what a resumed run continues from (with the components given to the `Run`)."""

    obs: torch.Tensor  # [S·N, obs_dim], seed blocks of N envs
    # running return per env [S·N], float64: numpy where GAE runs on the host, else a tensor on the device
    episode_return: np.ndarray | torch.Tensor
    seed_grad_steps: np.ndarray  # [S] gradient steps each seed took (a seed stopped by target_kl takes fewer)
    env_steps: int = 0  # per seed
    grad_steps: int = 0  # minibatch steps of the batch (the statistics' step counter)
    rollout_copies: int = 0


def train_seeds(
    train_data: MarketData,
    config: PPOConfig,
    hparams: Mapping[str, Any] | None,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seeds: Sequence[int],
    on_eval: SeedsEvalCallback | None = None,
    checkpoint: TrainingCheckpoint | None = None,
    on_log: Callable[[dict[str, Any]], None] | None = None,
    block_rows: Sequence[tuple[int, int]] | None = None,
) -> list[TrainResult]:
    """Train one PPO agent per seed on ``train_data`` for ``config.total_steps`` env steps each, as one batched
    computation; result i is that of ``seeds[i]`` (see the module docstring). ``block_rows``: seed i trains on
    rows [start, stop) of ``train_data`` only (folds on the batch axis: `stack_market_data`).

    ``on_eval(env_steps, policies)`` gets one greedy policy per seed and returns one score per seed. With
    ``checkpoint`` (one for the batch), the loop resumes from its saved state (if any) and saves its full state
    after any update at which the checkpoint is due; the result is the same as one uninterrupted run.
    """
    setup = set_up_seeds(SPEC, hparams, train_data, config.env, precision, device, seeds, block_rows)
    hp, device, plan, env, generators = setup.hp, setup.device, setup.plan, setup.env, setup.generators
    n_seeds, n_envs, n_steps, obs_dim = len(setup.seeds), config.env.n_envs, hp.n_steps, env.obs_dim
    rollout_size = n_steps * n_envs  # per seed
    policy_net = SeedStack([networks["policy"] for networks in setup.networks])
    value_net = SeedStack([networks["value"] for networks in setup.networks])
    # One optimizer (and one GradScaler under fp16) over both stacks: one backward of the summed loss. A seed
    # stopped by target_kl goes on at the next update: its Adam step count must be its own.
    params = [*policy_net.parameters(), *value_net.parameters()]
    capture = config.capture and capturable_plan(plan, device)
    stepper = SeedOptimStep.adam(
        params,
        hp.learning_rate,
        plan,
        hp.max_grad_norm,
        n_seeds=n_seeds,
        per_seed_steps=hp.target_kl is not None,
        capturable=capture,
    )
    policies = [GreedyPolicy(networks["policy"], plan) for networks in setup.networks]
    evals = EvalSchedule(on_eval, config.eval_every)
    minibatches_per_epoch = math.ceil(rollout_size / hp.batch_size)
    tags = [f"seed_{seed}" for seed in setup.seeds]
    columns = [f"{term}/{tag}" for term in _LOSS_TERMS for tag in tags]  # term-major: a [terms, S] row
    metrics = DeviceMetrics(
        columns,
        device,
        watched=[f"{term}/{tag}" for term in _WATCHED for tag in tags],
        capacity=minibatches_per_epoch * (1 if hp.target_kl is not None else hp.n_epochs),
    )
    n_updates = max(1, math.ceil(config.total_steps / rollout_size))
    on_host = gae_place(n_seeds * n_envs, device, config.gae) == "host"
    state = LoopState(
        obs=env.reset(),
        episode_return=np.zeros(n_seeds * n_envs, dtype=np.float64),
        seed_grad_steps=np.zeros(n_seeds, dtype=np.int64),
    )
    streams = SeedStreams.from_generators(generators, device)  # Gumbel noise, the epochs' permutations
    run = resume_or_start(
        checkpoint,
        {
            "policy": policy_net,
            "value": value_net,
            "optim": stepper,
            "streams": streams,
            **{f"generator_{index}": generator for index, generator in enumerate(generators)},
            "env": env,
            "metrics": metrics,
            "evals": evals,
        },
        state,
        total_steps=n_updates * rollout_size,
        device=device,
        on_log=on_log,
    )
    seed_offsets = torch.arange(n_seeds, device=device)[:, None] * rollout_size

    # The epoch's static buffers (the same addresses every update, as a captured graph needs): observations stay a
    # contiguous [S·T·N, obs_dim] table (a strided slice of a wider table would slow every matmul down); the
    # per-sample scalars [action, old log-prob, advantage, return, value] are packed in one [S·T·N, 5] table, so
    # a minibatch of every seed costs two gathers.
    obs_table = torch.empty(n_seeds * rollout_size, obs_dim, device=device)
    scalar_table = torch.empty(n_seeds * rollout_size, 5, device=device)
    active_mask = torch.ones(n_seeds, dtype=torch.bool, device=device)
    epoch_terms = torch.empty(minibatches_per_epoch, len(columns), device=device)
    held = active_mask if hp.target_kl is not None else None  # only a KL stop holds seeds

    def run_epoch() -> None:
        """One epoch of minibatch steps over the rollout tables, each seed in its own fresh order (a seed held by
        ``active_mask``, with ``target_kl``, keeps range order, masked out of the steps, and draws nothing); each
        step's [terms, S] row into ``epoch_terms``. No host sync, no host-side state."""
        index = streams.permutations(rollout_size, held) + seed_offsets
        for step, start in enumerate(range(0, rollout_size, hp.batch_size)):
            rows = index[:, start : start + hp.batch_size]
            batch = _minibatch(
                obs_table.index_select(0, rows.reshape(-1)).view(*rows.shape, obs_dim),
                scalar_table.index_select(0, rows.reshape(-1)).view(*rows.shape, 5),
            )
            loss, terms = ppo_loss(policy_net, value_net, batch, hp, plan)
            grad_norm = stepper.step(loss, active=held)
            torch.stack([*terms, grad_norm.float()], out=epoch_terms[step].view(len(_LOSS_TERMS), n_seeds))

    epoch = CapturedCall(run_epoch, device, capture=capture)
    masked = [True] * n_seeds  # what active_mask holds

    def by_seed(rows: torch.Tensor) -> torch.Tensor:
        """[T, S·N, ...] rollout rows -> [S, T·N, ...] (seed s's rows in its own (t, env) order)."""
        return rows.view(n_steps, n_seeds, n_envs, *rows.shape[2:]).movedim(1, 0).flatten(1, 2)

    def by_time(values: torch.Tensor) -> torch.Tensor:
        """[S, T·N] -> [T, S·N], the env layout GAE runs on."""
        return values.view(n_seeds, n_steps, n_envs).movedim(0, 1).reshape(n_steps, n_seeds * n_envs)

    def sync_policies() -> None:
        for index, networks in enumerate(setup.networks):
            policy_net.copy_to(index, networks["policy"])
            value_net.copy_to(index, networks["value"])

    for update in range(state.env_steps // rollout_size, n_updates):
        learning_rate = hp.learning_rate * (1.0 - update / n_updates) if hp.anneal_lr else hp.learning_rate
        stepper.set_learning_rate(learning_rate)  # shared: every seed follows the same schedule

        # 1. Rollout, entirely on the device; each seed's Gumbel noise −log(−log U) from its own stream.
        uniform = streams.uniform(n_steps * n_envs * N_ACTIONS).view(n_seeds, n_steps, n_envs, N_ACTIONS)
        gumbel = (
            uniform.movedim(0, 1).reshape(n_steps, n_seeds * n_envs, N_ACTIONS).log_().neg_().log_().neg_()
        )
        rollout_obs, rollout_next_obs, rollout_logits, rollout_actions = [], [], [], []
        rollout_rewards, rollout_terminated, rollout_truncated = [], [], []
        with (
            torch.no_grad(),
            plan.autocast(),
        ):  # one context for the whole rollout (the env ops are not autocast)
            for t in range(n_steps):
                logits = policy_net(state.obs.view(n_seeds, n_envs, obs_dim)).float().flatten(0, 1)
                actions = (logits + gumbel[t]).argmax(dim=1)  # Gumbel-max: a sample from softmax(logits)
                next_obs, rewards, terminated, truncated = env.step(actions)
                rollout_obs.append(state.obs)
                rollout_next_obs.append(env.final_obs)  # the true next state, also where the env auto-reset
                rollout_logits.append(logits)
                rollout_actions.append(actions)
                rollout_rewards.append(rewards)
                rollout_terminated.append(terminated)
                rollout_truncated.append(truncated)
                state.obs = next_obs
        state.env_steps += rollout_size

        # 2. Batched values of s and s′, and the behaviour policy's log-probs; tables [S, T·N, ...].
        stacked_obs = torch.stack(rollout_obs).view(n_steps, n_seeds, n_envs, obs_dim)
        seed_obs = obs_table.view(n_seeds, n_steps, n_envs, obs_dim)
        seed_obs.copy_(stacked_obs.movedim(1, 0))  # = by_seed, written into the epoch's static table
        seed_obs = seed_obs.view(n_seeds, rollout_size, obs_dim)
        seed_next_obs = by_seed(torch.stack(rollout_next_obs))
        seed_actions = by_seed(torch.stack(rollout_actions))
        with torch.no_grad(), plan.autocast():
            values = value_net(seed_obs).float().squeeze(2)
            next_values = value_net(seed_next_obs).float().squeeze(2)
        old_log_probs = (
            F.log_softmax(by_seed(torch.stack(rollout_logits)), dim=2)
            .gather(2, seed_actions[..., None])
            .squeeze(2)
        )

        # 3-4. GAE and the rollout's statistics, on one side or the other, with one host read.
        gae_inputs = GaeInputs(
            torch.stack(rollout_rewards),
            by_time(values),
            by_time(next_values),
            torch.stack(rollout_terminated),
            torch.stack(rollout_truncated),
        )
        gae = gae_on_host if on_host else gae_on_device
        targets, stats, state.episode_return = gae(gae_inputs, state.episode_return, hp, n_seeds)
        state.rollout_copies += 1
        bad = [tag for tag, seed_stats in zip(tags, stats, strict=True) if not seed_stats.finite]
        if bad:
            raise NonFiniteError(
                f"non-finite value estimates of {', '.join(bad)} in the rollout ending at env step "
                f"{state.env_steps}"
            )

        # 5. Minibatch epochs, each one `run_epoch` (one graph launch where captured).
        torch.stack(
            [
                seed_actions.to(torch.float32),
                old_log_probs,
                by_seed(targets[0]),
                by_seed(targets[1]),
                values,
            ],
            dim=2,
            out=scalar_table.view(n_seeds, rollout_size, 5),
        )
        active = [True] * n_seeds  # seeds still in this update's epochs (target_kl stops them one by one)
        epoch_reads: list[tuple[dict[str, Any], list[bool]]] = []
        for _ in range(hp.n_epochs):
            if hp.target_kl is not None and active != masked:  # only when a seed stopped or starts again
                if all(active):
                    active_mask.fill_(True)  # a device op: no transfer
                else:
                    active_mask.copy_(torch.tensor(active, device=device))
                masked = list(active)
            epoch()
            metrics.record_rows(epoch_terms)
            state.grad_steps += minibatches_per_epoch
            state.seed_grad_steps += minibatches_per_epoch * np.array(active, dtype=np.int64)
            if hp.target_kl is not None:  # one read per epoch, only when early stopping needs the KL
                epoch_reads.append((metrics.read(state.grad_steps), list(active)))
                kl = epoch_reads[-1][0]
                active = [
                    still and not kl[f"approx_kl/{tag}"] > hp.target_kl
                    for still, tag in zip(active, tags, strict=True)
                ]
                if not any(active):
                    break
        if hp.target_kl is None:
            windows = [metrics.read(state.grad_steps)] * n_seeds
        else:  # each seed's window: the epochs it took part in
            windows = [
                metrics.combine([read for read, took_part in epoch_reads if took_part[index]])
                for index in range(n_seeds)
            ]

        records = []
        for index, tag in enumerate(tags):
            window, seed_stats = windows[index], stats[index]
            records.append(
                {
                    "env_steps": state.env_steps,
                    "update": update + 1,
                    "grad_steps": int(state.seed_grad_steps[index]),
                    **{term: window[f"{term}/{tag}"] for term in _LOSS_TERMS},
                    "epochs": window["count"] // minibatches_per_epoch,
                    "learning_rate": learning_rate,
                    "value_mean": seed_stats.value_mean,
                    "value_min": seed_stats.value_min,
                    "value_max": seed_stats.value_max,
                    "explained_variance": seed_stats.explained_variance,
                    "episodes": seed_stats.episodes,
                    "episode_return_mean": seed_stats.episode_return_mean,
                }
            )
        run.log({"seeds": records})
        if evals.due(state.env_steps):
            sync_policies()
            evals.maybe(state.env_steps, policies)
        run.maybe_save(state.env_steps)

    sync_policies()
    return finish_seeds(
        setup,
        run,
        evals,
        policies,
        latest=(*_LOSS_TERMS, "value_mean", "explained_variance", "episode_return_mean"),
        seed_fields=[{"grad_steps": int(steps)} for steps in state.seed_grad_steps],
        env_steps=state.env_steps,
        updates=n_updates,
        host_syncs=state.rollout_copies + metrics.host_reads,
        captured=epoch.captured,  # the epochs ran as CUDA graph launches
        nan_checks=metrics.host_reads,  # every statistics read is the NaN/inf check
    )


def _minibatch(obs: torch.Tensor, scalars: torch.Tensor) -> Minibatch:
    """A minibatch from gathered obs rows and the matching rows of [action, old log-prob, advantage, return, value]."""
    actions, old_log_probs, advantages, returns, old_values = scalars.unbind(dim=-1)
    return Minibatch(obs, actions.long(), old_log_probs, advantages, returns, old_values)


class GaeInputs(NamedTuple):
    """A rollout's GAE inputs on the device, [T, S·N] each (the env layout)."""

    rewards: torch.Tensor
    values: torch.Tensor
    next_values: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor


class SeedStats(NamedTuple):
    """One seed's rollout statistics, as the update's record logs them."""

    finite: bool
    value_mean: float
    value_min: float
    value_max: float
    explained_variance: float | None
    episodes: int
    episode_return_mean: float | None


def gae_on_host(
    rollout: GaeInputs, running: np.ndarray | torch.Tensor, hp: PPOHyperparams, n_seeds: int
) -> tuple[torch.Tensor, list[SeedStats], np.ndarray]:
    """GAE in numpy after one device→host copy of the whole rollout: advantages and returns ([2, T, S·N], back
    on the device), each seed's statistics and the envs' running returns [S·N] after the rollout (``running``
    before it). Values with a NaN/inf stop before GAE (``finite`` False)."""
    if isinstance(running, torch.Tensor):  # a state saved where GAE ran on the device
        running = running.cpu().numpy()
    running = np.array(running, dtype=np.float64)
    packed = torch.stack(
        [
            rollout.rewards,
            rollout.values,
            rollout.next_values,
            rollout.terminated.float(),
            rollout.truncated.float(),
        ]
    )
    rewards_h, values_h, next_values_h, terminated_h, truncated_h = packed.cpu().numpy().astype(np.float64)
    n_steps = rewards_h.shape[0]
    finite = (
        np.isfinite(np.stack([values_h, next_values_h])).reshape(2, n_steps, n_seeds, -1).all(axis=(0, 1, 3))
    )
    if not finite.all():
        return packed[:2], [SeedStats(bool(ok), *([math.nan] * 4), 0, None) for ok in finite], running
    advantages_h, returns_h = gae_host(
        rewards_h * hp.reward_scale,
        values_h,
        next_values_h,
        terminated_h,
        truncated_h,
        hp.gamma,
        hp.gae_lambda,
    )
    finished = _finished_episode_returns(running, rewards_h, np.maximum(terminated_h, truncated_h), n_seeds)
    values_by_seed = values_h.reshape(n_steps, n_seeds, -1)
    returns_by_seed = returns_h.reshape(n_steps, n_seeds, -1)
    stats = []
    for index in range(n_seeds):
        seed_values = values_by_seed[:, index]
        stats.append(
            SeedStats(
                finite=True,
                value_mean=float(seed_values.mean()),
                value_min=float(seed_values.min()),
                value_max=float(seed_values.max()),
                explained_variance=_explained_variance(seed_values, returns_by_seed[:, index]),
                episodes=len(finished[index]),
                episode_return_mean=float(np.mean(finished[index])) if finished[index] else None,
            )
        )
    targets = torch.as_tensor(np.stack([advantages_h, returns_h]).astype(np.float32), device=packed.device)
    return targets, stats, running


def gae_on_device(
    rollout: GaeInputs, running: np.ndarray | torch.Tensor, hp: PPOHyperparams, n_seeds: int
) -> tuple[torch.Tensor, list[SeedStats], torch.Tensor]:
    """`gae_on_host` without the rollout's copy: GAE and the statistics on the device, one [S, 8] read."""
    running = torch.as_tensor(running, dtype=torch.float64, device=rollout.rewards.device)
    advantages, returns = gae_device(
        rollout.rewards.double() * hp.reward_scale,
        rollout.values,
        rollout.next_values,
        rollout.terminated,
        rollout.truncated,
        hp.gamma,
        hp.gae_lambda,
    )
    running, ended_sum, ended_count = episode_sums(
        running, rollout.rewards, rollout.terminated | rollout.truncated
    )

    def per_seed(table: torch.Tensor) -> torch.Tensor:
        """[T, S·N] -> [S, T·N] in float64."""
        return table.double().view(table.shape[0], n_seeds, -1).movedim(1, 0).flatten(1)

    values, seed_returns = per_seed(rollout.values), per_seed(returns)
    finite = torch.isfinite(torch.cat([values, per_seed(rollout.next_values)], dim=1)).all(dim=1)
    packed = torch.stack(
        [
            finite.double(),
            values.mean(dim=1),
            values.amin(dim=1),
            values.amax(dim=1),
            seed_returns.var(dim=1, correction=0),
            (seed_returns - values).var(dim=1, correction=0),
            ended_sum.view(n_seeds, -1).sum(dim=1),
            ended_count.view(n_seeds, -1).sum(dim=1).double(),
        ],
        dim=1,
    )
    stats = []
    for finite_flag, mean, low, high, variance, residual, ended, count in packed.cpu().tolist():
        stats.append(
            SeedStats(
                finite=finite_flag == 1.0,
                value_mean=mean,
                value_min=low,
                value_max=high,
                explained_variance=None if variance == 0 else 1.0 - residual / variance,
                episodes=int(count),
                episode_return_mean=ended / count if count else None,
            )
        )
    return torch.stack([advantages, returns]).float(), stats, running


def _finished_episode_returns(
    running: np.ndarray, rewards: np.ndarray, done: np.ndarray, n_seeds: int
) -> list[list[float]]:
    """Advance per-env running returns [S·N] (updated in place) over a rollout [T, S·N]; return each seed's
    episodes that ended, in (step, env) order."""
    finished: list[list[float]] = [[] for _ in range(n_seeds)]
    block = running.shape[0] // n_seeds
    for t in range(rewards.shape[0]):
        running += rewards[t]
        ended = np.flatnonzero(done[t] > 0)
        for env_index in ended:
            finished[env_index // block].append(float(running[env_index]))
        running[ended] = 0.0
    return finished


def _explained_variance(values: np.ndarray, returns: np.ndarray) -> float | None:
    variance = float(np.var(returns))
    return None if variance == 0 else 1.0 - float(np.var(returns - values)) / variance


# ------------------------------------------------------------------------------------------------ the registry


def search_space(trial: Trial, batch_bounds: tuple[int, int]) -> dict[str, Any]:
    """PPO search space (docs/HYPEROPT.md); minibatch sizes within the device's bounds."""
    return {
        "hidden_dim_base": trial.suggest_categorical("hidden_dim_base", PPO_HIDDEN_DIM_BASES),
        "learning_rate": trial.suggest_float("learning_rate", 1e-5, 3e-3, log=True),
        "gamma": trial.suggest_float("gamma", 0.9, 0.999),
        "gae_lambda": trial.suggest_float("gae_lambda", 0.8, 0.99),
        "n_steps": trial.suggest_categorical("n_steps", (32, 64, 128)),
        "n_epochs": trial.suggest_int("n_epochs", 2, 8),
        "batch_size": trial.suggest_categorical(
            "batch_size", batch_choices(*batch_bounds, (256, 512, 1024, 2048))
        ),
        "clip_range": trial.suggest_float("clip_range", 0.1, 0.3),
        "ent_coef": trial.suggest_float("ent_coef", 1e-4, 5e-2, log=True),
        "reward_scale": trial.suggest_categorical("reward_scale", REWARD_SCALES),
    }


def network_widths(base: int) -> dict[str, list[int]]:
    """The policy ``obs → b → b/2 → 3 logits`` and a separate, wider value net ``obs → 2b → b → b/2 → 1``."""
    return {"policy": [base, base // 2], "value": [2 * base, base, base // 2]}


def build_networks(architecture: Architecture) -> dict[str, nn.Module]:
    """Policy and value MLPs (tanh), orthogonal init (hidden gain √2, policy head 0.01, value head 1)."""
    hidden, activation = architecture.hidden, architecture.activation
    policy = mlp(architecture.obs_dim, hidden["policy"], architecture.n_actions, activation)
    value = mlp(architecture.obs_dim, hidden["value"], 1, activation)
    orthogonal_init(policy, head_gain=0.01)
    orthogonal_init(value, head_gain=1.0)
    return {"policy": policy, "value": value}


def run_config(*, total_steps: int, env: EnvConfig, eval_every: int, check_every: int) -> PPOConfig:
    """PPO's run settings: length, env and evaluation cadence (statistics are read once per update, so
    ``check_every`` does not apply)."""
    return PPOConfig(total_steps=total_steps, env=env, eval_every=eval_every)


#: A trial's fixed work in `ModelProfile.trial_cost` units (the env's steps and ten validations; PPO's rollouts cost
#: less than DQN's acting), and the price of each update (GAE on the host, statistics, the evaluation check: 8
#: updates of 2,048 steps cost 2.7 s more than 2 of 8,192 at the same epochs; bench/speed/hyperopt_cost.py)
TRIAL_OVERHEAD = 2.5e10
UPDATE_OVERHEAD = 9e9


def trial_cost(hp: Mapping[str, Any], s: TrialSizes) -> float:
    """A hyperopt trial's work (`ModelProfile.trial_cost`): per update, its price plus the rollout's env steps x
    (3 passes per epoch + the acting pass) x the weights of both networks."""
    widths = network_widths(hp["hidden_dim_base"])
    weights = dense_weights([s.obs_dim, *widths["policy"], N_ACTIONS]) + dense_weights(
        [s.obs_dim, *widths["value"], 1]
    )
    rollout = hp["n_steps"] * s.n_envs
    updates = math.ceil(s.trial_steps / rollout)
    return TRIAL_OVERHEAD + float(updates * (UPDATE_OVERHEAD + rollout * (3 * hp["n_epochs"] + 1) * weights))


#: Its cost-driving bounds and trial cost (`marketrl.loop.profile`).
PROFILE = ModelProfile(
    bounds={
        "hidden_dim_base": (64, 256),
        "n_steps": (32, 128),
        "n_epochs": (2, 8),
        "batch_size": (256, 2048),
    },
    trial_cost=trial_cost,
)
SPEC = AgentSpec(
    name="ppo",
    hparams_class=PPOHyperparams,
    search_space=search_space,
    networks={"policy": N_ACTIONS, "value": 1},
    network_widths=network_widths,
    activation="tanh",
    build_networks=build_networks,
    acting_network="policy",
    batch_limits=(64, 65536),  # the minibatch size
    memory=MemoryModel(obs_per_row=1, extra_fields=ROLLOUT_EXTRA_FIELDS),
    run_config=run_config,
    train_seeds=train_seeds,
    profile=PROFILE,
    saver=save_agent,
    loader=load_agent,
)
