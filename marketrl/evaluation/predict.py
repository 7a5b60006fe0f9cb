"""The predict stage: a finished run's trained models applied to new DBN files (docs/PREDICT.md).

A new file is featurized by the features stage itself (rule `predict_features`: the same code, the same lookback
context from the files before it), then each seed of a model decides on its rows exactly as evaluation decides on
a fold's test rows (`runs_positions`, `evaluate_positions`): normalized with the checkpoint's own statistics,
scored with the costs and env settings the checkpoint records. Nothing is refit or retrained.

The file must be one the model could not have seen: its first trading day after the fold's last training day, the
same dataset, schema and bar size as the training tables, and only symbol roots the fold trained on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq
import torch

from gpu_utils import resolve_device
from marketrl.env import evaluate_positions
from marketrl.env.market_data import series_order
from marketrl.evaluation.evaluate import (
    BAR_COLUMNS,
    applied_gates,
    forecast_columns,
    load_runs,
    runs_positions,
    walk_forward_record,
)
from marketrl.features import FEATURE_SET_VERSION
from marketrl.instruments.costs import symbol_root
from marketrl.runtime.io import atomic_write
from marketrl.runtime.provenance import collect, sha256_file
from marketrl.scoring.metrics import to_json_safe
from marketrl.splits.datasets import manifest_files
from marketrl.splits.folds import FoldPlan

log = logging.getLogger(__name__)

ENSEMBLE = "ensemble"
#: the per-bar columns of a predict table, per member (seed_{i} or ENSEMBLE); forecasters add FORECAST_COLUMNS
PREDICT_COLUMNS = ("member", "seed_index", "decision_ts_event", "pending", *BAR_COLUMNS)
FORECAST_COLUMNS = ("prediction", "forward_return")
#: what a pending decision's next bar has not told yet (null in its row; a forecaster's `forward_return`: `mark_pending`)
_UNKNOWN_YET = ("ts_event", "trading_day", "gross_return", "cost", "net_return")
#: the Parquet metadata key holding the table's provenance (JSON)
PROVENANCE_KEY = "marketrl.predict"
# what must agree between a new file's feature table and the training tables (their Parquet metadata)
_DATA_KEYS = ("dataset", "schema", "bar_size")
# ...and what the fills read (quote-aware fills: the quotes' source, null or absent without; env.fill_delay)
_FILL_KEYS = ("quotes", "fill_delay")


class PredictInputError(ValueError):
    """A new file that the model must not (look-ahead) or cannot (another market or bar size) be applied to."""


@dataclass(frozen=True)
class TrainedOn:
    """What a fold's models were trained on: the training tables' dataset, schema and bar size, the symbol
    roots of the fold's training rows and its last training day."""

    data: dict[str, str]
    roots: tuple[str, ...]
    last_train_day: date
    fold: int


def trained_on(manifest_path: str | Path, folds_path: str | Path, fold: int) -> TrainedOn:
    """`TrainedOn` of fold `fold` (-1: the last), from the feature manifest's tables and the fold plan."""
    plan = FoldPlan.load(folds_path)
    spec = plan.fold(fold if fold >= 0 else len(plan.folds) - 1)
    days = pl.Series(spec.train_days, dtype=pl.Date).implode()
    data: dict[str, str] = {}
    roots: set[str] = set()
    for path in manifest_files(manifest_path):
        rows = pl.read_parquet(path, columns=["trading_day", "symbol"])
        symbols = rows.filter(pl.col("trading_day").is_in(days))["symbol"].unique().to_list()
        if symbols and not data:
            data = _table_data(path)
        roots.update(symbol_root(symbol) for symbol in symbols)
    return TrainedOn(data, tuple(sorted(roots)), spec.last_train_day, spec.index)


def _table_data(path: str | Path) -> dict[str, str]:
    """A feature table's source file, dataset, schema and bar size (its Parquet metadata)."""
    metadata = pq.read_schema(path).metadata or {}
    keys = ("source_file", "source_sha256", *_DATA_KEYS, *_FILL_KEYS)
    return {key: metadata.get(f"marketrl.{key}".encode(), b"").decode() for key in keys}


