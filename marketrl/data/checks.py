"""Sanity checks of a DBN file and its bars, and the errors they raise: the zstd framing (walked without
decompressing), timestamps against the header and the clock, and price jumps between bars. marketrl.data.reader
runs them; every fault is a one-line ``DataFileError`` naming the file.
"""

from __future__ import annotations

import math
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import overload

import databento_dbn
import polars as pl

__all__ = [
    "DEFAULT_MAX_PRICE_JUMP",
    "EARLIEST_PLAUSIBLE",
    "DataConfigError",
    "DataFileError",
    "check_price_jumps",
    "check_timestamps",
    "check_zstd_frames",
]

NS_PER_SECOND = 1_000_000_000
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class DataFileError(ValueError):
    """A market-data file that cannot be turned into bars; the message names the file and the fault."""

    def __init__(self, path: str | Path, fault: str) -> None:
        super().__init__(f"{path}: {fault}")
        self.path = Path(path)
        self.fault = fault


class DataConfigError(DataFileError):
    """A file that the configuration cannot read (e.g. no session calendar for its dataset): never skipped."""


class _FileBytes:
    """Read-only ``bytes``-like view of an open file (``len``, ``[i]``, ``[a:b]``) by positional reads, so that
    the zstd frame walk reads a few bytes per block rather than the whole file."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, key: int) -> int: ...
    @overload
    def __getitem__(self, key: slice) -> bytes: ...
    def __getitem__(self, key: int | slice) -> int | bytes:
        if isinstance(key, slice):
            return os.pread(self._fd, max(0, key.stop - key.start), key.start)
        return os.pread(self._fd, 1, key)[0]


def check_zstd_frames(source: bytes | int, path: Path) -> None:
    """Walk the zstd frame and block headers of ``source`` (the bytes, or an open file descriptor, read a few
    bytes per block) without decompressing, and fail unless the data ends at a frame end.

    databento only *warns* on a truncated stream, and says nothing when the cut lands on a record boundary; the
    block walk catches both in microseconds.
    """
    data = _FileBytes(source) if isinstance(source, int) else source
    pos, end = 0, len(data)
    while pos < end:
        magic = data[pos : pos + 4]
        if len(magic) < 4:
            raise DataFileError(path, "truncated zstd stream (incomplete frame header)")
        magic_int = int.from_bytes(magic, "little")
        if 0x184D2A50 <= magic_int <= 0x184D2A5F:  # skippable frame: 4-byte size, then payload
            if pos + 8 > end:
                raise DataFileError(path, "truncated zstd stream (skippable frame header)")
            pos += 8 + int.from_bytes(data[pos + 4 : pos + 8], "little")
            continue
        if magic != _ZSTD_MAGIC:
            raise DataFileError(path, f"corrupt zstd stream (bad frame magic at byte {pos})")
        if pos + 5 > end:
            raise DataFileError(path, "truncated zstd stream (incomplete frame header)")
        descriptor = data[pos + 4]
        content_size_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
        has_checksum, dict_id_flag = (descriptor >> 2) & 1, descriptor & 3
        header_len = 1 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_id_flag]
        header_len += (1 if single_segment else 0, 2, 4, 8)[content_size_flag]
        pos += 4 + header_len
        while True:
            if pos + 3 > end:
                raise DataFileError(path, "truncated zstd stream (frame ends before its last block)")
            block_header = int.from_bytes(data[pos : pos + 3], "little")
            is_last, block_type, block_size = block_header & 1, (block_header >> 1) & 3, block_header >> 3
            if block_type == 3:
                raise DataFileError(path, f"corrupt zstd stream (reserved block type at byte {pos})")
            pos += 3 + (1 if block_type == 1 else block_size)
            if pos > end:
                raise DataFileError(path, "truncated zstd stream (last block is cut short)")
            if is_last:
                break
        pos += 4 if has_checksum else 0
        if pos > end:
            raise DataFileError(path, "truncated zstd stream (missing frame checksum)")


# Consecutive prices of one instrument more than this factor apart are a scale error (or a corrupt record), not
# a market move: ``data.max_price_jump``.
DEFAULT_MAX_PRICE_JUMP = 10.0


# No electronic market data before this; a timestamp later than now (plus a day of clock slack) cannot be data.
EARLIEST_PLAUSIBLE = datetime(1990, 1, 1, tzinfo=UTC)
_FUTURE_SLACK_NS = 86_400 * NS_PER_SECOND


def _check_plausible_time(ts_ns: int, what: str, path: Path) -> None:
    """A timestamp before ``EARLIEST_PLAUSIBLE`` or after now is a corrupt record or header, or a wrong clock:
    header and records may agree with each other and still be wrong (a whole file stamped 2118)."""
    earliest = int(EARLIEST_PLAUSIBLE.timestamp()) * NS_PER_SECOND
    latest = time.time_ns() + _FUTURE_SLACK_NS
    if not earliest <= ts_ns <= latest:
        when = "before 1990" if ts_ns < earliest else "in the future"
        raise DataFileError(path, f"{what} {_iso(ts_ns)} is {when} (corrupt data or a wrong clock)")


def check_timestamps(
    frame: pl.DataFrame, metadata: databento_dbn.Metadata, path: Path, slack_ns: int
) -> None:
    """Every record's ts_event lies inside the header's [start, end) (bars may open up to ``slack_ns``, one bar,
    before start), and header and records lie between 1990 and now. A corrupt frame or a wrong clock shows up
    here as records far outside the requested range."""
    _check_plausible_time(int(metadata.start), "header start", path)
    if frame.height == 0:
        return
    slack = slack_ns
    start, end = int(metadata.start), metadata.end
    ts = frame["ts_event"].cast(pl.Int64)
    first, last = int(ts.min()), int(ts.max())  # type: ignore[arg-type]
    undefined_end = end is None or int(end) == databento_dbn.UNDEF_TIMESTAMP
    if first < start - slack or (not undefined_end and last >= int(end)):
        bad = first if first < start - slack else last
        raise DataFileError(
            path,
            f"record timestamp {_iso(bad)} outside the header's range [{_iso(start)}, "
            f"{'open' if undefined_end else _iso(int(end))}) (corrupt data or a wrong clock)",
        )
    _check_plausible_time(last, "record timestamp", path)  # inside the header's range, unless it is open


def _iso(ts_ns: int) -> str:
    seconds, ns = divmod(ts_ns, NS_PER_SECOND)
    return f"{datetime.fromtimestamp(seconds, tz=UTC).strftime('%Y-%m-%dT%H:%M:%S')}.{ns:09d}Z"


def check_price_jumps(bars: pl.DataFrame, path: Path, max_jump: float) -> None:
    """Fail when one instrument's price moves by more than a factor ``max_jump`` from one bar to the next
    (open against the previous close) or within one bar (high against low). ``bars`` sorted by instrument."""
    if bars.height == 0 or max_jump <= 0:
        return
    same = pl.col("instrument_id") == pl.col("instrument_id").shift(1)
    step = (pl.col("open") / pl.col("close").shift(1)).log().abs()
    within = (pl.col("high") / pl.col("low")).log().abs()
    limit = math.log(max_jump)
    # Non-positive prices are reported as such by the features stage, not as a jump.
    positive = pl.min_horizontal("open", "high", "low", "close") > 0
    jumped = (same & (pl.col("close").shift(1) > 0) & (step > limit)).fill_null(False)
    bad = (jumped | (within > limit)) & positive
    if not bars.select(bad.any()).item():
        return
    row = bars.with_columns(pl.col("close").shift(1).alias("_prev_close")).filter(bad).row(0, named=True)
    same_bar = row["high"] / row["low"] > max_jump
    seen = f"high {row['high']} vs low {row['low']}" if same_bar else f"{row['_prev_close']} -> {row['open']}"
    raise DataFileError(
        path,
        f"price of {row['symbol']} ({row['instrument_id']}) jumps more than {max_jump:g}x at {row['ts_event']} "
        f"({seen}): a price-scale error or corrupt record (limit: data.max_price_jump)",
    )
