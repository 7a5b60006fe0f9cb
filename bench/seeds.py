"""Benchmark: S seeds of a model trained as one batched computation vs the same S seeds one after another, side
by side in one process, the same steps per seed, CPU, torch at 1 thread (issue 24).

    python bench/seeds.py                       # S in {1, 2, 5}, every agent with a part here
    python bench/seeds.py --seeds 1 2 5 16 --steps 25600
    python bench/seeds.py --quick               # a short sanity run

Each model's part lives in bench/seeds_<model>.py as ``bench_<model>(S_values, steps) -> rows``.
"""

from __future__ import annotations

import argparse

from seeds_dqn import N_ENVS, bench_dqn, print_rows

BENCHES = {"dqn": bench_dqn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=N_ENVS * 200, help="env steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 5], help="the S values")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHES), default=sorted(BENCHES))
    parser.add_argument("--quick", action="store_true", help="S in {1, 2}, a few steps: checks it runs")
    args = parser.parse_args()
    seeds, steps = ([1, 2], N_ENVS * 20) if args.quick else (args.seeds, args.steps)
    for name in args.only:
        print_rows(BENCHES[name](seeds, steps))


if __name__ == "__main__":
    main()
