"""Calibration of the out-of-sample verdict: how often it claims an edge that is not there (false-positive rate)
and how often it finds one that is (power), measured end to end on synthetic worlds (docs/METRICS.md,
"Calibration").

A *world* is one cheap run of the pipeline's own pieces: demo data generated with its own seed and planted edge
(`marketrl.data.demo`), the feature tables (`marketrl.features`), walk-forward folds (`marketrl.splits.folds`), fixed
hyperparameters (no hyperopt), a few fast models of the supervised zoo (`marketrl.models`) trained per fold and
seed, the baselines and turnover-matched random traders of the evaluation stage, and the report's verdict
(`marketrl.verdict.verdicts.model_verdicts`, the family-wise test over every model × baseline × direction). A
world's outcome is "beats" (some model beats every baseline), "worse", "none" (no claim) or "not enough data".

An *arm* is one (edge, edge kind, pooled test days) triple with `calibration.worlds` worlds (one no-edge arm per
test-day count, whatever the kinds). Rates carry exact binomial
(Clopper–Pearson) intervals; the minimum detectable edge at 80% power is read off each test-day count's power
curve (per edge kind) by linear interpolation between the edges tried.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import polars as pl
import torch
from scipy.stats import beta

from marketrl.calendars.annual import ANNUALIZER
from marketrl.calibration.plan import (
    NO_EDGE,
    CalibrationError,
    CalibrationSettings,
    WorldSpec,
    job_worlds,
    world_specs,
)
from marketrl.data.demo import generate_demo_files
from marketrl.data.file_order import CONTEXT_FILES
from marketrl.env import EnvConfig, MarketData, evaluate_positions
from marketrl.evaluation.evaluate import BAR_COLUMNS, baseline_positions, matched_trader_positions
from marketrl.features import MAX_LOOKBACK, build_feature_file
from marketrl.models import MODELS, RunSettings
from marketrl.models.base import ModelSpec
from marketrl.report.build import template_environment
from marketrl.report.tables import baseline_order
from marketrl.runtime.io import atomic_write, write_json_atomic
from marketrl.scoring.batched import score_positions
from marketrl.scoring.gate import (
    FoldRecord,
    GateDecision,
    flat_gates,
    gated_positions,
    record_gate,
    record_or_pooled,
)
from marketrl.scoring.metrics import to_json_safe
from marketrl.settings.config import derive_seed
from marketrl.splits.datasets import env_config_from_config, fold_window, load_feature_tables, tuning_window
from marketrl.splits.folds import FoldConfig, FoldPlan, make_fold_plan
from marketrl.training.zoo import positions_sharpe
from marketrl.verdict.inputs import (
    DETERMINISTIC_BASELINES,
    RANDOM_BASELINE,
    HyperoptSummary,
    MatchedRandom,
    ReportInputs,
    Run,
    pooled_fold_studies,
)
from marketrl.verdict.strategies import VerdictRules, build_strategies
from marketrl.verdict.verdicts import ModelVerdict, model_verdicts

FORMAT = "marketrl-calibration"
VERSION = 1
OUTCOMES = ("beats", "worse", "none", "not enough data")
TARGET_POWER = 0.8
TARGET_FALSE_POSITIVE_RATE = 0.05
CI_LEVEL = 0.95
WORLD_START = "2024-01-02"
# Fixed hyperparameters (no hyperopt), chosen for speed: the planted signal is the last 15 minutes' return, one
# feature row (window 1) carries it; LightGBM subsamples rows and features so that its seeds differ.
FIXED_HPARAMS: dict[str, dict[str, Any]] = {
    "linear": {"window": 1},
    "lightgbm": {
        "window": 1,
        "n_estimators": 40,
        "num_leaves": 15,
        "feature_fraction": 0.8,
        "bagging_fraction": 0.8,
    },
}


def _world_config(
    config: Mapping[str, Any], settings: CalibrationSettings, spec: WorldSpec
) -> dict[str, Any]:
    """The config a world runs with: its own root seed, its folds and its number of random traders."""
    world = copy.deepcopy(dict(config))
    world["seed"] = spec.seed(int(config["seed"]))
    world["evaluation"] = {**world["evaluation"], "random_baseline_seeds": settings.random_traders}
    return world


def _fold_config(settings: CalibrationSettings, spec: WorldSpec) -> FoldConfig:
    """Expanding folds ending at the last day. The tuning windows are used by the nested-tuning arms only: fold
    k's is the train_days days right before its first test day, its validation tail the fold's own."""
    return FoldConfig(
        n=settings.folds,
        scheme="expanding",
        train_days=settings.train_days,
        test_days=spec.test_days // settings.folds,
        validation_days=settings.validation_days,
        embargo_bars=MAX_LOOKBACK,
        tuning_days=settings.train_days,
        tuning_validation_days=settings.validation_days,
    )


def _world_features(spec: WorldSpec, n_days: int, seed: int, workdir: Path) -> pl.DataFrame:
    """Demo DBN files for the world, featurized file by file with the earlier files as context (as the
    pipeline's features rule gives them), in one table."""
    raw = generate_demo_files(
        workdir / "raw", WORLD_START, n_days, seed, edge=spec.edge, edge_kind=spec.demo_kind
    )
    tables = []
    for i, path in enumerate(raw):
        out = workdir / "features" / f"{path.name}.parquet"
        build_feature_file(path, out, context_srcs=raw[max(0, i - CONTEXT_FILES) : i])
        tables.append(out)
    return load_feature_tables(tables)


def _tune_fold(
    zoo_model: ModelSpec,
    model: str,
    table: pl.DataFrame,
    plan: FoldPlan,
    fold: int,
    world: Mapping[str, Any],
    run_settings: RunSettings,
    n_trials: int,
) -> HyperoptSummary:
    """Nested tuning of one model on one fold of a world: a seeded TPE search of `n_trials` trials over the
    model's own search space, each trained on the fold's own tuning window and scored by its validation Sharpe
    (the pipeline's objective); returned in the shape of the pipeline's per-fold hyperopt summary."""
    window = tuning_window(table, plan, world, "cpu", fold)
    train, validation = window.splits["train"], window.splits["validation"]
    env_config = env_config_from_config(world)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = optuna.samplers.TPESampler(seed=derive_seed(world["seed"], "calibration-tuning", model, fold))
    study = optuna.create_study(direction="maximize", sampler=sampler)

    def objective(trial: optuna.Trial) -> float:
        seed = derive_seed(world["seed"], "calibration-trial", model, fold, trial.number)
        (trained,) = zoo_model.train_seeds(
            train, validation, run_settings, zoo_model.search_space(trial), "fp32", "cpu", [seed]
        )
        return positions_sharpe(validation, trained.positions(validation), env_config)

    study.optimize(objective, n_trials=n_trials)
    trials = [
        {"number": t.number, "state": t.state.name, "value": t.value, "params": t.params, "intermediate": {}}
        for t in study.trials
    ]
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best = study.best_trial
    data = {
        "algo": model,  # the hyperopt JSON's on-disk key, kept for compatibility
        "fold": fold,
        "best_params": best.params,
        "best_value": best.value,
        "best_trial": best.number,
        "n_trials": len(trials),
        "n_complete": len(complete),
        "n_pruned": 0,
        "n_failed": len(trials) - len(complete),
    }
    sharpes = [float(t.value) / ANNUALIZER for t in complete]
    return HyperoptSummary(model, Path(f"<calibration {model} fold {fold}>"), trials, sharpes, data)


def model_hparams(model: str) -> dict[str, Any]:
    """The fixed hyperparameters of `model` in every world (FIXED_HPARAMS; the model's defaults otherwise)."""
    return dict(FIXED_HPARAMS.get(model, {}))


def _matched_traders(
    data: MarketData, positions: torch.Tensor, world: Mapping[str, Any], key: tuple[str, int, int]
) -> MatchedRandom:
    """The turnover-matched random traders of one model run, as the evaluation stage makes them
    (`marketrl.evaluation.evaluate.matched_trader_positions`), keeping only the daily returns the verdict reads
    (no per-trader summaries)."""
    rate, traders = matched_trader_positions(data, positions, world, key)
    scores = score_positions(data, traders, env_config_from_config(world), summaries=False)
    return MatchedRandom(rate, scores.days, scores.daily_net_returns)


def _baseline_runs(fold: int, per_strategy: Mapping[str, pl.DataFrame]) -> tuple[list[Run], list[Run]]:
    source = Path(f"<calibration baselines fold {fold}>")
    fixed = [Run(name, False, fold, None, per_strategy[name], source) for name in DETERMINISTIC_BASELINES]
    random = [
        Run(RANDOM_BASELINE, False, fold, int(name.removeprefix("random_")), frame, source)
        for name, frame in per_strategy.items()
        if name.startswith("random_")
    ]
    return fixed, sorted(random, key=lambda run: run.seed_index or 0)


def _classify(verdicts: Sequence[ModelVerdict]) -> str:
    """The world's outcome: any model's family-wise "beats" first, then "not enough data", then "worse"."""
    if any(v.beats for v in verdicts):
        return "beats"
    if not all(v.enough_data for v in verdicts):
        return "not enough data"
    if any(c.worse for v in verdicts for c in v.comparisons):
        return "worse"
    return "none"


def _gates(
    runs: Sequence[Any], validation: MarketData, env_config: EnvConfig, min_t: float | None
) -> list[GateDecision | None]:
    """A model x fold's validation gates as its train job decides them, its seeds as one batch (None each: no
    gate configured)."""
    if min_t is None:
        return [None] * len(runs)
    positions = torch.stack([trained.positions(validation) for trained in runs])
    return flat_gates(validation, positions, env_config, min_t)


def _test_record(test: MarketData, positions: Sequence[torch.Tensor], env_config: EnvConfig) -> FoldRecord:
    """A fold's part of a model's walk-forward record: its seeds' ungated test returns, as the evaluate job
    writes them (metrics.json ``ungated``) and `read_test_records` reads them back."""
    scores = score_positions(test, torch.stack(list(positions)), env_config)
    assert scores.summaries is not None and scores.daily_gross_returns is not None
    return FoldRecord.of_seeds(
        scores.days,
        scores.daily_net_returns,
        scores.daily_gross_returns,
        [summary["avg_daily_turnover"] for summary in scores.summaries],
        scores.summaries[0]["n_bars"],
    )


def run_world(config: Mapping[str, Any], settings: CalibrationSettings, spec: WorldSpec) -> dict[str, Any]:
    """Run one world end to end and score it with the report's verdict; returns its outcome and, per model,
    the mean seed Sharpe, the claims and the smallest Sharpe difference to a baseline (all annualised)."""
    world = _world_config(config, settings, spec)
    cfg = _fold_config(settings, spec)
    env_config = env_config_from_config(world)
    # No costs in the settings: the trading rule charges the data's own per-row cost fractions, each instrument's
    # from its contract spec (as zoo.run_settings does; a per-instrument cost config has no single cost_fraction).
    run_settings = RunSettings(fill=env_config.fill)
    with tempfile.TemporaryDirectory(prefix="marketrl-calibration-") as tmp:
        table = _world_features(spec, cfg.required_days, world["seed"], Path(tmp))
    plan = make_fold_plan(table["trading_day"].unique().to_list(), cfg)

    model_runs: list[Run] = []
    baseline_runs: list[Run] = []
    random_runs: list[Run] = []
    tuned: dict[str, dict[int, HyperoptSummary]] = {}  # the nested-tuning arm's studies, model -> fold
    records: dict[str, list[FoldRecord]] = {}  # each model's walk-forward record so far (the earlier folds)
    record_min_t = world["training"]["record_min_t"]
    for fold in range(settings.folds):
        window = fold_window(table, plan, fold, world, "cpu", splits=("train", "validation", "test"))
        train, validation, test = (window.splits[s] for s in ("train", "validation", "test"))
        per_strategy = {
            name: evaluate_positions(test, positions, env_config).select(BAR_COLUMNS)
            for name, positions in baseline_positions(test, world, fold).items()
        }
        fixed, random = _baseline_runs(fold, per_strategy)
        baseline_runs += fixed
        random_runs += random
        for model in settings.models:
            zoo_model = MODELS[model]
            hparams = model_hparams(model)
            if spec.per_fold:  # the fold trains with its own study's choice
                study = _tune_fold(
                    zoo_model, model, table, plan, fold, world, run_settings, settings.per_fold_trials
                )
                tuned.setdefault(model, {})[fold] = study
                hparams = dict(study.data["best_params"])
            # a deterministic model has one distinct run, as in the pipeline (registry.DETERMINISTIC)
            seed_indices = range(1 if zoo_model.deterministic else settings.seeds)
            runs = [
                zoo_model.train_seeds(
                    train,
                    validation,
                    run_settings,
                    hparams,
                    "fp32",
                    "cpu",
                    [derive_seed(world["seed"], "train", model, fold, seed_index)],
                )[0]
                for seed_index in seed_indices
            ]
            # the train job's validation gates (`marketrl.scoring.gate`, its seeds pooled too), then from the
            # second fold on the model's walk-forward record, as the evaluate job applies them
            gate_min_t = world["training"]["gate_min_t"]
            record = record_gate(records[model], record_min_t) if record_min_t is not None and fold else None
            run_gates = _gates(runs, validation, env_config, gate_min_t)
            gates = record_or_pooled(record, run_gates, world["training"]["pooled_min_t"])
            ungated = []
            for seed_index, trained, gate in zip(seed_indices, runs, gates, strict=True):
                ungated.append(trained.positions(test).to(torch.float32))
                positions = gated_positions(ungated[-1], gate)
                bars = evaluate_positions(test, positions, env_config).select(BAR_COLUMNS)
                matched = _matched_traders(test, positions, world, (model, fold, seed_index))
                source = Path(f"<calibration {model} fold {fold} seed {seed_index}>")
                model_runs.append(Run(model, True, fold, seed_index, bars, source, None, matched))
            records.setdefault(model, []).append(_test_record(test, ungated, env_config))

    hyperopt = {model: pooled_fold_studies(model, by_fold) for model, by_fold in tuned.items()}
    inputs = ReportInputs(model_runs, baseline_runs, random_runs, hyperopt, [], plan, hyperopt_folds=tuned)
    agents = build_strategies(model_runs, pooled_summary=False)
    baselines = baseline_order(build_strategies(baseline_runs, pooled_summary=False))
    random_seeds = build_strategies(random_runs, pooled_summary=False)
    rules = VerdictRules.from_config(world)
    verdicts, family = model_verdicts(inputs, agents, baselines, random_seeds, rules, world["seed"])
    return to_json_safe(
        {
            "edge": spec.edge,
            "kind": spec.kind,
            "test_days": spec.test_days,
            "index": spec.index,
            "per_fold": spec.per_fold,
            "seed": world["seed"],
            "n_days": family.n_days,
            "outcome": _classify(verdicts),
            "detectable": family.detectable,
            "critical": family.critical,
            "models": {
                v.model: {
                    "sharpe": v.sharpe.point,
                    "beats": v.beats,
                    "enough_data": v.enough_data,
                    "worse_than": [c.baseline for c in v.comparisons if c.worse],
                    "better_than": [c.baseline for c in v.comparisons if c.beats],
                    "diffs": {c.baseline: c.diff for c in v.comparisons},
                    "min_diff": min((c.diff for c in v.comparisons), default=math.nan),
                    "max_p_beats": max((c.p_beats for c in v.comparisons), default=math.nan),
                    # nested tuning: the DSR's N (every fold's trials) and each fold's choice
                    **(
                        {
                            "dsr_n": v.deflation.n_trials,
                            "dsr": v.deflation.dsr,
                            "fold_params": [
                                tuned[v.model][k].data["best_params"] for k in sorted(tuned[v.model])
                            ],
                        }
                        if v.model in tuned
                        else {}
                    ),
                }
                for v in verdicts
            },
        }
    )


def checked_settings(config: Mapping[str, Any]) -> CalibrationSettings:
    """The calibration settings, with every model name checked against the zoo's registry."""
    settings = CalibrationSettings.from_config(config)
    unknown = [m for m in settings.models if m not in MODELS]
    if unknown:
        raise CalibrationError(
            f"config key 'calibration.models': unknown model {unknown[0]!r} (known: {', '.join(MODELS)})"
        )
    return settings


def run_job(config: Mapping[str, Any], job: int, out_path: str | Path) -> dict[str, Any]:
    """Run the worlds of one job and write them atomically as one chunk JSON."""
    settings = checked_settings(config)
    worlds = [run_world(config, settings, spec) for spec in job_worlds(settings, job)]
    chunk = {"format": FORMAT, "version": VERSION, "job": job, "worlds": worlds}
    write_json_atomic(out_path, chunk)
    return chunk


# -------------------------------------------------------------------------------------------------- aggregation


def clopper_pearson(successes: int, trials: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Exact (Clopper–Pearson) two-sided interval of a binomial proportion: never below the nominal level."""
    if trials < 1 or not 0 <= successes <= trials:
        raise ValueError(
            f"clopper_pearson: need 0 <= successes <= trials, trials >= 1; got {successes}/{trials}"
        )
    tail = (1.0 - level) / 2.0
    lo = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    hi = 1.0 if successes == trials else float(beta.ppf(1.0 - tail, successes + 1, trials - successes))
    return lo, hi


def _rate(successes: int, trials: int) -> dict[str, Any]:
    lo, hi = clopper_pearson(successes, trials)
    return {"k": successes, "n": trials, "rate": successes / trials, "ci": [lo, hi]}


def _best_min_diff(world: Mapping[str, Any]) -> float:
    """The world's best model's smallest Sharpe difference to a baseline: what "beats every baseline" tests."""
    diffs = [m["min_diff"] for m in world["models"].values() if m["min_diff"] is not None]
    return max(diffs) if diffs else math.nan


def _crossing(xs: Sequence[float], ys: Sequence[float], level: float) -> float | None:
    """First x where the piecewise-linear curve through (xs, ys) reaches `level` (None if it never does)."""
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if y >= level:
            if i == 0:
                return float(x)
            x0, y0 = xs[i - 1], ys[i - 1]
            return float(x0 + (level - y0) * (x - x0) / (y - y0))
    return None


def world_kind(world: Mapping[str, Any]) -> str:
    """A recorded world's edge kind (worlds recorded before kinds existed were momentum or no-edge worlds)."""
    if float(world["edge"]) == 0:
        return NO_EDGE
    return str(world.get("kind", "momentum"))


def _world_key(world: Mapping[str, Any]) -> tuple[float, str, int, int, bool]:
    return (
        float(world["edge"]),
        world_kind(world),
        int(world["test_days"]),
        int(world["index"]),
        bool(world.get("per_fold", False)),
    )


def _members(
    worlds: Sequence[Mapping[str, Any]], edge: float, kind: str, days: int
) -> list[Mapping[str, Any]]:
    return [
        w
        for w in worlds
        if float(w["edge"]) == edge and world_kind(w) == kind and int(w["test_days"]) == days
    ]


def _arms(worlds: Sequence[Mapping[str, Any]], settings: CalibrationSettings) -> list[dict[str, Any]]:
    """One summary per arm (edge and kind x test days) of `worlds` (worlds of one scheme)."""
    arms = []
    for edge in settings.edges:
        for kind, days in ((k, d) for k in settings.arm_kinds(edge) for d in settings.test_days):
            members = _members(worlds, edge, kind, days)
            counts = {outcome: sum(w["outcome"] == outcome for w in members) for outcome in OUTCOMES}
            sharpes = {
                model: _finite_mean([_nan(w["models"][model]["sharpe"]) for w in members])
                for model in settings.models
            }
            arms.append(
                {
                    "edge": edge,
                    "kind": kind,
                    "better_than": _better_than_rates(members),
                    "test_days": days,
                    "worlds": len(members),
                    "beats": _rate(counts["beats"], len(members)),
                    "outcomes": counts,
                    "mean_sharpe": sharpes,
                    "mean_best_min_diff": _finite_mean([_best_min_diff(w) for w in members]),
                    "mean_formula_detectable": _finite_mean([_nan(w["detectable"]) for w in members]),
                }
            )
    return arms


def _finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values; NaN when there is none (every world of the arm left it undefined)."""
    finite = [value for value in values if math.isfinite(value)]
    return float(np.mean(finite)) if finite else math.nan


def _false_positive(arms: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The 'beats' rate over the no-edge arms (None without one)."""
    null_arms = [a for a in arms if a["edge"] == 0.0]
    if not null_arms:
        return None
    return _rate(sum(a["beats"]["k"] for a in null_arms), sum(a["worlds"] for a in null_arms))


def summarize(worlds: Sequence[Mapping[str, Any]], settings: CalibrationSettings) -> dict[str, Any]:
    """Rates per arm with Clopper–Pearson intervals, the false-positive rate of the no-edge worlds, and per edge
    kind and test-day count the edge and the Sharpe difference detectable at 80% power (None above every edge
    tried; the no-edge arm is each kind's curve at 0).
    With calibration.per_fold_trials > 0 the nested-tuning arms get their own arms and false-positive rate."""
    expected = {(s.edge, s.kind, s.test_days, s.index, s.per_fold) for s in world_specs(settings)}
    got = [_world_key(w) for w in worlds]
    if sorted(got) != sorted(expected):
        missing = sorted(expected - set(got))
        raise CalibrationError(
            f"calibration: the chunks hold {len(got)} worlds, the config asks for {len(expected)}"
            + (
                f" (missing e.g. edge {missing[0][0]:g} ({missing[0][1]}), {missing[0][2]} test days,"
                f" world {missing[0][3]})"
                if missing
                else ""
            )
        )
    arms = _arms([w for w in worlds if not _world_key(w)[4]], settings)
    detectable = []
    for kind, days in ((k, d) for k in settings.edge_kinds for d in settings.test_days):
        curve = sorted(
            (a for a in arms if a["test_days"] == days and a["kind"] in (kind, NO_EDGE)),
            key=lambda a: a["edge"],
        )
        edges = [a["edge"] for a in curve]
        power = [a["beats"]["rate"] for a in curve]
        edge_80 = _crossing(edges, power, TARGET_POWER)
        diff_80 = None
        if edge_80 is not None:
            diffs = [a["mean_best_min_diff"] for a in curve]
            diff_80 = float(np.interp(edge_80, edges, diffs))
        detectable.append(
            {
                "kind": kind,
                "test_days": days,
                "edge_at_80_power": edge_80,
                "sharpe_difference_at_80_power": diff_80,
            }
        )
    summary = {
        "arms": arms,
        "false_positive": _false_positive(arms),
        "false_positive_target": TARGET_FALSE_POSITIVE_RATE,
        "power": [a for a in arms if a["edge"] > 0.0],
        "detectable": detectable,
        "power_target": TARGET_POWER,
        "ci_level": CI_LEVEL,
    }
    if settings.per_fold_trials > 0:
        nested = [w for w in worlds if _world_key(w)[4]]
        per_fold_arms = _arms(nested, settings)
        for arm in per_fold_arms:  # the DSR's N of each model: every fold's trials
            members = _members(nested, arm["edge"], arm["kind"], arm["test_days"])
            arm["dsr_n"] = sorted({int(m["dsr_n"]) for w in members for m in w["models"].values()})
        summary["per_fold_arms"] = per_fold_arms
        summary["false_positive_per_fold"] = _false_positive(per_fold_arms)
    return summary


def _better_than_rates(members: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Per baseline, the share of worlds where some model is family-wise better than it (None for worlds
    recorded before the per-baseline claims were)."""
    if not members or any("better_than" not in m for w in members for m in w["models"].values()):
        return None
    baselines = sorted({b for w in members for m in w["models"].values() for b in m["diffs"]})
    return {
        baseline: {
            **_rate(
                sum(any(baseline in m["better_than"] for m in w["models"].values()) for w in members),
                len(members),
            ),
            "mean_diff": {
                model: float(np.nanmean([_nan(w["models"][model]["diffs"].get(baseline)) for w in members]))
                for model in members[0]["models"]
            },
        }
        for baseline in baselines
    }


def _nan(value: Any) -> float:
    return math.nan if value is None else float(value)


def read_chunks(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    """Every world of the chunk files, checked for format."""
    worlds = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise CalibrationError(f"{path}: cannot read calibration chunk ({err})".splitlines()[0]) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
            raise CalibrationError(f"{path}: not a calibration chunk (format {FORMAT!r} version {VERSION})")
        worlds += data["worlds"]
    return worlds


def calibration_result(
    worlds: Sequence[Mapping[str, Any]], config: Mapping[str, Any], command: str
) -> dict[str, Any]:
    """The calibration JSON: settings, the verdict rules in force, every world and the summary."""
    settings = CalibrationSettings.from_config(config)
    evaluation = config["evaluation"]
    return to_json_safe(
        {
            "format": FORMAT,
            "version": VERSION,
            "command": command,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "settings": {**config["calibration"]},
            "hparams": {model: model_hparams(model) for model in settings.models},
            "verdict_rules": {
                "min_test_days": evaluation["min_test_days"],
                "min_seeds": evaluation["min_seeds"],
                "bootstrap_samples": evaluation["bootstrap_samples"],
                "alpha": VerdictRules.from_config(config).alpha,
            },
            "summary": summarize(worlds, settings),
            "worlds": sorted(worlds, key=lambda w: (_world_key(w)[4], *_world_key(w)[:4])),
        }
    )


def render_html(result: Mapping[str, Any]) -> str:
    """A self-contained HTML page of the calibration (the report's template ``calibration.html``, autoescaped):
    false-positive rate, power per arm, claims per baseline, detectable edges."""
    return template_environment().get_template("calibration.html").render(result=result)


def write_outputs(result: Mapping[str, Any], json_path: str | Path, html_path: str | Path) -> None:
    """Write the calibration JSON and HTML, each atomically."""
    write_json_atomic(json_path, result)
    with atomic_write(html_path) as tmp:
        Path(tmp).write_text(render_html(result), encoding="utf-8")


def summarize_job(
    chunk_paths: Sequence[str | Path],
    config: Mapping[str, Any],
    json_path: str | Path,
    html_path: str | Path,
    command: str,
) -> dict[str, Any]:
    """The `calibration` rule: every world of the chunk files, summarized into the JSON and the HTML page."""
    result = calibration_result(read_chunks(chunk_paths), config, command)
    write_outputs(result, json_path, html_path)
    return result
