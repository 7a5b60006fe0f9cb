"""Assemble the report: load inputs, compute every section, render the Jinja2 template, write atomically."""

from __future__ import annotations

import json
import logging
import math
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import yaml

from marketrl.calendars.annual import ANNUALIZER
from marketrl.report import figures, forecast, tables, tuning
from marketrl.runtime import provenance
from marketrl.runtime.io import atomic_writes
from marketrl.scoring.metrics import to_json_safe
from marketrl.scoring.stats import is_finite_number
from marketrl.settings.config import derive_seed
from marketrl.settings.registry import DETERMINISTIC
from marketrl.verdict import diagnostics
from marketrl.verdict.days import DaysToAnswer, days_to_answer
from marketrl.verdict.inputs import (
    AGENT,
    BASELINES,
    FORECASTER,
    RANDOM_BASELINE,
    ReportInputError,
    ReportInputs,
    check_models,
    load_inputs,
    read_json_object,
)
from marketrl.verdict.strategies import (
    BASELINE_LABELS,
    DSR_THRESHOLD,
    Strategy,
    VerdictRules,
    build_strategies,
    config_value,
    random_seed_strategies,
)
from marketrl.verdict.verdicts import FamilySummary, ModelVerdict, deflation_for, model_verdicts, sharpe_stats

log = logging.getLogger(__name__)

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
SECTIONS = (
    ("leaderboard", "Leaderboard"),
    ("verdict", "Verdict: models vs baselines"),
    ("forecasts", "Forecast quality: predictions vs realized"),
    ("equity", "Equity curves"),
    ("drawdowns", "Drawdowns"),
    ("per-fold", "Per-fold results"),
    ("seeds", "Spread across seeds"),
    ("positions", "Positions and turnover"),
    ("costs", "Cost sensitivity"),
    ("hyperopt", "Hyperparameter optimisation"),
    ("training", "Training curves"),
    ("data", "Data and folds"),
    ("provenance", "Run provenance"),
)
PER_FOLD_COLUMNS = (
    ("sharpe", "Net Sharpe", "num"),
    ("gross_sharpe", "Gross Sharpe", "num"),
    ("total_return", "Net return", "pct"),
    ("gross_total_return", "Gross return", "pct"),
    ("max_drawdown", "Max DD", "pct"),
    ("hit_rate_days", "Day hit rate", "share"),
    ("avg_daily_turnover", "Turnover / day", "num"),
    ("n_trades", "Trades", "int"),
    ("total_cost", "Costs", "pct"),
)


# ----------------------------------------------------------------------------------------------- formatting


def _minus(text: str) -> str:
    return text.replace("-", "−")


def fmt_num(x: Any, digits: int = 2, sign: bool = False) -> str:
    """A number with fixed decimals and a typographic minus; '—' for missing/undefined."""
    if not is_finite_number(x):
        return "—"
    return _minus(f"{float(x):{'+' if sign else ''}.{digits}f}")


def fmt_pct(x: Any, digits: int = 2, sign: bool = False) -> str:
    """A fraction as a percentage."""
    return "—" if not is_finite_number(x) else fmt_num(100 * float(x), digits, sign) + "%"


def fmt_share(x: Any) -> str:
    return "—" if not is_finite_number(x) else f"{100 * float(x):.0f}%"


def fmt_prob(x: Any) -> str:
    return "—" if not is_finite_number(x) else f"{float(x):.3f}"


def fmt_int(x: Any) -> str:
    return "—" if not is_finite_number(x) else f"{int(x):,}".replace(",", "\u2009")


def fmt_ci(lo: Any, hi: Any, digits: int = 2, sign: bool = False) -> str:
    if not (is_finite_number(lo) and is_finite_number(hi)):
        return ""
    return f"[{fmt_num(lo, digits, sign)}, {fmt_num(hi, digits, sign)}]"


def fmt_pct_ci(lo: Any, hi: Any, digits: int = 2) -> str:
    if not (is_finite_number(lo) and is_finite_number(hi)):
        return ""
    return f"[{fmt_pct(lo, digits)}, {fmt_pct(hi, digits)}]"


