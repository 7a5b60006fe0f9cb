"""PPO (clipped surrogate, separate policy and value networks) on the tensor-resident TradingEnv, in one file.

Per update:
1. rollout: T vector steps of N envs on the device; actions by Gumbel-max on the policy logits (noise for the
   whole rollout drawn in one op, no distribution objects);
2. values V(s_t) and V(s′_t) (s′ = the true next state, the env's ``final_obs`` where it auto-reset) and old
   log-probs in batched passes over the whole rollout;
3. exactly ONE device→host copy: rewards, values, next values, terminated and truncated stacked in one tensor;
4. GAE on the CPU in numpy, vectorized over envs (loop over time only); advantages and returns go back to the
   device (a host→device copy, which does not stall);
5. ``n_epochs`` of shuffled minibatches; the loss terms accumulate on the device and are read once per update
   (once per epoch with ``target_kl``, which needs the epoch's KL on the host to decide whether to stop).

So a rollout costs a fixed number of host syncs, independent of T and N. Hyperparameters follow Stable-Baselines3's
names (``n_steps`` = T, ``batch_size`` = minibatch size); see `PPOHyperparams` and docs/AGENTS.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gpu_utils import DeviceMetrics, NonFiniteError, OptimStep, PrecisionPlan
from marketrl.agents.common import GreedyPolicy, RunConfig, TrainResult, finish, set_up
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
from marketrl.loop.resume import TrainingCheckpoint, resume_or_start
from marketrl.loop.schedule import EvalCallback, EvalSchedule

if TYPE_CHECKING:
    from marketrl.models.base import Trial

__all__ = ["SPEC", "PPOConfig", "PPOHyperparams", "compute_gae", "ppo_loss", "search_space", "train"]

_LOSS_TERMS = ["policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction", "grad_norm"]
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
    """Run settings (not tuned), those of every trainer. ``total_steps`` is rounded up to whole rollouts of
    n_steps × n_envs; ``eval_every`` is checked after each update."""


class Minibatch(NamedTuple):
    """Columns of one minibatch, views into one gathered tensor."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_probs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    next_values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalized advantage estimates and returns, all arrays [T, N]; loops over time only.

    ``next_values[t]`` is V of the true next state of step t (the final obs where an episode ended), so a
    truncated step bootstraps from it while a terminated one does not; the recursion never crosses an episode end.
    """
    deltas = rewards + gamma * next_values * (1.0 - terminated) - values
    carry = gamma * gae_lambda * (1.0 - np.maximum(terminated, truncated))
    advantages = np.empty_like(deltas)
    running = np.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + values


def ppo_loss(
    policy_net: nn.Module, value_net: nn.Module, batch: Minibatch, hp: PPOHyperparams, plan: PrecisionPlan
) -> tuple[torch.Tensor, torch.Tensor]:
    """Total loss (fp32) and the detached 0-dim terms [policy_loss, value_loss, entropy, approx_kl, clip_fraction]."""
    with plan.autocast():
        logits = policy_net(batch.obs)
        values = value_net(batch.obs)
    log_probs_all = F.log_softmax(logits.float(), dim=1)
    entropy = -(log_probs_all.exp() * log_probs_all).sum(dim=1).mean()
    log_ratio = log_probs_all.gather(1, batch.actions[:, None]).squeeze(1) - batch.old_log_probs
    ratio = log_ratio.exp()
    advantages = batch.advantages
    if hp.normalize_advantage:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    surrogate = torch.minimum(
        advantages * ratio, advantages * ratio.clamp(1 - hp.clip_range, 1 + hp.clip_range)
    )
    policy_loss = -surrogate.mean()

    values = values.float().squeeze(1)
    value_error = (values - batch.returns).square()
    if hp.clip_range_vf is not None:
        clipped = batch.old_values + (values - batch.old_values).clamp(-hp.clip_range_vf, hp.clip_range_vf)
        value_error = torch.maximum(value_error, (clipped - batch.returns).square())
    value_loss = value_error.mean()

    loss = policy_loss - hp.ent_coef * entropy + hp.vf_coef * value_loss
    with torch.no_grad():
        approx_kl = (ratio - 1 - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > hp.clip_range).float().mean()
    return loss, [policy_loss.detach(), value_loss.detach(), entropy.detach(), approx_kl, clip_fraction]


@dataclass
class LoopState:
    """The loop's own variables: what a resumed run continues from (with the components given to the `Run`)."""

    obs: torch.Tensor
    episode_return: np.ndarray  # running return per env, on the host (rewards arrive there with the rollout)
    env_steps: int = 0
    grad_steps: int = 0
    rollout_copies: int = 0


