"""Out-of-sample evaluation of trained models (agents and forecasters) and of the baselines on each fold's test days.

Every model and baseline sees exactly the same test rows, environment semantics and cost model; every output
carries per-bar positions, gross returns, costs and net returns (docs/OUTPUTS.md), plus a performance summary. A
trained model is scored with the env settings and costs recorded in its checkpoint. `validation_sharpe` is the
agents' form of the validation objective (`marketrl.training.zoo.positions_sharpe`) that hyperopt maximizes.
Which runs trade is the gate's decision (`marketrl.scoring.gate`): on the first fold each run's validation gate,
from the second on the model's walk-forward record (`walk_forward_record`, from the earlier folds' metrics.json).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from gpu_utils import resolve_device
from marketrl.env import (
    EnvConfig,
    MarketData,
    Policy,
    evaluate,
    evaluate_positions,
    format_duration,
    matched_random_positions,
    position_change_rate,
    rule_positions,
)
from marketrl.instruments.costs import Costs, costs_from_record
from marketrl.runtime.io import atomic_writes, json_text
from marketrl.runtime.provenance import collect
from marketrl.scoring.batched import score_positions
from marketrl.scoring.gate import (
    POOLED,
    FoldRecord,
    GateDecision,
    gated_positions,
    record_gate,
    record_or_pooled,
)
from marketrl.scoring.metrics import average_strategies, performance_summary, to_json_safe
from marketrl.settings.config import derive_seed
from marketrl.splits.datasets import (
    cost_model_from_config,
    env_config_from_config,
    fold_window,
    load_features_for_days,
)
from marketrl.splits.folds import FoldPlan, select_rows
from marketrl.splits.normalize import FeatureNormalizer
from marketrl.training.zoo import LoadedModel, get_entry, seeds_positions

log = logging.getLogger(__name__)

BAR_COLUMNS = (
    "ts_event",
    "trading_day",
    "symbol",
    "position",
    "gross_return",
    "cost",
    "net_return",
    "traded",
    "half_spread_ticks",
    "quote_fallback",
)
#: env settings that change what a trained policy sees or is charged (n_envs and episode_length shape only training)
POLICY_ENV_KEYS = ("window", "fill", "contracts", "max_gap")


class TrainedSettingsError(ValueError):
    """The config disagrees with the settings a model was trained with, or the checkpoint does not record them."""


def validation_sharpe(policy: Policy, data: MarketData, env_config: EnvConfig) -> float:
    """The objective hyperopt maximizes and training reports: annualized Sharpe of daily net returns of the
    greedy policy on `data` (0 when it stays flat)."""
    sharpe = performance_summary(evaluate(policy, data, env_config))["sharpe"]
    return 0.0 if sharpe is None or not math.isfinite(sharpe) else float(sharpe)


def trained_settings(
    meta: Mapping[str, Any], config: Mapping[str, Any], model_path: str | Path
) -> tuple[EnvConfig, Costs]:
    """The env settings and cost model the model was trained with, read from its checkpoint metadata.

    The config must agree on each of them (POLICY_ENV_KEYS and every cost field): agents and baselines are
    scored on the same terms, and a policy is never fed observations or charged costs it was not trained on.
    """
    env = meta.get("env")
    costs = (meta.get("extra") or {}).get("costs")
    if not isinstance(env, Mapping) or any(key not in env for key in POLICY_ENV_KEYS) or costs is None:
        missing = "costs" if isinstance(env, Mapping) and costs is None else "env settings"
        raise TrainedSettingsError(f"{model_path}: the checkpoint records no {missing}; retrain the model")
    max_gap = None if env["max_gap"] is None else timedelta(seconds=float(env["max_gap"]))
    current = env_config_from_config(config)
    trained = EnvConfig(
        window=env["window"],
        contracts=env["contracts"],
        fill=env["fill"],
        max_gap=max_gap,
        # training-only settings: evaluation steps every segment once, in one batch
        episode_length=current.episode_length,
        n_envs=current.n_envs,
    )
    for key in POLICY_ENV_KEYS:
        ours, theirs = getattr(trained, key), getattr(current, key)
        if ours != theirs:
            if key == "max_gap":
                ours, theirs = format_duration(ours), format_duration(theirs)
            raise TrainedSettingsError(
                f"config key 'env.{key}': the model at {model_path} was trained with {key}={ours}, "
                f"the config says {theirs}"
            )
    trained_costs = costs_from_record(costs)
    config_costs = cost_model_from_config(config["costs"]).to_config()
    # "kind" comes first: the other fields exist only for the same kind
    for key, value in trained_costs.to_config().items():
        if config_costs.get(key) != value:
            name = "model" if key == "kind" else key
            raise TrainedSettingsError(
                f"config key 'costs.{name}': the model at {model_path} was trained with {name}={value}, "
                f"the config says {config_costs.get(key)}"
            )
    return trained, trained_costs


def _test_span(bars: pl.DataFrame) -> dict[str, str | None]:
    days = bars["trading_day"]
    return {
        "test_first": None if days.is_empty() else str(days.min()),
        "test_last": None if days.is_empty() else str(days.max()),
    }


def forecast_columns(data: MarketData, predictions: torch.Tensor, horizon: int) -> pl.DataFrame:
    """Per decision bar t (the rows of `evaluate_positions`): ``prediction``, the forecaster's predicted forward
    return known at t, and ``forward_return``, the realized close_{t+h}/close_t - 1 inside t's segment (null where
    t+h is past the segment's last bar)."""
    rows = torch.arange(data.n_rows, device=data.device)
    ahead = (rows + horizon).clamp(max=data.n_rows - 1)
    inside = (rows + horizon < data.n_rows) & (data.segment_id.index_select(0, ahead) == data.segment_id)
    realized = data.close.index_select(0, ahead).double() / data.close.double() - 1.0
    decision_rows = np.flatnonzero(data.is_decision.cpu().numpy())
    inside_host = inside.cpu().numpy()[decision_rows]
    return pl.DataFrame(
        {
            "prediction": predictions.double().cpu().numpy()[decision_rows],
            "forward_return": np.where(inside_host, realized.cpu().numpy()[decision_rows], np.nan),
        }
    ).with_columns(pl.col("forward_return").fill_nan(None))


