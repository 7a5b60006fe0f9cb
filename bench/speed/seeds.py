"""Benchmark (issue 24): S seeds of a model trained as one batched computation vs the same S seeds one after
another, side by side in one process at the same steps per seed, torch at 1 thread on the CPU; wall and CPU time.

    python bench/speed/seeds.py                         # S in {1, 2, 5}: PPO, DQN and the forecasters
    python bench/speed/seeds.py --only ppo dqn --seeds 1 2 5 16
    python bench/speed/seeds.py --only ppo --seeds 1 5 --profile     # also: what one PPO seed's CPU goes to
    python bench/speed/seeds.py --only forecasters --forecasters mlp lstm --json seeds.json
    python bench/speed/seeds.py --quick                 # S in {1, 2}, a few steps: a sanity run (tests/test_bench_quick.py)

Each model's part lives in its own module beside this script, ``bench_<part>(s_values, steps)`` in
``bench/speed/seeds_<part>.py``, with its own table printer: PPO (2 rollouts of 128 x 64 env steps per seed by
default, fastest of 3 alternated runs), DQN (12,800 env steps per seed) and the forecasters (mlp, lstm,
transformer; 30 optimizer steps per seed).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# this script runs from bench/speed/, so its sibling modules import by their file names
import seeds_dqn
import seeds_forecasters
import seeds_ppo

PARTS = ("ppo", "dqn", "forecasters")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 5], help="the values of S")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument(
        "--repeats", type=int, default=3, help="PPO: alternated runs per side; the fastest is kept"
    )
    parser.add_argument(
        "--profile", action="store_true", help="PPO: also the largest ops of one seed's run (torch.profiler)"
    )
    parser.add_argument(
        "--forecasters", nargs="+", default=["mlp", "lstm", "transformer"], help="the forecasters' models"
    )
    parser.add_argument("--json", type=Path, help="also write every part's rows to this file")
    parser.add_argument("--quick", action="store_true", help="S in {1, 2}, a few steps, one run per side")
    args = parser.parse_args()
    seeds = [1, 2] if args.quick else args.seeds
    rows: dict[str, list] = {}
    if "ppo" in args.only:
        ppo_steps = seeds_ppo.HPARAMS["n_steps"] * seeds_ppo.N_ENVS * (1 if args.quick else 2)
        rows["ppo"] = seeds_ppo.bench_ppo(seeds, ppo_steps, repeats=1 if args.quick else args.repeats)
        seeds_ppo.print_rows(rows["ppo"])
        seeds_ppo.print_bound(rows["ppo"])
        if args.profile:
            for name, share in seeds_ppo.profile_ops(ppo_steps):
                print(f"  {name:<28} {share:6.1%} of one seed's op CPU")
    if "dqn" in args.only:
        rows["dqn"] = seeds_dqn.bench_dqn(seeds, seeds_dqn.N_ENVS * (20 if args.quick else 200))
        seeds_dqn.print_rows(rows["dqn"])
    if "forecasters" in args.only:
        steps = 3 if args.quick else 30
        rows["forecasters"] = seeds_forecasters.bench_forecasters(seeds, steps, args.forecasters)
        print(seeds_forecasters.table(rows["forecasters"]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
