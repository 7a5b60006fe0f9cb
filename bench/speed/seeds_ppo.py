"""PPO's part of bench/speed/seeds.py: S seeds trained as one batch (`ppo.train_seeds`) against S single-seed runs one
after the other, side by side in one process at the same env steps per seed (demo sizes: 64 envs, the default
rollout of 128 steps, minibatches of 1024, 4 epochs, hidden_dim_base 64, fp32 on the CPU). A module of seeds.py,
not run alone:

    python bench/speed/seeds.py --only ppo --seeds 1 5 --profile    # also: what a seed's CPU goes to

Under the table, the batched CPU is split into the work each seed adds and the work the seeds share (a line
through S = 1 and the largest S): the ratio to S sequential runs cannot exceed one seed's CPU over its own part.
"""

from __future__ import annotations

import time
from typing import Any

import torch

# bench/speed/env.py (seeds.py runs from bench/speed/, so its sibling imports as `env`)
from env import synthetic_frame

from marketrl.agents import ppo
from marketrl.env import EnvConfig, MarketData
from marketrl.instruments.costs import CostModel
from marketrl.splits.normalize import FeatureNormalizer

N_ENVS = 64
HPARAMS = {"hidden_dim_base": 64, "n_steps": 128, "batch_size": 1024, "n_epochs": 4}


def market_data(n_bars: int = 20_000, n_features: int = 51) -> MarketData:
    """Synthetic bars of bench/speed/env.py (51 features: the demo's obs width)."""
    frame = synthetic_frame(n_bars, n_features)
    names = [f"f{j}" for j in range(n_features)]
    costs = CostModel(
        kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
    )
    return MarketData.from_frame(frame, names, FeatureNormalizer().fit(frame, names), costs, max_gap=None)


def _timed(run: Any) -> tuple[float, float, Any]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = run()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def bench_ppo(
    s_values: list[int],
    steps: int,
    data: MarketData | None = None,
    hparams: dict[str, Any] | None = None,
    repeats: int = 3,
) -> list[dict[str, Any]]:
    """For each S: wall and CPU seconds of one `train_seeds` over S seeds and of S one-seed `train_seeds` calls in a row, each
    seed ``steps`` env steps (rounded up to whole rollouts), the two alternated ``repeats`` times and the fastest
    of each kept (on a shared machine the minimum is the least disturbed); ``ratio`` = sequential / batched."""
    torch.set_num_threads(1)
    data = data or market_data()
    hparams = {**HPARAMS, **(hparams or {})}
    config = ppo.PPOConfig(total_steps=steps, env=EnvConfig(n_envs=N_ENVS, max_gap=None))
    ppo.train_seeds(
        data,
        ppo.PPOConfig(total_steps=64, env=EnvConfig(n_envs=4, max_gap=None)),
        {**hparams, "n_steps": 16, "batch_size": 64},
        "fp32",
        "cpu",
        [0],
    )  # warm-up: lazy initialisation
    rows = []
    for n_seeds in s_values:
        seeds = list(range(n_seeds))
        batched, sequential = [], []
        for _ in range(repeats):
            batched.append(
                _timed(lambda seeds=seeds: ppo.train_seeds(data, config, hparams, "fp32", "cpu", seeds))
            )
            sequential.append(
                _timed(
                    lambda seeds=seeds: [
                        ppo.train_seeds(data, config, hparams, "fp32", "cpu", [s])[0] for s in seeds
                    ]
                )
            )
        results, singles = batched[0][2], sequential[0][2]
        same_work = [r.log["env_steps"] for r in results] == [r.log["env_steps"] for r in singles]
        if not same_work or len(results) != n_seeds:
            raise AssertionError(f"S={n_seeds}: batched and sequential runs did not make the same env steps")
        batch_wall, batch_cpu = min(t[0] for t in batched), min(t[1] for t in batched)
        seq_wall, seq_cpu = min(t[0] for t in sequential), min(t[1] for t in sequential)
        rows.append(
            {
                "agent": "ppo",
                "S": n_seeds,
                "env_steps_per_seed": results[0].log["env_steps"],
                "batched_wall_s": batch_wall,
                "batched_cpu_s": batch_cpu,
                "sequential_wall_s": seq_wall,
                "sequential_cpu_s": seq_cpu,
                "ratio_wall": seq_wall / batch_wall,
                "ratio_cpu": seq_cpu / batch_cpu,
                "host_syncs_batched": results[0].log["host_syncs"],
            }
        )
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    """One line per (agent, S)."""
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, CPU, fastest of the repeats")
    header = (
        f"{'agent':<5} | {'S':>2} | {'steps/seed':>10} | {'batched wall':>12} | {'seq wall':>8} | {'ratio':>5} | "
        f"{'batched cpu':>11} | {'seq cpu':>7} | {'ratio':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['agent']:<5} | {r['S']:>2} | {r['env_steps_per_seed']:>10} | {r['batched_wall_s']:>11.2f}s | "
            f"{r['sequential_wall_s']:>7.2f}s | {r['ratio_wall']:>5.2f} | {r['batched_cpu_s']:>10.2f}s | "
            f"{r['sequential_cpu_s']:>6.2f}s | {r['ratio_cpu']:>5.2f}"
        )


def amdahl(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Batched CPU as T(S) = a·S + b, fit through S = 1 and the largest S measured: ``a`` is the work every seed
    adds (its arithmetic), ``b`` what the seeds share (per-op dispatch, Python). The sequential runs cost S·T(1),
    so the ratio at S is S·T(1) / (a·S + b), and no S beats T(1) / a. None without S = 1 and a larger S."""
    by_s = {r["S"]: r["batched_cpu_s"] for r in rows}
    largest = max(by_s)
    if 1 not in by_s or largest == 1:
        return None
    per_seed = (by_s[largest] - by_s[1]) / (largest - 1)
    shared = by_s[1] - per_seed
    return {
        "per_seed_s": per_seed,
        "shared_s": shared,
        "per_seed_share": per_seed / by_s[1],
        "ratio_limit": by_s[1] / per_seed,
    }


def profile_ops(steps: int, n_seeds: int = 1, top: int = 8) -> list[tuple[str, float]]:
    """(op, share of the run's op CPU) of one `train_seeds` over ``n_seeds`` seeds under torch.profiler, the
    ``top`` largest by self CPU time: what the per-seed arithmetic is."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(1)
    data = market_data()
    config = ppo.PPOConfig(total_steps=steps, env=EnvConfig(n_envs=N_ENVS, max_gap=None))
    ppo.train_seeds(data, config, HPARAMS, "fp32", "cpu", list(range(n_seeds)))  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ppo.train_seeds(data, config, HPARAMS, "fp32", "cpu", list(range(n_seeds)))
    events = prof.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    ranked = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)[:top]
    return [(event.key, event.self_cpu_time_total / total) for event in ranked]


def print_bound(rows: list[dict[str, Any]]) -> None:
    """The Amdahl line under the table (see `amdahl`)."""
    fit = amdahl(rows)
    if fit is not None:
        print(
            f"per-seed work {fit['per_seed_s']:.2f}s, shared {fit['shared_s']:.2f}s of one seed's "
            f"{fit['per_seed_s'] + fit['shared_s']:.2f}s (per-seed share {fit['per_seed_share']:.0%}): "
            f"no S can beat {fit['ratio_limit']:.2f}x on this CPU"
        )