def check_new_file(features_path: str | Path, rows: pl.DataFrame, trained: TrainedOn, model: str) -> None:
    """Raise `PredictInputError` (one line naming the file) unless `rows` may be predicted by the models of
    `trained`: feature rows exist, same dataset/schema/bar size, quotes where the training tables had them
    (joined with the same ``env.fill_delay``), known symbol roots, no training day."""
    data = _table_data(features_path)
    source = data["source_file"] or Path(features_path).name
    if rows.is_empty():
        raise PredictInputError(
            f"{source}: no feature rows to predict (every bar is lookback warm-up, or the file was skipped)"
        )
    theirs = {key: data[key] for key in _DATA_KEYS}
    ours = {key: trained.data.get(key, "") for key in _DATA_KEYS}
    if theirs != ours:
        raise PredictInputError(
            f"{source}: holds {_describe(theirs)} bars, the {model} models of fold {trained.fold} were trained on "
            f"{_describe(ours)}"
        )
    quoted, trained_quoted = _quoted(data), _quoted(trained.data)
    if quoted != trained_quoted:
        raise PredictInputError(
            f"{source}: {'carries' if quoted else 'has no'} quotes, the {model} models of fold {trained.fold} were "
            f"evaluated with{'out' if not trained_quoted else ''} quote-aware fills (data.quotes): its costs "
            "would not be evaluation's"
        )
    if data.get("fill_delay", "") != trained.data.get("fill_delay", ""):
        raise PredictInputError(
            f"{source}: quotes joined with env.fill_delay {data.get('fill_delay') or 0}, the {model} models of "
            f"fold {trained.fold} with {trained.data.get('fill_delay') or 0}"
        )
    roots = sorted({symbol_root(symbol) for symbol in rows["symbol"].unique().to_list()})
    unknown = [root for root in roots if root not in trained.roots]
    if unknown:
        raise PredictInputError(
            f"{source}: holds {', '.join(roots)}, the {model} models of fold {trained.fold} were trained on "
            f"{', '.join(trained.roots)} (no model for {unknown[0]})"
        )
    first_day = rows["trading_day"].min()
    if first_day <= trained.last_train_day:
        raise PredictInputError(
            f"{source}: starts on trading day {first_day}, on or before {trained.last_train_day}, the last "
            f"training day of fold {trained.fold}: predicting it would be look-ahead"
        )


def _quoted(data: Mapping[str, str]) -> bool:
    """Whether a feature table's metadata says it carries quotes (quote-aware fills)."""
    return data.get("quotes", "") not in ("", "null")


def _describe(data: Mapping[str, str]) -> str:
    return f"{data['dataset']} {data['schema']} (bar size {data['bar_size']})"