def fmt_value(x: Any) -> str:
    """A hyperparameter or provenance value: numbers compactly, everything else as text."""
    if isinstance(x, bool) or x is None:
        return str(x)
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def data_value(x: Any) -> str:
    """Machine-readable cell value for data-value attributes, 12 significant digits ('' when undefined).

    12 digits rather than repr: float sums over unordered groups can differ in the last bit between runs,
    and the report must be byte-stable."""
    if not is_finite_number(x):
        return ""
    return str(x) if isinstance(x, int) else f"{float(x):.12g}"


FORMATTERS: dict[str, Callable[[Any], str]] = {
    "num": fmt_num,
    "pct": fmt_pct,
    "share": fmt_share,
    "int": fmt_int,
}


def template_environment() -> jinja2.Environment:
    """The Jinja2 environment of every page under templates/ (the report, the calibration): autoescaped, strict
    about undefined names, with the report's number formats as filters."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default=True),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters.update(
        num=fmt_num,
        pct=fmt_pct,
        share=fmt_share,
        prob=fmt_prob,
        int=fmt_int,
        ci=fmt_ci,
        pct_ci=fmt_pct_ci,
        value=fmt_value,
        data_value=data_value,
        baseline_label=lambda name: BASELINE_LABELS.get(name, name),
    )
    env.globals.update(formatters=FORMATTERS, finite=is_finite_number)
    return env


# ------------------------------------------------------------------------------------------------ sections


def _per_fold_rows(
    strategies: Sequence[Strategy],
    random_seeds: Sequence[Strategy],
    folds: Sequence[int],
) -> list[dict[str, Any]]:
    rows = []
    for fold in folds:
        for strategy in strategies:
            if fold not in strategy.fold_summaries:
                continue
            summary = strategy.fold_summaries[fold]
            if strategy.name == RANDOM_BASELINE and random_seeds:
                # The seed-averaged position is fractional: its trade count would count every tiny change.
                per_seed = [s.fold_summaries[fold] for s in random_seeds if fold in s.fold_summaries]
                summary = {
                    **summary,
                    "avg_daily_turnover": float(np.mean([x["avg_daily_turnover"] for x in per_seed])),
                    "n_trades": round(float(np.mean([x["n_trades"] for x in per_seed]))),
                }
            rows.append(
                {
                    "fold": fold,
                    "strategy": strategy.name,
                    "seed": strategy.seed_index,
                    "label": strategy.label,
                    "is_agent": strategy.is_agent,
                    "summary": summary,
                }
            )
    return rows


def input_files_summary(manifest_path: str | Path) -> dict[str, Any]:
    """What the feature manifest says about the input files: how many, which were skipped and why
    (`data.on_bad_file: skip`), which only served as warm-up context (the first file(s)), bars dropped outside
    the session and inside the daily halt per file, the rolls of every continuous symbol and where the file names
    disagree with the data's time order, and the features.user features (docs/OUTPUTS.md). A malformed manifest is a
    ReportInputError naming it."""
    manifest = read_json_object(manifest_path, "feature manifest")
    files, rolls = manifest.get("files"), manifest.get("rolls", [])
    if not isinstance(files, list) or not all(isinstance(entry, dict) and "path" in entry for entry in files):
        raise ReportInputError(
            f"{manifest_path}: feature manifest: 'files' must be a list of objects with a path"
        )
    if not isinstance(rolls, list) or not all(isinstance(roll, dict) for roll in rolls):
        raise ReportInputError(f"{manifest_path}: feature manifest: 'rolls' must be a list of objects")
    name_order = manifest.get("name_order")
    if name_order is not None and not (isinstance(name_order, dict) and {"file", "after"} <= set(name_order)):
        raise ReportInputError(
            f"{manifest_path}: feature manifest: 'name_order' must be null or an object with file and after"
        )
    user = manifest.get("user_features")
    if user is not None and not (isinstance(user, dict) and isinstance(user.get("names"), list)):
        raise ReportInputError(
            f"{manifest_path}: feature manifest: 'user_features' must be null or an object with a list of names"
        )

    def name(entry: Mapping[str, Any]) -> str:
        return str(entry.get("source_file") or Path(str(entry["path"])).name)

    counted = [entry for entry in files if entry.get("dropped_outside_session") is not None]
    return {
        "n_files": len(files),
        "skipped": [{"file": name(e), "reason": str(e["skipped"])} for e in files if e.get("skipped")],
        "warmup_only": [
            {"file": name(e), "note": str(e["warmup_only"])} for e in files if e.get("warmup_only")
        ],
        "dropped": [
            {"file": name(e), "in_halt": e.get("dropped_in_halt"), "outside": e["dropped_outside_session"]}
            for e in counted
        ],
        "n_counted": len(counted),
        "in_halt": sum(int(e.get("dropped_in_halt") or 0) for e in counted),
        "outside": sum(int(e["dropped_outside_session"]) for e in counted),
        "rolls": rolls,
        "name_order": name_order,
        "user_features": user,  # None: the catalog's features only
    }


def _data_section(
    inputs: ReportInputs, strategies: Sequence[Strategy], input_files: Mapping[str, Any] | None
) -> dict[str, Any]:
    plan = inputs.plan
    bars_per_day = strategies[0].bars_per_day if strategies else math.nan  # median, per instrument and day
    embargo = plan.config.embargo_bars
    embargo_days = (
        min(0.5, embargo / bars_per_day) if is_finite_number(bars_per_day) and bars_per_day > 0 else 0.1
    )
    symbols = sorted({symbol for s in strategies if s.is_agent for symbol in s.symbols})
    windows = []
    for fold in plan.folds:
        windows.append(
            {
                "name": f"fold {fold.index}",
                "train": (fold.first_train_day, fold.inner_train_days[-1] if fold.inner_train_days else None),
                "n_train": len(fold.inner_train_days),
                "validation": (fold.first_validation_day, fold.last_validation_day),
                "n_validation": len(fold.validation_days),
                "test": (fold.first_test_day, fold.last_test_day),
                "n_test": len(fold.test_days),
            }
        )
    return {
        "plan": plan,
        "config": plan.config,
        "symbols": symbols,
        "bars_per_day": bars_per_day,
        "windows": windows,
        "tuning": plan.tuning,
        "nested_tuning": bool(inputs.hyperopt_folds),  # hyperopt.per_fold: one tuning window per fold
        "timeline": figures.folds_timeline_figure(plan, max(embargo_days, 0.08)),
        "input_files": input_files,  # None: no feature manifest given
    }


def _hyperopt_section(inputs: ReportInputs, models: Sequence[str]) -> list[dict[str, Any]]:
    sections = []
    for model in models:
        summary = inputs.hyperopt.get(model)
        if summary is None:
            sections.append(
                {"model": model, "source": None, "missing": "no hyperopt summary was given for this model"}
            )
            continue
        color = figures.model_color(model, models)
        importances, message = tuning.param_importances(summary)
        completed = [t for t in summary.trials if t.get("state") == "COMPLETE"]
        data = summary.data
        sections.append(
            {
                "model": model,
                "missing": "" if completed else "no hyperopt trial completed",
                "source": str(summary.source),
                "n_trials": data.get("n_trials", len(summary.trials)),
                "n_complete": data.get("n_complete", len(completed)),
                "n_pruned": data.get("n_pruned", sum(t.get("state") == "PRUNED" for t in summary.trials)),
                "n_failed": data.get("n_failed", sum(t.get("state") == "FAIL" for t in summary.trials)),
                "objective": data.get("objective", ""),
                "direction": data.get("direction", "maximize"),
                "best_value": data.get("best_value"),
                "best_trial": data.get("best_trial"),
                "best_fold": data.get("best_fold"),
                "best_params": tuning.best_params_rows(summary),
                "sampler": data.get("sampler") or {},
                "storage": provenance.redact_url(str(data.get("storage") or "")),  # never a password
                "tuning_window": data.get("tuning_window") or {},
                "n_dsr": deflation_for(inputs, model).n_trials,
                "history": figures.hyperopt_history_figure(summary, color) if summary.trials else None,
                "importance": figures.importance_figure(model, importances, color) if importances else None,
                "importance_message": message,
                # hyperopt.per_fold: each fold's own choice (does hidden_dim_base wander?)
                "per_fold": tuning.per_fold_rows(inputs.hyperopt_folds[model])
                if model in inputs.hyperopt_folds
                else None,
            }
        )
    return sections


def _training_section(inputs: ReportInputs, models: Sequence[str]) -> dict[str, Any]:
    figures_by_model = []
    for model in sorted({log.model for log in inputs.train_logs}):
        logs = [log for log in inputs.train_logs if log.model == model]
        if figures.training_metrics_present(logs):
            color = figures.model_color(model, models)
            agent = model not in models or inputs.kind_of(model) == AGENT
            steps = "env steps" if agent else "training steps"
            figures_by_model.append(
                {"model": model, "figure": figures.training_figure(model, logs, color, steps)}
            )
        else:
            figures_by_model.append({"model": model, "figure": None})
    rows = []
    for log in sorted(inputs.train_logs, key=lambda lg: (lg.model, lg.fold, lg.seed_index)):
        data = log.data
        precision = data.get("precision") if isinstance(data.get("precision"), Mapping) else {}
        rows.append(
            {
                "model": log.model,
                "fold": log.fold,
                "seed_index": log.seed_index,
                "seed": data.get("seed"),
                "device": data.get("device", ""),
                "precision": precision.get("mode", ""),
                "precision_reason": precision.get("reason", ""),
                "total_steps": data.get("total_steps"),
                "wall_s": data.get("wall_s"),
                "steps_per_s": data.get("steps_per_s"),
                "host_syncs": data.get("host_syncs"),
                "hidden_sizes": data.get("hidden_sizes") or {},
                "source": str(log.source),
            }
        )
    return {"figures": figures_by_model, "rows": rows}


def _provenance_section(inputs: ReportInputs, config: Mapping[str, Any]) -> dict[str, Any]:
    recorded_inputs: dict[str, str] = {}
    upstream_commits = set()
    for record in inputs.provenance_records:
        if record.get("git_commit"):
            upstream_commits.add(str(record["git_commit"]))
        if isinstance(record.get("inputs"), Mapping):
            recorded_inputs.update({str(k): str(v) for k, v in record["inputs"].items()})
    files = []
    for path in dict.fromkeys(inputs.files):
        files.append(
            {"path": str(path), "sha256": provenance.sha256_file(path), "bytes": path.stat().st_size}
        )
    public = provenance.public_config(dict(config))  # hyperopt.storage without its password
    return {
        "config_yaml": yaml.safe_dump(to_json_safe(public), sort_keys=True, allow_unicode=True, width=100),
        "config_hash": provenance.config_hash(public),
        "git_commit": provenance.git_commit(),
        "upstream_commits": sorted(upstream_commits),
        "packages": provenance.package_versions(
            (*provenance.TRACKED_PACKAGES, "scipy", "matplotlib", "jinja2")
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "files": files,
        "recorded_inputs": sorted(recorded_inputs.items()),
    }


def _grouped_assumptions(verdicts: Sequence[ModelVerdict]) -> list[tuple[str, list[str]]]:
    """Each DSR assumption once, with the models it applies to (eleven models would repeat it eleven times)."""
    grouped: dict[str, list[str]] = {}
    for verdict in verdicts:
        for text in verdict.deflation.assumptions:
            grouped.setdefault(text, []).append(verdict.model)
    return list(grouped.items())


# ----------------------------------------------------------------------------------------------- entry point


def build_context(
    inputs: ReportInputs, config: Mapping[str, Any], input_files: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Every number and figure of the report, ready for the template (`input_files`: `input_files_summary`)."""
    rules = VerdictRules.from_config(config)
    n_boot = rules.n_boot
    multipliers = [float(m) for m in config_value(config, "evaluation.cost_multipliers")]
    root_seed = int(config_value(config, "seed"))
    check_models(inputs, config)
    models = inputs.models

    agents = build_strategies(inputs.model_runs, multipliers=multipliers)
    baselines = tables.baseline_order(build_strategies(inputs.baseline_runs, multipliers=multipliers))
    random_seeds = random_seed_strategies(inputs)
    strategies = [*agents, *baselines]

    verdicts, family = model_verdicts(inputs, agents, baselines, random_seeds, rules, root_seed)
    baseline_stats = [
        {
            "name": b.name,
            "stats": sharpe_stats(
                b.pooled, b.pooled_summary, n_boot, derive_seed(root_seed, "report", "sharpe", b.name)
            ),
        }
        for b in baselines
        if b.pooled is not None
    ]
    quality = {
        model: forecast.forecast_quality(model, agents, inputs.horizon_of(model))
        for model in inputs.forecasters
    }
    board = tables.leaderboard(
        inputs,
        verdicts,
        agents,
        baselines,
        random_seeds,
        {b["name"]: b["stats"].sharpe for b in baseline_stats},
        quality,
        n_boot=n_boot,
        seed=root_seed,
    )
    spreads = [tables.seed_spread(model, agents, n_boot, root_seed) for model in models]
    random_fold_sharpe = {
        fold: np.array([s.fold_summaries[fold]["sharpe"] for s in random_seeds if fold in s.fold_summaries])
        for fold in inputs.folds
    }
    random_fold_sharpe = {k: v[np.isfinite(v)] for k, v in random_fold_sharpe.items()}
    cost_rows = tables.cost_sensitivity(strategies, multipliers)
    fill_rows = tables.fills_paid([*strategies, *random_seeds])
    profile = tables.position_profile(strategies, random_seeds)
    learning = diagnostics.learning_diagnostics(inputs, agents)
    warnings = tables.stored_metric_warnings(strategies)
    for warning in warnings:
        log.warning(warning)

    test_days = sorted({str(d) for s in agents for d in (s.pooled.daily()[0] if s.pooled else [])})
    return {
        "title": "marketrl evaluation report",
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "sections": SECTIONS,
        "number": {section_id: k for k, (section_id, _) in enumerate(SECTIONS, start=1)},
        "models": models,
        "kinds": {model: inputs.kind_of(model) for model in models},
        "horizons": {model: inputs.horizon_of(model) for model in models},
        "forecaster_kind": FORECASTER,
        "leaderboard": board,
        "learning": [learning[model] for model in models],
        "learning_rules": {
            "always_flat": diagnostics.ALWAYS_FLAT_SHARE,
            "in_market": diagnostics.IN_MARKET_FLAT_SHARE,
            "churn_drag": diagnostics.MIN_CHURN_DRAG,
            "curve_tolerance": diagnostics.CURVE_TOLERANCE,
            "converged_share": diagnostics.CONVERGED_SHARE,
            "flag_labels": diagnostics.FLAG_LABELS,
        },
        "forecasts": [
            {
                "quality": q,
                "figure": figures.forecast_figure(q, figures.model_color(model, models)),
            }
            for model, q in quality.items()
        ],
        "baselines": [b.name for b in baselines],
        "all_baselines": BASELINES,
        "verdicts": verdicts,
        "family": family,
        "days_to_answer": _days_to_answer(family, config),
        "rules_test_days": int(config["folds"]["test_days"]),
        "dsr_threshold": DSR_THRESHOLD,
        "dsr_assumptions": _grouped_assumptions(verdicts),
        "annualizer": ANNUALIZER,
        "rules": rules,
        "verdict_baselines": [c.baseline for c in verdicts[0].comparisons] if verdicts else [],
        "baseline_stats": baseline_stats,
        "n_boot": n_boot,
        "n_folds": len(inputs.folds),
        "n_test_days": len(test_days),
        "first_test_day": test_days[0] if test_days else "",
        "last_test_day": test_days[-1] if test_days else "",
        "n_seeds": {model: sum(1 for a in agents if a.name == model) for model in models},
        "deterministic": [model for model in models if model in DETERMINISTIC],
        "n_random_seeds": len(random_seeds),
        "equity_figure": figures.equity_figure(strategies, models),
        "drawdown_figure": figures.drawdown_figure(strategies, models),
        "drawdown_rows": [
            {"label": s.label, "is_agent": s.is_agent, "summary": s.pooled_summary} for s in strategies
        ],
        "per_fold_columns": PER_FOLD_COLUMNS,
        "per_fold_rows": _per_fold_rows(strategies, random_seeds, inputs.folds),
        "seed_spreads": spreads,
        "seeds_figure": figures.seeds_figure(spreads, random_fold_sharpe, models),
        "random_fold_sharpe": {
            k: (float(np.median(v)) if v.size else math.nan) for k, v in random_fold_sharpe.items()
        },
        "positions": profile,
        "positions_figure": figures.positions_figure(profile, models),
        "multipliers": multipliers,
        "cost_rows": cost_rows,
        "fill_rows": fill_rows,
        "cost_model": _cost_model_text(config, fill_rows),
        "wide_half_spread": tables.WIDE_HALF_SPREAD_TICKS,
        "cost_figure": figures.cost_figure(cost_rows, multipliers, models),
        "hyperopt": _hyperopt_section(inputs, models),
        "training": _training_section(inputs, models),
        "data": _data_section(inputs, strategies, input_files),
        "provenance": _provenance_section(inputs, config),
        "warnings": warnings,
    }


