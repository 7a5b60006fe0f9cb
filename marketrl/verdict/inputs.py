"""Read and check the files the report is built from (docs/OUTPUTS.md); nothing else is read.

Required inputs (every listed eval file, its bars.parquet, the fold plan, every listed hyperopt JSON and train log)
raise a one-line :class:`ReportInputError` naming the file when missing or malformed. Optional content (no completed
hyperopt trials, no training history) is kept as empty and reported by its section instead.

Only the columns the report uses are read, and no model run's per-bar table is kept: a model run's columns are
checked here and its table read (and checked) when its strategy is built (`Run.read`, one strategy at a time,
marketrl.verdict.strategies.build_strategies), which keeps its days, summaries and a bounded path for the figures.
The random baseline's traders (most of a run's rows) are checked here fold by fold but not kept either:
`RandomTraders` reads them again one trader at a time.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from marketrl.scoring.metrics import (
    REQUIRED_COLUMNS,
    MetricsInputError,
    average_strategies,
    portfolio_bars,
)
from marketrl.scoring.stats import is_finite_number
from marketrl.splits.folds import FoldError, FoldPlan

DETERMINISTIC_BASELINES = ("buy_and_hold", "flat", "momentum")
RANDOM_BASELINE = "random"
BASELINES = (*DETERMINISTIC_BASELINES, RANDOM_BASELINE)
#: the per-agent baseline: random traders that trade as often as the agent (metrics.json "matched_random")
MATCHED_RANDOM = "matched_random"
_RANDOM_PREFIX = "random_"
#: metrics.json "kind" of a model run; absent in outputs written before the model zoo (then an agent)
AGENT, FORECASTER = "agent", "forecaster"
MODEL_KINDS = (AGENT, FORECASTER)
#: the extra per-bar columns of a forecaster's bars.parquet (docs/OUTPUTS.md)
FORECAST_COLUMNS = ("prediction", "forward_return")
#: What each decision's fills paid (marketrl.env.rollout.fill_columns); absent from outputs written before them.
FILL_COLUMNS = ("traded", "half_spread_ticks", "quote_fallback")


class ReportInputError(ValueError):
    """A report input is missing or malformed; the one-line message names the file (or config key)."""


@dataclass(frozen=True)
class MatchedRandom:
    """An agent run's turnover-matched random traders: daily net returns [n_traders, n_days] on `days`."""

    change_rate: float
    days: np.ndarray  # datetime64[D], ascending
    daily: np.ndarray


@dataclass(frozen=True)
class Fills:
    """A run's fills at a known half-spread (`traded` > 0, `half_spread_ticks` finite), reduced to the contracts
    traded at each half-spread paid (`ticks` ascending and distinct, `traded` their contracts, float64), whether its
    `quote_fallback` column holds any value (the data had quotes) and how many fills fell back: what the report's
    fill table reads of a per-bar table (marketrl.report.tables.fills_paid). Half-spreads are few distinct values
    (multiples of half a tick from quotes, or the configured fallback), so this stays small however many fills."""

    traded: np.ndarray
    ticks: np.ndarray
    quoted: bool
    fallback: int

    @classmethod
    def of(cls, bars: pl.DataFrame) -> Fills | None:
        """The fills of a per-bar table; None where it predates the fill columns."""
        if "traded" not in bars.columns:
            return None
        traded = bars["traded"].to_numpy().astype(np.float64)
        ticks = bars["half_spread_ticks"].fill_null(np.nan).to_numpy().astype(np.float64)
        filled = (traded > 0) & np.isfinite(ticks)
        values, at = np.unique(ticks[filled], return_inverse=True)
        fallback = bars["quote_fallback"]
        return cls(
            np.bincount(at, weights=traded[filled], minlength=values.size),
            values,
            fallback.null_count() < fallback.len(),
            int(fallback.fill_null(False).sum()),
        )


