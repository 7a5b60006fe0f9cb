"""The features stage: decode one DBN.zst file (with as many earlier files as its lookbacks need) and write its
feature table as zstd Parquet, one row group per chunk of marketrl.features.engine, with provenance metadata.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl
import pyarrow.parquet as pq

from marketrl.calendars.sessions import SessionCalendar
from marketrl.data.file_order import CONTEXT_FILES
from marketrl.data.labels import Labels, first_conflict, labels_of, odd_file
from marketrl.data.quotes import (
    QUOTE_COLUMNS,
    bar_quotes,
    check_fill_delay,
    fill_delay_ns,
    load_quotes,
    quotes_at_bars,
    read_quotes,
)
from marketrl.data.reader import (
    DEFAULT_MAX_PRICE_JUMP,
    QUOTE_SCHEMAS,
    BarFile,
    DataConfigError,
    DataFileError,
    read_bars,
)
from marketrl.features.catalog import (
    BOOK_FEATURE_NAMES,
    FEATURE_NAMES,
    FEATURE_SET_VERSION,
    MAX_LOOKBACK,
    _c,
)
from marketrl.features.engine import _check_finite, _check_positive_prices, feature_chunks
from marketrl.features.user import UserFeatureError, UserFeatures
from marketrl.runtime.io import atomic_write

__all__ = [
    "MAX_CONTEXT_GAP",
    "ON_BAD_FILE_KEY",
    "PARQUET_ZSTD_LEVEL",
    "FeatureJob",
    "OnBadFile",
    "build_feature_batch",
    "build_feature_file",
    "feature_options",
    "resorted_note",
    "skipped_reason",
    "warmup_only_note",
]

# Context files further back than this are not context: a lookback across a gap of weeks (data of January and
# June) would mix unrelated markets. Longer than any exchange's closure (a weekend with a holiday: ~4 days).
MAX_CONTEXT_GAP = dt.timedelta(days=7)

# significance, which zstd compresses far better), zstd at a fast level; dictionary encoding and min/max
# statistics only on the key columns (float features have no useful dictionary or statistics).
_PARQUET_KEY_COLUMNS = ["ts_event", "trading_day", "instrument_id", "symbol"]
PARQUET_ZSTD_LEVEL = -1


def _write_chunks(chunks: Iterator[pl.DataFrame], tmp: Path, metadata: dict[str, str], path: Path) -> int:
    """Check and write each chunk as one Parquet row group; returns the rows written.

    Encoding runs on a second thread, overlapping the next chunk's features; at most one chunk waits for it.
    """
    writer: pq.ParquetWriter | None = None
    rows = 0
    try:
        with ThreadPoolExecutor(max_workers=1) as encoder:
            pending: Future[None] | None = None
            for chunk in chunks:
                if chunk.height == 0:
                    continue
                _check_finite(chunk, path)
                table = chunk.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(
                        tmp,
                        table.schema.with_metadata(metadata),
                        compression="zstd",
                        compression_level=PARQUET_ZSTD_LEVEL,
                        use_dictionary=_PARQUET_KEY_COLUMNS,
                        write_statistics=_PARQUET_KEY_COLUMNS,
                        use_byte_stream_split=[
                            name for name, dtype in chunk.schema.items() if dtype in (pl.Float32, pl.Float64)
                        ],
                    )
                if pending is not None:
                    pending.result()
                pending = encoder.submit(writer.write_table, table)
                rows += chunk.height
            if pending is not None:
                pending.result()
    finally:
        if writer is not None:  # after the encoder thread has finished (the with block waits for it)
            writer.close()
    return rows


OnBadFile = Literal["error", "skip"]
ON_BAD_FILE_KEY = "data.on_bad_file"


def feature_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``build_feature_file`` keyword arguments that the ``data`` config section sets (bar_size, session,
    max_price_jump, on_bad_file); absent keys keep the defaults."""
    options: dict[str, Any] = {}
    if "bar_size" in data:
        options["bar_size"] = data["bar_size"]
    if data.get("session"):
        options["session"] = dict(data["session"])
    if "max_price_jump" in data:
        options["max_price_jump"] = float(data["max_price_jump"])
    if "on_bad_file" in data:
        if data["on_bad_file"] not in ("error", "skip"):
            raise ValueError(f"{ON_BAD_FILE_KEY}: expected 'error' or 'skip', got {data['on_bad_file']!r}")
        options["on_bad_file"] = data["on_bad_file"]
    return options


