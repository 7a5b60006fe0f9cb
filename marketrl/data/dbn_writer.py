"""Write Databento DBN files: a ``databento_dbn.Metadata`` header and records, zstd-compressed, atomically.

Records are ``databento_dbn`` messages (``OHLCVMsg``, ``TradeMsg``, ...) serialized with ``bytes()``, so the
files are what Databento's own encoder writes. The demo data generator (marketrl/data/demo.py) writes its day
files with this; the tests' synthetic files (tests/support/synthetic.py) and bench/speed/features.py use it too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import databento_dbn as dbn
import zstandard

from marketrl.runtime.io import atomic_write

__all__ = ["PRICE_SCALE", "PUBLISHER_ID", "MappingInterval", "SymbolMapping", "encode_dbn", "write_dbn"]

PUBLISHER_ID = 1  # GLBX.MDP3
PRICE_SCALE = 1_000_000_000  # DBN fixed-point prices: integer units of 1e-9


@dataclass(frozen=True)
class MappingInterval:
    """One (start_date, end_date) → instrument_id interval of a symbology mapping (end exclusive)."""

    start_date: dt.date
    end_date: dt.date
    symbol: str


@dataclass(frozen=True)
class SymbolMapping:
    """A raw symbol and its intervals, in the shape ``databento_dbn.Metadata(mappings=...)`` accepts."""

    raw_symbol: str
    intervals: list[MappingInterval] = field(default_factory=list)


def _utc_date(ts_ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(ts_ns / 1e9, tz=dt.UTC).date()


def encode_dbn(
    messages: Iterable[object],
    *,
    schema: str,
    start_ns: int,
    end_ns: int,
    symbols: dict[str, int] | None = None,
    mappings: Sequence[SymbolMapping] | None = None,
    dataset: str = "GLBX.MDP3",
    compress: bool = True,
    stype_in: str = "raw_symbol",
) -> bytes:
    """Header + records as DBN bytes (zstd-compressed unless ``compress=False``).

    ``symbols`` maps raw symbol → instrument_id for the whole [start, end] date range; pass ``mappings`` for
    anything finer (e.g. an instrument_id that changes symbol between days); ``stype_in`` is the symbology of
    the mappings' raw symbols ("continuous" for ES.c.0-style symbols).
    """
    if mappings is None:
        first, last = _utc_date(start_ns), _utc_date(end_ns) + dt.timedelta(days=1)
        mappings = [
            SymbolMapping(raw, [MappingInterval(first, last, str(iid))])
            for raw, iid in (symbols or {}).items()
        ]
    metadata = dbn.Metadata(
        dataset=dataset,
        start=start_ns,
        end=end_ns,
        stype_in=dbn.SType(stype_in),
        stype_out=dbn.SType.INSTRUMENT_ID,
        schema=dbn.Schema.from_str(schema),
        symbols=[m.raw_symbol for m in mappings],
        mappings=list(mappings),
    )
    payload = bytes(metadata) + b"".join(bytes(m) for m in messages)
    # With a content checksum, as Databento writes its files: zstd then rejects corrupted bytes while decoding.
    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(payload) if compress else payload


def write_dbn(path: str | Path, data: bytes) -> Path:
    """Atomically write encoded DBN bytes to ``path``."""
    with atomic_write(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)
