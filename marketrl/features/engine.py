"""The feature query planner and the chunk engine: the catalog's entries (marketrl.features.catalog) in
dependency stages, computed over sorted bars in chunks of ``CHUNK_BARS`` bars.

- **per instrument**: frames are sorted by (instrument_id, ts_event) and the rolling expressions run over the
  flat columns; every row whose window could reach into the previous instrument's bars is a warm-up row (fewer
  than MAX_LOOKBACK earlier bars of its own instrument) and is dropped. The cumulative day-VWAP runs
  ``.over(instrument, day)``. The equivalence with computing each instrument alone is tested.
- **bounded memory**: the table is computed in chunks of ``CHUNK_BARS`` bars (each with the MAX_LOOKBACK bars
  before it as context), so the working set is one chunk whatever the file's length.
- **cost**: the query runs the entries in dependency stages and drops each intermediate column after its last
  reader. Measured in bench/speed/features.py.
- no NaN/inf reaches the table: ``non_finite_columns`` is checked before writing (marketrl.features.build).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from marketrl.data.quotes import QUOTE_COLUMNS
from marketrl.data.reader import DataFileError, chunked_like
from marketrl.features.catalog import (
    _BAR_RETURN,
    _DAY_SUMS,
    _ENTRIES,
    BASE_COLUMNS,
    BOOK_CATALOG,
    BOOK_FEATURE_NAMES,
    CATALOG,
    FEATURE_NAMES,
    LOOKBACKS,
    MAX_LOOKBACK,
    FeatureSpec,
    _c,
)
from marketrl.features.user import UserFeatures, user_columns, with_reference

__all__ = ["CHUNK_BARS", "FeatureChunks", "feature_chunks", "non_finite_columns"]


@dataclass(frozen=True)
class _Stage:
    """One ``with_columns`` of the query, and the intermediate columns no later stage reads."""

    columns: tuple[pl.Expr, ...]
    drop: tuple[str, ...]


_PASSED_THROUGH = ("_bar_index", *_DAY_SUMS)


@functools.cache
def _plan(bar_ns: int, with_book: bool) -> tuple[_Stage, ...]:
    """The query's stages: every entry the outputs need, in the first stage after all it reads.

    Outputs (the features and ``bar_return``) are cast to Float32 where they are computed; the shared columns
    stay Float64 and are dropped after the stage of their last reader.
    """
    outputs = (_BAR_RETURN, *CATALOG, *(BOOK_CATALOG if with_book else ()))
    needed: dict[str, FeatureSpec] = {}
    pending = list(outputs)
    while pending:
        spec = pending.pop()
        if spec.name not in needed:
            needed[spec.name] = spec
            pending += [_ENTRIES[column] for column in spec.inputs if column in _ENTRIES]
    stage_of: dict[str, int] = {}
    columns: dict[int, list[pl.Expr]] = {}
    for spec in _ENTRIES.values():  # definition order is a topological order
        if spec.name not in needed:
            continue
        expr, helpers = spec.expr(bar_ns)
        first = 1 + max((stage_of.get(column, 0) for column in spec.inputs), default=0)
        for name, helper in helpers.items():
            columns.setdefault(first, []).append(helper.alias(name))
        stage = first + bool(helpers)  # a truncated EMA reads its recursion column (_Ema.truncated)
        is_output = spec.name in (_BAR_RETURN.name, *FEATURE_NAMES, *BOOK_FEATURE_NAMES)
        columns.setdefault(stage, []).append(expr.cast(pl.Float32) if is_output else expr)
        stage_of[spec.name] = stage
        for name in helpers:
            stage_of[name] = first
    last_read: dict[str, int] = {}
    for spec in needed.values():
        for column in spec.inputs:
            if column in needed:
                last_read[column] = max(last_read.get(column, 0), stage_of[spec.name])
        for name in spec.expr(bar_ns)[1]:
            last_read[name] = stage_of[spec.name]
    return tuple(
        _Stage(
            tuple(columns[k]),
            tuple(name for name, stage in last_read.items() if stage == k and name not in LOOKBACKS),
        )
        for k in sorted(columns)
    )


def _feature_query(
    frame: pl.LazyFrame, bar_ns: int, with_book: bool, user: UserFeatures | None = None
) -> pl.LazyFrame:
    """Lazy query over bars carrying ``_bar_index`` and the day sums (``_with_day_sums``): ``BASE_COLUMNS``, the
    features (the ``user`` features last, computed after the catalog's), and ``_bar_index``, ``_day_tpv``,
    ``_day_volume`` passed through."""
    for stage in _plan(bar_ns, with_book):
        frame = frame.with_columns(*stage.columns)
        if stage.drop:
            frame = frame.drop(*stage.drop)
    features = FEATURE_NAMES + (BOOK_FEATURE_NAMES if with_book else ())
    if user is not None:
        helpers, columns = user_columns(user)
        frame = frame.with_columns(*helpers).with_columns(*columns)
        features += user.names
    return frame.select(*BASE_COLUMNS, *features, *_PASSED_THROUGH)


def _starts_run(*keys: str) -> pl.Expr:
    """True on the first row of each run of equal ``keys`` (the frame is sorted by them)."""
    changed = [_c(key) != _c(key).shift(1) for key in keys]
    return pl.any_horizontal(*changed).fill_null(True)


_ROW = pl.int_range(pl.len(), dtype=pl.UInt32)
# Position of the bar within its instrument (rows sorted by instrument): row number minus the instrument's first.
_BAR_INDEX = (_ROW - pl.when(_starts_run("instrument_id")).then(_ROW).forward_fill()).alias("_bar_index")


@dataclass(frozen=True)
class _DaySums:
    """Running Σ(typical price·volume) and Σvolume of one (instrument, UTC day), up to and including some bar."""

    instrument_id: int
    trading_day: Any
    tpv: float
    volume: float

    @classmethod
    def at_end(cls, table: pl.DataFrame) -> _DaySums:
        """The sums at the last row of a feature chunk."""
        return cls(*table.select("instrument_id", "trading_day", "_day_tpv", "_day_volume").row(-1))


def _with_day_sums(frame: pl.LazyFrame, first_own: int, carry: _DaySums | None) -> pl.LazyFrame:
    """Add ``_day_tpv``, ``_day_volume`` (for ``vwap_dev_day``): Σ(typical price·volume) and Σvolume since the
    instrument's first bar of the UTC day, for a frame whose own rows start at row ``first_own``.

    Day sums are not bounded by MAX_LOOKBACK, so chunks hand them on: the context rows before ``first_own`` add
    nothing, and the previous chunk's sums (``carry``) are added to the first own row's term where that row
    continues their day. Every running sum is then the same sequence of float additions as one cumulative sum
    over the whole table.
    """
    own = _ROW >= first_own
    tpv = pl.when(own).then((_c("high") + _c("low") + _c("close")) / 3.0 * _c("volume")).otherwise(0.0)
    volume = pl.when(own).then(_c("volume")).otherwise(0.0)
    if carry is not None:
        continues = (
            (_ROW == first_own)
            & (_c("instrument_id") == carry.instrument_id)
            & (_c("trading_day") == carry.trading_day)
        )
        tpv = tpv + pl.when(continues).then(carry.tpv).otherwise(0.0)
        volume = volume + pl.when(continues).then(carry.volume).otherwise(0.0)
    day = _starts_run("instrument_id", "trading_day").cum_sum().set_sorted()  # lets polars group by slices
    # The terms are materialized first: inside .over() the row numbers above would restart at every day.
    return frame.with_columns(tpv.alias("_day_tpv"), volume.alias("_day_volume")).with_columns(
        _c("_day_tpv", "_day_volume").cum_sum().over(day)
    )


# Bars per chunk (and Parquet row group). A chunk's working set is ~0.8 KB per bar (the float64 window columns
# plus the float32 output), ~25 MB here, whatever the file's length.
CHUNK_BARS = 24576


def _feature_chunks(
    bars: pl.DataFrame,
    bar_ns: int,
    *,
    with_book: bool,
    keep: pl.Expr,
    chunk_bars: int,
    user: UserFeatures | None = None,
) -> Iterator[pl.DataFrame]:
    """Rows of ``bars`` (sorted, with ``_bar_index``) that satisfy ``keep``, with features, ``chunk_bars`` bars at
    a time.

    Each chunk is computed over its own bars plus the MAX_LOOKBACK bars before it, which every window of its
    first non-warm-up row fits in. Chunk boundaries are fixed multiples of ``chunk_bars`` from the first bar, so
    bars added after a row never change how that row is computed.
    """
    carry: _DaySums | None = None
    for start in range(0, bars.height, chunk_bars):
        first = max(0, start - MAX_LOOKBACK)
        frame = _with_day_sums(bars.slice(first, start + chunk_bars - first).lazy(), start - first, carry)
        table = _feature_query(frame, bar_ns, with_book, user).collect(
            engine="in-memory"  # the streaming engine adds ~0.1 s of set-up per query
        )
        table = table.slice(start - first)  # the chunk's own rows
        carry = _DaySums.at_end(table)
        kept = table.select(keep).to_series()
        if not kept.all():
            table = table.filter(kept)
        yield table.drop(*_PASSED_THROUGH)


def _check_positive_prices(bars: pl.DataFrame, path: Path) -> None:
    non_positive = pl.min_horizontal("open", "high", "low", "close") <= 0
    if bars.select(non_positive.any()).item():  # an aggregate first: filtering would copy the whole table
        row = bars.filter(non_positive).row(0, named=True)
        raise DataFileError(
            path,
            f"non-positive price in instrument {row['symbol']} ({row['instrument_id']}) at {row['ts_event']}; "
            "log-return features need positive prices",
        )


@dataclass(frozen=True)
class FeatureChunks:
    """The feature table of some bars, counted before any row is computed; iterate for its chunks."""

    bars: pl.DataFrame  # sorted, with _bar_index, instruments too short to give a row left out
    bar_ns: int
    with_book: bool
    keep: pl.Expr  # the table's rows: in scope (ts_event >= keep_from) and past the warm-up
    rows: int
    instruments: int  # instruments with at least one row
    dropped: list[str]  # symbols of the instruments left out (drop_short=True)
    chunk_bars: int
    user: UserFeatures | None = None  # features.user, appended after the catalog's

    def __iter__(self) -> Iterator[pl.DataFrame]:
        return _feature_chunks(
            self.bars,
            self.bar_ns,
            with_book=self.with_book,
            keep=self.keep,
            chunk_bars=self.chunk_bars,
            user=self.user,
        )


def feature_chunks(
    bars: pl.DataFrame,
    bar_ns: int,
    *,
    path: Path,
    with_book: bool = False,
    keep_from: Any = None,
    drop_short: bool = False,
    chunk_bars: int | None = None,
    user: UserFeatures | None = None,
) -> FeatureChunks:
    """Check ``bars`` (read_bars' layout, sorted by instrument and time) and count the feature table's rows:
    warm-up rows dropped, only rows with ``ts_event >= keep_from`` kept. Iterating the result computes the
    table in chunks of ``chunk_bars`` (default ``CHUNK_BARS``) bars.

    An instrument left with no rows is an error (``DataFileError`` naming ``path``), or, with
    ``drop_short=True``, left out and listed in ``dropped`` (then every instrument may be, giving no rows).
    ``user``: features of a ``features.user`` file (marketrl.features.user), appended after the catalog's.
    """
    _check_positive_prices(bars, path)
    if user is not None and user.reference:
        bars = with_reference(bars, user.reference, path)
    bars = bars.hstack([chunked_like(bars.select(_BAR_INDEX).to_series(), bars["ts_event"])])
    in_scope = pl.lit(True) if keep_from is None else _c("ts_event") >= keep_from
    keep = in_scope & (_c("_bar_index") >= MAX_LOOKBACK)
    counts = (
        bars.select("instrument_id", in_scope.alias("in_scope"), keep.alias("keep"))
        .group_by("instrument_id", maintain_order=True)
        .agg(pl.len().alias("total"), _c("in_scope").sum().alias("bars"), _c("keep").sum().alias("rows"))
        .filter(_c("bars") > 0)
    )
    short = counts.filter(_c("rows") == 0)
    if short.height:  # symbols only for these few (a group_by over the symbol column would copy it)
        last_rows = _c("instrument_id") != _c("instrument_id").shift(-1)
        symbols = bars.select("instrument_id", "symbol").filter(last_rows.fill_null(True))
        short = short.join(symbols, on="instrument_id", how="left", maintain_order="left")
    if short.height and not drop_short:
        row = short.row(0, named=True)
        raise DataFileError(
            path,
            f"too few bars for the lookbacks: instrument {row['symbol']} ({row['instrument_id']}) has "
            f"{row['total']} bar(s) (with context), a feature row needs {MAX_LOOKBACK} earlier bars (MAX_LOOKBACK)",
        )
    if counts.height == short.height and not drop_short:
        raise DataFileError(
            path, f"too few bars for the lookbacks: no instrument has {MAX_LOOKBACK + 1} bars"
        )
    if short.height:  # instruments are independent: leave the short ones out before computing
        bars = bars.filter(~_c("instrument_id").is_in(short["instrument_id"].implode()))
    return FeatureChunks(
        bars=bars,
        bar_ns=bar_ns,
        with_book=with_book,
        keep=keep,
        rows=int(counts["rows"].sum()),
        instruments=counts.height - short.height,
        dropped=short["symbol"].to_list() if short.height else [],
        chunk_bars=chunk_bars or CHUNK_BARS,
        user=user,
    )


def non_finite_columns(table: pl.DataFrame) -> list[str]:
    """The float columns of ``table`` that hold a null, NaN or ±inf, in column order; the quote columns
    (``QUOTE_COLUMNS``, null where a bar has no quote) are not checked."""
    value_columns = [
        name
        for name, dtype in table.schema.items()
        if dtype in (pl.Float32, pl.Float64) and name not in QUOTE_COLUMNS
    ]
    # Fast path: one sum per column is finite unless a value is NaN/inf (or the sum overflows, which the exact
    # check below then clears). Null counts are metadata.
    sums = table.select(pl.col(value_columns).sum()).row(0)
    if all(math.isfinite(total) for total in sums) and not any(table[c].null_count() for c in value_columns):
        return []
    # is_finite is null for nulls and all() skips those, hence the separate null count.
    finite = table.select(pl.col(value_columns).is_finite().all()).row(0, named=True)
    return [c for c in value_columns if table[c].null_count() or not finite[c]]


def _check_finite(table: pl.DataFrame, path: Path) -> None:
    """Fail, naming the first offending column, if any float column holds a null, NaN or infinity."""
    offenders = non_finite_columns(table)
    if offenders:
        raise DataFileError(
            path, f"non-finite values in column {offenders[0]!r} ({len(offenders)} column(s) affected)"
        )


# Parquet layout (docs/FEATURES.md): float columns BYTE_STREAM_SPLIT-encoded (their bytes grouped by
