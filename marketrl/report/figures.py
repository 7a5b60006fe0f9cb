"""Report figures: matplotlib (Agg, object API, no pyplot state) rendered to inline SVG with stable bytes.

Text is drawn as glyph paths (no font needed offline, nothing from the data lands in SVG text), the SVG
comments/metadata are stripped, and every figure gets its own hash salt so element ids never collide when
several SVGs share one HTML document.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import wraps
from typing import Any, ParamSpec

import matplotlib
import numpy as np
from markupsafe import Markup, escape
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from marketrl.report.forecast import ForecastQuality
from marketrl.report.tables import SeedSpread
from marketrl.verdict.inputs import HyperoptSummary, TrainLog
from marketrl.verdict.strategies import BASELINE_LABELS, PATH_POINTS, EquityPath, Strategy, evenly_spaced

P = ParamSpec("P")

_RC = {
    "svg.fonttype": "path",
    "font.family": "DejaVu Sans",
    "font.size": 8.5,
    "axes.titlesize": 9.5,
    "axes.titleweight": "bold",
    "axes.labelsize": 8.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#9ca3af",
    "axes.grid": True,
    "grid.color": "#e5e7eb",
    "grid.linewidth": 0.6,
    "legend.frameon": False,
    "legend.fontsize": 8,
    "xtick.color": "#4b5563",
    "ytick.color": "#4b5563",
    "path.simplify": True,
}
# Points kept per plotted line: enough for a smooth curve at report width, small enough for the size budget (the
# strategies' equity paths keep as many bars).
MAX_LINE_POINTS = PATH_POINTS
# Points of all the lines of one panel together: with many models × seeds each line gets fewer (≥ MIN_LINE_POINTS).
PANEL_POINTS = 12_000
MIN_LINE_POINTS = 300
# Test days up to which a daily line marks each day (the demo's 60 pooled days); more would be a blot of markers.
MARKED_DAYS = 60
# One colour per model, distinct from the baselines' black, orange and greys (eleven models and one spare).
AGENT_COLORS = (
    "#2563eb",
    "#059669",
    "#7c3aed",
    "#dc2626",
    "#0891b2",
    "#be185d",
    "#65a30d",
    "#9333ea",
    "#0f766e",
    "#b45309",
    "#4f46e5",
    "#e11d48",
)
BASELINE_STYLES = {
    "buy_and_hold": {"color": "#111827", "linestyle": "-"},
    "momentum": {"color": "#d97706", "linestyle": "-"},
    "random": {"color": "#9ca3af", "linestyle": "-"},
    "flat": {"color": "#6b7280", "linestyle": ":"},
}
WINDOW_COLORS = {
    "train": "#93c5fd",
    "validation": "#fcd34d",
    "test": "#f87171",
    "tuning train": "#c4b5fd",
    "tuning validation": "#a78bfa",
}


def plot_text(text: object) -> str:
    """Data-derived text made literal for matplotlib: no mathtext, no legend-hiding leading underscore."""
    value = str(text).replace("$", r"\$")
    return " " + value if value.startswith("_") else value


def model_color(model: str, models: Sequence[str]) -> str:
    return (
        AGENT_COLORS[sorted(models).index(model) % len(AGENT_COLORS)] if model in models else AGENT_COLORS[0]
    )


def _clean_svg(svg: str, alt: str) -> Markup:
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<!--.*?-->\s*", "", svg, flags=re.DOTALL)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.DOTALL)
    # Responsive: keep the viewBox, let CSS size it.
    svg = re.sub(r'<svg([^>]*?)\swidth="[^"]*"\sheight="[^"]*"', r"<svg\1", svg, count=1)
    label = str(escape(alt))
    svg = svg.replace("<svg", f'<svg class="figure" role="img" aria-label="{label}"', 1)
    return Markup(svg.strip())


def figure_to_svg(fig: Figure, name: str, alt: str) -> Markup:
    """Render a figure to a cleaned inline SVG; ``name`` salts its element ids (stable across runs)."""
    with matplotlib.rc_context({"svg.hashsalt": f"marketrl-{name}"}):
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None}, bbox_inches="tight")
    return _clean_svg(buffer.getvalue(), alt)


def styled(function: Callable[P, Markup]) -> Callable[P, Markup]:
    """Run a figure function under the report's matplotlib style, without touching global rcParams."""

    @wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> Markup:
        with matplotlib.rc_context(_RC):
            return function(*args, **kwargs)

    return wrapper


