"""Benchmark: what one hyperopt trial costs at each corner of a model's search space, next to its median trial.

    python bench/speed/hyperopt_cost.py                   # every model, full trial budgets (config.yaml), CPU, 1 thread
    python bench/speed/hyperopt_cost.py --only dqn lstm   # some models
    python bench/speed/hyperopt_cost.py --quick           # tiny budgets, two models (what tests/test_bench_quick.py runs)

A **trial** is what `marketrl.training.hyperopt.run_trial` runs for one seed: the zoo entry's `train` call on the
tuning window's train split with its validation split (ten validations, as in hyperopt), at the SAME budget as
hyperopt (`hyperopt.trial_steps` env steps for agents, `hyperopt.trial_updates` optimizer steps or boosting rounds
for forecasters, from config.yaml), then the validation Sharpe of its positions. No pruning. The search space is
the entry's own (`entry.search_space(budget, window, config)`), so an agent's batch sizes are bounded by the
device as in a worker.

Data: `--days` demo days (marketrl.data.demo) featurized as the pipeline does (51 features), the first
`days - validation_days` as train rows and the last `--validation-days` as validation rows, normalized on the
train rows: the shape of the default tuning window (folds.tuning_days=12, tuning_validation_days=4).

For each model:
* **corners**: every combination of the extreme values (low/high of a range, smallest/largest of numeric
  choices) of the parameters that drive the cost at a fixed step budget (the `bounds` of the model's
  `ModelProfile`, in its own file); every other parameter (learning rate, gamma, coefficients...) at the middle
  of its range.
* **warm-up**: one untimed trial (the cheapest corner) first, so that no timed trial pays one-time costs.
* **median trial**: `--median-trials` random draws from the whole space (log-uniform where the space is log,
  uniform choices, as Optuna's random start-up samples); the median of their costs.

Cost = `time.process_time()` of the trial (CPU seconds of this process, torch at `--threads` threads), which a
loaded machine disturbs far less than wall time. Printed per model: each corner, its cost and its ratio to the
median trial, then the worst ratio; `--json` keeps every figure with the analytic `cost_proxy` of each trial
(the profile's `trial_cost`; tests/test_search_space_bounds.py bounds that proxy; the bench reports how it
correlates with the measured cost).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
# run as `python bench/speed/hyperopt_cost.py`: sys.path holds bench/speed/, not the checkout that tests.support is in
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.search_cost import (  # noqa: E402
    TrialSizes,
    corners,
    cost_drivers,
    cost_proxy,
    random_trials,
)

QUICK_MODELS = ("dqn", "mlp")


# ------------------------------------------------------------------------------------------------ the run


@dataclass
class TrialCost:
    """One measured trial."""

    label: str
    hparams: dict[str, Any]
    cpu_s: float
    proxy: float
    score: float
    ratio: float | None = None


@dataclass
class ModelCosts:
    """Every measured trial of one model."""

    model: str
    drivers: tuple[str, ...]
    median_trials: list[TrialCost] = field(default_factory=list)
    corners: list[TrialCost] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(t.cpu_s for t in self.median_trials)

    @property
    def worst(self) -> TrialCost:
        return max(self.corners, key=lambda t: t.cpu_s)


def tuning_data(
    days: int, validation_days: int, config_path: Path, validation_bars: int | None = None
) -> tuple[Any, dict[str, Any]]:
    """`days` demo days -> feature tables -> a WindowData with train and validation splits on the CPU, and the
    run config (config.yaml, NQ costed with its own contract spec). `validation_bars`: only each instrument's
    first bars of the validation days (--quick: a validation pass steps bar by bar and would dominate)."""
    import polars as pl
    import yaml

    from marketrl.data.definitions import demo_run_config
    from marketrl.data.demo import generate_demo_files
    from marketrl.features import build_feature_file
    from marketrl.splits.datasets import build_window, load_feature_tables

    overrides = yaml.safe_load(config_path.read_text())
    with tempfile.TemporaryDirectory(prefix="bench-hyperopt-cost-") as tmp:
        raw = generate_demo_files(Path(tmp) / "raw", "2024-01-02", days, seed=0)
        tables = []
        for i, path in enumerate(raw):
            out = Path(tmp) / "features" / path.name.replace(".dbn.zst", ".parquet")
            build_feature_file(path, out, prev_src=raw[i - 1] if i else None)
            tables.append(out)
        table = load_feature_tables(tables)
        config = demo_run_config(Path(tmp) / "raw", overrides)
    trading_days = sorted(table["trading_day"].unique().to_list())
    cut = trading_days[len(trading_days) - validation_days]
    frames = {
        "train": table.filter(pl.col("trading_day") < cut),
        "validation": table.filter(pl.col("trading_day") >= cut),
    }
    if validation_bars is not None:
        first = pl.int_range(pl.len()).over("instrument_id") < validation_bars
        frames["validation"] = frames["validation"].filter(first)
    return build_window(table, frames, config, "cpu"), config


def measure(
    model: str, hparams: dict[str, Any], window: Any, config: dict[str, Any], seed: int
) -> tuple[float, float]:
    """(CPU seconds, validation Sharpe) of one trial of `model` with `hparams`, as `run_trial` runs one seed."""
    import torch

    from gpu_utils import HardwareBudget, detect_precision
    from marketrl.splits.datasets import env_config_from_config
    from marketrl.training.zoo import TrainRequest, get_entry, positions_sharpe

    entry = get_entry(model)
    device = torch.device("cpu")
    started = time.process_time()
    (trained,) = entry.train(
        TrainRequest(
            train_data=window.splits["train"],
            validation_data=window.splits["validation"],
            config=config,
            hparams=hparams,
            precision=detect_precision(device, config["training"]["precision"]),
            device=device,
            seeds=(seed,),
            budget=entry.trial_budget(config),
            memory=HardwareBudget.detect(device),
        )
    )
    validation = window.splits["validation"]
    env_config = env_config_from_config(config)
    score = positions_sharpe(validation, trained.positions(validation, env_config), env_config)
    return time.process_time() - started, score


def sizes_of(window: Any, config: Mapping[str, Any]) -> TrialSizes:
    """The `TrialSizes` of this run's data and config."""
    return TrialSizes(
        trial_steps=config["hyperopt"]["trial_steps"],
        trial_updates=config["hyperopt"]["trial_updates"],
        epochs=config["training"]["epochs"],
        n_envs=config["training"]["n_envs"],
        train_rows=window.splits["train"].n_rows,
        validation_rows=window.splits["validation"].n_rows,
        features=window.splits["train"].n_features,
        obs_dim=window.splits["train"].n_features * config["env"]["window"] + 1,
    )


