"""Benchmark: marketrl DQN/PPO vs Stable-Baselines3 on the same data, env semantics and hyperparameters.

    python bench/speed/agents.py            # all configurations, torch at 1 thread, CPU
    python bench/speed/agents.py --quick    # a short sanity run of every configuration
    python bench/speed/agents.py --only ppo-64 dqn-64

For each configuration, in one process: SB3 (through `make_sb3_vec_env` of tests/support/adapters.py over the same TradingEnv),
marketrl, and the *floor*: the unavoidable math of the same run — the same number of optimizer updates at the
same batch size on random tensors (same loss, same networks, same optimizer step), plus the acting forward
passes (PPO: the policy on N rows per vector step and the value net once over the rollout; DQN: the Q-network on
N rows per vector step). Reported: env steps/s of each, marketrl / SB3, and efficiency = floor time / marketrl
time. Networks are set to SB3's defaults for the comparison (``net_arch: [64, 64]`` for every network; ReLU for
DQN, tanh + orthogonal init for PPO, as SB3 does). SB3's DQN is not Double DQN, so marketrl runs with
``double_q: false`` here; SB3's ``target_update_interval`` (env steps) is converted to gradient steps.
Needs the ``bench`` extra (stable-baselines3).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/speed/agents.py`: sys.path holds bench/speed/, not the checkout that tests.support is in
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# bench/speed/env.py (this script runs from bench/speed/, so its sibling imports as `env`)
from env import synthetic_frame  # noqa: E402  (the same synthetic bars as bench/speed/env.py)

from gpu_utils import OptimStep, PrecisionPlan, SeedOptimStep, detect_precision, make_optimizer  # noqa: E402
from marketrl.agents import dqn, ppo  # noqa: E402
from marketrl.agents.networks import build_networks, make_architecture  # noqa: E402
from marketrl.env import N_ACTIONS, EnvConfig, MarketData, TradingEnv  # noqa: E402
from marketrl.instruments.costs import CostModel  # noqa: E402
from marketrl.loop.schedule import seeded  # noqa: E402
from marketrl.splits.normalize import FeatureNormalizer  # noqa: E402
from tests.support.adapters import make_sb3_vec_env  # noqa: E402


@dataclass
class Case:
    """One benchmark configuration: algorithm, env count and marketrl hyperparameters (SB3 gets the same)."""

    name: str
    algo: str
    n_envs: int
    hparams: dict[str, Any]
    updates: int  # PPO: rollouts; DQN: vector steps after learning starts
    quick_updates: int
    target: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    quick_hparams: dict[str, Any] = field(
        default_factory=dict
    )  # --quick: smaller rollouts where they dominate


PPO_64 = {"n_steps": 128, "batch_size": 1024, "n_epochs": 4}
PPO_SB3_DEFAULTS = {"n_steps": 2048, "batch_size": 64, "n_epochs": 10, "ent_coef": 0.0}
PPO_LARGE = {"n_steps": 32, "batch_size": 4096, "n_epochs": 4}
DQN_64 = {"batch_size": 1024, "train_freq": 1, "gradient_steps": 4, "learning_starts": 1024}
DQN_LARGE = {"batch_size": 1024, "train_freq": 1, "gradient_steps": 4, "learning_starts": 8192}

CASES = [
    Case("ppo-64", "ppo", 64, PPO_64, updates=8, quick_updates=2, target="≥ 1.5× SB3, ≥ 90% efficiency"),
    Case("dqn-64", "dqn", 64, DQN_64, updates=300, quick_updates=40, target="≥ 1.15× SB3, ≥ 90% efficiency"),
    Case(
        "ppo-sb3-defaults",
        "ppo",
        8,
        PPO_SB3_DEFAULTS,
        updates=2,
        quick_updates=1,
        target="no slower than SB3",
        quick_hparams={"n_steps": 256},
    ),
    Case("ppo-1024", "ppo", 1024, PPO_LARGE, updates=4, quick_updates=1, target="report the ratio"),
    Case("dqn-1024", "dqn", 1024, DQN_LARGE, updates=60, quick_updates=8, target="report the ratio"),
]
COMMON = {"net_arch": [64, 64], "learning_rate": 3e-4}
DQN_COMMON = {"double_q": False, "buffer_size": 100_000, "exploration_fraction": 0.1, "max_grad_norm": 10.0}
SB3_DQN_TARGET_INTERVAL = 10_000  # SB3's default target_update_interval, in env steps
clock = time.perf_counter  # --clock cpu switches to process CPU time (steadier on a shared machine)


# ------------------------------------------------------------------------------------------------------- data


def market_data(n_bars: int, n_features: int) -> MarketData:
    frame = synthetic_frame(n_bars, n_features)
    names = [f"f{j}" for j in range(n_features)]
    costs = CostModel(
        kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
    )
    return MarketData.from_frame(frame, names, FeatureNormalizer().fit(frame, names), costs, max_gap=None)


# ------------------------------------------------------------------------------------------------ the three runs


def total_steps(case: Case, updates: int) -> int:
    if case.algo == "ppo":
        return updates * case.hparams["n_steps"] * case.n_envs
    return case.hparams["learning_starts"] + updates * case.n_envs


def run_marketrl(case: Case, data: MarketData, env: EnvConfig, steps: int) -> tuple[float, dict[str, Any]]:
    if case.algo == "ppo":
        config = ppo.PPOConfig(total_steps=steps, env=env)
        hparams = {**COMMON, **case.hparams}
        module: Any = ppo
    else:
        config = dqn.DQNConfig(total_steps=steps, env=env)
        grad_steps_per_env_step = case.hparams["gradient_steps"] / (case.hparams["train_freq"] * case.n_envs)
        target_update = max(1, round(SB3_DQN_TARGET_INTERVAL * grad_steps_per_env_step))
        hparams = {**COMMON, **DQN_COMMON, **case.hparams, "target_update": target_update}
        module = dqn
    started = clock()
    (result,) = module.train_seeds(data, config, hparams, "fp32", "cpu", [0])
    return clock() - started, result.log


def run_sb3(case: Case, data: MarketData, env: EnvConfig, steps: int) -> tuple[float, dict[str, int]]:
    """Train SB3 for ``steps`` env steps; the time and the work it did (env steps, gradient steps)."""
    from stable_baselines3 import DQN, PPO

    vec_env = make_sb3_vec_env(TradingEnv(data, env, seed=0))
    hp = case.hparams
    if case.algo == "ppo":
        defaults = ppo.PPOHyperparams(**{**COMMON, **hp})
        model: Any = PPO(
            "MlpPolicy",
            vec_env,
            learning_rate=defaults.learning_rate,
            n_steps=defaults.n_steps,
            batch_size=defaults.batch_size,
            n_epochs=defaults.n_epochs,
            gamma=defaults.gamma,
            gae_lambda=defaults.gae_lambda,
            clip_range=defaults.clip_range,
            ent_coef=defaults.ent_coef,
            vf_coef=defaults.vf_coef,
            max_grad_norm=defaults.max_grad_norm,
            policy_kwargs={"net_arch": {"pi": COMMON["net_arch"], "vf": COMMON["net_arch"]}},
            device="cpu",
            seed=0,
            verbose=0,
        )
    else:
        defaults = dqn.DQNHyperparams(**{**COMMON, **DQN_COMMON, **hp})
        model = DQN(
            "MlpPolicy",
            vec_env,
            learning_rate=defaults.learning_rate,
            buffer_size=defaults.buffer_size,
            # SB3 trains once num_timesteps > learning_starts, marketrl once env_steps >= learning_starts: one less
            # gives SB3 the same gradient steps (checked by check_same_work).
            learning_starts=defaults.learning_starts - 1,
            batch_size=defaults.batch_size,
            gamma=defaults.gamma,
            train_freq=defaults.train_freq,
            gradient_steps=defaults.gradient_steps,
            target_update_interval=SB3_DQN_TARGET_INTERVAL,
            exploration_fraction=defaults.exploration_fraction,
            exploration_final_eps=defaults.exploration_final_eps,
            max_grad_norm=defaults.max_grad_norm,
            policy_kwargs={"net_arch": COMMON["net_arch"]},
            device="cpu",
            seed=0,
            verbose=0,
        )
    torch.set_num_threads(1)
    started = clock()
    model.learn(total_timesteps=steps)
    elapsed = clock() - started
    grad_steps = model._n_updates  # DQN: gradient steps; PPO: epochs, each ceil(rollout / batch) minibatches
    if case.algo == "ppo":
        grad_steps *= math.ceil(hp["n_steps"] * case.n_envs / hp["batch_size"])
    return elapsed, {"env_steps": int(model.num_timesteps), "grad_steps": int(grad_steps)}


class UnequalWork(SystemExit):
    """marketrl, SB3 and the floor did not do the same work: one line naming what differs."""

    def __init__(self, what: str) -> None:
        super().__init__(f"bench/speed/agents.py: unequal work: {what}")


def check_same_work(
    case: Case, ours: dict[str, Any], sb3: dict[str, int] | None, floor_grad_steps: int
) -> None:
    """The same env steps and gradient steps on every side, else ``UnequalWork``."""
    sides = {"marketrl": (ours["env_steps"], ours["grad_steps"]), "floor": (None, floor_grad_steps)}
    if sb3 is not None:
        sides["SB3"] = (sb3["env_steps"], sb3["grad_steps"])
    for name, (env_steps, grad_steps) in sides.items():
        if (env_steps is not None and env_steps != ours["env_steps"]) or grad_steps != ours["grad_steps"]:
            raise UnequalWork(
                f"{case.name}: marketrl {ours['env_steps']:,} env steps / {ours['grad_steps']:,} gradient steps, "
                f"{name} {env_steps if env_steps is not None else '-'} / {grad_steps:,}"
            )


def ppo_floor(case: Case, obs_dim: int, updates: int, plan: PrecisionPlan) -> tuple[float, int]:
    """Policy forward per vector step, value forward over the rollout, and every optimizer step on random data."""
    hp = ppo.PPOHyperparams(**{**COMMON, **case.hparams})
    with seeded(0):
        nets = build_networks(make_architecture("ppo", obs_dim, {"net_arch": COMMON["net_arch"]}))
    policy_net, value_net = nets["policy"], nets["value"]
    stepper = OptimStep(
        make_optimizer([*policy_net.parameters(), *value_net.parameters()], hp.learning_rate, plan, "cpu"),
        plan,
        hp.max_grad_norm,
    )
    rollout = hp.n_steps * case.n_envs
    obs = torch.randn(case.n_envs, obs_dim)
    # A rollout-sized random table consumed in contiguous minibatch views: the data streams through memory as
    # in a real update (one cache-resident minibatch reused 32 times would understate the floor), but no gather
    # or shuffle is charged to the floor.
    table = _random_minibatch(rollout, obs_dim)
    batches = [
        ppo.Minibatch(*(column[start : start + hp.batch_size] for column in table))
        for start in range(0, rollout, hp.batch_size)
    ]
    started = clock()
    for _ in range(updates):
        with torch.no_grad():
            for _ in range(hp.n_steps):
                policy_net(obs)
            value_net(table.obs)
        for _ in range(hp.n_epochs):
            for batch in batches:
                loss, _ = ppo.ppo_loss(policy_net, value_net, batch, hp, plan)
                stepper.step(loss)
    return clock() - started, updates * hp.n_epochs * len(batches)


def _random_minibatch(size: int, obs_dim: int) -> ppo.Minibatch:
    return ppo.Minibatch(
        obs=torch.randn(size, obs_dim),
        actions=torch.randint(0, N_ACTIONS, (size,)),
        old_log_probs=torch.full((size,), -math.log(N_ACTIONS)),
        advantages=torch.randn(size),
        returns=torch.randn(size),
        old_values=torch.randn(size),
    )


def dqn_floor(
    case: Case, obs_dim: int, vector_steps: int, grad_steps: int, plan: PrecisionPlan
) -> tuple[float, int]:
    """Q-network forward on N rows per vector step plus every gradient step (TD loss incl. target net) on random data."""
    hp = dqn.DQNHyperparams(**{**COMMON, **DQN_COMMON, **case.hparams})
    # the trainer's own shapes: one seed on the seed axis (StackedQNetwork, SeedOptimStep, [1, B] batches)
    with seeded(0):
        q_net = build_networks(make_architecture("dqn", obs_dim, {"net_arch": COMMON["net_arch"]}))["q"]
    target_net = build_networks(make_architecture("dqn", obs_dim, {"net_arch": COMMON["net_arch"]}))["q"]
    q_net, target_net = dqn.StackedQNetwork([q_net]), dqn.StackedQNetwork([target_net]).requires_grad_(False)
    stepper = SeedOptimStep.adam(q_net.parameters(), hp.learning_rate, plan, hp.max_grad_norm, n_seeds=1)
    obs = torch.randn(1, case.n_envs, obs_dim)
    batch = dqn.Batch(
        obs=torch.randn(1, hp.batch_size, obs_dim),
        actions=torch.randint(0, N_ACTIONS, (1, hp.batch_size)),
        rewards=torch.randn(1, hp.batch_size),
        discounts=torch.full((1, hp.batch_size), hp.gamma),
        next_obs=torch.randn(1, hp.batch_size, obs_dim),
    )
    started = clock()
    for _ in range(vector_steps):
        with torch.no_grad():
            q_net(obs)
    for _ in range(grad_steps):
        loss, _ = dqn.td_loss(q_net, target_net, batch, plan, double_q=hp.double_q)
        stepper.step(loss)
    return clock() - started, grad_steps


# ------------------------------------------------------------------------------------------------------- main


def measure(case: Case, data: MarketData, updates: int, repeats: int, skip_sb3: bool) -> dict[str, Any]:
    """Median-of-``repeats`` times of marketrl, the floor and SB3 (interleaved, so load spikes hit all three),
    each round checked for equal work (``check_same_work``).

    Efficiency is the median of the per-round ratios floor / marketrl: a round's two runs are seconds apart,
    so they share the machine's load, which the ratio of two separate medians would not guarantee."""
    plan = detect_precision("cpu", "fp32")
    obs_dim = data.n_features + 1
    steps = total_steps(case, updates)
    env = EnvConfig(n_envs=case.n_envs, episode_length=256, max_gap=None)
    times: dict[str, list[float]] = {"marketrl": [], "floor": [], "sb3": []}
    log: dict[str, Any] = {}
    for _ in range(repeats):
        elapsed, log = run_marketrl(case, data, env, steps)
        times["marketrl"].append(elapsed)
        if case.algo == "ppo":
            floor, floor_grad_steps = ppo_floor(case, obs_dim, updates, plan)
        else:
            floor, floor_grad_steps = dqn_floor(
                case, obs_dim, log["env_steps"] // case.n_envs, log["grad_steps"], plan
            )
        times["floor"].append(floor)
        sb3_work = None
        if not skip_sb3:
            sb3_time, sb3_work = run_sb3(case, data, env, steps)
            times["sb3"].append(sb3_time)
        check_same_work(
            case, log, sb3_work, floor_grad_steps
        )  # the warm-up round checks it before any timing
    median = {name: statistics.median(values) if values else float("nan") for name, values in times.items()}
    efficiencies = [floor / ours for floor, ours in zip(times["floor"], times["marketrl"], strict=True)]
    return {
        "env_steps": log["env_steps"],
        "sb3_steps": steps,
        "host_syncs": log["host_syncs"],
        "efficiency": statistics.median(efficiencies),
        "efficiency_range": (min(efficiencies), max(efficiencies)),
        **median,
    }


