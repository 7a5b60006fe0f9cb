"""Feature tables -> fold splits -> device-resident MarketData, shared by hyperopt, training and evaluation.

Normalization is always fit on the training rows of the window at hand (a fold's inner train split, or the tuning
window's train split) and reused, unchanged, for that window's validation and test rows.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any, Literal

import polars as pl
import torch

from marketrl.env import EnvConfig, MarketData, parse_duration
from marketrl.env.config import QUOTE_KEYS
from marketrl.features import BASE_COLUMNS, BOOK_FEATURE_NAMES, FEATURE_NAMES, non_finite_columns
from marketrl.instruments.costs import Costs, costs_from_config, is_continuous
from marketrl.runtime.io import write_json_atomic
from marketrl.runtime.provenance import sha256_file
from marketrl.splits.folds import FoldPlan, select_rows, select_tuning_rows
from marketrl.splits.normalize import FeatureNormalizer


class DatasetError(ValueError):
    """Feature tables that cannot be combined (overlaps, missing columns, non-finite values)."""


def load_feature_tables(
    feature_files: Sequence[str | Path], days: Collection[date] | None = None
) -> pl.DataFrame:
    """All feature tables in one frame sorted by (instrument_id, ts_event); overlapping bars are an error.

    `days`: only the rows of these trading days are read (a lazy scan with the filter pushed into the Parquet
    reader, so a table's other rows are never held in memory); None, every row."""
    if not feature_files:
        raise DatasetError("no feature files given (data.files / data.demo produced nothing)")
    frames = []
    for path in feature_files:
        try:
            frame = _read_table(path, days)
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise DatasetError(f"{path}: cannot read feature table: {exc}".splitlines()[0]) from exc
        missing = [name for name in FEATURE_NAMES if name not in frame.columns]
        if missing:
            raise DatasetError(f"{path}: not a marketrl feature table (no column {missing[0]!r})")
        _check_finite(frame, path)
        frames.append(frame.with_columns(pl.lit(str(path)).alias("_source")))
    # a table without rows (skipped, warm-up only) may lack the quote columns: its missing quotes are null
    quoted = [c for c in QUOTE_KEYS if any(c in f.columns and f.height for f in frames)]
    frames = [
        f.with_columns(pl.lit(None, pl.Float64).alias(c) for c in quoted if c not in f.columns)
        for f in frames
    ]
    common = [c for c in frames[0].columns if all(c in f.columns for f in frames)]
    table = pl.concat([f.select(common) for f in frames], how="vertical")
    duplicates = (
        table.group_by("instrument_id", "ts_event")
        .agg(pl.col("_source").unique().sort(), pl.col("symbol").first())
        .filter(pl.col("_source").list.len() > 1)
    )
    if duplicates.height:
        row = duplicates.sort("ts_event").row(0, named=True)
        raise DatasetError(
            f"overlapping data: {row['_source'][0]} and {row['_source'][1]} both hold {row['symbol']} at "
            f"{row['ts_event']} (two files cover the same day?)"
        )
    _check_spans_disjoint(table)
    return table.drop("_source").sort("instrument_id", "ts_event")


def _read_table(path: str | Path, days: Collection[date] | None) -> pl.DataFrame:
    """One feature table, whole or only the rows of `days` (scan_parquet + filter: row groups and rows outside
    them are skipped while reading, not read and then dropped)."""
    if days is None:
        return pl.read_parquet(path)
    wanted = pl.Series(sorted(days), dtype=pl.Date).implode()
    return pl.scan_parquet(path).filter(pl.col("trading_day").is_in(wanted)).collect()


def _check_spans_disjoint(table: pl.DataFrame) -> None:
    """Per instrument, each file's bars lie before the next file's first bar: time ranges that overlap without a
    shared bar are a partial duplicate download, or records stamped far outside their neighbours' span (a wrong
    clock inside a header range that allows it). A CME session spanning two UTC-day files shares no bar."""
    spans = (
        table.group_by("instrument_id", "_source")
        .agg(
            pl.col("ts_event").min().alias("first"),
            pl.col("ts_event").max().alias("last"),
            pl.col("symbol").first(),
        )
        .sort("instrument_id", "first", "_source")
        .with_columns(
            pl.col("_source", "first").shift(-1).over("instrument_id").name.prefix("next_"),
        )
        .filter(pl.col("next_first") <= pl.col("last"))
    )
    if spans.height:
        row = spans.sort("first").row(0, named=True)
        raise DatasetError(
            f"overlapping files: {row['_source']} holds {row['symbol']} from {row['first']} to {row['last']}, "
            f"past the first bar of {row['next__source']} at {row['next_first']} (a duplicate download, or "
            "records far outside the neighbouring files' span?)"
        )


def _check_finite(frame: pl.DataFrame, path: str | Path) -> None:
    """A NaN, inf or null in any float column would poison normalization and training: name the column."""
    offenders = non_finite_columns(frame)
    if offenders:
        raise DatasetError(
            f"{path}: non-finite value (NaN, inf or null) in column {offenders[0]!r} "
            f"({len(offenders)} column(s) affected)"
        )


def write_feature_manifest(feature_files: Sequence[str | Path], out_path: str | Path) -> dict[str, Any]:
    """results/features/manifest.json: the number of feature columns (``n_features``), every feature table with its
    sha256, rows, days, source file, bars dropped outside the session (and in the daily halt), skip reason, warm-up-only note and re-sort note, the rolls of every
    continuous symbol, and the ``features.user`` features the tables carry (``user_features``: path, sha256,
    names, lookbacks, reference; None without).

    The fan-out jobs depend on this one file instead of on every feature table, which keeps the DAG small
    (thousands of jobs x hundreds of files would be hundreds of thousands of edges).
    """
    import pyarrow.parquet as pq  # here, not at the top: the jobs that read feature tables need no pyarrow

    from marketrl.features import resorted_note, skipped_reason, warmup_only_note

    entries, spans = [], []
    user: dict[str, Any] | None = None
    for index, path in enumerate(feature_files):
        frame = pl.read_parquet(path, columns=["ts_event", "trading_day", "instrument_id", "symbol"])
        days = frame["trading_day"]
        metadata = pq.read_schema(path).metadata or {}  # tables written elsewhere may carry none
        record = json.loads(_metadata_value(metadata, "user_features") or "null")
        if index and record != user:
            raise DatasetError(
                f"{path}: built with other features.user features ({_user_names(record)}) than "
                f"{feature_files[0]} ({_user_names(user)}); rerun the features stage"
            )
        user = record
        entries.append(
            {
                "path": str(path),
                "sha256": sha256_file(path),
                "rows": days.len(),
                "first_day": str(days.min()) if days.len() else None,
                "last_day": str(days.max()) if days.len() else None,
                "source_file": _metadata_value(metadata, "source_file"),
                "dropped_outside_session": _metadata_count(metadata, "dropped_outside_session"),
                "dropped_in_halt": _metadata_count(metadata, "dropped_in_halt"),
                "skipped": skipped_reason(path),  # data.on_bad_file: skip; None for a featurized file
                "warmup_only": warmup_only_note(path),  # the first file(s): all bars warm-up, context only
                "resorted": resorted_note(path),  # records out of time order, re-sorted; None when in order
            }
        )
        spans.append(contract_spans(frame))
    # the feature columns a window holds (rows x features: the train and tuning jobs' memory requests,
    # marketrl.workflow.resources); from the first table with rows, as the jobs read them (feature_names_of)
    with_rows = [entry["path"] for entry in entries if entry["rows"]]
    n_features = (
        len(feature_names_of(pl.DataFrame(schema=pl.read_parquet_schema(with_rows[0])))) if with_rows else 0
    )
    manifest = {
        "files": entries,
        "n_features": n_features,
        "rolls": continuous_rolls(pl.concat(spans)) if spans else [],
        "name_order": name_order_disagreement(entries),
        "user_features": user,
    }
    write_json_atomic(out_path, manifest)
    return manifest


def _user_names(record: Mapping[str, Any] | None) -> str:
    return ", ".join(record["names"]) + f" of {record['path']}" if record else "none"


def name_order_disagreement(entries: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Where the source file names, in the manifest's (time) order, first stop sorting ascending: ``{"file": F,
    "after": E}`` with F's data later than E's but F's name sorting before E's (day-month-year names, say); None
    when names and time agree. Files without rows (skipped, or a header that could not be read) have no place
    in time and are left out."""
    names = [str(e["source_file"]) for e in entries if e.get("source_file") and e.get("rows")]
    for earlier, later in itertools.pairwise(names):
        if later < earlier:
            return {"file": later, "after": earlier}
    return None


def _metadata_value(metadata: Mapping[bytes, bytes], key: str) -> str | None:
    value = metadata.get(f"marketrl.{key}".encode())
    return value.decode() if value is not None else None


def _metadata_count(metadata: Mapping[bytes, bytes], key: str) -> int | None:
    value = _metadata_value(metadata, key)
    return int(value) if value is not None else None


_SPAN_SCHEMA = {
    "symbol": pl.String,
    "instrument_id": pl.UInt32,
    "first_ts": pl.Datetime("ns", "UTC"),
    "last_ts": pl.Datetime("ns", "UTC"),
    "first_day": pl.Date,
}


def contract_spans(frame: pl.DataFrame) -> pl.DataFrame:
    """First and last bar (and first trading day) of each contract under each continuous symbol of a feature
    table (columns ts_event, trading_day, instrument_id, symbol): what `continuous_rolls` needs of it."""
    continuous = [symbol for symbol in frame["symbol"].unique().to_list() if is_continuous(symbol)]
    if not continuous:
        return pl.DataFrame(schema=_SPAN_SCHEMA)
    return (
        frame.filter(pl.col("symbol").is_in(continuous))
        .group_by("symbol", "instrument_id")
        .agg(
            pl.col("ts_event").min().alias("first_ts"),
            pl.col("ts_event").max().alias("last_ts"),
            pl.col("trading_day").min().alias("first_day"),
        )
        .cast(_SPAN_SCHEMA)  # type: ignore[arg-type]
    )


def continuous_rolls(spans: pl.DataFrame) -> list[dict[str, Any]]:
    """Every change of contract under a continuous symbol, in time order: symbol, the new contract's first
    trading day, old and new instrument_id and the last / first bar either side (the env's roll, docs/ENV.md)."""
    rolls = []
    rows = spans.sort("symbol", "first_ts", "instrument_id").rows(named=True)
    for old, new in itertools.pairwise(rows):
        if old["symbol"] == new["symbol"] and old["instrument_id"] != new["instrument_id"]:
            rolls.append(
                {
                    "symbol": new["symbol"],
                    "trading_day": str(new["first_day"]),
                    "old_instrument_id": old["instrument_id"],
                    "new_instrument_id": new["instrument_id"],
                    "old_last_bar": old["last_ts"].isoformat(),
                    "new_first_bar": new["first_ts"].isoformat(),
                }
            )
    return sorted(rolls, key=lambda roll: (roll["new_first_bar"], roll["symbol"]))


def _manifest_entries(manifest_path: str | Path) -> list[dict[str, Any]]:
    """The ``files`` entries of a feature manifest, with a one-line error for anything else."""
    try:
        manifest = json.loads(Path(manifest_path).read_text(encoding="utf-8"))
        return list(manifest["files"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(f"{manifest_path}: not a feature manifest: {exc}".splitlines()[0]) from exc


def _verified(entry: Mapping[str, Any], manifest_path: str | Path) -> str:
    """The path of a manifest entry whose file still has the sha256 the manifest recorded."""
    if sha256_file(entry["path"]) != entry["sha256"]:
        raise DatasetError(f"{entry['path']}: changed since {manifest_path} was written; rerun the pipeline")
    return str(entry["path"])


def manifest_files(manifest_path: str | Path, verify: bool = True) -> list[str]:
    """The feature tables listed in a manifest; with `verify`, each file's sha256 must still match."""
    entries = _manifest_entries(manifest_path)
    return [_verified(entry, manifest_path) if verify else entry["path"] for entry in entries]


def load_features(manifest_path: str | Path) -> pl.DataFrame:
    """Every feature table of a manifest, combined (see load_feature_tables)."""
    return load_feature_tables(manifest_files(manifest_path))


def load_features_for_days(
    manifest_path: str | Path, days: Collection[date], only_days: bool = False
) -> pl.DataFrame:
    """The feature tables of a manifest that hold a row of any of `days` (by each entry's first_day..last_day),
    each hash-checked, combined as `load_features` combines all of them: a fold split's rows selected from it are
    the rows selected from `load_features` (tests/test_evaluate_cost.py). A job that needs a few days (an
    evaluation, one fold's test days, a training window) reads and hashes a few tables instead of every one.
    `only_days`: of those tables, only the rows of `days` (`load_feature_tables`), for a job whose splits are
    made of these days alone (a training job's fold window, a study's tuning window)."""
    wanted = {day.isoformat() for day in days}
    if not wanted:
        raise DatasetError("load_features_for_days: no trading days asked for")
    paths = [
        _verified(entry, manifest_path)
        for entry in _manifest_entries(manifest_path)
        # ISO dates compare as strings; an empty table (skipped, no rows) has no first_day and holds no day
        if entry.get("rows") and any(entry["first_day"] <= day <= entry["last_day"] for day in wanted)
    ]
    if not paths:
        raise DatasetError(f"{manifest_path}: no feature table holds a day of {min(wanted)}..{max(wanted)}")
    return load_feature_tables(paths, days=set(days) if only_days else None)


def feature_names_of(table: pl.DataFrame) -> list[str]:
    """The catalog's base features, plus the book group when every file carries it, plus the ``features.user``
    features: every other Float32 column, in table order (the features stage writes them after the catalog's)."""
    names = list(FEATURE_NAMES)
    if all(name in table.columns for name in BOOK_FEATURE_NAMES):
        names += list(BOOK_FEATURE_NAMES)
    known = {*BASE_COLUMNS, *FEATURE_NAMES, *BOOK_FEATURE_NAMES}
    names += [name for name, dtype in table.schema.items() if dtype == pl.Float32 and name not in known]
    return names


def cost_model_from_config(costs: Mapping[str, Any]) -> Costs:
    """The `costs` section of config.yaml: one CostModel, or one per symbol root (`costs.instruments`)."""
    return costs_from_config(costs)


def env_config_from_config(config: Mapping[str, Any]) -> EnvConfig:
    """EnvConfig from the `env` section and training.n_envs."""
    env = config["env"]
    return EnvConfig(
        window=env["window"],
        contracts=env["contracts"],
        episode_length=env["episode_length"],
        fill=env["fill"],
        n_envs=config["training"]["n_envs"],
        max_gap=parse_duration(env["max_gap"], key="env.max_gap"),
    )


@dataclass
class WindowData:
    """One window's splits on the device, and the normalizer fit on its training rows."""

    normalizer: FeatureNormalizer
    feature_names: list[str]
    splits: dict[str, MarketData]
    frames: dict[str, pl.DataFrame]


def build_window(
    table: pl.DataFrame,
    split_frames: Mapping[str, pl.DataFrame],
    config: Mapping[str, Any],
    device: torch.device | str,
    fit_on: str = "train",
) -> WindowData:
    """Fit the normalizer on `split_frames[fit_on]` and move every split to `device` as MarketData."""
    names = feature_names_of(table)
    normalizer = FeatureNormalizer().fit(split_frames[fit_on], names)
    costs = cost_model_from_config(config["costs"])
    max_gap = parse_duration(config["env"]["max_gap"], key="env.max_gap")  # the env's segments, as configured
    splits = {
        name: MarketData.from_frame(frame, names, normalizer, costs, device, max_gap=max_gap)
        for name, frame in split_frames.items()
    }
    return WindowData(normalizer, names, splits, dict(split_frames))


FoldSplitName = Literal["train", "validation", "train_full", "test"]


def fold_window(
    table: pl.DataFrame,
    plan: FoldPlan,
    fold: int,
    config: Mapping[str, Any],
    device: torch.device | str,
    splits: Sequence[FoldSplitName] = ("train", "validation"),
) -> WindowData:
    """A fold's splits; the normalizer is always fit on the fold's inner training rows."""
    fold_spec = plan.fold(fold)
    frames = {name: select_rows(table, fold_spec, name) for name in dict.fromkeys(("train", *splits))}
    window = build_window(table, frames, config, device)
    if "train" not in splits:
        window.splits.pop("train")
        window.frames.pop("train")
    return window


def tuning_window(
    table: pl.DataFrame,
    plan: FoldPlan,
    config: Mapping[str, Any],
    device: torch.device | str,
    fold: int | None = None,
) -> WindowData:
    """Hyperopt's window: inner train and validation rows, all before the first test day of any fold, or with
    `fold` (hyperopt.per_fold) before that fold's first test day."""
    frames = {name: select_tuning_rows(table, plan, name, fold) for name in ("train", "validation")}
    return build_window(table, frames, config, device)
