"""Synthetic but realistic pipeline outputs (the files of docs/OUTPUTS.md) for the report's tests.

`write_pipeline_outputs(root)` writes a fold plan, per-seed agent evaluations, per-fold baselines with several
random seeds, hyperopt summaries and training logs under `root`, and returns the paths and config that
`marketrl.report.build_report` takes. Agents have a tunable `skill`: the probability that the sign of their
position matches the sign of the coming bar return (0.5 = no skill; costs then make them lose). Models named in
FORECASTERS are written as forecasters (docs/OUTPUTS.md): `"kind": "forecaster"`, a `horizon`, and per bar a
`prediction` whose correlation with the realized forward return is `forecast_ic` (0 = no information), traded
on its sign.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from marketrl.runtime.io import write_json_atomic
from marketrl.scoring.metrics import (
    REQUIRED_COLUMNS,
    daily_returns,
    performance_summary,
    portfolio_bars,
    to_json_safe,
)
from marketrl.settings.config import load_config
from marketrl.splits.folds import FoldConfig, FoldPlan, make_fold_plan

REPO_ROOT = Path(__file__).resolve().parents[1]
AGENTS = ("dqn", "ppo")
FORECASTERS = ("linear", "lightgbm", "mlp", "lstm", "gru", "alstm", "tcn", "transformer", "dlinear")
BAR_VOLATILITY = 3e-4
MINUTE_NS = 60 * 10**9


@dataclass(frozen=True)
class PipelineOutputs:
    """Paths and config of one synthetic pipeline run; `report_kwargs(out)` feeds build_report."""

    root: Path
    eval_files: list[str]
    hyperopt_files: list[str]
    folds_path: str
    train_logs: list[str]
    config: dict[str, Any]
    plan: FoldPlan

    @property
    def bar_files(self) -> list[str]:
        """The per-bar table of each evaluation (this fixture writes it beside the metrics)."""
        return [str(Path(path).with_name("bars.parquet")) for path in self.eval_files]

    def report_kwargs(self, out_path: str | Path) -> dict[str, Any]:
        return {
            "eval_files": list(self.eval_files),
            "bar_files": self.bar_files,
            "hyperopt_files": list(self.hyperopt_files),
            "folds_path": self.folds_path,
            "train_logs": list(self.train_logs),
            "config": copy.deepcopy(self.config),
            "out_path": str(out_path),
        }


def _weekdays(start: date, count: int) -> list[date]:
    days, day = [], start
    while len(days) < count:
        if day.weekday() < 5:
            days.append(day)
        day += timedelta(days=1)
    return days


def _market(
    days: Sequence[date], symbols: Sequence[str], bars_per_day: int, rng: np.random.Generator
) -> pl.DataFrame:
    """Per (symbol, bar): fat-tailed, cross-correlated bar returns (the return the position earns over the bar)."""
    n = len(days) * bars_per_day
    shared = rng.standard_t(4, n) / math.sqrt(2.0)
    frames = []
    base = np.array([np.datetime64(d, "ns") for d in days])
    ts = (base[:, None] + np.arange(bars_per_day)[None, :] * np.timedelta64(MINUTE_NS, "ns")).ravel()
    day_of_bar = np.repeat(np.array(days, dtype="datetime64[D]"), bars_per_day)
    for symbol in symbols:
        own = rng.standard_t(4, n) / math.sqrt(2.0)
        returns = BAR_VOLATILITY * (0.85 * shared + math.sqrt(1 - 0.85**2) * own)
        frames.append(
            pl.DataFrame({"ts_event": ts, "trading_day": day_of_bar, "symbol": symbol, "ret": returns})
        )
    return pl.concat(frames).with_columns(
        pl.col("ts_event").dt.replace_time_zone("UTC"), pl.col("trading_day").cast(pl.Date)
    )


def _bars(market: pl.DataFrame, positions: np.ndarray, cost_per_side: float) -> pl.DataFrame:
    """Per-bar table: gross = position × bar return, cost on every change of position (flat before the first bar)."""
    frame = market.with_columns(pl.Series("position", positions, dtype=pl.Float64))
    previous = pl.col("position").shift(1).over("symbol").fill_null(0.0)
    frame = frame.with_columns(
        (pl.col("position") * pl.col("ret")).alias("gross_return"),
        (cost_per_side * (pl.col("position") - previous).abs()).alias("cost"),
    ).with_columns((pl.col("gross_return") - pl.col("cost")).alias("net_return"))
    return frame.select(
        "ts_event",
        "trading_day",
        "symbol",
        pl.col("position").cast(pl.Float32),
        pl.col("gross_return").cast(pl.Float32),
        pl.col("cost").cast(pl.Float32),
        pl.col("net_return").cast(pl.Float32),
    )


def _agent_positions(market: pl.DataFrame, skill: float, hold: int, rng: np.random.Generator) -> np.ndarray:
    """Decide every `hold` bars per symbol; the position's sign matches the next `hold` bars' return with
    probability `skill` (a stand-in for a trained agent; skill > 0.5 is look-ahead by construction)."""
    coming = market.select(
        pl.col("ret").rolling_sum(hold, min_samples=1).shift(-(hold - 1)).over("symbol").fill_null(0.0)
    )["ret"].to_numpy()
    correct = rng.random(coming.size) < skill
    position = np.where(correct, np.sign(coming), -np.sign(coming))
    position = np.where(rng.random(coming.size) < 0.15, 0.0, position)
    bar_of_symbol = market.select(pl.int_range(pl.len()).over("symbol"))["literal"].to_numpy()
    decision_row = np.arange(coming.size) - bar_of_symbol % hold
    return position[decision_row]


def forward_returns(market: pl.DataFrame, horizon: int) -> np.ndarray:
    """Realized forward return over `horizon` bars from each bar, within its symbol and day (NaN where the day
    ends first): prod(1 + ret) over the bar and the next horizon − 1 ones, minus 1."""
    growth = market.select(
        (pl.col("ret") + 1.0).log().rolling_sum(horizon).shift(-(horizon - 1)).over("symbol", "trading_day")
    )["ret"].to_numpy()
    return np.expm1(growth.astype(np.float64))


def _forecasts(
    market: pl.DataFrame, horizon: int, ic: float, hold: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prediction, forward return, positions) of a forecaster whose prediction correlates `ic` with the
    standardized forward return; it holds the sign of its prediction for `hold` bars (flat in 15% of blocks)."""
    forward = forward_returns(market, horizon)
    scale = BAR_VOLATILITY * math.sqrt(horizon)
    signal = np.where(np.isfinite(forward), forward / scale, rng.standard_normal(forward.size))
    noise = rng.standard_normal(forward.size)
    prediction = scale * (ic * signal + math.sqrt(1.0 - ic**2) * noise) * 0.1
    position = np.sign(prediction)
    position = np.where(rng.random(forward.size) < 0.15, 0.0, position)
    bar_of_symbol = market.select(pl.int_range(pl.len()).over("symbol"))["literal"].to_numpy()
    decision_row = np.arange(forward.size) - bar_of_symbol % hold
    return prediction, forward, position[decision_row]