def main() -> None:
    """Run the chosen configurations and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short sanity run of every configuration")
    parser.add_argument("--only", nargs="+", choices=[case.name for case in CASES], help="run only these")
    parser.add_argument(
        "--bars", type=int, default=None, help="synthetic bars (default 100,000; quick 20,000)"
    )
    parser.add_argument("--features", type=int, default=51)
    parser.add_argument(
        "--repeats", type=int, default=None, help="median of N runs per side (default 5, quick 1)"
    )
    parser.add_argument("--skip-sb3", action="store_true", help="marketrl and the floor only")
    parser.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="cpu: process CPU time, for a busy machine"
    )
    args = parser.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    repeats = args.repeats or (1 if args.quick else 5)
    data = market_data(args.bars or (20_000 if args.quick else 100_000), args.features)
    cases = [case for case in CASES if not args.only or case.name in args.only]
    if args.quick:
        cases = [dataclasses.replace(c, hparams={**c.hparams, **c.quick_hparams}) for c in cases]

    # Warm-up: first calls pay for lazy initialisation (torch kernels, the data's cached episode starts).
    for algo in sorted({case.algo for case in cases}):
        warm = next(case for case in cases if case.algo == algo)
        small = (
            {"n_steps": 16, "batch_size": 64} if algo == "ppo" else {"batch_size": 64, "learning_starts": 64}
        )
        warm = Case("warm-up", algo, 8, {**warm.hparams, **small}, 1, 1)
        measure(warm, data, 2, 1, args.skip_sb3)

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, bars {data.n_rows}, "
        f"obs_dim {data.n_features + 1}, median of {repeats}, {args.clock} clock{', quick' if args.quick else ''}"
    )
    header = (
        f"{'config':<17} | {'env steps':>9} | {'SB3 st/s':>9} | {'marketrl st/s':>13} | {'ratio':>6} | "
        f"{'floor st/s':>10} | {'efficiency (range)':>18} | {'syncs':>5} | target"
    )
    print(header)
    print("-" * len(header))
    for case in cases:
        result = measure(
            case, data, case.quick_updates if args.quick else case.updates, repeats, args.skip_sb3
        )
        steps, ours = result["env_steps"], result["marketrl"]
        print(
            f"{case.name:<17} | {steps:>9,} | {result['sb3_steps'] / result['sb3']:>9,.0f} | {steps / ours:>13,.0f} | "
            f"{result['sb3'] / ours * steps / result['sb3_steps']:>5.2f}× | {steps / result['floor']:>10,.0f} | "
            f"{result['efficiency']:>6.0%} ({result['efficiency_range'][0]:.0%}–{result['efficiency_range'][1]:.0%}) | "
            f"{result['host_syncs']:>5} | {case.target}",
            flush=True,
        )


if __name__ == "__main__":
    main()
