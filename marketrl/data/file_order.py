"""Databento file names and header start times, without databento or polars.

rules/common.smk orders the input files at every DAG parse, so this reads only the first bytes of each file's
header (decompressing a few bytes of a zstd frame) instead of opening it with the databento decoder.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
import struct
import sys
from collections.abc import Iterable
from pathlib import Path

import zstandard

__all__ = [
    "CONTEXT_FILES",
    "DBN_SUFFIX",
    "DBN_SUFFIXES",
    "DEMO_DEFINITIONS_DIR",
    "DEMO_QUOTES_DIR",
    "DbnHeaderError",
    "dbn_stem",
    "demo_definition_name",
    "demo_file_name",
    "demo_quote_file_name",
    "header_span_ns",
    "header_start_ns",
    "time_ordered",
]

log = logging.getLogger(__name__)

DBN_SUFFIXES = (".dbn.zst", ".dbn")
_PREFIX = b"DBN"
# DBN v1-v3 metadata: "DBN", version (u8), length (u32), dataset (16 bytes), schema (u16), start (u64 ns) ...
_START_OFFSET = 3 + 1 + 4 + 16 + 2
_HEADER_BYTES = _START_OFFSET + 16  # start and end (u64 ns each)
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class DbnHeaderError(ValueError):
    """A file's name or header is not that of a Databento DBN file; the message names the file."""


def dbn_stem(path: str | os.PathLike[str]) -> str:
    """A DBN file's name without ``.dbn.zst`` or ``.dbn`` (the features' wildcard)."""
    name = Path(path).name
    for suffix in DBN_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    raise DbnHeaderError(f"{path}: expected a Databento file ending in {' or '.join(DBN_SUFFIXES)}")


@functools.cache
def _span_ns(path: str, _mtime_ns: int, _size: int) -> tuple[int, int]:
    with open(path, "rb") as handle:
        magic = handle.read(4)
        handle.seek(0)
        if magic == _ZSTD_MAGIC:
            with zstandard.ZstdDecompressor().stream_reader(handle) as reader:
                head = reader.read(_HEADER_BYTES)
        else:
            head = handle.read(_HEADER_BYTES)
    if len(head) < _HEADER_BYTES or not head.startswith(_PREFIX):
        raise DbnHeaderError(f"{path}: no complete DBN metadata header (empty, truncated or not a DBN file)")
    start, end = struct.unpack_from("<QQ", head, _START_OFFSET)
    return start, end


def header_span_ns(path: str | os.PathLike[str]) -> tuple[int, int]:
    """The ``start`` and ``end`` of a DBN file's metadata (UTC ns; end exclusive, ``2**64 - 1`` where the file
    does not say), cached per file version (path, mtime, size)."""
    try:
        stat = os.stat(path)
        return _span_ns(os.fspath(path), stat.st_mtime_ns, stat.st_size)
    except (OSError, zstandard.ZstdError) as exc:
        raise DbnHeaderError(f"{path}: cannot read its DBN header: {exc}".splitlines()[0]) from exc


def header_start_ns(path: str | os.PathLike[str]) -> int:
    """The ``start`` of a DBN file's metadata (UTC ns), cached per file version (path, mtime, size)."""
    return header_span_ns(path)[0]


def time_ordered(paths: Iterable[str | os.PathLike[str]], *, skip_unreadable: bool = False) -> list[Path]:
    """``paths`` sorted by their header's start time (then name): the order in which each file's predecessor is
    its features' lookback context, whatever the names say. A name order that disagrees is logged.

    A file whose header cannot be read is a ``DbnHeaderError``; with ``skip_unreadable`` (``data.on_bad_file:
    skip``) it is noted in one line on stderr and put after every readable file (by name), so that it is no
    other file's context, and its features job skips it with the reason in the manifest.
    """
    files = [Path(p) for p in paths]
    starts: dict[Path, int] = {}
    unreadable: list[Path] = []
    for path in files:
        try:
            starts[path] = header_start_ns(path)
        except DbnHeaderError as exc:
            if not skip_unreadable:
                raise
            _note_unreadable(str(exc))
            unreadable.append(path)
    readable = [p for p in files if p in starts]
    ordered = sorted(readable, key=lambda p: (starts[p], p.name))
    by_name = sorted(readable, key=lambda p: p.name)
    ordered_all = ordered + sorted(unreadable, key=lambda p: p.name)
    if ordered != by_name:
        first = next(i for i, (a, b) in enumerate(zip(ordered, by_name, strict=True)) if a != b)
        log.warning(
            "input files: name order disagrees with the data's time order (first at %s); using the time order",
            ordered[first],
        )
    return ordered_all


@functools.cache
def _note_unreadable(message: str) -> None:
    """Once per process (the workflow re-reads the file list at every DAG parse)."""
    print(f"marketrl: skipping input file (data.on_bad_file: skip): {message}", file=sys.stderr)


# Demo file names follow Databento batch downloads, so the demo and a real download look alike.
DBN_SUFFIX = ".dbn.zst"
DEMO_DEFINITIONS_DIR = "definitions"  # the demo's definition file: its own folder, a separate download
DEMO_QUOTES_DIR = (
    "bbo-1m"  # the demo's quote files: a bbo-1m download of the same days, in its own folder too
)


def demo_file_name(day: dt.date) -> str:
    """A demo file's name, one per UTC day, as in a Databento batch download: glbx-mdp3-20240212.ohlcv-1m.dbn.zst."""
    return f"glbx-mdp3-{day:%Y%m%d}.ohlcv-1m{DBN_SUFFIX}"


def demo_quote_file_name(day: dt.date) -> str:
    """The demo's bbo-1m file of a UTC day (in ``DEMO_QUOTES_DIR``): glbx-mdp3-20240212.bbo-1m.dbn.zst."""
    return f"glbx-mdp3-{day:%Y%m%d}.bbo-1m{DBN_SUFFIX}"


def demo_definition_name(first: dt.date, last: dt.date) -> str:
    """The demo's definition file, named like a Databento batch download of [first, last]."""
    return f"glbx-mdp3-{first:%Y%m%d}-{last:%Y%m%d}.definition{DBN_SUFFIX}"


# Files before each input file that its features job may decode as lookback context. One is not enough: a
# Sunday UTC-day file of CME data holds only the 17:00 CT open hour (60 one-minute bars in winter, fewer than
# MAX_LOOKBACK), so Monday needs Friday behind it; a third covers one more short or empty file (a holiday) in
# between. The job decodes them newest first and stops once the lookbacks are covered, so the extra inputs
# cost a DAG edge each, not a decode.
CONTEXT_FILES = 3