def _empty_feature_table(
    with_book: bool, user: UserFeatures | None = None, with_quotes: bool = False
) -> pl.DataFrame:
    """A feature table with no rows: the columns and types ``build_feature_file`` writes."""
    columns: dict[str, Any] = {
        "ts_event": pl.Datetime("ns", "UTC"),
        "trading_day": pl.Date,
        "instrument_id": pl.UInt32,
        "symbol": pl.String,
        **dict.fromkeys(("open", "high", "low", "close", "volume"), pl.Float64),
        "bar_return": pl.Float32,
        **dict.fromkeys(FEATURE_NAMES + (BOOK_FEATURE_NAMES if with_book else ()), pl.Float32),
        **dict.fromkeys(user.names if user else (), pl.Float32),
        **dict.fromkeys(QUOTE_COLUMNS if with_quotes else (), pl.Float64),
    }
    return pl.DataFrame(schema=columns)


def skipped_reason(feature_file: str | Path) -> str | None:
    """Why ``build_feature_file`` skipped the source of ``feature_file`` (``on_bad_file="skip"``), else None."""
    metadata = pq.read_schema(feature_file).metadata or {}  # tables written elsewhere may carry none
    return metadata.get(b"marketrl.skipped", b"").decode() or None


def _check_scale_continuity(
    prev: pl.DataFrame, current: pl.DataFrame, src: Path, prev_path: Path, max_jump: float
) -> None:
    """The first bar of each instrument against its last bar in the previous file: a jump beyond ``max_jump``
    is a change of price scale (e.g. a file in cents after one in dollars), not a market move."""
    if max_jump <= 0 or prev.height == 0 or current.height == 0:
        return
    last = prev.group_by("instrument_id").agg(pl.col("close").last().alias("prev_close"))
    first = current.group_by("instrument_id").agg(pl.col("open").first(), pl.col("symbol").first())
    joined = first.join(last, on="instrument_id", how="inner")
    ratio = (_c("open") / _c("prev_close")).log().abs()
    bad = joined.filter(ratio > math.log(max_jump))
    if bad.height:
        row = bad.sort("instrument_id").row(0, named=True)
        raise DataFileError(
            src,
            f"price of {row['symbol']} ({row['instrument_id']}) jumps more than {max_jump:g}x from the previous "
            f"file {prev_path.name} ({row['prev_close']} -> {row['open']}): a price-scale change between files "
            "(limit: data.max_price_jump)",
        )


