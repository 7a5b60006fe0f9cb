"""Decode one Databento ``.dbn.zst`` file into time bars (polars), with every fault a one-line error.

Decoding uses databento's own reader (``DBNStore.from_bytes(...).to_ndarray()``): the records land in one numpy
structured array that polars wraps column by column: 0.1 s vs 4 s for ``to_df()`` on 1M ohlcv-1m records
(see bench/speed/features.py). Record layouts of the schemas read here (OHLCV, trades, tbbo, mbp-1, mbp-10, mbo) are
identical in DBN versions 1, 2 and 3, and ``to_ndarray`` reads each file with its own version's layout (it does
not upgrade), so all three versions decode the same way.

Conventions (also in docs/FEATURES.md):

- prices are fixed-point ×1e-9 → Float64; ``UNDEF_PRICE`` becomes null, and trades/bars with a null price are
  left out (a bar needs all four prices);
- records with ``ts_event == UNDEF_TIMESTAMP`` cannot be placed in time: they are dropped and counted
  (``BarFile.dropped_undef_ts``, logged as a warning);
- ``ts_event`` is UTC nanoseconds; a bar's ``ts_event`` is its open time;
- ``symbol`` comes from the file's own symbology mappings (by UTC date interval); where an instrument has no
  mapping for a date (e.g. files requested by instrument_id) the symbol is ``str(instrument_id)``;
- bars with no trades are absent, as in Databento's own OHLCV schemas; a file with records but no trade yields
  zero bars (not an error here: it is still valid context for the next day).
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import databento_dbn
import numpy as np
import polars as pl

from marketrl.calendars.sessions import SessionCalendar, SessionConfigError, calendar_for, session_frame
from marketrl.data.checks import (
    DEFAULT_MAX_PRICE_JUMP,
    DataConfigError,
    DataFileError,
    check_price_jumps,
    check_timestamps,
    check_zstd_frames,
)
from marketrl.data.file_order import DBN_SUFFIXES, dbn_stem, time_ordered

if TYPE_CHECKING:
    import databento

__all__ = [
    "BOOK_COLUMNS",
    "DBN_SUFFIXES",
    "DEFAULT_MAX_PRICE_JUMP",
    "OHLCV_SCHEMAS",
    "QUOTE_FILE_SCHEMAS",
    "QUOTE_SCHEMAS",
    "SUPPORTED_SCHEMAS",
    "TRADE_SCHEMAS",
    "BarFile",
    "DataConfigError",
    "DataFileError",
    "Resorted",
    "check_price_jumps",
    "chunked_like",
    "dbn_stem",
    "parse_bar_size",
    "read_bars",
    "resorted_note",
    "time_ordered",
]

log = logging.getLogger(__name__)

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
PRICE_DIVISOR = 1e9  # dividing (not ×1e-9) yields the double nearest the exact decimal price

OHLCV_SCHEMAS: dict[str, int] = {
    "ohlcv-1s": NS_PER_SECOND,
    "ohlcv-1m": 60 * NS_PER_SECOND,
    "ohlcv-1h": 3600 * NS_PER_SECOND,
    "ohlcv-1d": NS_PER_DAY,
}
# Schemas aggregated to bars from their trade records; the quote ones also carry the top of book.
QUOTE_SCHEMAS = ("tbbo", "mbp-1", "mbp-10")
TRADE_SCHEMAS = ("trades", "mbo", *QUOTE_SCHEMAS)
SUPPORTED_SCHEMAS = (*OHLCV_SCHEMAS, *TRADE_SCHEMAS)
# Schemas of the quote files (`data.quotes`) joined to bars of the same days (marketrl.data.quotes); alone a
# bbo-* file cannot make OHLCV bars, so it is no bar file.
QUOTE_FILE_SCHEMAS = ("bbo-1s", "bbo-1m", "mbp-1")

# rtype values each schema's records may carry (17 is the pre-2023 generic OHLCV rtype).
_OHLCV_DEPRECATED_RTYPE = 0x11
_ALLOWED_RTYPES: dict[str, frozenset[int]] = {
    name: frozenset({int(databento_dbn.RType.from_schema(databento_dbn.Schema.from_str(name)).value)})
    for name in (*SUPPORTED_SCHEMAS, *QUOTE_FILE_SCHEMAS)
}
for _name in OHLCV_SCHEMAS:
    _ALLOWED_RTYPES[_name] = _ALLOWED_RTYPES[_name] | {_OHLCV_DEPRECATED_RTYPE}

BOOK_COLUMNS = ("bid_px", "ask_px", "bid_sz", "ask_sz")
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_DBN_MAGIC = b"DBN"
_TRADE_ACTION = b"T"
_BAR_SIZE_RE = re.compile(r"^([1-9][0-9]*)(s|m|h|d)$")
_UNIT_NS = {"s": NS_PER_SECOND, "m": 60 * NS_PER_SECOND, "h": 3600 * NS_PER_SECOND, "d": NS_PER_DAY}


# Tie-breakers after ts_event, where the schema has them: the order in which the venue sent the records. They let
# a re-sort restore the order of same-nanosecond trades (which set a bar's open and close); _ByInstrument.take
# drops them.
ORDER_KEYS = ("ts_recv", "sequence")


@dataclass(frozen=True)
class Resorted:
    """One instrument's records that came out of time order and were re-sorted."""

    instrument_id: int
    first_ts: Any  # the first ts_event earlier than the record before it
    steps_back: int  # records earlier than the record before them
    records: int  # the instrument's records (trades, or bars)