def train(
    train_data: MarketData,
    config: PPOConfig,
    hparams: Mapping[str, Any] | None,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seed: int,
    on_eval: EvalCallback | None = None,
    checkpoint: TrainingCheckpoint | None = None,
) -> TrainResult:
    """Train a PPO agent on ``train_data`` for ``config.total_steps`` env steps; see the module docstring.

    With ``checkpoint``, the loop resumes from its saved state (if any) and saves its full state after any
    update at which the checkpoint is due; the result is the same as one uninterrupted run.
    """
    setup = set_up(SPEC, hparams, train_data, config.env, precision, device, seed)
    hp, device, plan, env, generator = setup.hp, setup.device, setup.plan, setup.env, setup.generator
    n_envs, n_steps, obs_dim = env.n_envs, hp.n_steps, env.obs_dim
    rollout_size = n_steps * n_envs
    policy_net, value_net = setup.networks["policy"], setup.networks["value"]
    # One optimizer (and one GradScaler under fp16) over both networks: one backward of the summed loss.
    params = [*policy_net.parameters(), *value_net.parameters()]
    stepper = OptimStep.adam(params, hp.learning_rate, plan, hp.max_grad_norm)
    policy = GreedyPolicy(policy_net, plan)
    evals = EvalSchedule(on_eval, config.eval_every)
    minibatches_per_epoch = math.ceil(rollout_size / hp.batch_size)
    metrics = DeviceMetrics(
        _LOSS_TERMS,
        device,
        watched=("policy_loss", "value_loss", "entropy"),
        capacity=minibatches_per_epoch * (1 if hp.target_kl is not None else hp.n_epochs),
    )
    n_updates = max(1, math.ceil(config.total_steps / rollout_size))
    state = LoopState(obs=env.reset(), episode_return=np.zeros(n_envs, dtype=np.float64))
    run = resume_or_start(
        checkpoint,
        {
            "policy": policy_net,
            "value": value_net,
            "optim": stepper,
            "generator": generator,
            "env": env,
            "metrics": metrics,
            "evals": evals,
        },
        state,
        total_steps=n_updates * rollout_size,
        device=device,
    )

    for update in range(state.env_steps // rollout_size, n_updates):
        learning_rate = hp.learning_rate * (1.0 - update / n_updates) if hp.anneal_lr else hp.learning_rate
        stepper.set_learning_rate(learning_rate)

        # 1. Rollout, entirely on the device.
        gumbel = torch.empty(n_steps, n_envs, N_ACTIONS, device=device).exponential_(generator=generator)
        gumbel = gumbel.log_().neg_()
        rollout_obs, rollout_next_obs, rollout_logits, rollout_actions = [], [], [], []
        rollout_rewards, rollout_terminated, rollout_truncated = [], [], []
        with (
            torch.no_grad(),
            plan.autocast(),
        ):  # one context for the whole rollout (the env ops are not autocast)
            for t in range(n_steps):
                logits = policy_net(state.obs).float()
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

        # 2. Batched values of s and s′, and the behaviour policy's log-probs.
        flat_obs = torch.stack(rollout_obs).view(rollout_size, obs_dim)
        flat_next_obs = torch.stack(rollout_next_obs).view(rollout_size, obs_dim)
        flat_actions = torch.stack(rollout_actions).view(rollout_size)
        with torch.no_grad(), plan.autocast():
            values = value_net(flat_obs).float().view(n_steps, n_envs)
            next_values = value_net(flat_next_obs).float().view(n_steps, n_envs)
        old_log_probs = (
            F.log_softmax(torch.stack(rollout_logits).view(rollout_size, N_ACTIONS), dim=1)
            .gather(1, flat_actions[:, None])
            .squeeze(1)
        )

        # 3. The rollout's one device→host copy.
        packed = torch.stack(
            [
                torch.stack(rollout_rewards),
                values,
                next_values,
                torch.stack(rollout_terminated).float(),
                torch.stack(rollout_truncated).float(),
            ]
        )
        rewards_h, values_h, next_values_h, terminated_h, truncated_h = (
            packed.cpu().numpy().astype(np.float64)
        )
        state.rollout_copies += 1
        if not (np.isfinite(values_h).all() and np.isfinite(next_values_h).all()):
            raise NonFiniteError(
                f"non-finite value estimates in the rollout ending at env step {state.env_steps}"
            )

        # 4. GAE on the host, then advantages and returns back to the device.
        advantages_h, returns_h = compute_gae(
            rewards_h * hp.reward_scale,
            values_h,
            next_values_h,
            terminated_h,
            truncated_h,
            hp.gamma,
            hp.gae_lambda,
        )
        done_h = np.maximum(terminated_h, truncated_h)
        finished = _finished_episode_returns(state.episode_return, rewards_h, done_h)
        targets = torch.as_tensor(np.stack([advantages_h, returns_h]).astype(np.float32), device=device)

        # 5. Minibatch epochs. Observations stay a contiguous [T·N, obs_dim] tensor (a strided slice of a wider
        # table would slow every matmul down); the per-sample scalars are packed in one [T·N, 5] table, so a
        # minibatch costs two gathers.
        scalars = torch.stack(
            [
                flat_actions.to(torch.float32),
                old_log_probs,
                targets[0].reshape(-1),
                targets[1].reshape(-1),
                values.reshape(-1),
            ],
            dim=1,
        )
        epoch_reads: list[dict[str, Any]] = []
        for _ in range(hp.n_epochs):
            order = torch.randperm(rollout_size, generator=generator, device=device)
            for index in order.split(hp.batch_size):
                batch = _minibatch(flat_obs.index_select(0, index), scalars.index_select(0, index))
                loss, terms = ppo_loss(policy_net, value_net, batch, hp, plan)
                grad_norm = stepper.step(loss)
                metrics.record([*terms, grad_norm.float()])
                state.grad_steps += 1
            if hp.target_kl is not None:  # one read per epoch, only when early stopping needs the KL
                epoch_reads.append(metrics.read(state.grad_steps))
                if epoch_reads[-1]["approx_kl"] > hp.target_kl:
                    break
        window = metrics.read(state.grad_steps) if hp.target_kl is None else metrics.combine(epoch_reads)

        run.log(
            {
                "env_steps": state.env_steps,
                "update": update + 1,
                "grad_steps": state.grad_steps,
                **{name: window[name] for name in _LOSS_TERMS},
                "epochs": window["count"] // minibatches_per_epoch,
                "learning_rate": learning_rate,
                "value_mean": float(values_h.mean()),
                "value_min": float(values_h.min()),
                "value_max": float(values_h.max()),
                "explained_variance": _explained_variance(values_h, returns_h),
                "episodes": len(finished),
                "episode_return_mean": float(np.mean(finished)) if finished else None,
            }
        )
        evals.maybe(state.env_steps, policy)
        run.maybe_save(state.env_steps)

    return finish(
        setup,
        run,
        evals,
        policy,
        {"policy": policy_net, "value": value_net},
        latest=(*_LOSS_TERMS, "value_mean", "explained_variance", "episode_return_mean"),
        env_steps=state.env_steps,
        grad_steps=state.grad_steps,
        updates=n_updates,
        host_syncs=state.rollout_copies + metrics.host_reads,
    )


def _minibatch(obs: torch.Tensor, scalars: torch.Tensor) -> Minibatch:
    """A minibatch from gathered obs rows and the matching rows of [action, old log-prob, advantage, return, value]."""
    actions, old_log_probs, advantages, returns, old_values = scalars.unbind(dim=1)
    return Minibatch(obs, actions.long(), old_log_probs, advantages, returns, old_values)


def _finished_episode_returns(running: np.ndarray, rewards: np.ndarray, done: np.ndarray) -> list[float]:
    """Advance per-env running returns (updated in place) over a rollout; return the episodes that ended."""
    finished: list[float] = []
    for t in range(rewards.shape[0]):
        running += rewards[t]
        ended = done[t] > 0
        if ended.any():
            finished.extend(running[ended].tolist())
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
    train=train,
)