def build_feature_file(
    src: Path,
    dst: Path,
    *,
    bar_size: str = "1m",
    context_srcs: Sequence[Path] = (),
    prev_src: Path | None = None,
    session: SessionCalendar | Mapping[str, Any] | None = None,
    max_price_jump: float = DEFAULT_MAX_PRICE_JUMP,
    on_bad_file: OnBadFile = "error",
    user: UserFeatures | None = None,
    quote_srcs: Sequence[Path] = (),
    fill_delay: float = 0.0,
) -> dict[str, Any]:
    """Decode ``src`` once, featurize it and atomically write ``dst`` (zstd Parquet with provenance metadata).

    ``context_srcs`` are the files before ``src`` of the same dataset/schema, in time order (e.g. the previous
    days; ``prev_src`` is shorthand for one): decoded newest first, only as many as the lookbacks need (see
    ``_read_context``), they let lookbacks run across file boundaries; only ``src``'s bars are written.
    ``session`` (the ``data.session`` config; None: the dataset's calendar) sets ``trading_day``;
    ``max_price_jump`` bounds price moves within a file and across each file boundary. Returns a summary
    (rows, instruments, schema, dbn_version, sha256, context, skipped, warmup_only, ...).

    Rows need ``MAX_LOOKBACK`` earlier bars of their instrument, context included: an instrument whose bars
    are all warm-up (a contract first seen near the end of the file, or the start of the data) is left out
    and listed in ``warmup_instruments``; a file with no row at all (the first file(s) of the data) gives an
    empty table whose metadata (``marketrl.warmup_only``, see ``warmup_only_note``) and summary
    (``warmup_only``) say so: its bars only serve as the next file's context.

    A bad or untradable ``src`` raises ``DataFileError`` (nothing is written) with ``on_bad_file="error"``;
    with ``"skip"`` it yields an empty feature table whose metadata (``marketrl.skipped``, see
    ``skipped_reason``) and summary (``skipped``) say why. Every error names the file its record came from: a
    bad context file (unreadable, or bad data such as a zero price) fails this file's job naming that file with
    ``"error"``; with ``"skip"`` only that file is skipped (as its own table), and here the context drops it and
    every file before it (a lookback across it would have a hole), with a warning. Features are computed and written in chunks of ``CHUNK_BARS`` bars, so memory
    beyond the bars stays bounded however long the file is.

    ``user``: the features of a ``features.user`` file (marketrl.features.user, audited by the caller), written
    after the catalog's and named in the metadata (``marketrl.user_features``).

    Quotes (``QUOTE_COLUMNS``, for quote-aware fills; marketrl.data.quotes): from ``quote_srcs`` (``data.quotes``:
    the bbo-1s/bbo-1m/mbp-1 files paired with ``src``), or, for a quote schema (tbbo, mbp-1, mbp-10), from the
    bars' own top of book; each row gets the quote as of its bar's close and open (null where none). They are
    not features: the observation does not see them. ``fill_delay`` (``env.fill_delay``, seconds, shorter than a
    bar) moves both instants that many seconds later, so the columns hold the quote a fill meets after the
    delay; it needs quotes at 1 s resolution or finer (bbo-1s or mbp-1 files, or the records of tbbo, mbp-1 or
    mbp-10 bars, read from ``src`` itself), else a ``DataConfigError`` naming the key and the schema found.
    """
    if on_bad_file not in ("error", "skip"):
        raise ValueError(f"{ON_BAD_FILE_KEY}: expected 'error' or 'skip', got {on_bad_file!r}")
    if prev_src is not None:
        if context_srcs:
            raise ValueError("build_feature_file: give context_srcs or prev_src, not both")
        context_srcs = [prev_src]
    job = FeatureJob(
        Path(src), Path(dst), tuple(Path(p) for p in context_srcs), tuple(Path(p) for p in quote_srcs)
    )
    options = {"session": session, "max_price_jump": max_price_jump}
    return _build_or_skip(job, bar_size, options, on_bad_file, user, _DecodedFiles(0), fill_delay)


@dataclass(frozen=True)
class FeatureJob:
    """One file of a features batch: its source, its feature table, and the ``context_srcs`` and ``quote_srcs``
    that ``build_feature_file`` takes for it."""

    src: Path
    dst: Path
    context_srcs: tuple[Path, ...] = ()
    quote_srcs: tuple[Path, ...] = ()


def build_feature_batch(
    jobs: Sequence[FeatureJob],
    *,
    bar_size: str = "1m",
    session: SessionCalendar | Mapping[str, Any] | None = None,
    max_price_jump: float = DEFAULT_MAX_PRICE_JUMP,
    on_bad_file: OnBadFile = "error",
    user: UserFeatures | None = None,
    fill_delay: float = 0.0,
) -> list[dict[str, Any]]:
    """``build_feature_file`` for each of ``jobs`` in turn (one features job of ``features.batch``: a month of
    files, in time order, with the same options), each table the same bytes as its own call would write;
    returns their summaries.

    The batch pays the process start-up once, and decodes each file once: the last ``CONTEXT_FILES + 1`` decoded
    files are kept, so a file read as ``src`` is reused as the next files' context. Each table is written
    atomically as it is done; an error (``on_bad_file="error"``, or a bug) stops the batch, and the workflow
    removes the tables the failed job had written.
    """
    if on_bad_file not in ("error", "skip"):
        raise ValueError(f"{ON_BAD_FILE_KEY}: expected 'error' or 'skip', got {on_bad_file!r}")
    options = {"session": session, "max_price_jump": max_price_jump}
    decoded = _DecodedFiles(CONTEXT_FILES + 1)
    return [_build_or_skip(job, bar_size, options, on_bad_file, user, decoded, fill_delay) for job in jobs]