@dataclass(frozen=True)
class BarFile:
    """Time bars decoded from one file, sorted by (instrument_id, ts_event)."""

    path: Path
    bars: pl.DataFrame
    schema: str
    dataset: str
    dbn_version: int
    sha256: str
    bar_ns: int
    records: int
    dropped_undef_ts: int
    dropped_outside_session: int = (
        0  # in the halt, or on a weekend/holiday trading day (marketrl.calendars.sessions)
    )
    dropped_in_halt: int = 0  # of those, the bars inside the daily halt
    calendar: SessionCalendar | None = None
    resorted: tuple[Resorted, ...] = ()  # instruments whose records came out of time order (tick schemas)

    @property
    def resorted_note(self) -> str | None:
        """What was re-sorted (the feature table's metadata says so), None when the file was in order."""
        return resorted_note(self.resorted)

    @property
    def has_book(self) -> bool:
        """True when the bars carry top-of-book columns (quote schemas)."""
        return self.schema in QUOTE_SCHEMAS


def resorted_note(resorted: Sequence[Resorted]) -> str | None:
    """One line saying which instruments' records were re-sorted and by what, None for none."""
    if not resorted:
        return None
    keys = ", ".join(("ts_event", *ORDER_KEYS))
    return "; ".join(
        f"{r.steps_back} of {r.records} records of instrument {r.instrument_id} out of time order "
        f"(first at {r.first_ts}), re-sorted by {keys} where the schema has them "
        "(records equal on all keys keep the file's order)"
        for r in resorted
    )


def parse_bar_size(bar_size: str) -> int:
    """Bar size such as ``"1s"``, ``"5m"``, ``"1h"``, ``"1d"`` → nanoseconds; it must divide one day."""
    match = _BAR_SIZE_RE.match(bar_size) if isinstance(bar_size, str) else None
    if match is None:
        raise ValueError(f"bar_size: expected e.g. '1s', '5m', '1h' or '1d', got {bar_size!r}")
    ns = int(match.group(1)) * _UNIT_NS[match.group(2)]
    if NS_PER_DAY % ns != 0:
        # Bars must align with UTC midnight so that day files never split a bar.
        raise ValueError(f"bar_size: {bar_size!r} does not divide one day evenly")
    return ns


# Records decoded at a time (7 MB of ohlcv records, 47 MB of mbp-10): read_bars keeps only the columns it needs
# from each chunk, so the raw records of a whole file never sit in memory at once.
DECODE_CHUNK_RECORDS = 1 << 17


@dataclass(frozen=True)
class _OpenedFile:
    """A DBN file whose bytes, zstd framing and header have been checked; its records are not decoded yet."""

    path: Path
    store: databento.DBNStore
    metadata: databento_dbn.Metadata
    schema: str
    sha256: str


