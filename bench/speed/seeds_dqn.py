"""DQN's part of bench/speed/seeds.py: S seeds batched in one `dqn.train_seeds` call vs the same S seeds trained one
after another with `dqn.train_seeds` of one seed, the same env steps per seed, in one process (CPU, torch at 1 thread). A module
of seeds.py, not run alone:

    python bench/speed/seeds.py --only dqn --seeds 1 2 5

Reported per S: wall and CPU seconds (time.process_time) of each, and sequential / batched (the speed-up).
Equal work is checked after timing: every seed made the same env and gradient steps in both, and on the CPU seed
i of the batch ends with exactly the weights of its sequential run (``same_weights``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from marketrl.agents import dqn
from marketrl.env import EnvConfig, MarketData
from marketrl.instruments.costs import CostModel
from marketrl.splits.normalize import FeatureNormalizer

N_ENVS = 64  # the demo's training.n_envs
N_FEATURES = 16
#: hidden_dim_base 64 (the issue's size); the rest DQN's defaults except a learning start early in the short run
HPARAMS: dict[str, Any] = {"hidden_dim_base": 64, "learning_starts": 1024, "batch_size": 256}


def _market_data(n_bars: int = 20_000) -> MarketData:
    from env import synthetic_frame  # bench/speed/env.py (seeds.py runs from bench/speed/)

    frame = synthetic_frame(n_bars, N_FEATURES)
    names = [f"f{j}" for j in range(N_FEATURES)]
    costs = CostModel(
        kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
    )
    return MarketData.from_frame(frame, names, FeatureNormalizer().fit(frame, names), costs, max_gap=None)


def _timed(fn: Callable[[], list[Any]]) -> tuple[list[Any], float, float]:
    """(fn's results, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    results = fn()
    return results, time.perf_counter() - wall, time.process_time() - cpu


def _one_by_one(data: MarketData, config: dqn.DQNConfig, seeds: Sequence[int]) -> list[Any]:
    return [dqn.train_seeds(data, config, HPARAMS, "fp32", "cpu", [seed])[0] for seed in seeds]


def bench_dqn(S_values: Sequence[int], steps: int) -> list[dict[str, Any]]:
    """One row per S: batched and sequential wall/CPU seconds for ``steps`` env steps per seed, and the ratios."""
    torch.set_num_threads(1)
    data = _market_data()
    config = dqn.DQNConfig(total_steps=steps, env=EnvConfig(n_envs=N_ENVS, episode_length=256, max_gap=None))
    dqn.train_seeds(
        data, dqn.DQNConfig(total_steps=N_ENVS * 20, env=config.env), HPARAMS, "fp32", "cpu", [0]
    )  # warm-up
    rows = []
    for n_seeds in S_values:
        seeds = list(range(n_seeds))
        batched_runs, *batched = _timed(partial(dqn.train_seeds, data, config, HPARAMS, "fp32", "cpu", seeds))
        sequential_runs, *sequential = _timed(partial(_one_by_one, data, config, seeds))
        pairs = list(zip(batched_runs, sequential_runs, strict=True))
        for left, right in pairs:
            steps_of = [(r.log["env_steps"], r.log["grad_steps"]) for r in (left, right)]
            if steps_of[0] != steps_of[1]:
                raise AssertionError(f"unequal work at S={n_seeds}: {steps_of}")
        rows.append(
            {
                "agent": "dqn",
                "S": n_seeds,
                "steps_per_seed": steps,
                "batched_wall_s": batched[0],
                "sequential_wall_s": sequential[0],
                "batched_cpu_s": batched[1],
                "sequential_cpu_s": sequential[1],
                "speedup_wall": sequential[0] / batched[0],
                "speedup_cpu": sequential[1] / batched[1],
                "same_weights": all(_same_weights(left, right) for left, right in pairs),
            }
        )
    return rows


def _same_weights(left: Any, right: Any) -> bool:
    return all(
        torch.equal(a, b)
        for name in left.networks
        for a, b in zip(
            left.networks[name].state_dict().values(), right.networks[name].state_dict().values(), strict=True
        )
    )


def print_rows(rows: Sequence[dict[str, Any]]) -> None:
    """A plain table of `bench_dqn`'s rows."""
    print("agent  S  steps/seed  batched wall/cpu s  sequential wall/cpu s  speed-up wall/cpu  same weights")
    for r in rows:
        print(
            f"{r['agent']:<5} {r['S']:>2}  {r['steps_per_seed']:>10}  "
            f"{r['batched_wall_s']:8.2f} / {r['batched_cpu_s']:6.2f}  "
            f"{r['sequential_wall_s']:10.2f} / {r['sequential_cpu_s']:6.2f}  "
            f"{r['speedup_wall']:6.2f}× / {r['speedup_cpu']:.2f}×  {'yes' if r['same_weights'] else 'no'}"
        )