def _cost_model_text(config: Mapping[str, Any], fill_rows: Sequence[Mapping[str, Any]]) -> str:
    """One sentence: the fills' cost model in use (quote-aware where the test bars carried quotes)."""
    costs = config.get("costs", {})
    if costs.get("model", "futures") == "bps":
        return (
            f"{costs.get('bps', 0.0):g} bps of notional per side; quotes are not used under costs.model: bps."
        )
    commission = f"plus a commission of {costs.get('commission_per_contract', 0.0):g} per contract per side"
    fallback = f"{costs.get('half_spread_ticks', 0.0):g} tick(s)"
    if any(row["fallback_fills"] is not None for row in fill_rows):
        source = config.get("data", {}).get("quotes") or "the bars' own top of book"
        delay = float(config.get("env", {}).get("fill_delay", 0) or 0)
        when = f"{delay:g} s after the fill time (env.fill_delay)" if delay else "at the fill time"
        return (
            f"Quote-aware fills: a buy fills at the ask and a sell at the bid of the quote {when} "
            f"(env.fill: {config.get('env', {}).get('fill', 'close')}; quotes: {source}), i.e. each side pays the quote's half-spread, "
            f"{commission}; a missing, zero or crossed quote falls back to costs.half_spread_ticks = {fallback} "
            "(the fallback fills are counted below)."
        )
    return (
        f"Fixed half-spread: every fill pays costs.half_spread_ticks = {fallback} per side (the data carry no "
        f"quotes), {commission}."
    )