def _open_dbn(path: Path, schemas: Sequence[str] = SUPPORTED_SCHEMAS) -> _OpenedFile:
    """Check the file's bytes, zstd framing and header (its schema one of ``schemas``), and hash it, without
    holding the file in memory.

    The frame walk reads only the block headers and the hash streams the file; decoding then streams it again
    (from the OS page cache).
    """
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
            if not head:
                raise DataFileError(path, "empty file (0 bytes)")
            if head == _ZSTD_MAGIC:
                check_zstd_frames(handle.fileno(), path)
            elif head[:3] != _DBN_MAGIC:
                raise DataFileError(path, "not a DBN file (neither zstd- nor DBN-magic at the start)")
            handle.seek(0)
            sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
    except OSError as exc:
        raise DataFileError(path, f"cannot read file ({exc.strerror or exc})") from exc
    # Imported here, not at module level: databento pulls in pandas (~0.4 s), which the training and
    # evaluation jobs, importing this module only for its constants, never need.
    import databento
    from databento.common.error import BentoWarning

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BentoWarning)
            store = databento.DBNStore.from_file(path)
            metadata, schema = store.metadata, store.schema
    except BentoWarning as exc:
        raise DataFileError(path, f"truncated DBN data ({exc})") from exc
    except Exception as exc:  # databento/zstd raise many types for garbage input; one message for all
        raise DataFileError(path, _decode_fault(exc)) from exc
    if schema is None:
        raise DataFileError(path, "mixed-schema file (metadata schema is None, e.g. a live stream)")
    if str(schema) not in schemas:
        raise DataFileError(path, f"unsupported schema {str(schema)!r} (supported: {', '.join(schemas)})")
    return _OpenedFile(path=path, store=store, metadata=metadata, schema=str(schema), sha256=sha256)


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _decode_fault(exc: Exception) -> str:
    """What a decoding failure means: zstd's own corruption and checksum errors are named as such."""
    reason = _first_line(exc)
    if "checksum" in reason.lower():
        return f"corrupt zstd data: frame content checksum mismatch ({reason})"
    if "zstd" in reason.lower() or "corruption" in reason.lower():
        return f"corrupt zstd data ({reason})"
    return f"not a valid DBN stream ({reason})"


def _record_chunks(opened: _OpenedFile) -> Iterator[np.ndarray]:
    """The file's records, ``DECODE_CHUNK_RECORDS`` at a time, each chunk checked against the header's schema."""
    from databento.common.error import BentoWarning  # see _open_dbn: loaded only when decoding

    path = opened.path
    chunks = opened.store.to_ndarray(count=DECODE_CHUNK_RECORDS)
    while True:
        try:
            # Only around the decoding step itself: the warnings filter is process-wide state.
            with warnings.catch_warnings():
                # databento signals a trailing partial record only with a warning: make it an error here.
                warnings.simplefilter("error", BentoWarning)
                chunk = next(chunks)
        except StopIteration:
            return
        except BentoWarning as exc:
            raise DataFileError(path, f"truncated DBN data ({exc})") from exc
        except Exception as exc:  # databento/zstd raise many types for garbage input; one message for all
            raise DataFileError(path, _decode_fault(exc)) from exc
        _check_record_types(chunk, opened.schema, path)
        yield chunk


def _check_record_types(records: np.ndarray, schema: str, path: Path) -> None:
    """Every record's rtype and length must match the header's schema (a mislabelled file decodes as garbage)."""
    expected_length = records.dtype.itemsize // 4
    lengths = records["length"]
    if (lengths != expected_length).any():
        bad = int(lengths[lengths != expected_length][0]) * 4
        raise DataFileError(
            path,
            f"header schema {schema!r} has {records.dtype.itemsize}-byte records, found a {bad}-byte record",
        )
    rtypes = np.unique(records["rtype"])
    unexpected = sorted(set(rtypes.tolist()) - _ALLOWED_RTYPES[schema])
    if unexpected:
        raise DataFileError(
            path, f"header schema {schema!r} does not match record type(s) rtype={unexpected}"
        )


