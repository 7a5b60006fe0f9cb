"""Pieces shared by the DQN and PPO trainers: hyperparameter parsing, the common set-up (`set_up`, and
`set_up_seeds` for S seeds trained as one batch) and ending (`finish`, `finish_seeds`) of a training run, the result
object, the greedy policy and the evaluation schedule."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn

from gpu_utils import PrecisionPlan, resolve_precision
from marketrl.agents.networks import build_networks, make_architecture
from marketrl.agents.spec import AgentSpec
from marketrl.env import EnvConfig, MarketData, TradingEnv
from marketrl.loop.hparams import (
    check_run_setting,
    parse_hparams,
)
from marketrl.loop.resume import Run
from marketrl.loop.schedule import EvalSchedule, seeded

__all__ = [
    "GreedyPolicy",
    "RunConfig",
    "SeedsSetup",
    "Setup",
    "TrainResult",
    "env_settings",
    "finish",
    "finish_seeds",
    "set_up",
    "set_up_seeds",
]

#: Offset of the trainer's own generator seed (exploration, Gumbel noise, minibatch order) from the run seed.
GENERATOR_SEED_OFFSET = 7919


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
    """Deterministic act function: ``obs [B, obs_dim] -> argmax actions [B]`` (LongTensor, obs's device)."""

    def __init__(self, net: nn.Module, plan: PrecisionPlan) -> None:
        self.net = net
        self.plan = plan

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions (argmax of Q-values or logits)."""
        with self.plan.autocast():
            scores = self.net(obs)
        return scores.float().argmax(dim=1)


@dataclass
class TrainResult:
    """What a trainer returns: the trained networks (on the training device), a greedy act function and a log.

    ``log`` keys: algo, env_steps, grad_steps, steps_per_second, host_syncs (device→host reads made by the loop),
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


class Setup(NamedTuple):
    """What every agent's ``train`` starts from (see `set_up`)."""

    hp: Any
    device: torch.device
    plan: PrecisionPlan
    env: TradingEnv
    architecture: dict[str, Any]
    networks: dict[str, nn.Module]
    generator: torch.Generator


class SeedsSetup(NamedTuple):
    """What a batched ``train_seeds`` starts from (see `set_up_seeds`): one entry per seed where seeds differ."""

    hp: Any
    device: torch.device
    plan: PrecisionPlan
    env: TradingEnv  # S blocks of n_envs envs, block i with seed i's episode starts
    architecture: dict[str, Any]
    networks: list[dict[str, nn.Module]]  # seed i's plain networks, initialized exactly as `set_up` does
    generators: list[torch.Generator]  # seed i's trainer generator (exploration, sampling order)
    seeds: list[int]


def set_up_seeds(
    spec: AgentSpec,
    hparams: Mapping[str, Any] | None,
    train_data: MarketData,
    env_config: EnvConfig,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seeds: Sequence[int],
) -> SeedsSetup:
    """`set_up` for S seeds at once: one env of S × ``env_config.n_envs`` envs (block i seeded with seeds[i]),
    and per seed the networks built under ``seeded(seed)`` and the generator ``seed + GENERATOR_SEED_OFFSET``,
    so seed i starts exactly as a single-seed run of seeds[i] does."""
    seeds = [int(seed) for seed in seeds]
    if not seeds:
        raise ValueError("seeds: expected at least one seed")
    hp = parse_hparams(spec.hparams_class, hparams, spec.name)
    device = torch.device(device)
    plan = resolve_precision(precision, device)
    env = TradingEnv(train_data, env_config, seed=seeds, device=device)
    architecture = make_architecture(spec, env.obs_dim, dataclasses.asdict(hp))
    networks = []
    for seed in seeds:
        with seeded(seed):
            networks.append(
                {name: net.to(device) for name, net in build_networks(architecture, spec).items()}
            )
    generators = [torch.Generator(device=device).manual_seed(seed + GENERATOR_SEED_OFFSET) for seed in seeds]
    return SeedsSetup(hp, device, plan, env, architecture, networks, generators, seeds)


def set_up(
    spec: AgentSpec,
    hparams: Mapping[str, Any] | None,
    train_data: MarketData,
    env_config: EnvConfig,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seed: int,
) -> Setup:
    """Parse the hyperparameters (``spec.hparams_class``), choose the precision, build the env and the seeded
    networks of the agent (on the device) and the trainer's generator (``seed + GENERATOR_SEED_OFFSET``)."""
    setup = set_up_seeds(spec, hparams, train_data, env_config, precision, device, [seed])
    return Setup(
        setup.hp,
        setup.device,
        setup.plan,
        setup.env,
        setup.architecture,
        setup.networks[0],
        setup.generators[0],
    )


def finish(
    setup: Setup,
    run: Run,
    evals: EvalSchedule,
    policy: GreedyPolicy,
    networks: dict[str, nn.Module],
    latest: tuple[str, ...],
    **log_fields: Any,
) -> TrainResult:
    """Time the run, make the final evaluation and assemble the `TrainResult`.

    Its log holds ``log_fields``, the most recent non-None value of each ``latest`` statistic in the history
    (None if never recorded), and the fields every trainer logs (see `TrainResult`).
    """
    env_steps = log_fields["env_steps"]
    summary = run.finish(env_steps)
    evals.final(env_steps, policy)
    return _result(setup, networks, policy, latest, summary, evals.records, summary["history"], log_fields)


def finish_seeds(
    setup: SeedsSetup,
    run: Run,
    evals: EvalSchedule,
    policies: list[GreedyPolicy],
    networks: list[dict[str, nn.Module]],
    latest: tuple[str, ...],
    seed_fields: list[dict[str, Any]],
    **batch_fields: Any,
) -> list[TrainResult]:
    """`finish` for a batch: the final evaluation of every seed, then one `TrainResult` per seed.

    The batch's history records are ``{"seeds": [record of seed 0, ...]}``; seed i's log gets its own records,
    evaluations, ``seed_fields[i]`` and ``latest`` values, plus the batch-wide ``batch_fields`` (host_syncs,
    steps_per_second: the batch's, not the seed's) and ``batch_seeds`` = S, ``seed`` = seeds[i].
    """
    summary = run.finish(batch_fields["env_steps"])
    evals.final(batch_fields["env_steps"], policies)
    results = []
    for index in range(len(setup.seeds)):
        history = [record["seeds"][index] for record in summary["history"]]
        fields = {**batch_fields, **seed_fields[index], "batch_seeds": len(setup.seeds)}
        records = evals.seed_records(index)
        results.append(
            _result(setup, networks[index], policies[index], latest, summary, records, history, fields)
        )
    return results


def _result(
    setup: Setup | SeedsSetup,
    networks: dict[str, nn.Module],
    policy: GreedyPolicy,
    latest: tuple[str, ...],
    summary: Mapping[str, Any],
    eval_records: list[list[Any]],
    history: list[dict[str, Any]],
    log_fields: Mapping[str, Any],
) -> TrainResult:
    """One run's `TrainResult`: ``log_fields``, the most recent non-None ``latest`` values and the common keys."""
    algo = setup.architecture["algo"]
    hparams = dataclasses.asdict(setup.hp)
    values: dict[str, Any] = dict.fromkeys(latest)
    for record in history:
        values.update({name: record[name] for name in latest if record.get(name) is not None})
    log = {
        "algo": algo,
        **log_fields,
        **values,
        "steps_per_second": summary["steps_per_second"],
        "precision": setup.plan.to_dict(),
        "env": env_settings(setup.env.config),
        "hidden_sizes": setup.architecture["hidden"],
        "architecture": setup.architecture,
        "hparams": hparams,
        "evals": eval_records,
        "history": history,
    }
    return TrainResult(algo, networks, policy, setup.architecture, hparams, setup.plan, log)