@dataclass(frozen=True)
class Run:
    """One strategy's per-bar test table for one fold: an agent seed, a baseline, or one random-baseline seed.

    ``seed_index`` is the agent's seed index or the random baseline's seed number, None for the deterministic
    baselines and for the random baseline averaged over its seeds.
    """

    strategy: str
    is_agent: bool
    fold: int
    seed_index: int | None
    bars: pl.DataFrame
    source: Path
    stored_metrics: Mapping[str, Any] | None = None
    matched: MatchedRandom | None = None  # agents only; None in outputs written before the matched traders
    kind: str = AGENT  # model runs: "agent" or "forecaster"
    horizon: int | None = None  # forecasters: bars ahead that `prediction` forecasts
    forecasts: pl.DataFrame | None = None  # forecasters: trading_day, prediction, forward_return per bar
    # model runs: the validation gate's record (metrics.json "flat_gate"); None where the run has none (not gated)
    flat_gate: Mapping[str, Any] | None = None
    # a run reduced to days (marketrl.verdict.strategies.digest): its fills, its `bars` then an empty table
    fills: Fills | None = None
    # a model run as load_inputs left it: its per-bar table (and predictions) on disk at `source`, read by `read`
    deferred: bool = False

    def read(self) -> Run:
        """The run with its per-bar table (and a forecaster's predictions) in memory and checked: itself unless
        load_inputs left them on disk (`deferred`)."""
        return _read_model_run(self) if self.deferred else self

    def fills_paid(self) -> Fills | None:
        """The run's fills: kept from its digest, else from its per-bar table."""
        return self.fills if self.fills is not None else Fills.of(self.bars)

    @property
    def label(self) -> str:
        """Display name, e.g. ``ppo seed 1`` or ``momentum``."""
        if self.is_agent:
            return f"{self.strategy} seed {self.seed_index}"
        return self.strategy


@dataclass(frozen=True)
class RandomTraders:
    """The random baseline's traders as load_inputs found them: per fold (in the order given) its baselines'
    bars.parquet and the traders' seeds with their strategy names. Their per-bar tables are most of a run's rows,
    and the report needs only their days and summaries: `runs` reads one trader's tables at a time."""

    files: dict[int, Path] = field(default_factory=dict)
    names: dict[int, dict[int, str]] = field(default_factory=dict)  # fold -> seed -> strategy name

    @property
    def seeds(self) -> list[int]:
        """Every trader's seed, ascending."""
        return sorted({seed for names in self.names.values() for seed in names})

    def runs(self, seed: int) -> list[Run]:
        """The per-bar runs of trader `seed` in every fold that has it (checked when load_inputs read them)."""
        runs = []
        for fold, path in self.files.items():
            name = self.names[fold].get(seed)
            if name is None:
                continue
            scan, columns = _scan_bars(path, ("strategy",))
            columns.remove("strategy")
            table = _collect(scan.filter(pl.col("strategy") == name).select(columns), path)
            runs.append(Run(RANDOM_BASELINE, False, fold, seed, table, path))
        return runs


@dataclass(frozen=True)
class HyperoptSummary:
    """One model's hyperopt JSON (``results/hyperopt/{model}.json``)."""

    model: str
    source: Path
    trials: list[dict[str, Any]]
    trial_sharpe_daily: list[float]
    data: Mapping[str, Any]


@dataclass(frozen=True)
class TrainLog:
    """One training run's log (``train_log.json``)."""

    model: str
    fold: int
    seed_index: int
    source: Path
    history: list[dict[str, Any]]
    data: Mapping[str, Any]


