"""Pieces shared by the DQN and PPO trainers: hyperparameter parsing, the common set-up (`set_up`, `set_up_seeds`)
and ending (`finish`, `finish_seeds`) of a training run, the result object, the greedy policy, the evaluation
schedule and `SeedStack` (S copies of one MLP as one batched module, for trainers that batch seeds)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from gpu_utils import PrecisionPlan, resolve_precision, stack_modules
from marketrl.agents.networks import build_networks, make_architecture
from marketrl.agents.results import GreedyPolicy, RunConfig, TrainResult, env_settings
from marketrl.agents.spec import AgentSpec
from marketrl.env import EnvConfig, MarketData, TradingEnv
from marketrl.loop.hparams import (
    parse_hparams,
)
from marketrl.loop.resume import Run
from marketrl.loop.schedule import EvalSchedule, seeded

__all__ = [
    "GreedyPolicies",
    "GreedyPolicy",
    "RunConfig",
    "SeedStack",
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


class GreedyPolicies:
    """S greedy policies of one architecture as one act function: ``obs [S, B, obs_dim] -> actions [S, B]``,
    policy s acting on its own rows only, so a lockstep evaluation of S seeds steps its data once
    (`marketrl.env.policies_positions`). MLPs (an ``nn.Sequential``, or a network whose ``net`` is one and that has
    no other layers nor a cost prior) run as one `SeedStack` (batched weights: one ``baddbmm`` a layer); other networks (DQN's
    dueling heads) act one after another on their own rows. ``vmap`` over ``functional_call`` was slower than
    either at these tiny batches (a lockstep step holds one row per chain)."""

    def __init__(self, policies: Sequence[GreedyPolicy]) -> None:
        self.policies = list(policies)
        self.plan = policies[0].plan
        self.stack = _seed_stack([policy.net for policy in policies])

    @torch.no_grad()
    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        """Greedy actions [S, B]."""
        if self.stack is None:
            return torch.stack([policy(rows) for policy, rows in zip(self.policies, obs, strict=True)])
        return self.stack(obs).float().argmax(dim=-1)  # fp32, as `GreedyPolicy`


def _seed_stack(nets: Sequence[nn.Module]) -> SeedStack | None:
    """The nets as one `SeedStack` where each is a plain MLP, else None."""
    if all(isinstance(net, nn.Sequential) for net in nets):
        return SeedStack(nets).to(next(nets[0].parameters()).device)
    bodies = [getattr(net, "net", None) for net in nets]
    plain = all(
        isinstance(body, nn.Sequential)
        and len(list(net.children())) == 1
        and not getattr(net, "cost_prior", False)  # the cost prior acts after the body
        for net, body in zip(nets, bodies, strict=True)
    )
    return SeedStack(bodies).to(next(nets[0].parameters()).device) if plain else None


class Setup(NamedTuple):
    """What every agent's ``train_seeds`` starts from (see `set_up`)."""

    hp: Any
    device: torch.device
    plan: PrecisionPlan
    env: TradingEnv
    architecture: dict[str, Any]
    networks: dict[str, nn.Module]
    generator: torch.Generator


class SeedsSetup(NamedTuple):
    """What a trainer of S batched seeds starts from (see `set_up_seeds`): per-seed entries are lists in the
    order of ``seeds``; the env holds S blocks of ``n_envs`` envs, block i that of ``seeds[i]``."""

    hp: Any
    device: torch.device
    plan: PrecisionPlan
    env: TradingEnv
    architecture: dict[str, Any]
    seeds: list[int]
    networks: list[dict[str, nn.Module]]
    generators: list[torch.Generator]


