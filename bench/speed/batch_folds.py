"""Benchmark (issue 36, item 3): F walk-forward folds of S seeds each trained as one batched computation (folds on
the batch axis: each fold's own normalized rows, `stack_market_data` + ``block_rows``) vs the F folds one after
another (one S-seed batch each, what one train job per model x fold does), side by side in one process, the same
steps per copy (env steps for the agents, optimizer steps for the forecasters, each validated on its own fold's
split), torch at 1 thread on the CPU; wall and CPU time.

    python bench/speed/batch_folds.py                   # F in {1, 2, 4}, S = 5: PPO, DQN, MLP, LSTM, demo sizes
    python bench/speed/batch_folds.py --folds 1 2 4 8 --seeds 5 --only ppo
    python bench/speed/batch_folds.py --quick           # F in {1, 2}, S = 2, a few steps (tests/test_bench_quick.py)

Each fold is its own synthetic table (random-walk prices, its own seed and length, normalized on itself), so the
batched copies really train on different data. Equal work is checked after timing: every copy of the batch ends
with the weights of its fold's sequential run within ``--tolerance`` (``same_weights``; a batched matrix product
may sum in another order), and made the same env steps. Reported per F: wall and CPU seconds of each side and
sequential / batched (the speed-up of one fold-batched job over F fold jobs run one after another on one core).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from marketrl.agents import dqn, ppo
from marketrl.env import EnvConfig, MarketData, stack_market_data
from marketrl.instruments.costs import CostModel
from marketrl.models.base import RunSettings, TrainHooks
from marketrl.splits.normalize import FeatureNormalizer
from marketrl.training.zoo import get_entry

N_ENVS = 64  # the demo's training.n_envs
N_FEATURES = 16
AGENTS = ("ppo", "dqn")
#: the torch forecasters measured: the MLP (vmap over the copies on the CPU) and the LSTM (copies one after another)
FORECASTERS = ("mlp", "lstm")
HPARAMS: dict[str, dict[str, Any]] = {
    "ppo": {"hidden_dim_base": 64, "n_steps": 128, "batch_size": 1024, "n_epochs": 4},
    "dqn": {"hidden_dim_base": 64, "learning_starts": 1024, "batch_size": 256},
    "mlp": {"window": 16, "hidden_dim_base": 64, "batch_size": 256},
    "lstm": {"window": 16, "hidden_dim_base": 32, "batch_size": 256},
}
QUICK_HPARAMS: dict[str, dict[str, Any]] = {
    "ppo": {"hidden_dim_base": 16, "n_steps": 16, "batch_size": 128, "n_epochs": 2},
    "dqn": {"hidden_dim_base": 16, "learning_starts": 128, "batch_size": 32},
    "mlp": {"window": 4, "hidden_dim_base": 8, "batch_size": 64},
    "lstm": {"window": 4, "hidden_dim_base": 8, "batch_size": 64},
}


def fold_data(n_folds: int, n_bars: int, first_seed: int = 0) -> list[MarketData]:
    """One synthetic table per fold (an expanding window: fold k has k more tenths of ``n_bars``), each normalized
    on its own rows."""
    from env import synthetic_frame  # bench/speed/env.py (this script runs from bench/speed/)

    names = [f"f{j}" for j in range(N_FEATURES)]
    costs = CostModel(
        kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
    )
    parts = []
    for fold in range(n_folds):
        frame = synthetic_frame(n_bars + fold * n_bars // 10, N_FEATURES, seed=first_seed + fold)
        normalizer = FeatureNormalizer().fit(frame, names)
        parts.append(MarketData.from_frame(frame, names, normalizer, costs, max_gap=None))
    return parts


def train(
    algo: str,
    data: MarketData,
    seeds: list[int],
    steps: int,
    hparams: dict[str, Any],
    rows: list | None,
    validation: list[MarketData],
) -> tuple[list[Any], float, float]:
    """One ``train_seeds`` batch (a forecaster validated on ``validation[i]`` for seed i: its fold's split);
    (results, wall s, CPU s)."""
    wall, cpu = time.perf_counter(), time.process_time()
    if algo in FORECASTERS:
        settings = RunSettings(epochs=10_000, max_steps=steps, check_every=50, eval_every=max(1, steps // 4))
        blocks = {} if rows is None else {"block_rows": rows, "block_validation": validation}
        results = get_entry(algo).spec.train_seeds(
            data,
            None if rows else validation[0],
            settings,
            hparams,
            "fp32",
            "cpu",
            seeds,
            TrainHooks(),
            **blocks,
        )
    else:
        module = dqn if algo == "dqn" else ppo
        config_cls = dqn.DQNConfig if algo == "dqn" else ppo.PPOConfig
        config = config_cls(total_steps=steps, env=EnvConfig(n_envs=N_ENVS, max_gap=None))
        results = module.train_seeds(data, config, hparams, "fp32", "cpu", seeds, block_rows=rows)
    return results, time.perf_counter() - wall, time.process_time() - cpu


def weights(result: Any) -> list[torch.Tensor]:
    if hasattr(result, "networks"):  # an agent
        return [tensor for net in result.networks.values() for tensor in net.state_dict().values()]
    return list(result.state["state_dict"].values())


def steps_run(result: Any) -> int:
    """The steps a copy made: env steps (an agent), optimizer steps (a forecaster)."""
    return int(result.log["env_steps"] if "env_steps" in result.log else result.log["steps"])


def bench(
    algo: str,
    folds: list[int],
    n_seeds: int,
    steps: int,
    hparams: dict[str, Any],
    n_bars: int,
    tolerance: float,
) -> list[dict[str, Any]]:
    """Rows of one algorithm: F folds batched against the same F folds one after another."""
    parts = fold_data(max(folds), n_bars)
    validation = fold_data(max(folds), n_bars // 5, first_seed=100)
    train(algo, parts[0], [999], steps, hparams, None, validation[:1])  # warm-up: first calls, allocator
    rows = []
    for n_folds in folds:
        seeds = [[1000 * fold + index for index in range(n_seeds)] for fold in range(n_folds)]
        sequential_wall = sequential_cpu = 0.0
        alone = []
        for fold in range(n_folds):
            results, wall, cpu = train(
                algo, parts[fold], seeds[fold], steps, hparams, None, [validation[fold]]
            )
            alone += results
            sequential_wall += wall
            sequential_cpu += cpu
        stacked, ranges = stack_market_data(parts[:n_folds])
        block_rows = [ranges[fold] for fold in range(n_folds) for _ in range(n_seeds)]
        block_validation = [validation[fold] for fold in range(n_folds) for _ in range(n_seeds)]
        flat_seeds = [seed for fold_seeds in seeds for seed in fold_seeds]
        together, wall, cpu = train(algo, stacked, flat_seeds, steps, hparams, block_rows, block_validation)
        difference = max(
            (a - b).abs().max().item()
            for one, other in zip(together, alone, strict=True)
            for a, b in zip(weights(one), weights(other), strict=True)
        )
        same_steps = all(
            steps_run(one) == steps_run(other) for one, other in zip(together, alone, strict=True)
        )
        rows.append(
            {
                "algo": algo,
                "folds": n_folds,
                "seeds_per_fold": n_seeds,
                "steps_per_copy": steps_run(together[0]),
                "sequential_wall_s": sequential_wall,
                "sequential_cpu_s": sequential_cpu,
                "batched_wall_s": wall,
                "batched_cpu_s": cpu,
                "speedup": sequential_wall / wall,
                "max_weight_difference": difference,
                "same_weights": same_steps and difference <= tolerance,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folds", type=int, nargs="+", default=[1, 2, 4], help="the values of F")
    parser.add_argument("--seeds", type=int, default=5, help="S, seeds per fold")
    parser.add_argument("--only", nargs="+", choices=AGENTS + FORECASTERS, default=list(AGENTS + FORECASTERS))
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest weight difference allowed")
    parser.add_argument("--json", type=Path, help="also write the rows to this file")
    parser.add_argument("--quick", action="store_true", help="F in {1, 2}, S = 2, a few steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folds, n_seeds = ([1, 2], 2) if args.quick else (args.folds, args.seeds)
    hparams = QUICK_HPARAMS if args.quick else HPARAMS
    n_bars = 4_000 if args.quick else 20_000
    rows = []
    for algo in args.only:
        if algo in FORECASTERS:
            steps = 12 if args.quick else 240  # the demo's training.max_updates
        elif algo == "ppo":
            steps = hparams["ppo"]["n_steps"] * N_ENVS * 2  # two rollouts a copy
        else:
            steps = hparams["dqn"]["learning_starts"] + (6 if args.quick else 80) * N_ENVS
        rows += bench(algo, folds, n_seeds, steps, hparams[algo], n_bars, args.tolerance)
    print(
        "| model | F | S | steps/copy | sequential wall s | batched wall s | sequential / batched "
        "| CPU s seq / batched | max weight diff | same weights |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['algo']} | {row['folds']} | {row['seeds_per_fold']} | {row['steps_per_copy']:,} "
            f"| {row['sequential_wall_s']:.2f} | {row['batched_wall_s']:.2f} | {row['speedup']:.2f} "
            f"| {row['sequential_cpu_s']:.1f} / {row['batched_cpu_s']:.1f} | {row['max_weight_difference']:.1e} "
            f"| {'yes' if row['same_weights'] else 'NO'} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    if not all(row["same_weights"] for row in rows):
        raise SystemExit("unequal work: a batched copy did not end with its fold's sequential weights")


if __name__ == "__main__":
    main()