def _build_or_skip(
    job: FeatureJob,
    bar_size: str,
    options: dict[str, Any],
    on_bad_file: OnBadFile,
    user: UserFeatures | None,
    decoded: _DecodedFiles,
    fill_delay: float,
) -> dict[str, Any]:
    """One file's table, or with ``on_bad_file="skip"`` the empty table of a bad ``job.src``."""
    try:
        return _build_feature_file(
            job.src,
            job.dst,
            bar_size,
            job.context_srcs,
            options,
            on_bad_file,
            user,
            job.quote_srcs,
            decoded,
            fill_delay,
        )
    except DataFileError as exc:
        if on_bad_file == "error" or exc.path != job.src or isinstance(exc, DataConfigError):
            raise
        return _write_skipped(job.src, job.dst, bar_size, exc, user)


def _user_metadata(user: UserFeatures | None) -> dict[str, str]:
    return {"marketrl.user_features": json.dumps(user.record())} if user else {}


def _write_skipped(
    src: Path, dst: Path, bar_size: str, exc: DataFileError, user: UserFeatures | None
) -> dict[str, Any]:
    """The empty feature table of a skipped file, with the reason in its metadata."""
    reason = exc.fault.removesuffix(_SKIP_HINT)
    metadata = {
        "marketrl.feature_set_version": FEATURE_SET_VERSION,
        "marketrl.source_file": src.name,
        "marketrl.bar_size": bar_size,
        "marketrl.rows": "0",
        "marketrl.skipped": reason,
        **_user_metadata(user),
    }
    table = _empty_feature_table(with_book=False, user=user).to_arrow()
    with atomic_write(dst) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp, compression="zstd")
    logging.getLogger(__name__).warning("%s: skipped (%s: skip): %s", src, ON_BAD_FILE_KEY, reason)
    return {
        "rows": 0,
        "instruments": 0,
        "features": len(FEATURE_NAMES) + len(user.names if user else ()),
        "bar_size": bar_size,
        "warmup_only": None,
        "resorted": None,
        "skipped": reason,
    }


_SKIP_HINT = f"; set {ON_BAD_FILE_KEY}: skip to skip such files"


def resorted_note(feature_file: str | Path) -> str | None:
    """Which records of the source of ``feature_file`` came out of time order and were re-sorted, else None."""
    metadata = pq.read_schema(feature_file).metadata or {}  # tables written elsewhere may carry none
    return metadata.get(b"marketrl.resorted", b"").decode() or None


def warmup_only_note(feature_file: str | Path) -> str | None:
    """Why the feature table of ``feature_file`` has no rows when every bar of its source is warm-up (the
    first file(s) of the data, kept as context for the next), else None."""
    metadata = pq.read_schema(feature_file).metadata or {}  # tables written elsewhere may carry none
    return metadata.get(b"marketrl.warmup_only", b"").decode() or None


@dataclass(frozen=True)
class _Context:
    """The bars of earlier files that a file's lookbacks reach, and the files they come from (time order)."""

    bars: list[pl.DataFrame]  # one frame per file, oldest first, each strictly before the next file's start
    files: list[dict[str, str]]  # {"file": name, "sha256": ...}, oldest first


