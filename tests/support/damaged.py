"""Damaged copies of real Databento files: the same header and records, with the mappings, prices, order or times
changed, re-encoded as DBN (zstd) so that the reader meets them exactly as it would a damaged download."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from pathlib import Path

import databento
import databento_dbn as dbn
import numpy as np
import zstandard

from marketrl.data.dbn_writer import MappingInterval, SymbolMapping, write_dbn

__all__ = ["NS_PER_DAY", "damaged_copy"]

NS_PER_DAY = 86_400 * 1_000_000_000


def damaged_copy(
    src: Path,
    dst: Path,
    *,
    records: Callable[[np.ndarray], np.ndarray] | None = None,
    mappings: dict[str, str] | None = None,
    ids: dict[str, str] | None = None,
    shift_days: int = 0,
) -> Path:
    """Write ``src`` to ``dst`` with its records passed through ``records`` (a copy: edit freely), its raw symbols
    renamed by ``mappings`` (old -> new), the instrument ids they map to by ``ids`` (old -> new), and every
    timestamp (header, mappings, ts_event, ts_recv) moved by ``shift_days`` days. The header keeps the file's
    own DBN version."""
    store = databento.DBNStore.from_file(src)
    meta, data = store.metadata, store.to_ndarray().copy()
    if records is not None:
        data = records(data)
    shift = shift_days * NS_PER_DAY
    for column in ("ts_event", "ts_recv"):
        if column in (data.dtype.names or ()):
            data[column] += np.uint64(shift)
    shift_date = dt.timedelta(days=shift_days)
    renamed = {(mappings or {}).get(raw, raw): intervals for raw, intervals in (meta.mappings or {}).items()}
    moved = [
        SymbolMapping(
            raw,
            [
                MappingInterval(
                    i["start_date"] + shift_date,
                    i["end_date"] + shift_date,
                    (ids or {}).get(i["symbol"], i["symbol"]),
                )
                for i in intervals
            ],
        )
        for raw, intervals in renamed.items()
    ]
    header = dbn.Metadata(
        dataset=meta.dataset,
        start=meta.start + shift,
        end=meta.end + shift,
        stype_in=dbn.SType(meta.stype_in),
        stype_out=dbn.SType(meta.stype_out),
        schema=dbn.Schema.from_str(str(meta.schema)),
        symbols=list(renamed),
        mappings=moved,
        version=meta.version,
    )
    payload = bytes(header) + data.tobytes()
    return write_dbn(dst, zstandard.ZstdCompressor(level=3, write_checksum=True).compress(payload))