def label(hp: Mapping[str, Any], drivers: tuple[str, ...]) -> str:
    """The corner's driver values, e.g. ``window=1 hidden_dim_base=128``."""
    return " ".join(f"{name}={_short(hp[name])}" for name in drivers)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def run_model(model: str, window: Any, config: dict[str, Any], args: argparse.Namespace) -> ModelCosts:
    """Median trial, then every corner, of one model."""
    import torch

    from gpu_utils import HardwareBudget
    from marketrl.training.zoo import get_entry

    space = get_entry(model).search_space(HardwareBudget.detect(torch.device("cpu")), window, config)
    drivers = cost_drivers(model)
    sizes = sizes_of(window, config)
    result = ModelCosts(model, drivers)

    def one(name: str, hp: dict[str, Any]) -> TrialCost:
        cpu_s, score = measure(model, hp, window, config, args.seed)
        cost = TrialCost(name, hp, cpu_s, cost_proxy(model, hp, sizes), score)
        print(f"  {model:<11} {name:<70} {cpu_s:8.2f} s", flush=True)
        return cost

    # untimed warm-up: the first trial of a model pays one-time costs (lazy imports, first kernels) the others do not
    measure(model, corners(space, drivers)[0], window, config, args.seed)
    for k, hp in enumerate(random_trials(space, args.median_trials, args.seed)):
        result.median_trials.append(one(f"random {k}: {label(hp, drivers)}", hp))
    for hp in corners(space, drivers):
        result.corners.append(one(label(hp, drivers), hp))
    for trial in result.median_trials + result.corners:
        trial.ratio = trial.cpu_s / result.median_s
    return result


