"""Benchmark (issue 24): S seeds of a model trained as one batched computation vs the same S seeds one after
another, side by side in one process at the same steps per seed, torch at 1 thread on the CPU; wall and CPU time.

    python bench/seeds.py                         # S in {1, 2, 5}: PPO, DQN and the forecasters
    python bench/seeds.py --only ppo dqn --seeds 1 2 5 16
    python bench/seeds.py --quick                 # S in {1, 2}, a few steps: a sanity run (tests/test_bench_quick.py)

Each model's part lives in its own file, ``bench_<part>(s_values, steps)`` in ``bench/seeds_<part>.py``, with
its own table printer: PPO (2 rollouts of 128 x 64 env steps per seed by default, fastest of 3 alternated runs),
DQN (12,800 env steps per seed) and the forecasters (mlp, lstm, transformer; 30 optimizer steps per seed).
"""

from __future__ import annotations

import argparse

# this script runs from bench/, so its siblings import by their file names
import seeds_dqn
import seeds_forecasters
import seeds_ppo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 5], help="the values of S")
    parser.add_argument(
        "--only", nargs="+", choices=["ppo", "dqn", "forecasters"], default=["ppo", "dqn", "forecasters"]
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="PPO: alternated runs per side; the fastest is kept"
    )
    parser.add_argument("--quick", action="store_true", help="S in {1, 2}, a few steps, one run per side")
    args = parser.parse_args()
    seeds = [1, 2] if args.quick else args.seeds
    ppo_rollout = seeds_ppo.HPARAMS["n_steps"] * seeds_ppo.N_ENVS
    if "ppo" in args.only:
        rows = seeds_ppo.bench_ppo(
            seeds, ppo_rollout * (1 if args.quick else 2), repeats=1 if args.quick else args.repeats
        )
        seeds_ppo.print_rows(rows)
        seeds_ppo.print_bound(rows)
    if "dqn" in args.only:
        seeds_dqn.print_rows(seeds_dqn.bench_dqn(seeds, seeds_dqn.N_ENVS * (20 if args.quick else 200)))
    if "forecasters" in args.only:
        print(seeds_forecasters.table(seeds_forecasters.bench_forecasters(seeds, 3 if args.quick else 30)))


if __name__ == "__main__":
    main()
