"""Benchmark: the evaluate job's scoring, per seed and per trader (the path before issue 24) vs batched.

    python bench/speed/evaluate.py                 # demo sizes: 20 sessions of 1-minute ES/NQ bars, 5 seeds, 50 traders
    python bench/speed/evaluate.py --quick         # 5 sessions, 10 traders

Both paths score the same positions of S "seeds" (persistent random traders) and each seed's turnover-matched
random traders, in one process on the CPU (torch at 1 thread, as the job runs):
  per trader  the reference, kept here only: per seed, `evaluate_positions` then `performance_summary` on its
              frame, then per matched trader a polars frame, its `performance_summary` and its daily returns;
  batched     `marketrl.evaluation.evaluate.score_runs`, the job's scoring: every seed and trader in one
              `score_positions` pass, polars only for the seeds' own per-bar frames.
It checks that both give the same summaries and daily returns (to float tolerance), then prints the CPU seconds
(time.process_time) of each and their ratio. Model loading and policy inference, equal in both, are left out
of the comparison; the last line times the inference apart (S greedy 2 x 64 MLP Q-networks over 51 features,
`policy_positions`), so that scoring and inference together give the model-side CPU of one evaluate job.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: tests.support

from marketrl.env import (
    EnvConfig,
    MarketData,
    evaluate_positions,
    matched_random_positions,
    policy_positions,
    position_change_rate,
)
from marketrl.evaluation.evaluate import BAR_COLUMNS, score_runs
from marketrl.scoring.metrics import daily_returns, performance_summary, portfolio_bars
from marketrl.settings.config import derive_seed
from marketrl.splits.normalize import FeatureNormalizer
from tests.support.cme import COSTS, MAX_GAP, cme_frame


def seed_positions(data: MarketData, n_seeds: int, change_rate: float = 0.05) -> list[torch.Tensor]:
    """Persistent random positions per seed: at each row a new position in {-1, 0, 1} with probability
    `change_rate`, else the previous one (as a trained policy holds for a while)."""
    out = []
    for seed in range(n_seeds):
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randint(-1, 2, (data.n_rows,), generator=generator).float()
        change = torch.rand(data.n_rows, generator=generator) < change_rate
        change[0] = True
        last_change = torch.where(change, torch.arange(data.n_rows), 0).cummax(0).values
        out.append(draws[last_change])
    return out


def per_trader_reference(
    data: MarketData, positions: torch.Tensor, env_config: EnvConfig, config: dict[str, Any], key: tuple
) -> dict[str, Any]:
    """One seed as the evaluate job scored it before issue 24: one polars frame and summary per trader."""
    bars = evaluate_positions(data, positions, env_config).select(BAR_COLUMNS)
    rate = position_change_rate(data, positions)
    days: list[str] = []
    per_seed, daily = [], []
    for i in range(config["evaluation"]["random_baseline_seeds"]):
        seed = derive_seed(config["seed"], "matched_random", *key, i)
        trader = evaluate_positions(data, matched_random_positions(data, rate, seed=seed), env_config)
        per_seed.append(performance_summary(trader))
        portfolio = portfolio_bars(trader)
        trader_days, returns = daily_returns(portfolio["trading_day"], portfolio["portfolio_return"])
        days = [str(day) for day in np.asarray(trader_days).astype("datetime64[D]")]
        daily.append(returns.tolist())
    block = {"change_rate": rate, "days": days, "daily_net_returns": daily, "per_seed": per_seed}
    return {"bars": bars, "metrics": performance_summary(bars), "matched_random": block}


def same_summary(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def close(x: Any, y: Any) -> bool:
        if isinstance(x, float) and math.isnan(x):
            return isinstance(y, float) and math.isnan(y)
        if isinstance(x, str | int):
            return x == y
        return math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12)

    return a.keys() == b.keys() and all(close(a[key], b[key]) for key in a)


def check_same_results(old: list[dict[str, Any]], new: list[tuple[Any, dict[str, Any]]]) -> None:
    for seed, (reference, (bars, scored)) in enumerate(zip(old, new, strict=True)):
        ref_block, block = reference["matched_random"], scored["matched_random"]
        ok = (
            reference["bars"].equals(bars)
            and same_summary(reference["metrics"], scored["metrics"])
            and ref_block["days"] == block["days"]
            and ref_block["change_rate"] == block["change_rate"]
            and np.allclose(
                ref_block["daily_net_returns"], block["daily_net_returns"], rtol=1e-12, atol=1e-15
            )
            and all(same_summary(a, b) for a, b in zip(ref_block["per_seed"], block["per_seed"], strict=True))
        )
        if not ok:
            sys.exit(f"seed {seed}: the batched scores differ from the per-trader reference")


def mlp_policies(data: MarketData, n_seeds: int, window: int) -> list[Any]:
    """Greedy policies of S randomly initialised 2 x 64 MLP Q-networks (the DQN's shape at hidden 64)."""
    policies = []
    for seed in range(n_seeds):
        torch.manual_seed(seed)
        q = torch.nn.Sequential(
            torch.nn.Linear(window * data.n_features + 1, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 64),
            torch.nn.ReLU(),
            torch.nn.Linear(64, 3),
        )
        policies.append(lambda obs, q=q: q(obs).argmax(-1))
    return policies


def cpu_seconds(fn: Any) -> tuple[float, Any]:
    start = time.process_time()
    result = fn()
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--days", type=int, default=20)
    parser.add_argument("--minutes", type=int, default=1, help="bar size in minutes")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--traders", type=int, default=50, help="matched random traders per seed")
    parser.add_argument("--quick", action="store_true", help="5 sessions, 10 traders")
    args = parser.parse_args()
    if args.quick:
        args.days, args.traders = 5, 10
    torch.set_num_threads(1)

    frame = cme_frame(days=args.days, minutes=args.minutes, n_features=51)
    names = [f"f{j}" for j in range(51)]
    data = MarketData.from_frame(frame, names, FeatureNormalizer().fit(frame, names), COSTS, max_gap=MAX_GAP)
    env_config = EnvConfig(max_gap=MAX_GAP)
    config = {"seed": 20240102, "evaluation": {"random_baseline_seeds": args.traders}}
    positions = seed_positions(data, args.seeds)
    keys = [("bench", 0, seed) for seed in range(args.seeds)]
    print(
        f"{data.n_rows:,} rows ({args.days} sessions of {args.minutes}-minute ES/NQ bars), {args.seeds} seeds x "
        f"{args.traders} matched traders, torch threads 1"
    )

    old_s, old = cpu_seconds(
        lambda: [
            per_trader_reference(data, p, env_config, config, key)
            for p, key in zip(positions, keys, strict=True)
        ]
    )
    new_s, new = cpu_seconds(lambda: score_runs(data, positions, env_config, config, keys))
    check_same_results(old, new)
    print("same summaries, daily returns and per-bar frames: yes")
    print(f"{'path':<12} {'CPU s':>8}")
    print(f"{'per trader':<12} {old_s:>8.2f}")
    print(f"{'batched':<12} {new_s:>8.2f}")
    print(f"speed-up: {old_s / new_s:.1f}x")
    policies = mlp_policies(data, args.seeds, env_config.window)
    with torch.inference_mode():
        infer_s, _ = cpu_seconds(lambda: [policy_positions(policy, data, env_config) for policy in policies])
    print(f"policy inference ({args.seeds} MLP Q-networks, shared by both paths): {infer_s:.2f} CPU s")


if __name__ == "__main__":
    main()
