"""Out-of-sample evaluation of trained agents and of the baselines, on each fold's test days.

Agents and baselines see exactly the same test rows, environment semantics and cost model; every output carries
per-bar positions, gross returns, costs and net returns (docs/OUTPUTS.md), plus a performance summary.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
import torch

from gpu_utils import resolve_device
from marketrl.agents.checkpoint import load_policy
from marketrl.config import derive_seed
from marketrl.datasets import (
    cost_model_from_config,
    env_config_from_config,
    fold_window,
    load_features,
)
from marketrl.env import MarketData, evaluate, evaluate_positions, rule_positions
from marketrl.folds import FoldPlan, select_rows
from marketrl.io import atomic_write, write_json_atomic
from marketrl.metrics import average_strategies, performance_summary, to_json_safe
from marketrl.normalize import FeatureNormalizer
from marketrl.provenance import collect

log = logging.getLogger(__name__)

BAR_COLUMNS = ("ts_event", "trading_day", "symbol", "position", "gross_return", "cost", "net_return")


def _write_bars(bars: pl.DataFrame, path: str | Path) -> None:
    with atomic_write(path) as tmp:
        bars.write_parquet(tmp, compression="zstd")


def _test_span(bars: pl.DataFrame) -> dict[str, str | None]:
    days = bars["trading_day"]
    return {
        "test_first": None if days.is_empty() else str(days.min()),
        "test_last": None if days.is_empty() else str(days.max()),
    }


def evaluate_job(
    *,
    algo: str,
    fold: int,
    seed_index: int,
    manifest_path: str,
    folds_path: str,
    model_path: str,
    config: Mapping[str, Any],
    metrics_path: str,
    bars_path: str,
) -> dict[str, Any]:
    """Score one trained model on its fold's test days with its deterministic (greedy) policy."""
    device = resolve_device(config["training"]["device"])
    policy, meta = load_policy(model_path, device)
    normalizer = FeatureNormalizer.from_state_dict(meta["normalizer"])
    plan = FoldPlan.load(folds_path)
    test_rows = select_rows(load_features(manifest_path), plan.fold(fold), "test")
    env_config = env_config_from_config(config)
    data = MarketData.from_frame(
        test_rows,
        normalizer.feature_names,
        normalizer,
        cost_model_from_config(config["costs"]),
        device,
        max_gap=env_config.max_gap,
    )
    with torch.inference_mode():
        bars = evaluate(policy, data, env_config)
    bars = bars.select(BAR_COLUMNS)
    summary = performance_summary(bars)
    log.info(
        "%s fold %d seed %d: test Sharpe %s over %d bars",
        algo,
        fold,
        seed_index,
        summary["sharpe"],
        bars.height,
    )
    result = {
        "algo": algo,
        "fold": fold,
        "seed_index": seed_index,
        "seed": derive_seed(config["seed"], "train", algo, fold, seed_index),
        **_test_span(bars),
        "metrics": summary,
        "model": {
            "path": str(model_path),
            "precision": meta.get("precision"),
            "hidden": meta.get("hidden_sizes"),
        },
        "provenance": collect(dict(config), device=str(device)),
    }
    _write_bars(bars, bars_path)
    write_json_atomic(metrics_path, to_json_safe(result))
    return result


def baseline_positions(data: MarketData, config: Mapping[str, Any], fold: int) -> dict[str, torch.Tensor]:
    """Target positions of every baseline: buy-and-hold, flat, momentum, and `random_{i}` per seed."""
    evaluation = config["evaluation"]
    strategies = {
        "buy_and_hold": rule_positions(data, "long"),
        "flat": rule_positions(data, "flat"),
        "momentum": rule_positions(data, "momentum", lookback=evaluation["momentum_lookback"]),
    }
    for i in range(evaluation["random_baseline_seeds"]):
        seed = derive_seed(config["seed"], "baseline_random", fold, i)
        strategies[f"random_{i}"] = rule_positions(data, "random", seed=seed)
    return strategies


def baselines_job(
    *,
    fold: int,
    manifest_path: str,
    folds_path: str,
    config: Mapping[str, Any],
    metrics_path: str,
    bars_path: str,
) -> dict[str, Any]:
    """Evaluate the baselines on one fold's test days with the agents' environment and cost model."""
    device = torch.device("cpu")  # rule baselines are a handful of vector ops: no GPU needed
    plan = FoldPlan.load(folds_path)
    window = fold_window(load_features(manifest_path), plan, fold, config, device, splits=("test",))
    data = window.splits["test"]
    env_config = env_config_from_config(config)
    per_strategy = {
        name: evaluate_positions(data, positions, env_config).select(BAR_COLUMNS)
        for name, positions in baseline_positions(data, config, fold).items()
    }
    bars = pl.concat([frame.with_columns(strategy=pl.lit(name)) for name, frame in per_strategy.items()])
    random_names = [name for name in per_strategy if name.startswith("random_")]
    # "random" is the equal-weight book of all random traders: per-bar averages of positions, returns and costs.
    random_mean = average_strategies([per_strategy[name] for name in random_names])
    strategies = {
        name: performance_summary(frame) for name, frame in per_strategy.items() if name not in random_names
    }
    strategies["random"] = performance_summary(random_mean)
    result = {
        "fold": fold,
        **_test_span(bars),
        "strategies": strategies,
        "random_seeds": len(random_names),
        "random_per_seed": [performance_summary(per_strategy[name]) for name in random_names],
        "costs": cost_model_from_config(config["costs"]).to_config(),
        "provenance": collect(dict(config)),
    }
    _write_bars(bars, bars_path)
    write_json_atomic(metrics_path, to_json_safe(result))
    return result