def render(context: Mapping[str, Any]) -> str:
    """The HTML text of the report."""
    return template_environment().get_template("report.html").render(**context)


def _days_to_answer(family: FamilySummary, config: Mapping[str, Any]) -> tuple[DaysToAnswer, ...]:
    """The run's detectable edges projected to the pooled test days an edge of 1, 2 and 3 would need."""
    return days_to_answer(
        family.detectable, family.one_comparison_detectable, family.n_days, int(config["folds"]["test_days"])
    )


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def verdict_record(
    verdicts: Sequence[ModelVerdict],
    family: FamilySummary,
    config: Mapping[str, Any],
    eval_files: Sequence[str],
    learning: Sequence[diagnostics.LearningDiagnostics] = (),
    leaderboard: Sequence[tables.LeaderboardRow] = (),
) -> dict[str, Any]:
    """The report's verdict as plain data (``results/verdict.json``): the models that beat every baseline at the
    family-wise level (``winners``; the predict stage's default models), each model's claim, adjusted p-value,
    binding baseline and annualised Sharpe with its interval, from `leaderboard` its break-even cost
    (``break_even_cost``) and, from `learning`, whether it learned
    (``diagnostics``: docs/OUTPUTS.md), what the run could detect (``detectable_sharpe_difference``, defined in
    ``headline``; every model's own figure under ``models``, the low-information ones flagged), the report's headline (``sentence``: the
    family sentence the verdict section opens with, which `make run` prints last) and provenance."""
    learned = {d.model: d.to_record() for d in learning}
    costs = {row.name: row.break_even for row in leaderboard if row.break_even is not None}
    return {
        "sentence": family.sentence,
        "winners": [v.model for v in verdicts if v.beats],
        "alpha": family.alpha,
        "pooled_test_days": family.n_days,
        "detectable_sharpe_difference": _finite(family.detectable),
        "one_comparison_detectable": _finite(family.one_comparison_detectable),
        "headline": {
            "definition": family.headline_definition,
            "basis": "reference_trader" if family.reference_note else "median_of_trading_models",
            "models": list(family.headline_models),
        },
        "min_trading_share": family.min_trading_share,
        "low_information_models": list(family.low_information),
        "first_step_level": _finite(family.level),
        "max_t_critical": _finite(family.max_t_critical),
        "days_to_answer": [row.to_record() for row in _days_to_answer(family, config)],
        "models": {
            v.model: {
                "beats_every_baseline": v.beats,
                "enough_data": v.enough_data,
                "p_beats_every": _finite(v.p_beats_every),
                "binding_baseline": v.binding,
                "detectable": _finite(v.detectable),
                "critical": _finite(v.critical),
                "trading_share": _finite(v.trading_share),
                "low_information": v.low_information,
                "sharpe": {
                    "point": _finite(v.sharpe.point),
                    "lo": _finite(v.sharpe.lo),
                    "hi": _finite(v.sharpe.hi),
                },
                "deterministic": v.deterministic,
                **({"break_even_cost": costs[v.model].to_record()} if v.model in costs else {}),
                **({"diagnostics": learned[v.model]} if v.model in learned else {}),
            }
            for v in verdicts
        },
        "provenance": provenance.collect(
            dict(config), {path: provenance.sha256_file(path) for path in eval_files}
        ),
    }