def _prices(values: np.ndarray) -> pl.Series:
    """Fixed-point int64 prices → Float64, UNDEF_PRICE → null."""
    # Converted by polars rather than numpy so that the columns live in polars' allocator, whose freed memory
    # the later sort re-uses (freed numpy buffers stay in the process and only add to the peak).
    series = pl.Series(values)
    if not (values == databento_dbn.UNDEF_PRICE).any():
        return series / PRICE_DIVISOR
    return pl.select(
        pl.when(series == databento_dbn.UNDEF_PRICE).then(None).otherwise(series / PRICE_DIVISOR)
    ).to_series()


def _defined_ts(records: np.ndarray) -> np.ndarray:
    """The records with a defined ts_event."""
    defined = records["ts_event"] != databento_dbn.UNDEF_TIMESTAMP
    return records if defined.all() else records[defined]


def _ts_column(values: np.ndarray) -> pl.Series:
    return pl.Series("ts_event", values.view(np.int64)).cast(pl.Datetime("ns", "UTC"))


def _ohlcv_frame(records: np.ndarray) -> pl.DataFrame:
    return pl.DataFrame(
        [
            _ts_column(records["ts_event"]),
            pl.Series("instrument_id", records["instrument_id"]),
            _prices(records["open"]).alias("open"),
            _prices(records["high"]).alias("high"),
            _prices(records["low"]).alias("low"),
            _prices(records["close"]).alias("close"),
            pl.Series("volume", records["volume"]).cast(pl.Float64),
        ]
    )


def _order_keys(records: np.ndarray) -> list[pl.Series]:
    """The ``ORDER_KEYS`` columns that ``records`` has."""
    names = records.dtype.names or ()
    return [pl.Series(f"_{key}", records[key]) for key in ORDER_KEYS if key in names]


def _trade_frame(records: np.ndarray) -> pl.DataFrame:
    trades = records[records["action"] == _TRADE_ACTION]
    return pl.DataFrame(
        [
            _ts_column(trades["ts_event"]),
            pl.Series("instrument_id", trades["instrument_id"]),
            _prices(trades["price"]).alias("price"),
            pl.Series("size", trades["size"]),
            *_order_keys(trades),
        ]
    )


def _book_frame(records: np.ndarray) -> pl.DataFrame:
    """Top of book after every record (trade or not)."""
    return pl.DataFrame(
        [
            _ts_column(records["ts_event"]),
            pl.Series("instrument_id", records["instrument_id"]),
            _prices(records["bid_px_00"]).alias("bid_px"),
            _prices(records["ask_px_00"]).alias("ask_px"),
            pl.Series("bid_sz", records["bid_sz_00"]).cast(pl.Float64),
            pl.Series("ask_sz", records["ask_sz_00"]).cast(pl.Float64),
            *_order_keys(records),
        ]
    )


class _ByInstrument:
    """Rows gathered chunk by chunk into per-instrument pieces, handed out sorted by (instrument_id, ts_event).

    Splitting each decoded chunk by instrument as it arrives replaces a sort of the whole table, which would
    hold two copies of it at once. Databento files are time-ordered, so the pieces of one instrument are
    already in time order; any that are not are sorted by ts_event, then by the ``ORDER_KEYS`` columns where
    present (ties after those keep file order), and listed in ``resorted``.
    """

    def __init__(self) -> None:
        self._pieces: dict[int, list[pl.DataFrame]] = {}
        self._empty: pl.DataFrame | None = None
        self.resorted: list[Resorted] = []

    def add(self, frame: pl.DataFrame) -> None:
        if self._empty is None:
            self._empty = frame.clear()
        for (instrument_id,), piece in frame.partition_by(
            "instrument_id", maintain_order=True, as_dict=True
        ).items():
            self._pieces.setdefault(instrument_id, []).append(piece)

    def take(self) -> pl.DataFrame:
        """All rows, sorted; the pieces are released as they are used.

        The columns stay in pieces (chunks): later steps read them chunk by chunk, and copying them into one
        chunk each would need a second copy of the table at once.
        """
        instruments = []
        for instrument_id in sorted(self._pieces):
            rows = pl.concat(self._pieces.pop(instrument_id), how="vertical", rechunk=False)
            keys = ["ts_event", *(name for name in rows.columns if name.startswith("_"))]
            if not rows["ts_event"].is_sorted():
                backwards = rows["ts_event"] < rows["ts_event"].shift(1)
                self.resorted.append(
                    Resorted(
                        instrument_id,
                        rows["ts_event"].filter(backwards)[0],
                        int(backwards.sum()),
                        rows.height,
                    )
                )
                rows = rows.sort(keys, maintain_order=True)
            instruments.append(rows.drop(keys[1:]))
        if not instruments:
            assert self._empty is not None, "take() before any add()"
            return self._empty.drop(name for name in self._empty.columns if name.startswith("_"))
        return pl.concat(instruments, how="vertical", rechunk=False)