class _DecodedFiles:
    """The last ``size`` files decoded and checked by ``_read_file`` within one batch (``build_feature_batch``):
    a batch's consecutive files are each other's context, so each file is decoded once rather than once as
    ``src`` and again as the context of the next ``CONTEXT_FILES`` files. A file that fails is not kept (each
    reader raises its own error again). Size 0 keeps nothing (one file per call)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.files: OrderedDict[Path, BarFile] = OrderedDict()

    def get(self, path: Path) -> BarFile | None:
        bar_file = self.files.get(path)
        if bar_file is not None:
            self.files.move_to_end(path)
        return bar_file

    def put(self, path: Path, bar_file: BarFile) -> None:
        if self.size <= 0:
            return
        self.files[path] = bar_file
        self.files.move_to_end(path)
        while len(self.files) > self.size:
            self.files.popitem(last=False)


def _read_file(path: Path, bar_size: str, options: dict[str, Any], decoded: _DecodedFiles) -> BarFile:
    """``read_bars`` plus the checks that need no other file, so that a fault is reported against the file the
    record came from: checked later, on the bars of a file and its context together, a zero price in a context
    file would be blamed on (and, with ``on_bad_file: skip``, skip) the file that read it."""
    path = Path(path)
    bar_file = decoded.get(path)
    if bar_file is None:
        bar_file = read_bars(path, bar_size, **options)
        _check_positive_prices(bar_file.bars, bar_file.path)
        decoded.put(path, bar_file)
    return bar_file


def _labels_of_files(
    paths: Sequence[Path], bar_size: str, options: dict[str, Any], decoded: _DecodedFiles
) -> list[Labels]:
    """The labels of the files that can be read (the others have no say), in the order given."""
    labels = []
    for path in paths:
        try:
            labels.append(labels_of(path, _read_file(path, bar_size, options, decoded).bars))
        except DataFileError:
            continue  # an unreadable file is reported as its own table
    return labels


def _read_context(
    current: BarFile,
    context_srcs: Sequence[Path],
    bar_size: str,
    options: dict[str, Any],
    on_bad_file: OnBadFile,
    decoded: _DecodedFiles,
) -> _Context:
    """Decode ``context_srcs`` (in time order) newest first, stopping as soon as every instrument of
    ``current`` seen in the context so far has ``MAX_LOOKBACK`` context bars and the context reaches back
    before the current file's first trading day (the day-VWAP sums the whole session, which can span three
    UTC-day files after a Monday holiday), or the files run out.

    A file contributes only its bars strictly before the first bar of the next newer one (files may overlap),
    and each boundary is checked for a price-scale change. Each context file's labels are checked against the
    current file's (marketrl.data.labels: an instrument id keeps its symbol root, a symbol its price level
    within ``max_price_jump``); on a disagreement the remaining earlier files are decoded too and vote, and the
    error names the odd file out. An unusable context file (``on_bad_file="skip"``: unreadable, bad data, or
    the odd file out) ends the context there, with a warning: going past it would leave a hole in the lookbacks.
    """
    log = logging.getLogger(__name__)
    src = current.path
    wanted = set(current.bars["instrument_id"].unique().to_list())
    counts: dict[int, int] = {}
    parts: list[pl.DataFrame] = []
    files: list[dict[str, str]] = []
    newer, newer_path, cutoff = current.bars, src, current.bars["ts_event"].min()
    first_day = current.bars["trading_day"].min()
    current_labels, accepted = (
        labels_of(src, current.bars),
        [],
    )  # accepted: context files' labels, newest first
    for path in reversed(context_srcs):
        try:
            earlier = _read_file(path, bar_size, options, decoded)
        except DataFileError as exc:
            if on_bad_file == "error" or isinstance(exc, DataConfigError):
                raise
            log.warning("%s: context file unusable, no context from it on back: %s", src, exc)
            break
        if (earlier.schema, earlier.dataset) != (current.schema, current.dataset):
            raise DataFileError(
                src,
                f"context file {earlier.path} is {earlier.dataset}/{earlier.schema}, "
                f"expected {current.dataset}/{current.schema}",
            )
        part = earlier.bars.filter(_c("ts_event") < cutoff)
        if part.height and cutoff - part["ts_event"].max() > MAX_CONTEXT_GAP:
            log.info(
                "%s: no context from %s on back: more than %s before", src, earlier.path.name, MAX_CONTEXT_GAP
            )
            break
        try:
            _check_scale_continuity(part, newer, newer_path, earlier.path, options["max_price_jump"])
        except DataFileError as exc:
            if newer_path == src or on_bad_file == "error":
                raise
            log.warning("%s: no context from %s on back: %s", src, earlier.path.name, exc)
            break
        earlier_labels = labels_of(earlier.path, earlier.bars)
        conflict = first_conflict(current_labels, earlier_labels, options["max_price_jump"])
        if conflict is not None:
            older = context_srcs[: list(context_srcs).index(path)]
            voters = [
                *_labels_of_files(older, bar_size, options, decoded),
                earlier_labels,
                *accepted[::-1],
                current_labels,
            ]
            wrong, _, fault = odd_file(
                conflict, current_labels, earlier_labels, voters, options["max_price_jump"]
            )
            if wrong is current_labels or on_bad_file == "error":
                raise DataFileError(wrong.path, fault)
            log.warning("%s: no context from %s on back: %s", src, earlier.path.name, fault)
            break
        accepted.append(earlier_labels)
        parts.append(part)
        files.append({"file": earlier.path.name, "sha256": earlier.sha256})
        if part.height:
            newer, newer_path, cutoff = part, earlier.path, part["ts_event"].min()
        for instrument, n in part.group_by("instrument_id").len().iter_rows():
            counts[instrument] = counts.get(instrument, 0) + n
        seen = [counts[i] for i in wanted if i in counts]
        day_covered = part.height > 0 and part["trading_day"].min() < first_day
        if seen and min(seen) >= MAX_LOOKBACK and day_covered:
            break
    return _Context(bars=parts[::-1], files=files[::-1])


def _build_feature_file(
    src: Path,
    dst: Path,
    bar_size: str,
    context_srcs: Sequence[Path],
    options: dict[str, Any],
    on_bad_file: OnBadFile,
    user: UserFeatures | None,
    quote_srcs: Sequence[Path],
    decoded: _DecodedFiles,
    fill_delay: float = 0.0,
) -> dict[str, Any]:
    current = _read_file(src, bar_size, options, decoded)
    if user is not None and user.reads_book and not current.has_book:
        raise UserFeatureError(
            f"features.user: {user.path} reads the book (bid_px, ask_px, bid_sz, ask_sz or a book_* feature), "
            f"which {src.name} ({current.schema}) does not have"
        )
    if current.bars.height == 0:
        raise DataFileError(
            src,
            f"no tradable bars in this {current.schema} file (a holiday, or snapshots only?)"
            + (_SKIP_HINT if on_bad_file == "error" else ""),
        )
    # after the context: a bar file that relabels an instrument is named as such (marketrl.data.labels) before
    # its quotes are found to be another instrument's
    context = _read_context(current, context_srcs, bar_size, options, on_bad_file, decoded)
    delay_ns = fill_delay_ns(fill_delay)
    quotes = load_quotes(quote_srcs, current.bars, src, current.bar_ns, fill_delay) if quote_srcs else None
    if quotes is None and delay_ns:  # the bars' closes are too coarse: the file's own records, or an error
        check_fill_delay(fill_delay, current.bar_ns, current.schema if current.has_book else None, src)
        quotes = read_quotes(src, QUOTE_SCHEMAS).quotes
    bars, keep_from = current.bars, None
    if context.files:
        keep_from = bars["ts_event"].min()
        bars = pl.concat([*context.bars, bars], how="vertical").sort(
            "instrument_id", "ts_event", maintain_order=True
        )
    del context.bars[:]  # the concatenation holds them from here on
    if quotes is None and current.has_book:  # context bars included: their closes are the first opens' quotes
        quotes = bar_quotes(bars, current.bar_ns)
    # Instruments without a row have only warm-up bars: left out and listed, never an error (a contract
    # first traded near the end of the file gets its rows in the next file, with this one as context).
    selection = feature_chunks(
        bars,
        current.bar_ns,
        path=src,
        with_book=current.has_book,
        keep_from=keep_from,
        drop_short=True,
        user=user,
    )
    del bars  # the selection holds the bars (with _bar_index) from here on
    feature_names = list(FEATURE_NAMES) + (list(BOOK_FEATURE_NAMES) if current.has_book else [])
    feature_names += list(user.names) if user else []
    metadata = {
        "marketrl.feature_set_version": FEATURE_SET_VERSION,
        "marketrl.source_file": src.name,
        "marketrl.source_sha256": current.sha256,
        "marketrl.schema": current.schema,
        "marketrl.dataset": current.dataset,
        "marketrl.dbn_version": str(current.dbn_version),
        "marketrl.bar_size": bar_size,
        "marketrl.rows": str(selection.rows),
        "marketrl.max_lookback": str(MAX_LOOKBACK),
        "marketrl.feature_names": ",".join(feature_names),
        "marketrl.session": json.dumps(current.calendar.to_config() if current.calendar else None),
        "marketrl.dropped_outside_session": str(current.dropped_outside_session),
        "marketrl.dropped_in_halt": str(current.dropped_in_halt),
        "marketrl.context_files": json.dumps(context.files),
        "marketrl.warmup_instruments": json.dumps(selection.dropped),
        "marketrl.quotes": json.dumps(
            None if quotes is None else [p.name for p in quote_srcs] or f"{current.schema} book"
        ),
        **_user_metadata(user),
    }
    if delay_ns:  # absent at 0: the quotes then sit at the bars' closes and opens, as without the key
        metadata["marketrl.fill_delay"] = f"{fill_delay:g}"
    if current.resorted_note:  # read_bars logged it too; the open/close of same-ns trades may differ
        metadata["marketrl.resorted"] = current.resorted_note
    if context.files:  # the nearest earlier file, as before multi-file context
        metadata["marketrl.prev_source_file"] = context.files[-1]["file"]
        metadata["marketrl.prev_source_sha256"] = context.files[-1]["sha256"]
    warmup_only = None
    if selection.rows == 0:
        warmup_only = (
            f"all {current.bars.height} bars are warm-up (fewer than {MAX_LOOKBACK} earlier bars per "
            f"instrument with {len(context.files)} context file(s)): context for the next file"
        )
        metadata["marketrl.warmup_only"] = warmup_only
        logging.getLogger(__name__).info("%s: no feature rows, %s", src, warmup_only)
    elif selection.dropped:
        logging.getLogger(__name__).info(
            "%s: only warm-up bars, no rows yet: %s", src, ", ".join(selection.dropped)
        )
    with atomic_write(dst) as tmp:
        if selection.rows == 0:
            table = _empty_feature_table(current.has_book, user, with_quotes=quotes is not None).to_arrow()
            pq.write_table(table.replace_schema_metadata(metadata), tmp, compression="zstd")
        else:
            chunks = iter(selection)
            if quotes is not None:
                chunks = (quotes_at_bars(chunk, quotes, current.bar_ns, delay_ns) for chunk in selection)
            written = _write_chunks(chunks, tmp, metadata, src)
            if written != selection.rows:  # inside the block: a wrong file is never renamed into place
                raise RuntimeError(f"{src}: wrote {written} feature rows, counted {selection.rows}")
    return {
        "rows": selection.rows,
        "instruments": selection.instruments,
        "schema": current.schema,
        "dataset": current.dataset,
        "dbn_version": current.dbn_version,
        "sha256": current.sha256,
        "context": context.files,
        "prev_sha256": context.files[-1]["sha256"] if context.files else None,
        "bar_size": bar_size,
        "features": len(feature_names),
        "records": current.records,
        "dropped_undef_ts": current.dropped_undef_ts,
        "dropped_outside_session": current.dropped_outside_session,
        "dropped_in_halt": current.dropped_in_halt,
        "warmup_instruments": selection.dropped,
        "warmup_only": warmup_only,
        "resorted": current.resorted_note,
        "quotes": metadata["marketrl.quotes"],
        "skipped": None,
    }