def with_stand_in_bars(rows: pl.DataFrame, max_gap: timedelta | None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`rows` plus one stand-in bar after the last bar of each series (a continuous symbol, else an instrument)
    still trading at the file's end (within `max_gap` of its last bar; without one, on its last trading day), and
    the stand-ins' (symbol, ts_event).

    A stand-in copies its series' last bar one bar step later (the table's smallest step between bars). It makes
    that last bar a decision bar, so every model decides there as it would once the real next bar exists: a
    decision at t reads only rows up to t. Nothing of the stand-in is reported (`pending` rows null what it set).
    """
    # MarketData's own series, in its row order (series, then time)
    order, series = series_order(
        rows["instrument_id"].to_numpy(),
        rows["ts_event"].dt.epoch("ns").to_numpy(),
        rows["symbol"].to_numpy(),
    )
    ordered = (rows if order is None else rows[order]).with_columns(_series=pl.Series(series))
    gaps = ordered.select(gap=pl.col("ts_event").diff().over("_series"))["gap"]
    steps = gaps.filter(gaps > timedelta(0))
    step = steps.min() if steps.len() else timedelta(minutes=1)
    lasts = ordered.group_by("_series", maintain_order=True).last()
    end = rows["ts_event"].max()
    still_trading = (
        pl.col("trading_day") == rows["trading_day"].max()
        if max_gap is None
        else pl.col("ts_event") >= end - max_gap
    )
    later = (pl.col("ts_event") + step).cast(rows.schema["ts_event"])  # a Python timedelta is microseconds
    stand_ins = lasts.filter(still_trading).with_columns(later).drop("_series")
    extended = pl.concat([rows, stand_ins.select(rows.columns)]).sort("instrument_id", "ts_event")
    return extended, stand_ins.select("symbol", "ts_event")


def mark_pending(bars: pl.DataFrame, stand_ins: pl.DataFrame, horizon: int | None = None) -> pl.DataFrame:
    """One member's `bars` with ``pending`` (Boolean): True on a decision whose next bar is a stand-in
    (`with_stand_in_bars`), the position to hold into the bar that has not come yet; what that bar would tell is
    null there. With a forecaster's `horizon` h, ``forward_return`` is null on the last h decisions of a series
    with a stand-in too: their bar t+h is the stand-in."""
    keys = stand_ins.with_columns(pending=pl.lit(True))
    marked = bars.join(keys, on=["symbol", "ts_event"], how="left", maintain_order="left")
    pending = pl.col("pending").fill_null(False)
    marked = marked.with_columns(
        pending, *(pl.when(pending).then(None).otherwise(pl.col(name)).alias(name) for name in _UNKNOWN_YET)
    )
    if horizon is None or "forward_return" not in marked.columns:
        return marked
    from_the_end = pl.col("decision_ts_event").rank("ordinal", descending=True).over("symbol")
    reaches = pl.col("symbol").is_in(stand_ins["symbol"].implode()) & (from_the_end <= horizon)
    return marked.with_columns(forward_return=pl.when(reaches).then(None).otherwise(pl.col("forward_return")))


def ensemble_positions(positions: torch.Tensor) -> torch.Tensor:
    """The seeds' majority position per bar from their positions [S, T]: the position more than half of the
    seeds hold, else flat (no majority: the seeds disagree, so the ensemble does not trade)."""
    middle = positions.median(dim=0).values  # a strict majority's value, if there is one, is the median
    majority = (positions == middle).sum(dim=0) * 2 > positions.shape[0]
    return torch.where(majority, middle, torch.zeros_like(middle))


def predict_job(
    *,
    model: str,
    seed_indices: Sequence[int],
    features_path: str,
    manifest_path: str,
    folds_path: str,
    model_paths: Sequence[str],
    config: Mapping[str, Any],
    out_path: str,
    record_paths: Sequence[str] = (),
) -> pl.DataFrame:
    """Apply every seed of `model` (fold `predict.fold`) to one new file's feature table; write its per-bar table.

    One row per decision bar and member (each seed, then the ensemble, `ensemble_positions`): the position held
    after the decision at the bar's close and its gross return, cost and net return over the next bar
    (`BAR_COLUMNS`, as evaluation writes them). The file's last bar of each series still trading at its end
    gets a ``pending`` row: the decision there, whose next bar has not come (its returns null;
    `with_stand_in_bars`); the last bar of a chain inside the file (before a halt) has no row. A
    forecaster adds its prediction (the ensemble's: the seeds' mean) and the realized forward return. The
    provenance (checkpoint hashes, feature set version, costs, the job's config slice) is the table's Parquet
    metadata under `PROVENANCE_KEY`. Each seed trades under the gate its fold's evaluation applied
    (`applied_gates`: the walk-forward record of the folds before it, ``record_paths``, else its validation gate).
    """
    if not seed_indices or len(seed_indices) != len(model_paths):
        raise ValueError(
            f"predict_job: expected one model path per seed, got {seed_indices} and {model_paths}"
        )
    device = resolve_device(config["training"]["device"])
    trained = trained_on(manifest_path, folds_path, config["predict"]["fold"])
    rows = pl.read_parquet(features_path)
    check_new_file(features_path, rows, trained, model)
    runs, env_config, cost_model = load_runs(model, model_paths, config, device)
    folds = {(run.meta.get("extra") or {}).get("fold") for run in runs}
    if folds != {trained.fold}:  # the rule gives the checkpoints of predict.fold; anything else is a bug
        raise ValueError(
            f"predict_job: checkpoints of fold(s) {sorted(map(str, folds))}, expected {trained.fold}"
        )
    extended, stand_ins = with_stand_in_bars(rows, env_config.max_gap)
    record = walk_forward_record(
        record_paths, config["training"]["record_min_t"], rows["trading_day"].unique().to_list()
    )
    gates = applied_gates(runs, record, config["training"]["pooled_min_t"])
    data, positions, predictions = runs_positions(runs, extended, env_config, cost_model, device, gates=gates)
    cpu = torch.device("cpu")
    data = data.to(cpu)
    positions = [p.to(cpu) for p in positions]
    members = [(f"seed_{i}", i, p) for i, p in zip(seed_indices, positions, strict=True)]
    members.append((ENSEMBLE, None, ensemble_positions(torch.stack(positions))))
    horizon = runs[0].horizon if predictions[0] is not None else None
    if horizon is not None:
        predicted = [p.to(cpu) for p in predictions if p is not None]
        predicted.append(torch.stack(predicted).mean(dim=0))
    frames = []
    for position, (member, seed_index, held) in enumerate(members):
        bars = evaluate_positions(data, held, env_config).select("decision_ts_event", *BAR_COLUMNS)
        if horizon is not None:
            bars = pl.concat([bars, forecast_columns(data, predicted[position], horizon)], how="horizontal")
        bars = mark_pending(bars, stand_ins, horizon)
        frames.append(bars.with_columns(member=pl.lit(member), seed_index=pl.lit(seed_index, dtype=pl.Int32)))
    table = pl.concat(frames).select(*PREDICT_COLUMNS, *(FORECAST_COLUMNS if horizon is not None else ()))
    provenance = {
        "algo": model,  # on-disk key kept for compatibility
        "kind": runs[0].kind,
        "fold": trained.fold,
        "last_train_day": str(trained.last_train_day),
        "first_day": str(rows["trading_day"].min()),
        "last_day": str(rows["trading_day"].max()),
        "ensemble": "majority: the position more than half of the seeds hold, else flat",
        "checkpoints": [
            {"seed_index": i, "path": str(path), "sha256": sha256_file(path)}
            for i, path in zip(seed_indices, model_paths, strict=True)
        ],
        "features": {
            "path": str(features_path),
            "sha256": sha256_file(features_path),
            "feature_set_version": FEATURE_SET_VERSION,
            **_table_data(features_path),
        },
        "trained_on": {**trained.data, "roots": list(trained.roots)},
        "costs": cost_model.to_config(),
        "horizon": horizon,
        "flat_gates": [None if gate is None else to_json_safe(gate.to_dict()) for gate in gates],
        "provenance": collect(dict(config), device=str(device)),
    }
    arrow = table.to_arrow()
    metadata = {**(arrow.schema.metadata or {}), PROVENANCE_KEY.encode(): json.dumps(provenance).encode()}
    with atomic_write(out_path) as tmp:
        pq.write_table(arrow.replace_schema_metadata(metadata), tmp, compression="zstd")
    ensemble = table.filter(pl.col("member") == ENSEMBLE)
    log.info(
        "%s fold %d on %s: %d bars, ensemble net return %.6f",
        model,
        trained.fold,
        provenance["features"]["source_file"],
        ensemble.height,
        float(ensemble["net_return"].sum()),
    )
    return table


def read_provenance(path: str | Path) -> dict[str, Any]:
    """The provenance a predict table carries in its Parquet metadata."""
    metadata = pq.read_schema(path).metadata or {}
    return json.loads(metadata[PROVENANCE_KEY.encode()])