@dataclass
class ReportInputs:
    """Everything the report reads, loaded and checked."""

    model_runs: list[Run]
    baseline_runs: list[Run]
    random_seed_runs: list[Run]
    hyperopt: dict[str, HyperoptSummary]
    train_logs: list[TrainLog]
    plan: FoldPlan
    files: list[Path] = field(default_factory=list)
    provenance_records: list[Mapping[str, Any]] = field(default_factory=list)
    # hyperopt.per_fold: each fold's own study, {model: {fold: summary}}; `hyperopt` then holds their pooled trials
    hyperopt_folds: dict[str, dict[int, HyperoptSummary]] = field(default_factory=dict)
    # the random traders load_inputs left on disk (`random_seed_runs`: those given as tables, e.g. by the calibration)
    random_traders: RandomTraders = field(default_factory=RandomTraders)

    @property
    def models(self) -> list[str]:
        """Every model of the run (agents and forecasters), sorted by name."""
        return sorted({run.strategy for run in self.model_runs})

    def kind_of(self, model: str) -> str:
        """ "agent" or "forecaster" (load_inputs checked that every run of a model has the same kind)."""
        return next(run.kind for run in self.model_runs if run.strategy == model)

    def horizon_of(self, model: str) -> int | None:
        """The forecast horizon in bars of a forecaster, None for an agent."""
        return next(run.horizon for run in self.model_runs if run.strategy == model)

    @property
    def forecasters(self) -> list[str]:
        return [model for model in self.models if self.kind_of(model) == FORECASTER]

    @property
    def folds(self) -> list[int]:
        return sorted({run.fold for run in self.model_runs} | {run.fold for run in self.baseline_runs})


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON object from ``path``; a one-line ReportInputError naming the file otherwise."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportInputError(f"{path}: {what} not found") from None
    except OSError as err:
        raise ReportInputError(f"{path}: cannot read {what} ({err.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReportInputError(f"{path}: {what} is not valid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ReportInputError(f"{path}: {what} must be a JSON object, got {type(data).__name__}")
    return data


def _require(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: Path, what: str) -> Any:
    value = data.get(key)
    # bool is an int; a fold index of `true` is a malformed file, not fold 1.
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ReportInputError(f"{path}: {what} field {key!r} must be {expected}, got {value!r}")
    return value


def _scan_bars(bars_path: Path, extra_columns: Sequence[str] = ()) -> tuple[pl.LazyFrame, list[str]]:
    """A lazy scan of a per-bar table and the columns the report reads of it: REQUIRED_COLUMNS, the fill columns
    where the table has them, then `extra_columns` (checked present)."""
    if not bars_path.is_file():
        raise ReportInputError(f"{bars_path}: per-bar evaluation table not found")
    try:
        scan = pl.scan_parquet(bars_path)
        names = scan.collect_schema().names()
    except Exception as err:  # polars raises several unrelated types for a bad file
        raise _unreadable(bars_path, err) from None
    missing = [c for c in (*REQUIRED_COLUMNS, *extra_columns) if c not in names]
    if missing:
        expected = [*REQUIRED_COLUMNS, *extra_columns]
        raise ReportInputError(f"{bars_path}: missing column(s) {missing}; expected {expected}")
    return scan, [*REQUIRED_COLUMNS, *(c for c in FILL_COLUMNS if c in names), *extra_columns]


def _unreadable(bars_path: Path, err: Exception) -> ReportInputError:
    reason = str(err).splitlines()[0] if str(err) else type(err).__name__
    return ReportInputError(f"{bars_path}: cannot read Parquet ({reason})")


def _collect(frame: pl.LazyFrame, bars_path: Path) -> pl.DataFrame:
    """`frame` read, a damaged file reported as a one-line ReportInputError naming it."""
    try:
        return frame.collect()
    except Exception as err:  # polars raises several unrelated types for a bad file
        raise _unreadable(bars_path, err) from None


def _checked(run: Run) -> Run:
    """Validate the table with marketrl.scoring.metrics' own checks, re-raised with the file name."""
    try:
        portfolio_bars(run.bars)
    except MetricsInputError as err:
        raise ReportInputError(f"{run.source}: {err}") from None
    return run


def _agent_run(path: Path, bars_path: Path, data: Mapping[str, Any]) -> Run:
    """A model run from its metrics.json, its per-bar table's columns checked but left on disk (`Run.read`)."""
    what = "model evaluation"
    model = _require(data, "algo", str, path, what)
    fold = _require(data, "fold", int, path, what)
    seed_index = _require(data, "seed_index", int, path, what)
    kind = data.get("kind", AGENT)
    if kind not in MODEL_KINDS:
        raise ReportInputError(
            f"{path}: {what} field 'kind' must be one of {list(MODEL_KINDS)}, got {kind!r}"
        )
    horizon = None
    if kind == FORECASTER:
        horizon = _require(data, "horizon", int, path, what)
        if horizon < 1:
            raise ReportInputError(f"{path}: {what} field 'horizon' must be a positive number of bars")
    _scan_bars(bars_path, FORECAST_COLUMNS if kind == FORECASTER else ())
    stored = data.get("metrics") if isinstance(data.get("metrics"), Mapping) else None
    matched = _matched_random(path, data["matched_random"]) if "matched_random" in data else None
    gate = _flat_gate(path, data["flat_gate"]) if data.get("flat_gate") is not None else None
    return Run(
        model,
        True,
        fold,
        seed_index,
        pl.DataFrame(),
        bars_path,
        stored,
        matched,
        kind,
        horizon,
        None,
        gate,
        deferred=True,
    )


def _read_model_run(run: Run) -> Run:
    """A deferred model run with its per-bar table read from `source` and checked; a forecaster's predictions
    apart (`forecasts`)."""
    forecaster = run.kind == FORECASTER
    scan, columns = _scan_bars(run.source, FORECAST_COLUMNS if forecaster else ())
    bars = _collect(scan.select(columns), run.source)
    forecasts = None
    if forecaster:
        forecasts = bars.select(
            "ts_event", "trading_day", *(pl.col(c).cast(pl.Float64) for c in FORECAST_COLUMNS)
        )
        if forecasts["prediction"].is_infinite().any():
            raise ReportInputError(f"{run.source}: column 'prediction' holds infinite values")
    return _checked(
        replace(run, bars=bars.drop(FORECAST_COLUMNS, strict=False), forecasts=forecasts, deferred=False)
    )


#: the validation gate's statistics in metrics.json "flat_gate" (marketrl.scoring.gate.GateDecision): numbers or
#: null (undefined), beside the boolean "set_flat"
FLAT_GATE_NUMBERS = (
    "t_stat",
    "min_t",
    "net_sharpe",
    "gross_sharpe",
    "turnover",
    "n_bars",
    "n_days",
    "pooled_t",
)


def _flat_gate(path: Path, block: Any) -> dict[str, Any]:
    """The `flat_gate` block of a model's metrics.json, checked: a boolean `set_flat` and its statistics."""
    expected = f"an object with a boolean 'set_flat' and numbers (or null) {list(FLAT_GATE_NUMBERS)}"
    if not isinstance(block, Mapping) or not isinstance(block.get("set_flat"), bool):
        raise ReportInputError(f"{path}: field 'flat_gate' must be {expected}")
    basis = block.get("basis", "validation")  # metrics from before the walk-forward record have no basis
    if basis not in ("validation", "pooled", "record"):
        raise ReportInputError(
            f"{path}: field 'flat_gate.basis' must be 'validation', 'pooled' or 'record', got {basis!r}"
        )
    gate: dict[str, Any] = {"set_flat": block["set_flat"], "basis": basis}
    for key in FLAT_GATE_NUMBERS:
        value = block.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ReportInputError(f"{path}: field 'flat_gate' must be {expected}; {key!r} is {value!r}")
        gate[key] = None if value is None or not math.isfinite(value) else float(value)
    return gate


def _matched_random(path: Path, block: Any) -> MatchedRandom:
    """The `matched_random` block of an agent's metrics.json, checked."""
    expected = (
        "an object with 'change_rate', 'days' (ISO dates) and 'daily_net_returns' (one list per trader)"
    )
    if not isinstance(block, Mapping):
        raise ReportInputError(f"{path}: field 'matched_random' must be {expected}")
    days, daily, rate = block.get("days"), block.get("daily_net_returns"), block.get("change_rate")
    try:
        day_array = np.array(days, dtype="datetime64[D]")
        returns = np.array(daily, dtype=np.float64)
    except (TypeError, ValueError):
        raise ReportInputError(f"{path}: field 'matched_random' must be {expected}") from None
    if (
        not isinstance(days, list)
        or not isinstance(daily, list)
        or not daily
        or isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or returns.shape != (len(daily), len(days))
        or np.any(day_array[1:] <= day_array[:-1])
    ):
        raise ReportInputError(f"{path}: field 'matched_random' must be {expected}")
    return MatchedRandom(float(rate), day_array, returns)


def _baseline_runs(path: Path, bars_path: Path, data: Mapping[str, Any]) -> tuple[list[Run], dict[int, str]]:
    """The fold's deterministic baselines and the seed-averaged random baseline (per-bar tables), and the random
    traders' seeds and strategy names: their tables are checked here but not kept (`RandomTraders` reads them
    again one trader at a time)."""
    fold = _require(data, "fold", int, path, "baseline evaluation")
    strategies = _require(data, "strategies", dict, path, "baseline evaluation")
    scan, columns = _scan_bars(bars_path, extra_columns=("strategy",))
    columns.remove("strategy")
    names = sorted(_collect(scan.select(pl.col("strategy").unique()), bars_path)["strategy"].to_list())
    missing = [name for name in DETERMINISTIC_BASELINES if name not in names]
    random_names = [name for name in names if name.startswith(_RANDOM_PREFIX)]
    if missing or not random_names:
        expected = [*DETERMINISTIC_BASELINES, "random_0", "..."]
        raise ReportInputError(
            f"{bars_path}: column 'strategy' lacks {missing or ['random_<i>']}; expected {expected}"
        )
    fixed = _collect(
        scan.filter(pl.col("strategy").is_in(DETERMINISTIC_BASELINES)).select(*columns, "strategy"), bars_path
    )
    runs = [
        _checked(
            Run(
                name,
                False,
                fold,
                None,
                fixed.filter(pl.col("strategy") == name).select(columns),
                bars_path,
                strategies.get(name),
            )
        )
        for name in DETERMINISTIC_BASELINES
    ]
    seeds: dict[int, str] = {}
    for name in random_names:
        suffix = name.removeprefix(_RANDOM_PREFIX)
        if not suffix.isdigit():
            raise ReportInputError(f"{bars_path}: strategy {name!r} is not random_<integer>")
        seeds[int(suffix)] = name

    def traders() -> Iterator[pl.DataFrame]:
        """Each trader's table, read alone and checked (the evaluation job writes one strategy after another: the
        filtered read skips the other row groups)."""
        for seed, name in sorted(seeds.items()):
            table = _collect(scan.filter(pl.col("strategy") == name).select(REQUIRED_COLUMNS), bars_path)
            yield _checked(Run(RANDOM_BASELINE, False, fold, seed, table, bars_path)).bars

    # The evaluation job's own average (same seeds, same order): its stored summary is checked like the others.
    mean = average_strategies(traders())
    runs.append(
        _checked(Run(RANDOM_BASELINE, False, fold, None, mean, bars_path, strategies.get(RANDOM_BASELINE)))
    )
    return runs, dict(sorted(seeds.items()))


def _hyperopt(path: Path) -> HyperoptSummary:
    data = read_json_object(path, "hyperopt summary")
    what = "hyperopt summary"
    model = _require(data, "algo", str, path, what)
    trials = _require(data, "trials", list, path, what)
    sharpes = _require(data, "trial_sharpe_daily", list, path, what)
    for trial in trials:
        if not isinstance(trial, dict) or not isinstance(trial.get("params", {}), dict):
            raise ReportInputError(
                f"{path}: every entry of 'trials' must be an object with a 'params' object"
            )
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in sharpes):
        raise ReportInputError(f"{path}: 'trial_sharpe_daily' must be a list of numbers")
    return HyperoptSummary(model, path, trials, [float(x) for x in sharpes], data)