def _momentum_positions(market: pl.DataFrame, lookback: int) -> np.ndarray:
    signal = market.select(
        pl.col("ret").rolling_sum(lookback, min_samples=1).shift(1).over("symbol").fill_null(0.0)
    )["ret"]
    return np.sign(signal.to_numpy())


def _random_positions(n: int, rng: np.random.Generator) -> np.ndarray:
    changes = rng.random(n) < 0.05
    choice = rng.integers(-1, 2, n).astype(np.float64)
    index = np.maximum.accumulate(np.where(changes, np.arange(n), 0))
    return choice[index]


def _matched_random_block(
    market: pl.DataFrame,
    positions: np.ndarray,
    cost_per_side: float,
    n_traders: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """The evaluate job's `matched_random` block: traders that change position as often as `positions` (per
    symbol, from flat), to one of the two other positions at random; their daily net returns and summaries."""
    symbol = market["symbol"].to_numpy()
    first = np.r_[True, symbol[1:] != symbol[:-1]]
    previous = np.where(first, 0.0, np.r_[0.0, positions[:-1]])
    rate = float(np.mean(positions != previous))
    per_seed, daily, days = [], [], []
    for _ in range(n_traders):
        steps = np.where(rng.random(positions.size) < rate, rng.integers(1, 3, positions.size), 0)
        total = np.cumsum(steps)
        segment_total = total - np.maximum.accumulate(np.where(first, total - steps, 0))
        bars = _bars(market, ((1 + segment_total) % 3 - 1).astype(np.float64), cost_per_side)
        portfolio = portfolio_bars(bars)
        trader_days, returns = daily_returns(portfolio["trading_day"], portfolio["portfolio_return"])
        days = [str(day) for day in trader_days.astype("datetime64[D]")]
        daily.append(returns.tolist())
        per_seed.append(_summary(bars))
    return {"change_rate": rate, "days": days, "daily_net_returns": daily, "per_seed": per_seed}


def _summary(bars: pl.DataFrame) -> dict[str, Any]:
    return to_json_safe(performance_summary(bars))


def _hyperopt_summary(
    model: str,
    n_trials: int,
    n_complete_max: int | None,
    rng: np.random.Generator,
    plan: FoldPlan,
    fold: int | None = None,
) -> dict[str, Any]:
    trials, daily = [], []
    for number in range(n_trials):
        params: dict[str, Any] = {
            "hidden_dim_base": int(rng.choice([64, 128, 256])),
            "learning_rate": float(10 ** rng.uniform(-5, -3)),
            "gamma": float(rng.uniform(0.9, 0.999)),
        }
        if model == "ppo":
            params["clip_range"] = float(rng.uniform(0.1, 0.3))
        elif model == "dqn":
            params["target_update_steps"] = int(rng.integers(500, 5000))
        else:
            params["threshold_multiplier"] = float(rng.uniform(0.5, 3.0))
        sharpe_daily = float(rng.normal(0.0, 0.08))
        pruned = number % 4 == 3
        completed_so_far = len(daily)
        if n_complete_max is not None and completed_so_far >= n_complete_max:
            pruned = True
        state = "PRUNED" if pruned else "COMPLETE"
        annual = sharpe_daily * math.sqrt(252)
        intermediate = {"1": annual * 0.5, "2": annual * 0.8}
        trial = {
            "number": number,
            "state": state,
            "value": None if pruned else annual,
            "params": params,
            "intermediate": {"1": intermediate["1"]} if pruned else intermediate,
            "user_attrs": {"setup_s": 0.02, "train_s": float(rng.uniform(5, 15))}
            | ({} if pruned else {"val_sharpe_daily": sharpe_daily}),
        }
        trials.append(trial)
        if not pruned:
            daily.append(sharpe_daily)
    complete = [t for t in trials if t["state"] == "COMPLETE"]
    best = max(complete, key=lambda t: t["value"]) if complete else None
    tuning = plan.tuning_for(fold)
    return {
        "algo": model,
        "fold": fold,
        "objective": "annualized Sharpe of daily net returns on the tuning validation tail",
        "direction": "maximize",
        "best_params": best["params"] if best else {},
        "best_value": best["value"] if best else None,
        "best_trial": best["number"] if best else None,
        "n_trials": n_trials,
        "n_complete": len(complete),
        "n_pruned": n_trials - len(complete),
        "n_failed": 0,
        "trials": trials,
        "trial_sharpe_daily": daily,
        "sampler": {"name": "TPESampler", "seed": 123},
        "tuning_window": {
            "first_day": tuning.first_day.isoformat(),
            "last_day": tuning.last_day.isoformat(),
            "train_first": tuning.train_days[0].isoformat(),
            "train_last": tuning.train_days[-1].isoformat(),
            "validation_first": tuning.validation_days[0].isoformat(),
            "validation_last": tuning.validation_days[-1].isoformat(),
        },
        "precision": {"mode": "fp32", "reason": "cpu: fp32"},
        "provenance": {"packages": {"torch": "2.13.0"}, "git_commit": "0123abc", "config_hash": "fixture"},
    }


def _forecaster_train_log(model: str, fold: int, seed_index: int, rng: np.random.Generator) -> dict[str, Any]:
    """A supervised model's log as the model zoo writes it: training records (loss, batch count, gradient norm)
    and validation-loss records in `history`, the validation Sharpes only in `validation`."""
    history: list[dict[str, Any]] = []
    for i in range(1, 9):
        history.append(
            {
                "step": 50 * i,
                "loss": float(1.0 * math.exp(-i / 3) + 0.9 + rng.normal(0, 0.01)),
                "count": 50,
                "grad_norm": float(abs(rng.normal(0.5, 0.1))),
            }
        )
        history.append({"step": 50 * i, "validation_loss": float(0.5 * math.exp(-i / 5) + 0.95)})
    validation = [{"step": 100 * i, "val_sharpe": float(rng.normal(0.2, 0.3))} for i in range(1, 5)]
    return {
        "algo": model,
        "fold": fold,
        "seed_index": seed_index,
        "seed": 1000 * fold + seed_index,
        "hparams": {"hidden_dim_base": 64, "window": 16, "threshold_multiplier": 1.5},
        "hidden_sizes": {"encoder": [64, 32]} if model not in ("linear", "lightgbm") else {},
        "precision": {"mode": "fp32", "reason": "cpu: fp32"},
        "device": "cpu",
        "total_steps": 400,
        "wall_s": 3.1,
        "steps_per_s": 129.0,
        "host_syncs": 12,
        "history": history,
        "validation": validation,
        "provenance": {"git_commit": "0123abc"},
    }


def _train_log(model: str, fold: int, seed_index: int, rng: np.random.Generator) -> dict[str, Any]:
    if model in FORECASTERS:
        return _forecaster_train_log(model, fold, seed_index, rng)
    history = []
    for i in range(1, 11):
        step = i * 6000
        history.append(
            {
                "step": step,
                "loss": float(0.05 * math.exp(-i / 4) + rng.normal(0, 0.002)),
                "entropy": float(1.09 - 0.04 * i) if model == "ppo" else None,
                "value_mean": float(rng.normal(0, 0.01)) if model == "ppo" else None,
                "q_mean": float(0.01 * i + rng.normal(0, 0.005)) if model == "dqn" else None,
                "episode_return_mean": float(-0.002 + 0.0003 * i + rng.normal(0, 0.0005)),
                "val_sharpe": float(rng.normal(0.1 * i / 10, 0.2)),
            }
        )
    return {
        "algo": model,
        "fold": fold,
        "seed_index": seed_index,
        "seed": 1000 * fold + seed_index,
        "hparams": {"hidden_dim_base": 128, "learning_rate": 3e-4},
        "hidden_sizes": {"policy": [128, 64], "value": [256, 128, 64]},
        "precision": {"mode": "fp32", "reason": "cpu: fp32"},
        "device": "cpu",
        "total_steps": 60000,
        "wall_s": 41.2,
        "steps_per_s": 1456.3,
        "host_syncs": 610,
        "history": history,
        "provenance": {"git_commit": "0123abc", "inputs": {"results/features/demo.parquet": "ab" * 32}},
    }


def _gate_record(set_flat: bool) -> dict[str, Any]:
    """A validation gate's record (marketrl.scoring.gate.GateDecision.to_dict) that sets the run flat or not."""
    return {
        "set_flat": set_flat,
        "t_stat": 0.2 if set_flat else 2.5,
        "min_t": 1.0,
        "net_sharpe": -1.5 if set_flat else 2.0,
        "gross_sharpe": 0.5 if set_flat else 2.6,
        "turnover": 4.0,
        "n_bars": 240,
        "n_days": 2,
    }


def _validation_curve(trend: float, rng: np.random.Generator) -> list[dict[str, float]]:
    """EVALS_PER_RUN validation records as train.ProgressLog writes them: {step, val_sharpe, elapsed_s}."""
    return [
        {"step": 1000 * i, "val_sharpe": float(trend * i + rng.normal(0.0, 0.02)), "elapsed_s": 1.5 * i}
        for i in range(1, 6)
    ]


def write_pipeline_outputs(
    root: str | Path,
    *,
    models: Sequence[str] = ("dqn", "ppo"),
    n_folds: int = 3,
    n_seeds: int = 2,
    test_days: int = 3,
    bars_per_day: int = 60,
    symbols: Sequence[str] = ("SYNTH-ES", "SYNTH-NQ"),
    random_seeds: int = 5,
    n_trials: int = 10,
    n_complete_max: int | None = None,
    skill: Mapping[str, float] | None = None,
    forecast_ic: Mapping[str, float] | None = None,
    horizon: int = 5,
    hold_bars: int = 10,
    cost_per_side: float = 2e-5,
    bootstrap_samples: int = 200,
    seed: int = 0,
    matched_random: bool = True,
    per_fold: bool = False,
    flat_models: Sequence[str] = (),
    gated: Mapping[str, Collection[tuple[int, int]]] | None = None,
    validation_trend: Mapping[str, float] | None = None,
    random_cost_per_side: float | None = None,
) -> PipelineOutputs:
    """Write a complete set of the fan-out's outputs under `root` (see the module docstring); `per_fold`: one
    hyperopt summary per model x fold (hyperopt.per_fold) instead of one per model.

    Degenerate models for the "did it learn?" diagnostics (none by default; the other draws stay as they are):
    `flat_models` never leave flat; every run of a model in `gated` carries a validation gate record
    (metrics.json `flat_gate`), which sets its (fold, seed index) pairs flat (no position on any test bar);
    a model in `validation_trend` logs EVALS_PER_RUN validation Sharpes (train_log.json `validation`) that
    change by that much per evaluation, with a little noise. `random_cost_per_side` prices the random-baseline
    traders' trades apart from everyone else's (default: `cost_per_side`)."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    skill = dict(skill or {})
    forecast_ic = dict(forecast_ic or {})
    gated = {model: set(pairs) for model, pairs in (gated or {}).items()}
    validation_trend = dict(validation_trend or {})
    fold_config = FoldConfig(
        n=n_folds,
        scheme="expanding",
        train_days=12,
        test_days=test_days,
        validation_days=2,
        embargo_bars=30,
        tuning_days=12,
        tuning_validation_days=3,
    )
    plan = make_fold_plan(_weekdays(date(2024, 1, 2), fold_config.required_days), fold_config)
    folds_path = root / "results" / "folds.json"
    plan.save(folds_path)

    eval_files: list[str] = []
    for fold in plan.folds:
        market = _market(fold.test_days, symbols, bars_per_day, rng)
        fold_meta = {
            "fold": fold.index,
            "test_first": fold.first_test_day.isoformat(),
            "test_last": fold.last_test_day.isoformat(),
        }
        for model in models:
            for seed_index in range(n_seeds):
                kind: dict[str, Any] = {}
                if model in FORECASTERS:
                    prediction, forward, positions = _forecasts(
                        market, horizon, forecast_ic.get(model, 0.0), hold_bars, rng
                    )
                    bars = _bars(market, positions, cost_per_side).with_columns(
                        pl.Series("prediction", prediction),
                        pl.Series("forward_return", forward).fill_nan(None),
                    )
                    kind = {"kind": "forecaster", "horizon": horizon}
                else:
                    positions = _agent_positions(market, skill.get(model, 0.5), hold_bars, rng)
                    bars = _bars(market, positions, cost_per_side)
                    kind = {"kind": "agent"}
                set_flat = (fold.index, seed_index) in gated.get(model, set())
                if model in flat_models or set_flat:
                    positions = np.zeros_like(positions)
                    flat = _bars(market, positions, cost_per_side)
                    bars = flat.with_columns(*(bars[c] for c in bars.columns if c not in flat.columns))
                if model in gated:
                    kind["flat_gate"] = _gate_record(set_flat)
                folder = root / "results" / "eval" / model / f"fold_{fold.index}" / f"seed_{seed_index}"
                folder.mkdir(parents=True, exist_ok=True)
                bars.write_parquet(folder / "bars.parquet")
                write_json_atomic(
                    folder / "metrics.json",
                    {
                        **fold_meta,
                        "algo": model,
                        "seed_index": seed_index,
                        "seed": 7 + seed_index,
                        "metrics": _summary(bars.select(REQUIRED_COLUMNS)),
                        "provenance": {},
                    }
                    | kind
                    | (
                        {
                            "matched_random": _matched_random_block(
                                market,
                                positions,
                                cost_per_side,
                                random_seeds,
                                # its own stream: the other fixtures' draws stay as they were
                                np.random.default_rng(
                                    (seed, fold.index, list(models).index(model), seed_index)
                                ),
                            )
                        }
                        if matched_random
                        else {}
                    ),
                )
                eval_files.append(str(folder / "metrics.json"))
        n = market.height
        strategies = {
            "buy_and_hold": np.ones(n),
            "flat": np.zeros(n),
            "momentum": _momentum_positions(market, 10),
        }
        tables = [
            _bars(market, pos, cost_per_side).with_columns(pl.lit(name).alias("strategy"))
            for name, pos in strategies.items()
        ]
        random_tables = [
            _bars(
                market,
                _random_positions(n, rng),
                cost_per_side if random_cost_per_side is None else random_cost_per_side,
            ).with_columns(pl.lit(f"random_{i}").alias("strategy"))
            for i in range(random_seeds)
        ]
        all_bars = pl.concat(tables + random_tables)
        folder = root / "results" / "eval" / "baselines" / f"fold_{fold.index}"
        folder.mkdir(parents=True, exist_ok=True)
        all_bars.write_parquet(folder / "bars.parquet")
        random_mean = (
            pl.concat(random_tables)
            .group_by("symbol", "ts_event")
            .agg(
                pl.col("trading_day").first(),
                *(pl.col(c).mean() for c in ("position", "gross_return", "cost", "net_return")),
            )
        )
        summaries = {
            name: _summary(table.drop("strategy")) for name, table in zip(strategies, tables, strict=True)
        }
        summaries["random"] = _summary(random_mean)
        write_json_atomic(
            folder / "metrics.json", {**fold_meta, "strategies": summaries, "random_seeds": random_seeds}
        )
        eval_files.append(str(folder / "metrics.json"))

    hyperopt_files = []
    for model in models:
        for fold in [fold.index for fold in plan.folds] if per_fold else [None]:
            name = f"{model}.json" if fold is None else f"{model}/fold_{fold}.json"
            path = root / "results" / "hyperopt" / name
            write_json_atomic(path, _hyperopt_summary(model, n_trials, n_complete_max, rng, plan, fold))
            hyperopt_files.append(str(path))

    train_logs = []
    for model in models:
        for fold in plan.folds:
            for seed_index in range(n_seeds):
                path = (
                    root
                    / "results"
                    / "models"
                    / model
                    / f"fold_{fold.index}"
                    / f"seed_{seed_index}"
                    / "train_log.json"
                )
                log = _train_log(model, fold.index, seed_index, rng)
                if model in validation_trend:
                    log["validation"] = _validation_curve(
                        validation_trend[model], np.random.default_rng((seed, fold.index, seed_index))
                    )
                write_json_atomic(path, log)
                train_logs.append(str(path))

    config = load_config(REPO_ROOT / "config.yaml")
    # Before the model zoo the key was training.algos; the report reads either (whichever the config has).
    key = "models" if "models" in config["training"] else "algos"
    config["training"][key] = list(models)
    config["training"]["seeds"] = n_seeds
    config["folds"] = {**config["folds"], "n": n_folds, "test_days": test_days}
    config["evaluation"]["bootstrap_samples"] = bootstrap_samples
    config["hyperopt"]["per_fold"] = per_fold
    config["evaluation"]["random_baseline_seeds"] = random_seeds
    config["data"]["databento"]["symbols"] = list(symbols)
    return PipelineOutputs(root, eval_files, hyperopt_files, str(folds_path), train_logs, config, plan)