def load_runs(
    model: str, model_paths: Sequence[str], config: Mapping[str, Any], device: torch.device
) -> tuple[list[LoadedModel], EnvConfig, Costs]:
    """Every seed's checkpoint of `model`, and the env settings and cost model they were trained with (each
    seed's equal the config's, or `trained_settings` raises, hence each other's)."""
    entry = get_entry(model, config["training"]["extra_models"])
    runs = [entry.load(path, device) for path in model_paths]
    settings = [trained_settings(run.meta, config, path) for run, path in zip(runs, model_paths, strict=True)]
    env_config, cost_model = settings[0]
    return runs, env_config, cost_model


def runs_positions(
    runs: Sequence[LoadedModel],
    rows: pl.DataFrame,
    env_config: EnvConfig,
    cost_model: Costs,
    device: torch.device,
    gates: Sequence[GateDecision | None] | None = None,
) -> tuple[MarketData, list[torch.Tensor], list[torch.Tensor | None]]:
    """Every run's positions [T] (float32) on the feature rows `rows`, and a forecaster's predictions (None for
    an agent). Each run's rows are normalized with its own checkpoint's statistics (never refit here); agents that
    share them step in lockstep together. Returns the first run's MarketData too: its rows, prices and costs are
    the same whatever the normalizer. A run its gate set flat has all-flat positions: ``gates`` one decision per
    run (None: each run's own validation gate, as its checkpoint records it; `applied_gates`)."""
    data_of: dict[str, MarketData] = {}  # per distinct normalizer (the seeds of a fold normally share one)

    def data_for(meta: Mapping[str, Any]) -> MarketData:
        key = json.dumps(meta["normalizer"], sort_keys=True)
        if key not in data_of:
            normalizer = FeatureNormalizer.from_state_dict(meta["normalizer"])
            data_of[key] = MarketData.from_frame(
                rows, normalizer.feature_names, normalizer, cost_model, device, max_gap=env_config.max_gap
            )
        return data_of[key]

    with torch.inference_mode():
        # a forecaster predicts once: its positions and its forecast columns come from the same predictions
        predictions = [
            run.predictions(data_for(run.meta)) if run.predictions is not None else None for run in runs
        ]
        # agents whose seeds share the data step in lockstep together (one stacked forward a bar)
        shared = len({json.dumps(run.meta["normalizer"], sort_keys=True) for run in runs}) == 1
        together = seeds_positions(list(runs), data_for(runs[0].meta), env_config) if shared else None
        positions = together or [
            (
                run.positions(data_for(run.meta), env_config)
                if predicted is None or run.positions_from_predictions is None
                else run.positions_from_predictions(data_for(run.meta), predicted)
            ).to(torch.float32)
            for run, predicted in zip(runs, predictions, strict=True)
        ]
    # a run its gate set flat trades nothing (`marketrl.scoring.gate`); its predictions stay as they are
    decisions = [run.gate for run in runs] if gates is None else list(gates)
    positions = [gated_positions(p, gate) for p, gate in zip(positions, decisions, strict=True)]
    return data_for(runs[0].meta), positions, predictions