def table(costs: ModelCosts) -> str:
    """The markdown table of one model: its corners, their cost and ratio to the median trial."""
    lines = [
        f"**{costs.model}**: median trial {costs.median_s:.2f} CPU-s (of {len(costs.median_trials)} random "
        f"trials); worst corner {costs.worst.ratio:.2f}x",
        "",
        "| corner | CPU-s | / median |",
        "|---|---|---|",
    ]
    lines += [f"| {t.label} | {t.cpu_s:.2f} | {t.ratio:.2f} |" for t in costs.corners]
    return "\n".join(lines)


def proxy_correlation(results: list[ModelCosts]) -> float:
    """Pearson correlation of log(proxy / median proxy) with log(cost / median cost), over every trial of
    every model (each model's figures relative to its own median trial)."""
    xs, ys = [], []
    for costs in results:
        median_proxy = statistics.median(t.proxy for t in costs.median_trials)
        for t in costs.median_trials + costs.corners:
            xs.append(math.log(t.proxy / median_proxy))
            ys.append(math.log(t.cpu_s / costs.median_s))
    return float(np.corrcoef(xs, ys)[0, 1]) if len(xs) > 2 else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from marketrl.training.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny budgets, 2 demo days, two models")
    parser.add_argument("--only", nargs="+", choices=list(ZOO), help="run only these models")
    parser.add_argument("--config", type=Path, default=ROOT / "config.yaml", help="budgets and run settings")
    parser.add_argument("--days", type=int, default=None, help="demo days of the tuning window (default 12)")
    parser.add_argument("--validation-days", type=int, default=None, help="its validation tail (default 4)")
    parser.add_argument(
        "--median-trials", type=int, default=None, help="random trials for the median (default 5)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    quick = {"days": 2, "validation_days": 1, "median_trials": 2}
    full = {"days": 12, "validation_days": 4, "median_trials": 5}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.only is None:
        args.only = list(QUICK_MODELS) if args.quick else list(ZOO)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    window, config = tuning_data(
        args.days, args.validation_days, args.config, validation_bars=300 if args.quick else None
    )
    if args.quick:  # tiny budgets: the same code paths, seconds in all
        config["hyperopt"] = {**config["hyperopt"], "trial_steps": 1_024, "trial_updates": 10}
        config["training"] = {**config["training"], "n_envs": 16, "check_every": 5}
    print(
        f"hyperopt trial cost per search-space corner: {window.splits['train'].n_rows} train / "
        f"{window.splits['validation'].n_rows} validation rows, {window.splits['train'].n_features} features; "
        f"trial_steps={config['hyperopt']['trial_steps']}, trial_updates={config['hyperopt']['trial_updates']}; "
        f"CPU time, torch threads={torch.get_num_threads()}"
    )
    results = [run_model(model, window, config, args) for model in args.only]
    print()
    for costs in results:
        print(table(costs))
        print()
    worst = max(results, key=lambda c: c.worst.ratio)
    correlation = proxy_correlation(results)
    print(
        f"worst corner over all models: {worst.model} {worst.worst.label}: {worst.worst.ratio:.2f}x its median"
    )
    print(
        f"cost_proxy vs CPU-s, log-log correlation over {sum(len(c.corners) + len(c.median_trials) for c in results)} trials: {correlation:.3f}"
    )
    if args.json is not None:
        report = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": platform.platform(),
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "trial_steps": config["hyperopt"]["trial_steps"],
            "trial_updates": config["hyperopt"]["trial_updates"],
            "proxy_correlation": correlation,
            "models": [
                {
                    "model": c.model,
                    "drivers": list(c.drivers),
                    "median_s": c.median_s,
                    "worst_ratio": c.worst.ratio,
                    "median_trials": [vars(t) for t in c.median_trials],
                    "corners": [vars(t) for t in c.corners],
                }
                for c in results
            ],
        }
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