def line_points(n_lines: int) -> int:
    """Points kept per line when a panel holds ``n_lines`` lines (the panel's SVG size stays bounded)."""
    return int(min(MAX_LINE_POINTS, max(MIN_LINE_POINTS, PANEL_POINTS // max(1, n_lines))))


def _line_style(strategy: Strategy, models: Sequence[str]) -> dict[str, Any]:
    if strategy.is_agent:
        return {"color": model_color(strategy.name, models), "linestyle": "-", "linewidth": 1.1, "alpha": 0.9}
    style = BASELINE_STYLES.get(strategy.name, {"color": "#6b7280", "linestyle": "-"})
    return {**style, "linewidth": 1.0, "alpha": 0.95}


def _legend_label(strategy: Strategy, labelled: set[str]) -> str | None:
    key = strategy.name
    if key in labelled:
        return None
    labelled.add(key)
    if strategy.is_agent:
        return plot_text(f"{strategy.name} (one line per seed)")
    return plot_text(BASELINE_LABELS.get(strategy.name, strategy.name))


def _time_axis(strategies: Sequence[Strategy]) -> np.ndarray:
    """The union of the strategies' pooled test days, ascending: day k spans [k, k + 1) of the trading-time axis."""
    return np.unique(np.concatenate([s.pooled.daily()[0] for s in strategies if s.pooled is not None]))


def _path(strategy: Strategy, days: np.ndarray) -> tuple[EquityPath, np.ndarray]:
    """The strategy's equity path and its bars' places on the trading-time axis of `days`."""
    path = strategy.path
    if path is None:
        raise ValueError(f"report: {strategy.label} has no equity path (build_strategies first)")
    return path, np.searchsorted(days, path.day) + path.place


def _decorate_time_axis(ax: Any, days: np.ndarray, fold_starts: Mapping[int, np.datetime64]) -> None:
    step = max(1, days.size // 12)
    ax.set_xticks(np.arange(0, days.size, step), [str(d)[5:] for d in days[::step]])
    for fold, first_day in sorted(fold_starts.items()):
        position = int(np.searchsorted(days, first_day))
        ax.axvline(position, color="#6b7280", linewidth=0.8, linestyle="--", alpha=0.7)
        ax.annotate(
            f"fold {fold}",
            (position, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -2),
            textcoords="offset points",
            va="top",
            fontsize=7.5,
            color="#4b5563",
        )
    ax.set_xlim(0, days.size)


def _fold_starts(strategies: Sequence[Strategy]) -> Mapping[int, np.datetime64]:
    path = strategies[0].path
    return path.fold_starts if path is not None else {}


@styled
def equity_figure(strategies: Sequence[Strategy], models: Sequence[str]) -> Markup:
    """Pooled out-of-sample equity (wealth from 1), net of costs and before costs, on a trading-time axis."""
    days = _time_axis(strategies)
    fig = Figure(figsize=(10, 6.2))
    axes = fig.subplots(2, 1, sharex=True)
    points = line_points(len(strategies))
    for ax, net, title in ((axes[0], True, "Net of costs"), (axes[1], False, "Before costs (gross)")):
        labelled: set[str] = set()
        for strategy in strategies:
            path, x = _path(strategy, days)
            equity = path.net if net else path.gross
            keep = evenly_spaced(equity.size, points)
            ax.plot(
                x[keep],
                equity[keep],
                label=_legend_label(strategy, labelled),
                **_line_style(strategy, models),
            )
        ax.axhline(1.0, color="#9ca3af", linewidth=0.6)
        ax.set_title(title, loc="left")
        ax.set_ylabel("wealth (start = 1)")
        _decorate_time_axis(ax, days, _fold_starts(strategies))
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[1].set_xlabel("test days in trading time (a day's bars spread evenly over it; tick labels MM-DD)")
    return figure_to_svg(fig, "equity", "Pooled out-of-sample equity curves, net of costs and before costs")


@styled
def drawdown_figure(strategies: Sequence[Strategy], models: Sequence[str]) -> Markup:
    """Pooled drawdown from the running peak (net of costs), bar by bar."""
    days = _time_axis(strategies)
    fig = Figure(figsize=(10, 3.4))
    ax = fig.subplots()
    labelled: set[str] = set()
    points = line_points(len(strategies))
    for strategy in strategies:
        path, x = _path(strategy, days)
        keep = evenly_spaced(path.drawdown.size, points)
        ax.plot(
            x[keep],
            100 * path.drawdown[keep],
            label=_legend_label(strategy, labelled),
            **_line_style(strategy, models),
        )
    ax.set_ylabel("drawdown (%)")
    _decorate_time_axis(ax, days, _fold_starts(strategies))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure_to_svg(fig, "drawdown", "Pooled out-of-sample drawdowns, net of costs")


@styled
def seeds_figure(
    spreads: Sequence[SeedSpread], random_fold_sharpe: Mapping[int, np.ndarray], models: Sequence[str]
) -> Markup:
    """Per-seed net Sharpe per fold and pooled (dots), IQM with its stratified-bootstrap CI (bar), random-seed
    Sharpes as a grey reference."""
    folds = spreads[0].folds
    positions = list(range(len(folds) + 1))
    labels = [f"fold {k}" for k in folds] + ["pooled"]
    fig = Figure(figsize=(10, 3.6))
    ax = fig.subplots()
    width = 0.7 / max(1, len(spreads) + 1)
    for slot, position in enumerate(positions[:-1]):
        reference = random_fold_sharpe.get(folds[slot])
        if reference is not None and reference.size:
            offset = position - 0.35 + width / 2
            jitter = np.linspace(-width / 3, width / 3, reference.size)
            ax.scatter(offset + jitter, reference, s=6, color="#d1d5db", zorder=1)
    ax.scatter([], [], s=6, color="#d1d5db", label="random baseline seeds")
    for index, spread in enumerate(spreads):
        color = model_color(spread.model, models)
        offset = -0.35 + width * (index + 1.5)
        columns = [spread.fold_sharpe[:, k] for k in range(len(folds))] + [spread.pooled_sharpe]
        aggregates = [*spread.per_fold_iqm, spread.pooled_iqm]
        for position, values, aggregate in zip(positions, columns, aggregates, strict=True):
            x = position + offset
            ax.scatter(np.full(values.size, x), values, s=16, color=color, alpha=0.75, zorder=3)
            if np.isfinite(aggregate.point):
                ax.plot([x - width / 2.5, x + width / 2.5], [aggregate.point] * 2, color=color, linewidth=2)
                ax.plot([x, x], [aggregate.lo, aggregate.hi], color=color, linewidth=1, alpha=0.6)
        ax.scatter(
            [], [], s=16, color=color, label=plot_text(f"{spread.model}: seeds (dots), IQM and CI (bar)")
        )
    ax.axhline(0.0, color="#6b7280", linewidth=0.7)
    ax.set_xticks(positions, labels)
    ax.set_ylabel("net Sharpe (annualised)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure_to_svg(fig, "seeds", "Net Sharpe of every seed per fold and pooled, with IQM and CI")


@styled
def positions_figure(profile: Sequence[Mapping[str, Any]], models: Sequence[str]) -> Markup:
    """Share of bars long / flat / short and average daily turnover per strategy."""
    names = [row["name"] for row in profile]
    labels = [
        plot_text(BASELINE_LABELS.get(n, n) if not row["is_agent"] else n)
        for n, row in zip(names, profile, strict=True)
    ]
    fig = Figure(figsize=(10, 0.9 + 0.38 * len(profile)))
    left, right = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    y = np.arange(len(profile))[::-1]
    long_share = np.array([row["long_share"] for row in profile]) * 100
    short_share = np.array([row["short_share"] for row in profile]) * 100
    flat_share = 100 - long_share - short_share
    left.barh(y, long_share, color="#16a34a", label="long")
    left.barh(y, flat_share, left=long_share, color="#e5e7eb", label="flat")
    left.barh(y, short_share, left=long_share + flat_share, color="#dc2626", label="short")
    left.set_yticks(y, labels)
    left.set_xlim(0, 100)
    left.set_xlabel("share of bars (%)")
    left.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=3)
    colors = [
        model_color(row["name"], models)
        if row["is_agent"]
        else BASELINE_STYLES.get(row["name"], {}).get("color", "#6b7280")
        for row in profile
    ]
    right.barh(y, [row["avg_daily_turnover"] for row in profile], color=colors)
    right.set_xlabel("average daily turnover (contracts per instrument)")
    return figure_to_svg(fig, "positions", "Position shares and daily turnover per strategy")


@styled
def cost_figure(
    rows: Sequence[Mapping[str, Any]], multipliers: Sequence[float], models: Sequence[str]
) -> Markup:
    """Pooled net Sharpe against the cost multiplier (agents: IQM over seeds, thin lines per seed)."""
    fig = Figure(figsize=(10, 3.4))
    ax = fig.subplots()
    xs = np.asarray(multipliers, dtype=np.float64)
    for row in rows:
        if row["is_agent"]:
            color = model_color(row["name"], models)
            for seed_values in row["per_seed_sharpe"]:
                ax.plot(xs, seed_values, color=color, linewidth=0.7, alpha=0.35)
            ax.plot(
                xs, row["sharpe"], color=color, linewidth=1.8, marker="o", ms=4, label=plot_text(row["name"])
            )
        else:
            style = BASELINE_STYLES.get(row["name"], {"color": "#6b7280", "linestyle": "-"})
            ax.plot(
                xs,
                row["sharpe"],
                marker="s",
                ms=3,
                linewidth=1.0,
                label=plot_text(BASELINE_LABELS.get(row["name"], row["name"])),
                **style,
            )
    ax.axhline(0.0, color="#6b7280", linewidth=0.7)
    ax.set_xticks(xs, [f"{m:g}×" for m in xs])
    ax.set_xlabel("cost multiplier m (net = gross − m × cost)")
    ax.set_ylabel("pooled net Sharpe (annualised)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figure_to_svg(fig, "costs", "Pooled net Sharpe at each cost multiplier")


@styled
def hyperopt_history_figure(summary: HyperoptSummary, color: str) -> Markup:
    """Objective per trial (completed dots, pruned crosses at their last reported value) and the best so far."""
    fig = Figure(figsize=(5.2, 3.0))
    ax = fig.subplots()
    complete_x, complete_y, pruned_x, pruned_y = [], [], [], []
    for trial in summary.trials:
        number = trial.get("number")
        if not isinstance(number, int):
            continue
        value = trial.get("value")
        if trial.get("state") == "COMPLETE" and isinstance(value, int | float):
            complete_x.append(number)
            complete_y.append(float(value))
        elif trial.get("state") == "PRUNED":
            intermediate = trial.get("intermediate") or {}
            reported = [
                v
                for _, v in sorted(intermediate.items(), key=lambda kv: int(kv[0]))
                if isinstance(v, int | float)
            ]
            if reported:
                pruned_x.append(number)
                pruned_y.append(float(reported[-1]))
    ax.scatter(complete_x, complete_y, s=18, color=color, label="completed", zorder=3)
    if pruned_x:
        ax.scatter(
            pruned_x, pruned_y, s=18, marker="x", color="#9ca3af", label="pruned (last report)", zorder=2
        )
    if complete_x:
        order = np.argsort(complete_x)
        values = np.asarray(complete_y)[order]
        maximize = summary.data.get("direction", "maximize") != "minimize"
        best = np.maximum.accumulate(values) if maximize else np.minimum.accumulate(values)
        ax.step(
            np.asarray(complete_x)[order],
            best,
            where="post",
            color="#111827",
            linewidth=1,
            label="best so far",
        )
    ax.set_xlabel("trial")
    ax.set_ylabel("objective")
    ax.legend(loc="best")
    return figure_to_svg(fig, f"hyperopt-history-{summary.model}", f"Optimization history of {summary.model}")


@styled
def importance_figure(name: str, importances: Mapping[str, float], color: str) -> Markup:
    """Horizontal bars of parameter importances (largest on top)."""
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig = Figure(figsize=(4.6, 0.6 + 0.3 * max(1, len(items))))
    ax = fig.subplots()
    ax.barh(np.arange(len(items)), [v for _, v in items], color=color)
    ax.set_yticks(np.arange(len(items)), [plot_text(k) for k, _ in items])
    ax.set_xlabel("importance (PED-ANOVA, normalised)")
    ax.grid(axis="y", visible=False)
    return figure_to_svg(fig, f"importance-{name}", f"Hyperparameter importances of {name}")


TRAINING_METRICS = (
    ("episode_return_mean", "episode return (mean)"),
    ("val_sharpe", "validation Sharpe"),
    ("loss", "loss"),
    ("train_loss", "training loss"),
    ("val_loss", "validation loss"),
    ("validation_loss", "validation loss"),
    ("grad_norm", "gradient norm"),
    ("policy_loss", "policy loss"),
    ("value_loss", "value loss"),
    ("entropy", "policy entropy"),
    ("value_mean", "value estimate (mean)"),
    ("q_mean", "Q estimate (mean)"),
)


# History keys that count steps or time rather than measure learning: never plotted as a curve.
_NOT_CURVES = {
    "step",
    "env_steps",
    "epoch",
    "updates",
    "update",
    "wall_s",
    "elapsed_s",
    "steps_per_s",
    "samples",
    "count",
    "rows",
    "train_rows",
    "batch_size",
}
# Panels per model at most; further unknown metrics are left out of the figure.
MAX_TRAINING_PANELS = 6


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _records(log: TrainLog) -> list[dict[str, Any]]:
    """The history records, plus the `validation` records ({step, val_sharpe}) when the history has no
    validation Sharpe of its own (a supervised model logs its losses in `history` only)."""
    validation = log.data.get("validation")
    if any("val_sharpe" in entry for entry in log.history) or not isinstance(validation, list):
        return list(log.history)
    return list(log.history) + [entry for entry in validation if isinstance(entry, dict)]


def training_metrics_present(logs: Sequence[TrainLog]) -> list[tuple[str, str]]:
    """The history metrics with at least one finite value in these logs: the known ones in display order,
    then any other numeric key a model logs (a forecaster's losses, say), at most MAX_TRAINING_PANELS."""
    seen: dict[str, None] = {}
    for log in logs:
        for entry in _records(log):
            for key, value in entry.items():
                if key not in _NOT_CURVES and _is_number(value) and np.isfinite(value):
                    seen.setdefault(key, None)
    known = [(key, title) for key, title in TRAINING_METRICS if key in seen]
    names = {key for key, _ in TRAINING_METRICS}
    others = [(key, key.replace("_", " ")) for key in sorted(seen) if key not in names]
    return (known + others)[:MAX_TRAINING_PANELS]


@styled
def training_figure(
    model: str, logs: Sequence[TrainLog], color: str, step_label: str = "env steps"
) -> Markup:
    """Small multiples of the training history metrics: per fold one stroke per seed, drawn as one line (one SVG
    path a fold, so 20 folds x 5 seeds do not make 100 elements a panel), later folds darker."""
    metrics = training_metrics_present(logs)
    ncols = min(3, len(metrics))
    nrows = -(-len(metrics) // ncols)
    fig = Figure(figsize=(10, 2.3 * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    folds = sorted({log.fold for log in logs})
    kept = line_points(len(logs))
    for ax, (key, title) in zip(axes, metrics, strict=False):
        for fold in folds:
            strokes: list[list[float]] = [[], []]  # steps, values; a NaN between seeds breaks the line
            for log in sorted((lg for lg in logs if lg.fold == fold), key=lambda lg: lg.seed_index):
                points = [(e.get("step"), e.get(key)) for e in _records(log)]
                points = [(s, v) for s, v in points if _is_number(s) and _is_number(v)]
                for i in evenly_spaced(len(points), kept):
                    strokes[0].append(float(points[i][0]))
                    strokes[1].append(float(points[i][1]))
                if points:
                    strokes[0].append(math.nan)
                    strokes[1].append(math.nan)
            if strokes[0]:
                shade = 0.45 + 0.55 * (folds.index(fold) + 1) / len(folds)
                ax.plot(strokes[0], strokes[1], color=color, alpha=shade, linewidth=1)
        ax.set_title(plot_text(title), loc="left")
        ax.set_xlabel(step_label)
    for ax in axes[len(metrics) :]:
        ax.set_visible(False)
    fig.tight_layout()
    return figure_to_svg(fig, f"training-{model}", f"Training curves of {model}")


@styled
def folds_timeline_figure(plan: Any, embargo_days: float) -> Markup:
    """Tuning and fold windows on a trading-day axis; black ticks mark the per-instrument embargo purge."""
    rows: list[tuple[str, list[tuple[str, int, int]]]] = []
    position = {day: i for i, day in enumerate(plan.trading_days)}

    def span(days: Sequence[Any]) -> tuple[int, int]:
        return position[days[0]], position[days[-1]] + 1

    tuning = plan.tuning
    rows.append(
        (
            "tuning",
            [
                ("tuning train", *span(tuning.train_days)),
                ("tuning validation", *span(tuning.validation_days)),
            ],
        )
    )
    for fold in plan.folds:
        windows = [("train", *span(fold.inner_train_days))] if fold.inner_train_days else []
        windows += [("validation", *span(fold.validation_days)), ("test", *span(fold.test_days))]
        rows.append((f"fold {fold.index}", windows))
    fig = Figure(figsize=(10, 0.8 + 0.42 * len(rows)))
    ax = fig.subplots()
    for index, (_, windows) in enumerate(rows):
        y = len(rows) - 1 - index
        for kind, start, stop in windows:
            ax.barh(
                y,
                stop - start,
                left=start,
                height=0.6,
                color=WINDOW_COLORS[kind],
                edgecolor="white",
                linewidth=0.5,
            )
            if kind != "test":
                # Purged bars at the end of every split followed by another split.
                ax.barh(y, embargo_days, left=stop - embargo_days, height=0.6, color="#111827")
    handles = [Patch(color=color, label=kind) for kind, color in WINDOW_COLORS.items()]
    handles.append(Patch(color="#111827", label="embargo (purged bars)"))
    ax.set_yticks(range(len(rows)), [name for name, _ in rows][::-1])
    n_days = len(plan.trading_days)
    step = max(1, n_days // 10)
    ticks = list(range(0, n_days, step))
    ax.set_xticks(ticks, [plan.trading_days[t].isoformat()[5:] for t in ticks])
    ax.set_xlim(0, n_days)
    ax.set_xlabel("trading days (MM-DD)")
    ax.grid(axis="y", visible=False)
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0.0, 1.0), ncols=6)
    return figure_to_svg(fig, "folds", "Timeline of tuning, training, validation, embargo and test windows")


@styled
def forecast_figure(quality: ForecastQuality, color: str) -> Markup:
    """Predictions vs realized of one forecaster: mean realized forward return per prediction decile against
    the mean prediction (with the diagonal), and the daily IC over the pooled test days (seeds thin, mean bold)."""
    fig = Figure(figsize=(10, 2.9))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2, 3]})
    scale = 1e4  # basis points: forward returns over a few bars are tiny fractions
    x, y = quality.calibration_prediction * scale, quality.calibration_realized * scale
    finite = np.isfinite(x) & np.isfinite(y)
    if finite.any():
        low = float(min(x[finite].min(), y[finite].min()))
        high = float(max(x[finite].max(), y[finite].max()))
        pad = 0.05 * (high - low) if high > low else 1.0
        left.plot(
            [low - pad, high + pad], [low - pad, high + pad], color="#9ca3af", linewidth=0.8, label="y = x"
        )
        left.plot(x[finite], y[finite], color=color, marker="o", ms=4, linewidth=1.2, label="decile means")
    left.axhline(0.0, color="#d1d5db", linewidth=0.6)
    left.set_xlabel("mean prediction per decile (bp)")
    left.set_ylabel("mean realized (bp)")
    left.set_title("Calibration", loc="left")
    left.legend(loc="upper left")
    days = sorted({d for series in quality.daily.values() for d in series[0].tolist()})
    index = {d: i for i, d in enumerate(days)}
    stacked = np.full((len(quality.daily), len(days)), np.nan)
    marked = len(days) <= MARKED_DAYS  # a marker per day only while they stay apart
    for row, (seed_days, ic, _) in enumerate(quality.daily.values()):
        positions = [index[d] for d in seed_days.tolist()]
        stacked[row, positions] = ic
        right.plot(
            positions, ic, color=color, linewidth=0.7, alpha=0.35, marker="." if marked else None, ms=2
        )
    with np.errstate(all="ignore"):
        valid = np.isfinite(stacked).all(axis=0)
        mean = np.where(valid, np.mean(np.where(np.isfinite(stacked), stacked, 0.0), axis=0), np.nan)
    right.plot(
        np.arange(len(days)),
        mean,
        color=color,
        linewidth=1.6,
        marker="o" if marked else None,
        ms=3,
        label="mean over seeds",
    )
    right.axhline(0.0, color="#6b7280", linewidth=0.7)
    step = max(1, len(days) // 10)
    right.set_xticks(range(0, len(days), step), [str(d)[5:10] for d in days[::step]])
    right.set_ylabel("IC (Pearson)")
    right.set_xlabel("test day (MM-DD)")
    right.set_title("Daily IC", loc="left")
    right.legend(loc="upper left")
    fig.tight_layout()
    return figure_to_svg(
        fig,
        f"forecast-{quality.model}",
        f"Predictions vs realized forward returns and daily IC of {quality.model}",
    )