def read_test_records(paths: Sequence[str | Path]) -> list[FoldRecord]:
    """The walk-forward record's parts: per fold (in fold order), the seeds' mean of the ungated daily returns
    their metrics.json (``ungated``, `evaluate_job`) records; every seed of a fold must cover the same days."""
    by_fold: dict[int, list[dict[str, Any]]] = {}
    for path in paths:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        block = data.get("ungated")
        if not isinstance(block, Mapping) or not isinstance(data.get("fold"), int):
            raise ValueError(f"{path}: expected a model's metrics.json with 'fold' and an 'ungated' block")
        by_fold.setdefault(data["fold"], []).append(dict(block))
    records = []
    for fold in sorted(by_fold):
        blocks = by_fold[fold]
        days = tuple(blocks[0]["days"])
        if any(tuple(block["days"]) != days for block in blocks):
            raise ValueError(f"fold {fold}: the seeds' metrics.json record different test days")
        records.append(
            FoldRecord.of_seeds(
                days,
                [block["daily_net_returns"] for block in blocks],
                [block["daily_gross_returns"] for block in blocks],
                [block["avg_daily_turnover"] for block in blocks],
                blocks[0]["n_bars"],
            )
        )
    return records


def walk_forward_record(
    record_paths: Sequence[str | Path], min_t: float | None, before: Sequence[Any]
) -> GateDecision | None:
    """The record gate of a fold (`marketrl.scoring.gate.record_gate`) from the metrics.json of the model's
    earlier folds; None (each run's validation gate decides) without a threshold or without earlier folds. Every
    record day must lie before ``before`` (the days the decision is for): a record never holds a day it decides."""
    if min_t is None or not record_paths:
        return None
    records = read_test_records(record_paths)
    first = min(str(day) for day in before)
    late = [day for record in records for day in record.days if day >= first]
    if late:
        raise ValueError(
            f"walk-forward record: day {late[0]} is not before the first day it decides ({first})"
        )
    return record_gate(records, min_t)


def applied_gates(
    runs: Sequence[LoadedModel], record: GateDecision | None, pooled_min_t: float | None
) -> list[GateDecision | None]:
    """The decision each run trades under (`marketrl.scoring.gate.record_or_pooled`): the model's walk-forward
    record where it has one, unless the fold's seeds pooled earn on its validation tail at ``pooled_min_t``
    (training.pooled_min_t); else the run's own validation gate (its checkpoint's)."""
    return record_or_pooled(record, [run.gate for run in runs], pooled_min_t)


def _ungated(scores: Any, index: int) -> dict[str, Any]:
    """metrics.json ``ungated``: what run ``index`` would have made with no gate (its part of a later record)."""
    assert scores.summaries is not None and scores.daily_gross_returns is not None
    return {
        "days": [str(day) for day in scores.days],
        "daily_net_returns": scores.daily_net_returns[index].tolist(),
        "daily_gross_returns": scores.daily_gross_returns[index].tolist(),
        "avg_daily_turnover": scores.summaries[index]["avg_daily_turnover"],
        "n_bars": int(scores.summaries[index]["n_bars"]),
    }


