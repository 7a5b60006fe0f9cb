"""Benchmark: what one hyperopt trial costs at each corner of a model's search space, next to its median trial.

    python bench/hyperopt_cost.py                   # every model, full trial budgets (config.yaml), CPU, 1 thread
    python bench/hyperopt_cost.py --only dqn lstm   # some models
    python bench/hyperopt_cost.py --quick           # tiny budgets, two models (what tests/test_bench_quick.py runs)

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
  choices) of the parameters that drive the cost at a fixed step budget (`COST_DRIVERS`); every other parameter
  (learning rate, gamma, coefficients...) at the middle of its range.
* **warm-up**: one untimed trial (the cheapest corner) first, so that no timed trial pays one-time costs.
* **median trial**: `--median-trials` random draws from the whole space (log-uniform where the space is log,
  uniform choices, as Optuna's random start-up samples); the median of their costs.

Cost = `time.process_time()` of the trial (CPU seconds of this process, torch at `--threads` threads), which a
loaded machine disturbs far less than wall time. Printed per model: each corner, its cost and its ratio to the
median trial, then the worst ratio; `--json` keeps every figure with the analytic `cost_proxy` of each trial
(tests/test_search_space_bounds.py bounds that proxy; the bench reports how it correlates with the measured cost).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: The parameters whose value changes what a trial computes at a fixed step budget (the others, learning rates,
#: discounts, coefficients, regularization, change the numbers but not the work).
COST_DRIVERS: dict[str, tuple[str, ...]] = {
    "dqn": ("hidden_dim_base", "batch_size", "gradient_steps"),
    "ppo": ("hidden_dim_base", "n_steps", "n_epochs", "batch_size"),
    "linear": ("window",),
    "lightgbm": ("window", "n_estimators", "num_leaves", "feature_fraction", "bagging_fraction"),
    "mlp": ("window", "hidden_dim_base", "batch_size"),
    "lstm": ("window", "hidden_dim_base", "batch_size", "num_layers"),
    "gru": ("window", "hidden_dim_base", "batch_size", "num_layers"),
    "alstm": ("window", "hidden_dim_base", "batch_size"),
    "tcn": ("window", "hidden_dim_base", "batch_size", "levels"),
    "transformer": ("window", "hidden_dim_base", "batch_size", "n_heads"),
    "dlinear": ("window", "hidden_dim_base", "batch_size", "kernel_size"),
}
QUICK_MODELS = ("dqn", "mlp")


# ------------------------------------------------------------------------------------------ probing a space


@dataclass(frozen=True)
class Param:
    """One parameter as the space declares it: a range (int or float, maybe log) or numeric choices."""

    name: str
    kind: str  # "int" | "float" | "categorical"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: tuple[Any, ...] = ()

    def extremes(self) -> tuple[Any, Any]:
        """(lowest, highest) value the space allows."""
        if self.kind == "categorical":
            return min(self.choices), max(self.choices)
        return self.low, self.high

    def middle(self) -> Any:
        """A value in the middle of the range (geometric for log ranges), or the middle choice."""
        if self.kind == "categorical":
            return sorted(self.choices)[len(self.choices) // 2]
        mid = math.sqrt(self.low * self.high) if self.log else (self.low + self.high) / 2
        return round(mid) if self.kind == "int" else mid

    def sample(self, rng: np.random.Generator) -> Any:
        """A random value, as Optuna's random sampler draws it (log-uniform for log ranges)."""
        if self.kind == "categorical":
            return self.choices[int(rng.integers(len(self.choices)))]
        if self.kind == "int":
            if self.log:
                return round(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
            return int(rng.integers(self.low, self.high + 1))
        if self.log:
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        return float(rng.uniform(self.low, self.high))


class ProbeTrial:
    """A stand-in for `optuna.Trial`: records every parameter the space declares and answers with
    ``values[name]`` where given, else with `Param.middle` (the `marketrl.models.base.Trial` protocol)."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self.values = dict(values or {})
        self.params: dict[str, Param] = {}

    def _answer(self, param: Param) -> Any:
        self.params[param.name] = param
        return self.values.get(param.name, param.middle())

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return self._answer(Param(name, "int", low, high, log))

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float:
        return self._answer(Param(name, "float", low, high, log))

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._answer(Param(name, "categorical", choices=tuple(choices)))


SpaceFn = Callable[[Any], dict[str, Any]]


def declared(space: SpaceFn) -> dict[str, Param]:
    """Every parameter of a (static) search space with its declared range."""
    probe = ProbeTrial()
    space(probe)
    return probe.params


def corners(space: SpaceFn, drivers: tuple[str, ...]) -> list[dict[str, Any]]:
    """The hyperparameters of every corner: each driver at its low or high extreme, the rest at the middle."""
    params = declared(space)
    missing = [name for name in drivers if name not in params]
    if missing:
        raise KeyError(f"cost drivers {missing} are not in the space ({', '.join(params)})")
    out = []
    for values in itertools.product(*(sorted(set(params[name].extremes())) for name in drivers)):
        out.append(space(ProbeTrial(dict(zip(drivers, values, strict=True)))))
    return out


def random_trials(space: SpaceFn, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` random draws from the whole space."""
    params = declared(space)
    rng = np.random.default_rng(seed)
    return [space(ProbeTrial({name: p.sample(rng) for name, p in params.items()})) for _ in range(n)]


# --------------------------------------------------------------------------------------------- cost proxy


@dataclass(frozen=True)
class Sizes:
    """What a trial's work depends on besides its hyperparameters: the budget, the data and the env."""

    trial_steps: int = 15_000  # hyperopt.trial_steps (agents' env steps)
    trial_updates: int = 150  # hyperopt.trial_updates (forecasters' optimizer steps / boosting rounds)
    epochs: int = 2  # training.epochs (forecasters' passes, capped by trial_updates)
    n_envs: int = 64  # training.n_envs
    train_rows: int = 21_418  # tuning train rows (8 demo days, 2 instruments; the bench's data)
    validation_rows: int = 13_099  # tuning validation rows (4 demo days)
    features: int = 51
    obs_dim: int = 52  # features x env.window + position
    learning_starts: int = 1_000  # DQN default (env steps before the first gradient step)


def _mlp_params(widths: list[int]) -> int:
    return sum(a * b for a, b in itertools.pairwise(widths))


def cost_proxy(model: str, hp: Mapping[str, Any], sizes: Sizes = Sizes()) -> float:
    """A trial's work in multiply-adds, up to a constant: a fixed overhead per trial plus samples processed x work
    per sample. Agents: gradient samples (DQN: gradient steps x batch, three passes;
    PPO: env steps x epochs) x network weights, plus acting passes. Forecasters: training samples
    (min(updates x batch, epochs x rows)) x per-sample work (window x width^2-like for sequence models), plus
    the validations' forward passes; LightGBM: rounds x rows x columns; ridge: rows x columns^2.
    """
    s = sizes
    return OVERHEAD.get(model, FORECASTER_OVERHEAD) + _work(model, hp, s)


#: A trial's fixed work in `cost_proxy` units, fitted to the bench's figures (docs/PERFORMANCE.md): agents step
#: the env trial_steps times and validate ten times whatever the network (DQN at hidden_dim_base=64, batch 64,
#: one gradient step per vector step: 8.4 CPU-s, of which ~0.2 s of training work; PPO's rollouts cost less),
#: forecasters build the rows and score the trading rule's positions (an LSTM at window 1, width 16: 0.4 s).
OVERHEAD = {"dqn": 3.5e11, "ppo": 2.5e10}
FORECASTER_OVERHEAD = 3e9
#: PPO's price per update (8 updates of 2,048 steps cost 2.7 s more than 2 of 8,192 at the same epochs)
PPO_UPDATE_OVERHEAD = 9e9
#: A forecaster's price per row and window step beyond its multiply-adds (an LSTM's width 16 -> 32 cost 1.4x,
#: its multiply-adds 2.5x)
STEP_OVERHEAD = 12_000


def _work(model: str, hp: Mapping[str, Any], s: Sizes) -> float:
    if model in ("dqn", "ppo"):
        base = hp["hidden_dim_base"]
        if model == "dqn":
            weights = _mlp_params([s.obs_dim, base, base // 2, base // 4, 3])
            vector_steps = s.trial_steps // s.n_envs
            learning = max(0, (s.trial_steps - s.learning_starts) // s.n_envs)
            samples = learning * hp["gradient_steps"] * hp["batch_size"] * 3 * 3  # 3 passes, fwd+bwd ~ 3x
            return float((samples + vector_steps * s.n_envs) * weights)
        weights = _mlp_params([s.obs_dim, base, base // 2, 3]) + _mlp_params(
            [s.obs_dim, 2 * base, base, base // 2, 1]
        )
        rollout = hp["n_steps"] * s.n_envs
        updates = math.ceil(s.trial_steps / rollout)
        # each update also pays a fixed price (GAE on the host, statistics, the evaluation check)
        return float(updates * (PPO_UPDATE_OVERHEAD + rollout * (3 * hp["n_epochs"] + 1) * weights))
    window, f = hp["window"], s.features
    if model == "linear":
        return float(s.train_rows * (window * f) ** 2)
    if model == "lightgbm":
        # a round builds histograms of rows x columns for each split; 4 -> 128 leaves cost 4.3x at window 8
        # (leaves^0.42: histogram subtraction and early stopping keep it far below linear)
        rounds = min(hp["n_estimators"], s.trial_updates)
        columns = window * f * hp["feature_fraction"]
        return float(rounds * s.train_rows * hp["bagging_fraction"] * columns * hp["num_leaves"] ** 0.42)
    width = hp["hidden_dim_base"]
    # small matrices: each row (and each step of a sequence model over the window) has a fixed price too
    overhead = STEP_OVERHEAD * (1 if model in ("mlp", "dlinear") else window)
    per_sample = (
        overhead
        + {
            "mlp": window * f * width + width * width // 2,
            "lstm": window * 4 * width * (f + width) * hp.get("num_layers", 1),
            "gru": window * 3 * width * (f + width) * hp.get("num_layers", 1),
            "alstm": window * (f * width + 4 * width * 2 * width + width * width // 2),
            "tcn": window * (f * width + 2 * hp.get("levels", 1) * hp.get("kernel_size", 2) * width * width),
            "transformer": window
            * (
                f * width
                + hp.get("n_layers", 1) * (4 * width * width + 4 * width * width + 2 * window * width)
            ),
            "dlinear": f * window * width * 2 + f * width,
        }[model]
    )
    steps = min(s.trial_updates, s.epochs * math.ceil(s.train_rows / hp["batch_size"]))
    samples = min(steps * hp["batch_size"], s.epochs * s.train_rows)
    validations = min(
        10, steps // max(1, s.trial_updates // 10)
    )  # ten per full run, fewer when it ends early
    # each validation: the validation loss and the positions of the trading rule, one forward pass each
    return float((3 * samples + 2 * validations * s.validation_rows) * per_sample)


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


def tuning_data(days: int, validation_days: int, config_path: Path) -> tuple[Any, dict[str, Any]]:
    """`days` demo days -> feature tables -> a WindowData with train and validation splits on the CPU, and the
    run config (config.yaml, NQ costed with its own contract spec)."""
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
            steps=config["hyperopt"]["trial_steps"],
            updates=config["hyperopt"]["trial_updates"],
            budget=HardwareBudget.detect(device),
        )
    )
    validation = window.splits["validation"]
    env_config = env_config_from_config(config)
    score = positions_sharpe(validation, trained.positions(validation, env_config), env_config)
    return time.process_time() - started, score


def sizes_of(window: Any, config: Mapping[str, Any]) -> Sizes:
    """The `Sizes` of this run's data and config."""
    return Sizes(
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
    drivers = COST_DRIVERS[model]
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
    parser.add_argument("--quick", action="store_true", help="tiny budgets, 3 demo days, two models")
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
    quick = {"days": 3, "validation_days": 1, "median_trials": 2}
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
    window, config = tuning_data(args.days, args.validation_days, args.config)
    if args.quick:  # tiny budgets: the same code paths, seconds in all
        config["hyperopt"] = {**config["hyperopt"], "trial_steps": 2_048, "trial_updates": 10}
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
