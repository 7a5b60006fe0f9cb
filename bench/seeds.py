"""Benchmark (issue 24): S seeds trained as one batched computation vs S single-seed runs one after the other,
side by side in one process at the same env steps per seed, torch at 1 thread on the CPU; wall and CPU time.

    python bench/seeds.py                     # S in {1, 2, 5}, 2 PPO rollouts per seed, fastest of 3
    python bench/seeds.py --seeds 1 5 --updates 1 --repeats 1
    python bench/seeds.py --quick             # S in {1, 2}, one rollout, one run per side (a sanity run)

Each model's part lives in its own file (`bench/seeds_<agent>.py`, a function ``bench_<agent>(s_values, steps)``).
"""

from __future__ import annotations

import argparse

# this script runs from bench/, so its siblings import by their file names
from seeds_ppo import HPARAMS, N_ENVS, bench_ppo, print_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 5])
    parser.add_argument(
        "--updates", type=int, default=2, help="PPO rollouts per seed (of 128 x 64 env steps)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="alternated runs per side; the fastest is kept"
    )
    parser.add_argument("--quick", action="store_true", help="S in {1, 2}, one rollout, one run per side")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.updates, args.repeats = [1, 2], 1, 1
    rows = bench_ppo(args.seeds, args.updates * HPARAMS["n_steps"] * N_ENVS, repeats=args.repeats)
    print_rows(rows)


if __name__ == "__main__":
    main()