def _train_log(path: Path) -> TrainLog:
    data = read_json_object(path, "training log")
    what = "training log"
    model = _require(data, "algo", str, path, what)
    fold = _require(data, "fold", int, path, what)
    seed_index = _require(data, "seed_index", int, path, what)
    history = data.get("history") or []
    if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
        raise ReportInputError(f"{path}: training log field 'history' must be a list of objects")
    return TrainLog(model, fold, seed_index, path, history, data)


def _check_layout(inputs: ReportInputs) -> None:
    """Every agent has the same seeds in every fold, and every fold has baselines; no duplicates."""
    seen: dict[tuple[str, int, int], Path] = {}
    kinds: dict[str, tuple[str, int | None, Path]] = {}
    for run in inputs.model_runs:
        key = (run.strategy, run.fold, run.seed_index or 0)
        if key in seen:
            raise ReportInputError(f"{run.source}: duplicates {seen[key]} ({run.label}, fold {run.fold})")
        seen[key] = run.source
        kind, horizon, first = kinds.setdefault(run.strategy, (run.kind, run.horizon, run.source))
        if (kind, horizon) != (run.kind, run.horizon):
            raise ReportInputError(
                f"{run.source}: {run.strategy} is kind {run.kind!r} (horizon {run.horizon}) here but "
                f"{kind!r} (horizon {horizon}) in {first}"
            )
    baseline_sources: dict[int, Path] = {}
    for run in inputs.baseline_runs:
        if baseline_sources.setdefault(run.fold, run.source) != run.source:
            raise ReportInputError(
                f"{run.source}: duplicates {baseline_sources[run.fold]} (baselines, fold {run.fold})"
            )
    if not inputs.model_runs:
        raise ReportInputError(
            "eval_files: no model evaluation (results/eval/{model}/fold_k/seed_s/metrics.json)"
        )
    baseline_folds = {run.fold for run in inputs.baseline_runs}
    agent_folds = {run.fold for run in inputs.model_runs}
    if agent_folds - baseline_folds:
        missing = sorted(agent_folds - baseline_folds)
        raise ReportInputError(f"eval_files: no baseline evaluation for fold(s) {missing}")
    for model in inputs.models:
        seeds_by_fold = {
            fold: sorted(
                r.seed_index or 0 for r in inputs.model_runs if r.strategy == model and r.fold == fold
            )
            for fold in sorted(baseline_folds)
        }
        if len({tuple(seeds) for seeds in seeds_by_fold.values()}) != 1:
            raise ReportInputError(
                f"eval_files: {model} has different seeds in different folds: {seeds_by_fold}"
            )
    n_folds = len(inputs.plan.folds)
    for fold in inputs.folds:
        if not 0 <= fold < n_folds:
            raise ReportInputError(
                f"eval_files: fold {fold} is not in the fold plan (folds 0..{n_folds - 1})"
            )