def _aggregate_to_bars(frame: pl.DataFrame, bar_ns: int, *, from_trades: bool) -> pl.DataFrame:
    """Group rows (trades, or finer bars) into bars of ``bar_ns`` per instrument; rows must be time-ordered."""
    bar_start = (pl.col("ts_event").cast(pl.Int64) // bar_ns * bar_ns).cast(pl.Datetime("ns", "UTC"))
    if from_trades:
        aggs = [
            pl.col("price").first().alias("open"),
            pl.col("price").max().alias("high"),
            pl.col("price").min().alias("low"),
            pl.col("price").last().alias("close"),
            pl.col("size").sum().cast(pl.Float64).alias("volume"),
        ]
    else:
        aggs = [
            pl.col("open").first(),
            pl.col("high").max(),
            pl.col("low").min(),
            pl.col("close").last(),
            pl.col("volume").sum(),
        ]
    return frame.with_columns(bar_start).group_by("instrument_id", "ts_event", maintain_order=True).agg(aggs)


def _check_ohlcv_bar_size(schema: str, bar_ns: int, path: Path) -> None:
    native_ns = OHLCV_SCHEMAS[schema]
    if bar_ns < native_ns or bar_ns % native_ns != 0:
        raise DataFileError(
            path,
            f"bar_size of {bar_ns // NS_PER_SECOND}s cannot be built from {schema} bars (needs a multiple)",
        )


def _bars_from_ohlcv(frame: pl.DataFrame, schema: str, bar_ns: int) -> pl.DataFrame:
    """OHLCV rows sorted by (instrument_id, ts_event) → bars of ``bar_ns``."""
    prices = ["open", "high", "low", "close"]
    if frame.select(pl.any_horizontal(pl.col(prices).is_null().any())).item():
        frame = frame.drop_nulls(prices)
    # Sorted, so a repeated (instrument, bar) shows up as equal neighbours.
    duplicated = frame.select(
        (
            (pl.col("instrument_id") == pl.col("instrument_id").shift(1))
            & (pl.col("ts_event") == pl.col("ts_event").shift(1))
        ).any()
    ).item()
    if bar_ns == OHLCV_SCHEMAS[schema] and not duplicated:
        return frame
    # Coarser bars, or the same bar from several publishers: merge.
    return _aggregate_to_bars(frame, bar_ns, from_trades=False)


def _bars_from_trades(trades: pl.DataFrame, book: pl.DataFrame | None, bar_ns: int) -> pl.DataFrame:
    """Trades (and book states) sorted by (instrument_id, ts_event) → bars of ``bar_ns``."""
    bars = _aggregate_to_bars(trades.drop_nulls("price"), bar_ns, from_trades=True)
    if book is None:
        return bars
    # Top of book at each bar's close: the last book state of any record (trade or not) inside the bar.
    closing_book = (
        book.with_columns(
            (pl.col("ts_event").cast(pl.Int64) // bar_ns * bar_ns).cast(pl.Datetime("ns", "UTC"))
        )
        .group_by("instrument_id", "ts_event", maintain_order=True)
        .agg(pl.col(*BOOK_COLUMNS).last())
    )
    return bars.join(closing_book, on=["instrument_id", "ts_event"], how="left", maintain_order="left")


def _symbol_map(metadata: databento_dbn.Metadata) -> pl.DataFrame:
    """(instrument_id, start_date, end_date, symbol) rows from the header's mappings; end_date is exclusive."""
    rows: dict[str, list] = {"instrument_id": [], "start_date": [], "end_date": [], "symbol": []}
    for raw_symbol, intervals in sorted((metadata.mappings or {}).items()):
        for interval in intervals:
            try:
                instrument_id = int(interval["symbol"])
            except (TypeError, ValueError):
                continue  # stype_out is not instrument_id: nothing to key on
            rows["instrument_id"].append(instrument_id)
            rows["start_date"].append(interval["start_date"])
            rows["end_date"].append(interval["end_date"])
            rows["symbol"].append(raw_symbol)
    return pl.DataFrame(
        rows,
        schema={"instrument_id": pl.UInt32, "start_date": pl.Date, "end_date": pl.Date, "symbol": pl.String},
    )


def chunked_like(series: pl.Series, like: pl.Series) -> pl.Series:
    """``series`` cut (without copying) into the chunks of ``like``.

    Bars are kept in the pieces they were decoded in; a frame whose columns are chunked differently gets all
    its columns copied into single chunks by the next frame operation, which would double its memory.
    """
    lengths = like.chunk_lengths()
    if len(lengths) <= 1:
        return series
    offsets = [0, *itertools.accumulate(lengths)]
    return pl.concat([series.slice(offsets[i], n) for i, n in enumerate(lengths)], rechunk=False)


def _attach_symbols(bars: pl.DataFrame, metadata: databento_dbn.Metadata) -> pl.DataFrame:
    """Add ``symbol`` by (instrument_id, UTC date) interval lookup (Databento's mappings are by UTC date);
    unmapped → str(id).

    ``bars`` are sorted by (instrument_id, ts_event), so each (instrument, UTC day) is one run of rows: the
    lookup runs once per run and its result is spread over the run's rows.
    """
    # Date is days since the epoch: integer division of the UTC nanoseconds is that, without calendar work.
    utc_day = (pl.col("ts_event").cast(pl.Int64) // NS_PER_DAY).cast(pl.Int32).cast(pl.Date)
    new_run = bars.select(
        (
            (pl.col("instrument_id") != pl.col("instrument_id").shift(1)) | (utc_day != utc_day.shift(1))
        ).fill_null(True)
    ).to_series()
    runs = bars.select("instrument_id", utc_day.alias("utc_day")).filter(new_run)
    mapping = _symbol_map(metadata)
    resolved = (
        runs.join(mapping, on="instrument_id", how="left")
        .filter(pl.col("symbol").is_null() | pl.col("utc_day").is_between("start_date", "end_date", "left"))
        .sort("instrument_id", "utc_day", "symbol", nulls_last=True)
        .unique(["instrument_id", "utc_day"], keep="first")
        .select("instrument_id", "utc_day", "symbol")
    )
    run_symbols = (
        runs.join(resolved, on=["instrument_id", "utc_day"], how="left", maintain_order="left")
        .select(pl.col("symbol").fill_null(pl.col("instrument_id").cast(pl.String)))
        .to_series()
    )
    run_of_row = new_run.cast(pl.UInt32).cum_sum() - 1
    return bars.hstack([chunked_like(run_symbols.gather(run_of_row).alias("symbol"), bars["ts_event"])])


def _collect_rows(opened: _OpenedFile) -> tuple[_ByInstrument, _ByInstrument, int, int]:
    """Decode chunk by chunk, keeping per chunk only what bars need: OHLCV rows or trades, and book states
    (quote schemas). Returns those, the record count and the count of records with an undefined ts_event."""
    is_ohlcv, has_book = opened.schema in OHLCV_SCHEMAS, opened.schema in QUOTE_SCHEMAS
    main, book = _ByInstrument(), _ByInstrument()
    records = dropped = 0
    for chunk in _record_chunks(opened):
        records += len(chunk)
        defined = _defined_ts(chunk)
        dropped += len(chunk) - len(defined)
        main.add(_ohlcv_frame(defined) if is_ohlcv else _trade_frame(defined))
        if has_book:
            book.add(_book_frame(defined))
    return main, book, records, dropped


def _check_instrument_order(main: _ByInstrument, path: Path) -> None:
    """OHLCV records of one instrument must come in time order (tick records are ordered by ts_recv, so their
    ts_event may step back a little: those are sorted, not rejected). Call after ``main.take()``."""
    if main.resorted:
        instrument_id, ts = main.resorted[0].instrument_id, main.resorted[0].first_ts
        raise DataFileError(path, f"bars of instrument {instrument_id} out of time order at {ts}")


def read_bars(
    path: str | Path,
    bar_size: str = "1m",
    *,
    session: SessionCalendar | Mapping[str, Any] | None = None,
    max_price_jump: float = DEFAULT_MAX_PRICE_JUMP,
) -> BarFile:
    """Decode one DBN file (``.dbn.zst`` or uncompressed ``.dbn``) into time bars of ``bar_size``.

    Columns: ``ts_event`` (Datetime ns UTC, bar open), ``trading_day`` (the exchange session date, from
    ``session`` or the dataset's default calendar, marketrl.calendars.sessions), ``instrument_id`` (UInt32), ``symbol``,
    ``open``/``high``/``low``/``close``/``volume`` (Float64), plus ``bid_px``/``ask_px``/``bid_sz``/``ask_sz``
    (last top of book in the bar, may be null) for quote schemas. Sorted by (instrument_id, ts_event). Bars
    outside every session (the daily halt, weekend days, holidays without a session) are dropped and counted
    (``dropped_outside_session``; ``dropped_in_halt`` of them in the halt).
    The records are decoded in chunks, each reduced to the columns the bars need before the next is decoded.

    Sanity checks, each a ``DataFileError``: timestamps inside the header's range, OHLCV bars in time order per
    instrument, no price jump larger than ``max_price_jump`` (0 disables it) between consecutive bars.
    """
    try:
        bar_ns = parse_bar_size(bar_size)
    except ValueError as exc:
        raise DataFileError(path, str(exc)) from exc
    opened = _open_dbn(Path(path))
    schema, is_ohlcv, has_book = opened.schema, opened.schema in OHLCV_SCHEMAS, opened.schema in QUOTE_SCHEMAS
    path, metadata, sha256 = opened.path, opened.metadata, opened.sha256
    main, book, records, dropped = _collect_rows(opened)
    if records == 0:
        raise DataFileError(path, f"no records (header-only {schema} file)")
    if dropped:
        log.warning("%s: dropped %d record(s) with undefined ts_event", path, dropped)
    if records == dropped:
        raise DataFileError(path, f"no records with a defined ts_event ({dropped} undefined)")
    try:
        calendar = calendar_for(str(metadata.dataset), session)
    except SessionConfigError as exc:
        raise DataConfigError(path, str(exc)) from exc
    rows = main.take()
    resorted = tuple(main.resorted)
    check_timestamps(rows, metadata, path, OHLCV_SCHEMAS.get(schema, 0))
    del opened  # nothing of the file is needed any more
    if is_ohlcv:  # after decoding, so that a broken file is reported as such whatever the bar size
        _check_instrument_order(main, path)
        _check_ohlcv_bar_size(schema, bar_ns, path)
        bars = _bars_from_ohlcv(rows, schema, bar_ns)
    else:
        bars = _bars_from_trades(rows, book.take() if has_book else None, bar_ns)
        if resorted:  # changes the bars' open/close where same-ns trades cannot be told apart: never silent
            log.warning("%s: %s", path, resorted_note(resorted))
    del rows
    bars = _attach_symbols(bars, metadata)
    check_price_jumps(bars, path, max_price_jump)
    bars, outside, in_halt = session_frame(bars, calendar, daily_bars=bar_ns == NS_PER_DAY)
    if outside:
        log.info(
            "%s: dropped %d bar(s) outside the %s session (%d in the daily halt)",
            path,
            outside,
            calendar.timezone,
            in_halt,
        )
    columns = ["ts_event", "trading_day", "instrument_id", "symbol", "open", "high", "low", "close", "volume"]
    if has_book:
        columns += list(BOOK_COLUMNS)
    return BarFile(
        path=path,
        # From the columns, not with select(), which would first copy every column into one chunk.
        bars=pl.DataFrame([bars[name] for name in columns]),
        schema=schema,
        dataset=str(metadata.dataset),
        dbn_version=int(metadata.version),
        sha256=sha256,
        bar_ns=bar_ns,
        records=records,
        dropped_undef_ts=dropped,
        dropped_outside_session=outside,
        dropped_in_halt=in_halt,
        calendar=calendar,
        resorted=resorted,
    )