def build_report(
    *,
    eval_files: list[str],
    bar_files: list[str],
    hyperopt_files: list[str],
    folds_path: str,
    train_logs: list[str],
    config: dict[str, Any],
    out_path: str,
    manifest_path: str | None = None,
    verdict_path: str | None = None,
) -> None:
    """Build the self-contained ``eval_report.html`` from the fan-out's outputs (docs/OUTPUTS.md) and write it
    atomically to ``out_path``; ``bar_files[i]`` is the per-bar table of ``eval_files[i]``; the feature manifest
    (``manifest_path``) gives the data section's input files, skips, session drops and rolls. With
    ``verdict_path``, the verdict as JSON too (`verdict_record`), both files or neither. Raises
    ReportInputError (a ValueError) naming a missing or malformed input."""
    started = time.perf_counter()
    inputs = load_inputs(eval_files, bar_files, hyperopt_files, folds_path, train_logs)
    input_files = input_files_summary(manifest_path) if manifest_path is not None else None
    context = build_context(inputs, config, input_files)
    html = render(context)
    outputs = [out_path] if verdict_path is None else [out_path, verdict_path]
    with atomic_writes(outputs) as tmps:
        tmps[0].write_text(html, encoding="utf-8")
        if verdict_path is not None:
            record = verdict_record(
                context["verdicts"],
                context["family"],
                config,
                eval_files,
                context["learning"],
                context["leaderboard"],
            )
            tmps[1].write_text(json.dumps(record, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    log.info("report: %s (%.0f kB)", out_path, len(html.encode()) / 1024)
    # the job log is where a person watches a long run: the build time goes there, never into the report
    log.info("report built in %.1f s", time.perf_counter() - started)


__all__ = ["SECTIONS", "build_context", "build_report", "render", "verdict_record"]