def load_inputs(
    eval_files: Sequence[str | Path],
    bar_files: Sequence[str | Path],
    hyperopt_files: Sequence[str | Path],
    folds_path: str | Path,
    train_logs: Sequence[str | Path],
) -> ReportInputs:
    """Load and check every input file; raise ReportInputError naming the first bad one.

    `bar_files[i]` is the per-bar table of the evaluation `eval_files[i]`.
    """
    if len(bar_files) != len(eval_files):
        raise ReportInputError(
            f"bar_files: {len(bar_files)} per-bar tables for {len(eval_files)} evaluations (expected one each)"
        )
    try:
        plan = FoldPlan.load(folds_path)
    except FoldError as err:
        raise ReportInputError(str(err)) from None
    model_runs: list[Run] = []
    baseline_runs: list[Run] = []
    traders = RandomTraders()
    records: list[Mapping[str, Any]] = []
    files: list[Path] = [Path(folds_path)]
    for name, bars_name in zip(eval_files, bar_files, strict=True):
        path, bars_path = Path(name), Path(bars_name)
        data = read_json_object(path, "evaluation metrics")
        if "strategies" in data:
            runs, names = _baseline_runs(path, bars_path, data)
            baseline_runs += runs
            traders.files[runs[0].fold] = bars_path
            traders.names[runs[0].fold] = names
        else:
            model_runs.append(_agent_run(path, bars_path, data))
        files += [path, bars_path]
        records.append(data.get("provenance") or {})
    hyperopt: dict[str, HyperoptSummary] = {}
    hyperopt_folds: dict[str, dict[int, HyperoptSummary]] = {}
    for name in hyperopt_files:
        summary = _hyperopt(Path(name))
        fold = summary.data.get("fold")
        if isinstance(fold, int) and not isinstance(fold, bool):  # a per-fold study (hyperopt.per_fold)
            hyperopt_folds.setdefault(summary.model, {})[fold] = summary
        else:
            hyperopt[summary.model] = summary
        files.append(Path(name))
    for model, by_fold in hyperopt_folds.items():
        if model in hyperopt:
            raise ReportInputError(
                f"{hyperopt[model].source}: {model} has both one study and per-fold studies; give one kind"
            )
        hyperopt[model] = pooled_fold_studies(model, by_fold)
    logs = [_train_log(Path(name)) for name in train_logs]
    files += [Path(name) for name in train_logs]
    records += [
        summary.data.get("provenance") or {}
        for summary in hyperopt.values()
        if summary.model not in hyperopt_folds
    ]
    records += [
        s.data.get("provenance") or {} for by_fold in hyperopt_folds.values() for s in by_fold.values()
    ]
    records += [log.data.get("provenance") or {} for log in logs]
    records = [record for record in records if isinstance(record, Mapping)]
    inputs = ReportInputs(
        model_runs, baseline_runs, [], hyperopt, logs, plan, files, records, hyperopt_folds, traders
    )
    _check_layout(inputs)
    return inputs