def evaluate_job(
    *,
    model: str,
    fold: int,
    seed_indices: Sequence[int],
    manifest_path: str,
    folds_path: str,
    model_paths: Sequence[str],
    config: Mapping[str, Any],
    metrics_paths: Sequence[str],
    bars_paths: Sequence[str],
    record_paths: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Score every seed of one model x fold on the fold's test days: an agent by its greedy policy, a forecaster
    by its trading rule, with the env settings and costs of its checkpoint; each with its turnover-matched random
    traders. The test rows are built once; all seeds and all their traders are scored in one batched pass
    (`marketrl.scoring.batched.score_positions`). Writes one metrics JSON and one per-bar table per seed, all
    or none (`atomic_writes`), and returns the metrics in `seed_indices` order.

    The metrics JSON records ``kind`` ("agent" | "forecaster"); a forecaster's also records ``horizon``, and its
    bars carry the ``prediction`` and ``forward_return`` columns (`forecast_columns`). ``record_paths``: the
    metrics.json of the model's earlier folds (the walk-forward record, `walk_forward_record`; from the second fold
    on under training.record_min_t); ``flat_gate`` is the decision applied, ``ungated`` what the run would have
    made without it.
    """
    n_seeds = len(seed_indices)
    if not n_seeds or not n_seeds == len(model_paths) == len(metrics_paths) == len(bars_paths):
        raise ValueError(
            f"evaluate_job: expected one model, metrics and bars path per seed, got {n_seeds} seeds, "
            f"{len(model_paths)} models, {len(metrics_paths)} metrics and {len(bars_paths)} bars paths"
        )
    device = resolve_device(config["training"]["device"])
    runs, env_config, cost_model = load_runs(model, model_paths, config, device)
    fold_spec = FoldPlan.load(folds_path).fold(fold)
    # only the tables holding a test day are read (and hash-checked): the test rows need no other
    test_rows = select_rows(load_features_for_days(manifest_path, fold_spec.test_days), fold_spec, "test")
    record = walk_forward_record(record_paths, config["training"]["record_min_t"], fold_spec.test_days)
    gates = applied_gates(runs, record, config["training"]["pooled_min_t"])
    data, ungated, predictions = runs_positions(
        runs, test_rows, env_config, cost_model, device, gates=[None] * len(runs)
    )
    positions = [gated_positions(p, gate) for p, gate in zip(ungated, gates, strict=True)]
    if record is not None:
        log.info(
            "%s fold %d: walk-forward record t %.2f over %d days -> %s",
            model,
            fold,
            record.t_stat,
            record.n_days,
            "set flat" if record.set_flat else "trades",
        )
        if gates and gates[0] is not None and gates[0].basis == POOLED:
            log.info(
                "%s fold %d: its seeds pooled earn on the validation tail (t %.2f >= %.2f) -> trades",
                model,
                fold,
                gates[0].pooled_t,
                gates[0].min_t,
            )
    # Scored on the CPU: its scatter sums and products run in a fixed order, CUDA's atomics do not, and the same
    # config must give the same bytes. A few seconds for a model x fold of demo size (bench/speed/evaluate.py).
    cpu = torch.device("cpu")
    scored_runs = score_runs(
        data.to(cpu),
        [p.to(cpu) for p in positions],
        env_config,
        config,
        [(model, fold, s) for s in seed_indices],
    )
    unscored = score_positions(
        data.to(cpu), torch.stack([p.to(cpu, torch.float32) for p in ungated]), env_config
    )
    provenance = collect(dict(config), device=str(device))  # the same for every seed: collected once
    frames, results = [], []
    for index, ((bars, scored), seed_index, run, model_path, predicted, gate) in enumerate(
        zip(scored_runs, seed_indices, runs, model_paths, predictions, gates, strict=True)
    ):
        extra: dict[str, Any] = {}
        if predicted is not None and run.horizon is not None:
            bars = pl.concat([bars, forecast_columns(data, predicted, run.horizon)], how="horizontal")
            extra["horizon"] = run.horizon
        sharpe = scored["metrics"]["sharpe"]
        log.info(
            "%s fold %d seed %d: test Sharpe %s over %d bars", model, fold, seed_index, sharpe, bars.height
        )
        frames.append(bars)
        results.append(
            {
                "algo": model,  # on-disk key kept for compatibility
                "kind": run.kind,
                **extra,
                "fold": fold,
                "seed_index": seed_index,
                "seed": derive_seed(config["seed"], "train", model, fold, seed_index),
                **_test_span(bars),
                **scored,
                "model": {"path": str(model_path), **run.info},
                **({} if gate is None else {"flat_gate": gate.to_dict()}),
                "ungated": _ungated(unscored, index),
                "provenance": provenance,
            }
        )
    texts = [json_text(to_json_safe(result)) for result in results]  # serialized before any file is opened
    with atomic_writes([*metrics_paths, *bars_paths]) as tmps:
        for text, tmp in zip(texts, tmps[:n_seeds], strict=True):
            tmp.write_text(text, encoding="utf-8")
        for bars, tmp in zip(frames, tmps[n_seeds:], strict=True):
            bars.write_parquet(tmp, compression="zstd")
    return results


def score_runs(
    data: MarketData,
    positions: Sequence[torch.Tensor],
    env_config: EnvConfig,
    config: Mapping[str, Any],
    keys: Sequence[tuple[str, int, int]],
) -> list[tuple[pl.DataFrame, dict[str, Any]]]:
    """Score R runs' positions ([T] each) and their turnover-matched random traders (`matched_trader_positions`,
    seeded by each run's key (model, fold, seed index)) in one batched pass (`score_positions`).

    Per run: its per-bar frame (BAR_COLUMNS) and its metrics.json fields ``metrics`` (the performance summary)
    and ``matched_random`` (change_rate, days, daily_net_returns and per_seed summaries of its traders)."""
    matched = [matched_trader_positions(data, p, config, key) for p, key in zip(positions, keys, strict=True)]
    stacked = torch.stack([p.to(torch.float32) for p in positions])
    scores = score_positions(data, torch.cat([stacked, *(traders for _, traders in matched)]), env_config)
    assert scores.summaries is not None
    n_runs, n_traders = len(positions), config["evaluation"]["random_baseline_seeds"]
    out = []
    for r, (rate, _) in enumerate(matched):
        traders = slice(n_runs + r * n_traders, n_runs + (r + 1) * n_traders)
        block = {
            "change_rate": rate,
            "days": [str(day) for day in scores.days] if n_traders else [],
            "daily_net_returns": scores.daily_net_returns[traders].tolist(),
            "per_seed": scores.summaries[traders],
        }
        bars = evaluate_positions(data, positions[r], env_config).select(BAR_COLUMNS)
        out.append((bars, {"metrics": scores.summaries[r], "matched_random": block}))
    return out


def matched_trader_positions(
    data: MarketData, positions: torch.Tensor, config: Mapping[str, Any], key: tuple[str, int, int]
) -> tuple[float, torch.Tensor]:
    """The change rate of one run's positions [T] and the positions [N, T] of its turnover-matched random traders
    (`evaluation.random_baseline_seeds` = N of them, seeded from `config["seed"]` and `key`): each changes
    position as often as the run did on these test days, in a random direction. Score them with the run
    (`score_positions`)."""
    rate = position_change_rate(data, positions)
    traders = [
        matched_random_positions(data, rate, seed=derive_seed(config["seed"], "matched_random", *key, i))
        for i in range(config["evaluation"]["random_baseline_seeds"])
    ]
    stacked = torch.stack(traders) if traders else torch.zeros(0, data.n_rows, device=data.device)
    return rate, stacked


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
    fold_spec = plan.fold(fold)
    # the normalizer is fit on the inner training days and the baselines trade the test days: no other table is read
    table = load_features_for_days(manifest_path, (*fold_spec.inner_train_days, *fold_spec.test_days))
    window = fold_window(table, plan, fold, config, device, splits=("test",))
    data = window.splits["test"]
    env_config = env_config_from_config(config)
    positions = baseline_positions(data, config, fold)
    # every strategy's summary in one batched pass; the per-bar frames are the bars.parquet output
    scores = score_positions(data, torch.stack(list(positions.values())), env_config)
    assert scores.summaries is not None
    summaries = dict(zip(positions, scores.summaries, strict=True))
    per_strategy = {
        name: evaluate_positions(data, strategy, env_config).select(BAR_COLUMNS)
        for name, strategy in positions.items()
    }
    bars = pl.concat([frame.with_columns(strategy=pl.lit(name)) for name, frame in per_strategy.items()])
    random_names = [name for name in per_strategy if name.startswith("random_")]
    # "random" is the equal-weight book of all random traders: per-bar averages of positions, returns and costs.
    random_mean = average_strategies([per_strategy[name] for name in random_names])
    strategies = {name: summary for name, summary in summaries.items() if name not in random_names}
    strategies["random"] = performance_summary(random_mean)
    result = {
        "fold": fold,
        **_test_span(bars),
        "strategies": strategies,
        "random_seeds": len(random_names),
        "random_per_seed": [summaries[name] for name in random_names],
        "costs": cost_model_from_config(config["costs"]).to_config(),
        "provenance": collect(dict(config)),
    }
    text = json_text(to_json_safe(result))
    with atomic_writes([metrics_path, bars_path]) as (metrics_tmp, bars_tmp):
        metrics_tmp.write_text(text, encoding="utf-8")
        bars.write_parquet(bars_tmp, compression="zstd")
    return result
