"""Study: what each part of DQN's design does to what it keeps of a planted edge and how much it trades without one.

    .venv/bin/python bench/studies/dqn_design.py                          # 320k env steps, 2 seeds, both worlds
    .venv/bin/python bench/studies/dqn_design.py --steps 32000 100000     # the demo's budget and more
    .venv/bin/python bench/studies/dqn_design.py --quick                  # tiny: a check, no figure

Data (bench/speed/time_to_quality.py's `build_splits`): `--days` demo days, the last `--validation-days` held out;
the clear world plants a reversion edge of `--edge` (the oracle holding −sign(ret_5), one contract, net of the same
costs), the no-edge world none. Every variant trains the same seeds on the same training days with the same
hyperparameters (`--hparams`, JSON over the fixed set below), one change at a time from the default design:

  default             normalize_rewards, all_actions and cost_prior on (docs/AGENTS.md)
  no_normalize        rewards x reward_scale only (per-bar returns ~1e-4 as they are)
  no_all_actions      one action per transition (the taken one)
  no_cost_prior       the network learns the cost of a position change too
  none                all three off: the design before issue 35

and the greedy policy is scored on the held-out days: net and gross annualised Sharpe of daily returns, net over
the oracle's, contract changes per day. Figures are means over seeds (the validation days are few: a seed's net
Sharpe has a standard error of several units, so read differences between variants across both worlds and step
budgets, not one cell). Torch at 1 thread, CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # the data builder of a sibling bench
from time_to_quality import Splits, build_splits

from marketrl.agents import dqn
from marketrl.env import evaluate
from marketrl.scoring.metrics import performance_summary

VARIANTS: dict[str, dict[str, bool]] = {
    "default": {},
    "no_normalize": {"normalize_rewards": False},
    "no_all_actions": {"all_actions": False},
    "no_cost_prior": {"cost_prior": False},
    "none": {"normalize_rewards": False, "all_actions": False, "cost_prior": False},
}
#: The fixed hyperparameters (a point the search space holds; reward_scale is a multiplier of normalized rewards,
#: so the variants without normalization get 1000, the best of the old {1, 10, 100, 1000} on these days).
HPARAMS: dict[str, Any] = {
    "hidden_dim_base": 64,
    "learning_rate": 3e-5,
    "batch_size": 128,
    "gamma": 0.8,
    "gradient_steps": 4,
    "target_update": 250,
    "exploration_fraction": 0.2,
    "exploration_final_eps": 0.05,
    "learning_starts": 1000,
    "reward_scale": 0.3,
}
RAW_REWARD_SCALE = 1000.0
WORLDS = {"clear": 1.0, "noedge": 0.0}  # x --edge


def score(result: dqn.TrainResult | Any, splits: Splits) -> dict[str, float]:
    """Net and gross Sharpe, net over the oracle's, contract changes per day of the greedy policy."""
    frame = evaluate(result.policy, splits.validation, splits.env)
    net = performance_summary(frame)["sharpe"] or 0.0
    gross_frame = frame.with_columns(pl.col("gross_return").alias("net_return"), pl.lit(0.0).alias("cost"))
    gross = performance_summary(gross_frame)["sharpe"] or 0.0
    positions = frame["position"].to_numpy()
    same_segment = frame["segment"].to_numpy()[1:] == frame["segment"].to_numpy()[:-1]
    changes = np.abs(np.diff(positions))[same_segment].sum()
    return {
        "net": float(net),
        "gross": float(gross),
        "turnover": float(changes) / splits.validation_days,
    }


def run_variant(splits: Splits, variant: str, steps: int, seeds: list[int], hparams: dict[str, Any]) -> dict:
    """Train the seeds as one batch with the variant's switches; their mean scores."""
    hp = {**hparams, **VARIANTS[variant]}
    if not hp.get("normalize_rewards", True):
        hp["reward_scale"] = RAW_REWARD_SCALE
    config = dqn.DQNConfig(total_steps=steps, env=splits.env, eval_every=0)
    results = dqn.train_seeds(splits.train, config, hp, "fp32", "cpu", seeds)
    scores = [score(result, splits) for result in results]
    mean = {key: float(np.mean([s[key] for s in scores])) for key in scores[0]}
    return {**mean, "seeds": scores}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[320_000], help="env steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--validation-days", type=int, default=10)
    parser.add_argument("--edge", type=float, default=10.0, help="the clear world's planted edge")
    parser.add_argument("--data-seed", type=int, default=7)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--worlds", nargs="+", choices=list(WORLDS), default=list(WORLDS))
    parser.add_argument("--hparams", default="{}", help="JSON over the fixed hyperparameters")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--quick", action="store_true", help="6 days, tiny budgets: a check, no figure")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hparams = {**HPARAMS, **json.loads(args.hparams)}
    if args.quick:
        args.days, args.validation_days, args.steps, args.seeds = 6, 2, [2_048], [0]
        hparams["learning_starts"] = 256
    out: dict[str, Any] = {"hparams": hparams, "cells": []}
    print(f"bench/studies/dqn_design.py: {args.days} demo days, the last {args.validation_days} held out; ")
    print(f"seeds {args.seeds}; hparams {json.dumps(hparams)}\n")
    print("| world | oracle net | env steps | variant | net Sharpe | net / oracle | gross | turnover/day |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for world in args.worlds:
            edge = WORLDS[world] * args.edge
            splits = build_splits(
                Path(scratch) / world, args.days, args.validation_days, edge, args.data_seed, "reversion"
            )
            for steps in args.steps:
                for variant in args.variants:
                    cell = run_variant(splits, variant, steps, args.seeds, hparams)
                    share = cell["net"] / splits.oracle_sharpe if world == "clear" else float("nan")
                    out["cells"].append(
                        {
                            "world": world,
                            "oracle": splits.oracle_sharpe,
                            "steps": steps,
                            "variant": variant,
                            **cell,
                        }
                    )
                    oracle = f"{splits.oracle_sharpe:.2f}" if world == "clear" else "—"
                    ratio = f"{share:.2f}" if world == "clear" else "—"
                    print(
                        f"| {world} | {oracle} | {steps:,} | {variant} | {cell['net']:.2f} | {ratio} | "
                        f"{cell['gross']:.2f} | {cell['turnover']:.1f} |",
                        flush=True,
                    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