def pooled_fold_studies(model: str, by_fold: Mapping[int, HyperoptSummary]) -> HyperoptSummary:
    """One summary holding every trial of every fold's study (each trial tagged with its `fold`): what the
    selection tried in all, so the DSR's N is the sum of the folds' trials. Its best is the highest of the
    folds' choices (`best_fold`); the folds' own choices stay in `ReportInputs.hyperopt_folds`."""
    folds = sorted(by_fold)
    summaries = [by_fold[k] for k in folds]
    trials = [{**trial, "fold": k} for k, s in zip(folds, summaries, strict=True) for trial in s.trials]
    scored = [
        (k, s) for k, s in zip(folds, summaries, strict=True) if is_finite_number(s.data.get("best_value"))
    ]
    best_fold, best = (
        max(scored, key=lambda ks: (ks[1].data["best_value"], -ks[0])) if scored else (None, None)
    )

    def total(key: str) -> int:
        return sum(int(s.data.get(key) or 0) for s in summaries)

    first = summaries[0].data
    data = {
        "algo": model,  # the hyperopt JSON's on-disk key, kept for compatibility
        "kind": first.get("kind"),
        "per_fold": True,
        "folds": folds,
        "objective": first.get("objective", ""),
        "direction": first.get("direction", "maximize"),
        "best_fold": best_fold,
        "best_value": None if best is None else best.data.get("best_value"),
        "best_trial": None if best is None else best.data.get("best_trial"),
        "best_params": {} if best is None else best.data.get("best_params") or {},
        "n_trials": total("n_trials"),
        "n_complete": total("n_complete"),
        "n_pruned": total("n_pruned"),
        "n_failed": total("n_failed"),
        "sampler": first.get("sampler") or {},
        "storage": first.get("storage"),
        "tuning_window": {},  # one per fold: ReportInputs.hyperopt_folds
    }
    sharpes = [x for s in summaries for x in s.trial_sharpe_daily]
    return HyperoptSummary(
        model, summaries[0].source.parent, trials, sharpes, data
    )  # results/hyperopt/{model}


def configured_models(config: Mapping[str, Any]) -> list[str]:
    """The run's model list: ``training.models``, or ``training.algos`` in configs from before the model zoo."""
    training = config.get("training") if isinstance(config, Mapping) else None
    training = training if isinstance(training, Mapping) else {}
    key = "models" if "models" in training else "algos"
    models = training.get(key)
    if not isinstance(models, list | tuple) or not models or not all(isinstance(m, str) for m in models):
        raise ReportInputError(
            f"config key 'training.{key}' must be a non-empty list of model names, got {models!r}"
        )
    return list(models)


def check_models(inputs: ReportInputs, config: Mapping[str, Any]) -> list[str]:
    """The configured models, checked against the evaluations given: each has one, and none is extra."""
    models = configured_models(config)
    key = "training.models" if "models" in (config.get("training") or {}) else "training.algos"
    missing = [m for m in models if m not in inputs.models]
    extra = [m for m in inputs.models if m not in models]
    if missing:
        raise ReportInputError(f"eval_files: no evaluation of {missing}, listed in config key '{key}'")
    if extra:
        raise ReportInputError(
            f"eval_files: evaluations of {extra}, not listed in config key '{key}' ({models})"
        )
    return models