def set_up_seeds(
    spec: AgentSpec,
    hparams: Mapping[str, Any] | None,
    train_data: MarketData,
    env_config: EnvConfig,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seeds: Sequence[int],
    block_rows: Sequence[tuple[int, int]] | None = None,
) -> SeedsSetup:
    """Parse the hyperparameters (``spec.hparams_class``), choose the precision, build one env of S seed blocks
    (`TradingEnv` with a sequence of seeds; ``block_rows``: each block's rows of a stacked ``train_data``, folds on
    the batch axis) and, for each seed, exactly what a single-seed run builds: its networks initialized under its
    seed and its trainer generator (``seed + GENERATOR_SEED_OFFSET``). Seeds must be distinct (a seed names its
    outputs and its statistics)."""
    seeds = [int(seed) for seed in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: expected distinct seeds, got {seeds}")
    hp = parse_hparams(spec.hparams_class, hparams, spec.name)
    device = torch.device(device)
    plan = resolve_precision(precision, device)
    env = TradingEnv(train_data, env_config, seed=seeds, device=device, block_rows=block_rows)
    architecture = make_architecture(spec, env.obs_dim, dataclasses.asdict(hp))
    networks = []
    for seed in seeds:
        with seeded(seed):
            networks.append(
                {name: net.to(device) for name, net in build_networks(architecture, spec).items()}
            )
    generators = [torch.Generator(device=device).manual_seed(seed + GENERATOR_SEED_OFFSET) for seed in seeds]
    return SeedsSetup(hp, device, plan, env, architecture, seeds, networks, generators)


def set_up(
    spec: AgentSpec,
    hparams: Mapping[str, Any] | None,
    train_data: MarketData,
    env_config: EnvConfig,
    precision: PrecisionPlan | str,
    device: torch.device | str,
    seed: int,
) -> Setup:
    """`set_up_seeds` for one seed: its env, networks and generator."""
    batch = set_up_seeds(spec, hparams, train_data, env_config, precision, device, [seed])
    return Setup(
        batch.hp,
        batch.device,
        batch.plan,
        batch.env,
        batch.architecture,
        batch.networks[0],
        batch.generators[0],
    )


_ACTIVATION_FUNCTIONS: dict[type[nn.Module], Callable[[torch.Tensor], torch.Tensor]] = {
    nn.ReLU: torch.relu,
    nn.Tanh: torch.tanh,
}


class SeedStack(nn.Module):
    """S same-shaped ``nn.Sequential`` MLPs as one module: every ``Linear``'s weight and bias stacked on a leading
    seed axis ([S, out, in], [S, out]) and applied with one batched matmul (`torch.baddbmm`): ``x [S, B, in] ->
    [S, B, out]``, row block s through copy s only. Parameter-free layers (activations) are applied as they are.

    Measured on one CPU thread, forward+backward of PPO's value MLP (hidden 64) at S=5, B=64: 0.85 ms, against
    1.5 ms for `torch.vmap` over `torch.func.functional_call` (2-3x at every size tried): hence batched weights.
    ``copy_to(i, module)`` writes copy i's weights into a plain module of the original architecture. DQN's
    `StackedQNetwork` is a body and two heads of these.
    """

    def __init__(self, modules: Sequence[nn.Sequential]) -> None:
        super().__init__()
        params, buffers = stack_modules(modules)
        if buffers:
            raise ValueError(f"SeedStack: modules with buffers ({', '.join(buffers)}) are not supported")
        self.names = list(params)
        self.stacked = nn.ParameterList([nn.Parameter(params[name].detach().clone()) for name in self.names])
        self.layers: list[tuple[int, int | None] | nn.Module] = []
        for name, layer in modules[0].named_children():
            if isinstance(layer, nn.Linear):
                bias = self.names.index(f"{name}.bias") if layer.bias is not None else None
                self.layers.append((self.names.index(f"{name}.weight"), bias))
            elif next(layer.parameters(), None) is None:
                self.layers.append(layer)
            else:
                raise ValueError(
                    f"SeedStack: layer {name} ({type(layer).__name__}) is neither Linear nor free"
                )

    @property
    def n_seeds(self) -> int:
        return self.stacked[0].shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [S, B, in] -> [S, B, out]``."""
        for layer in self.layers:
            if isinstance(layer, tuple):
                weight = self.stacked[layer[0]].transpose(1, 2)
                if layer[1] is None:
                    x = torch.bmm(x, weight)
                else:
                    x = torch.baddbmm(self.stacked[layer[1]].unsqueeze(1), x, weight)
            else:  # the activation's function: a module call costs more than the op on these small tensors
                x = _ACTIVATION_FUNCTIONS.get(type(layer), layer)(x)
        return x

    @torch.no_grad()
    def copy_to(self, index: int, module: nn.Module) -> None:
        """Copy ``index``'s weights into ``module`` (one of the modules this stack was built from, or the same
        architecture); device-side, no host sync."""
        own = dict(module.named_parameters())
        for name, stacked in zip(self.names, self.stacked, strict=True):
            own[name].copy_(stacked[index])


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
    return _result(
        setup.architecture,
        setup.hp,
        setup.plan,
        setup.env.config,
        networks,
        policy,
        summary["history"],
        evals.records,
        latest,
        {**log_fields, "steps_per_second": summary["steps_per_second"]},
    )


def finish_seeds(
    setup: SeedsSetup,
    run: Run,
    evals: EvalSchedule,
    policies: list[GreedyPolicy],
    latest: tuple[str, ...],
    seed_fields: Sequence[Mapping[str, Any]],
    networks: Sequence[dict[str, nn.Module]] | None = None,
    **batch_fields: Any,
) -> list[TrainResult]:
    """`finish` for S batched seeds: one `TrainResult` per seed, in the order of ``setup.seeds``.

    The loop logs one ``{"seeds": [record of seed i, ...]}`` per statistics read; seed i's log gets its own
    history, evaluations (``evals`` called with a `SeedsEvalCallback`), networks (``networks[i]``, default
    ``setup.networks[i]``, which the caller has brought up to date), ``seed_fields[i]`` and ``batch_fields``, which are the batch's (host_syncs:
    the device->host reads of the whole batch). ``steps_per_second`` counts the env steps of all S seeds, and
    ``batch_seeds`` is S.
    """
    env_steps = batch_fields["env_steps"]
    summary = run.finish(env_steps)
    evals.final(env_steps, policies)
    n_seeds = len(setup.seeds)
    batch = {
        **batch_fields,
        "steps_per_second": summary["steps_per_second"] * n_seeds,
        "batch_seeds": n_seeds,
    }
    return [
        _result(
            setup.architecture,
            setup.hp,
            setup.plan,
            setup.env.config,
            (setup.networks if networks is None else networks)[index],
            policies[index],
            [record["seeds"][index] for record in summary["history"]],
            evals.seed_records(index),
            latest,
            {**batch, **seed_fields[index]},
        )
        for index in range(n_seeds)
    ]


def _result(
    architecture: dict[str, Any],
    hp: Any,
    plan: PrecisionPlan,
    env_config: EnvConfig,
    networks: dict[str, nn.Module],
    policy: GreedyPolicy,
    history: list[dict[str, Any]],
    evals: list[list[Any]],
    latest: tuple[str, ...],
    log_fields: Mapping[str, Any],
) -> TrainResult:
    algo = architecture["algo"]
    hparams = dataclasses.asdict(hp)
    values: dict[str, Any] = dict.fromkeys(latest)
    for record in history:
        values.update({name: record[name] for name in latest if record.get(name) is not None})
    log = {
        "algo": algo,
        **log_fields,
        **values,
        "precision": plan.to_dict(),
        "env": env_settings(env_config),
        "hidden_sizes": architecture["hidden"],
        "architecture": architecture,
        "hparams": hparams,
        "evals": evals,
        "history": history,
    }
    return TrainResult(algo, networks, policy, architecture, hparams, plan, log)
