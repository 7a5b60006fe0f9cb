"""Quotes for the fills: the top of book as of each bar's open and close, from a quote file of the same days
(``data.quotes``: ``bbo-1s``, ``bbo-1m`` or ``mbp-1``) or from the bars of a quote schema themselves.

A quote is stamped with the time it was known: ``ts_recv`` (a bbo-1s/1m record's ``ts_recv`` is the end of its
interval, the instant its book is sampled; an mbp-1 record's is when the book change arrived). The join is as of
each bar's close (``ts_event + bar``) and open (``ts_event``), per instrument (contract), backward, never later
than that instant and never older than ``QUOTE_MAX_AGE`` (a quote from before the daily halt is no quote).
Where a bar has none, its columns are null and the env falls back to the configured half-spread (docs/ENV.md).

Sanity checks, each a one-line ``DataFileError`` naming the quote file: its schema, its records inside its
header's range, at most ``MAX_BAD_QUOTE_SHARE`` of its quotes crossed or zero, each instrument id mapped to the
symbol root the bars give it, and quotes of every instrument of the bars inside their span.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import databento_dbn
import polars as pl

from marketrl.data.checks import DataFileError, check_timestamps
from marketrl.data.file_order import header_span_ns
from marketrl.data.reader import (
    QUOTE_FILE_SCHEMAS,
    _open_dbn,
    _prices,
    _record_chunks,
    _symbol_map,
)
from marketrl.instruments.symbols import symbol_root

__all__ = [
    "MAX_BAD_QUOTE_SHARE",
    "QUOTE_COLUMNS",
    "QUOTE_MAX_AGE",
    "QuoteFile",
    "bar_quotes",
    "load_quotes",
    "quotes_at_bars",
    "read_quotes",
]

#: Feature-table columns (Float64, null where no quote): the quote as of the bar's close and as of its open.
QUOTE_COLUMNS = ("bid_px", "ask_px", "open_bid_px", "open_ask_px")
QUOTE_MAX_AGE = timedelta(minutes=15)
#: Crossed (bid > ask) or zero/negative quotes beyond this share of a file's two-sided quotes: a broken file.
MAX_BAD_QUOTE_SHARE = 0.01


@dataclass(frozen=True)
class QuoteFile:
    """One quote file's two-sided quotes: ``quote_ts`` (ts_recv, Datetime ns UTC), ``instrument_id`` (UInt32),
    ``bid_px``, ``ask_px`` (Float64), sorted by time; and the symbol roots its header maps each id to."""

    path: Path
    schema: str
    quotes: pl.DataFrame
    roots: dict[int, set[str]]


def read_quotes(path: str | Path) -> QuoteFile:
    """Decode a ``bbo-1s``/``bbo-1m``/``mbp-1`` file's top of book; one-sided or undefined quotes are left out.

    Errors (``DataFileError`` naming the file): another schema, records outside the header's range, more than
    ``MAX_BAD_QUOTE_SHARE`` of the quotes crossed or zero."""
    opened = _open_dbn(Path(path), QUOTE_FILE_SCHEMAS)
    path = opened.path
    frames = []
    for chunk in _record_chunks(opened):
        chunk = chunk[chunk["ts_recv"] != databento_dbn.UNDEF_TIMESTAMP]
        frames.append(
            pl.DataFrame(
                [
                    pl.Series("ts_event", chunk["ts_recv"].view("int64")).cast(pl.Datetime("ns", "UTC")),
                    pl.Series("instrument_id", chunk["instrument_id"]),
                    _prices(chunk["bid_px_00"]).alias("bid_px"),
                    _prices(chunk["ask_px_00"]).alias("ask_px"),
                ]
            )
        )
    if not frames or sum(frame.height for frame in frames) == 0:
        raise DataFileError(path, f"no quotes (header-only {opened.schema} file)")
    quotes = pl.concat(frames).drop_nulls(["bid_px", "ask_px"])
    check_timestamps(quotes, opened.metadata, path, 0)
    bad = quotes.select(
        ((pl.col("bid_px") <= 0) | (pl.col("ask_px") <= 0) | (pl.col("bid_px") > pl.col("ask_px"))).sum()
    ).item()
    if quotes.height and bad > MAX_BAD_QUOTE_SHARE * quotes.height:
        raise DataFileError(
            path,
            f"{bad} of {quotes.height} quotes crossed or zero ({bad / quotes.height:.1%}; at most "
            f"{MAX_BAD_QUOTE_SHARE:.0%} fall back to costs.half_spread_ticks)",
        )
    roots: dict[int, set[str]] = {}
    for instrument_id, symbol in _symbol_map(opened.metadata).select("instrument_id", "symbol").iter_rows():
        roots.setdefault(int(instrument_id), set()).add(symbol_root(symbol))
    quotes = quotes.rename({"ts_event": "quote_ts"}).sort("quote_ts", "instrument_id", maintain_order=True)
    return QuoteFile(path=path, schema=opened.schema, quotes=quotes, roots=roots)


def load_quotes(paths: Sequence[str | Path], bars: pl.DataFrame, bar_path: Path, bar_ns: int) -> pl.DataFrame:
    """The quotes of ``paths`` (the quote files paired with the bar file ``bar_path``: its own day's, and its
    neighbours' for the quotes around its first and last bar), checked against ``bars``, in one frame.

    Errors name the quote file: an instrument id that the quote file maps to another symbol root than the bars
    do (quotes of another instrument); the file whose header covers the bars' first bar holding no quote inside
    the bars' span (quotes of another day), or none of an instrument of the bars."""
    files = [read_quotes(path) for path in paths]
    if not files:
        raise DataFileError(bar_path, "data.quotes: no quote file paired with this bar file")
    bar_roots = {
        int(instrument_id): symbol_root(str(symbol))
        for instrument_id, symbol in bars.select("instrument_id", "symbol").unique().iter_rows()
    }
    for quote_file in files:
        for instrument_id, root in bar_roots.items():
            others = quote_file.roots.get(instrument_id, set()) - {root}
            if others:
                raise DataFileError(
                    quote_file.path,
                    f"maps instrument {instrument_id} to {sorted(others)[0]}, the bars of {bar_path.name} to "
                    f"{root}: quotes of another instrument",
                )
    first_ns = bars["ts_event"].cast(pl.Int64).min() if bars.height else 0
    own = next((f for f in files if _covers(f.path, int(first_ns))), files[0])  # type: ignore[arg-type]
    span = (pl.col("quote_ts") >= pl.lit(bars["ts_event"].min()) - QUOTE_MAX_AGE) & (
        pl.col("quote_ts") <= pl.lit(bars["ts_event"].max()) + timedelta(microseconds=bar_ns / 1000)
    )
    inside = own.quotes.filter(span)
    if bars.height and inside.height == 0:
        raise DataFileError(
            own.path, f"no quote inside the span of the bars of {bar_path.name}: quotes of another day"
        )
    quoted = set(inside["instrument_id"].unique().to_list())
    missing = sorted(set(bar_roots) - quoted)
    if missing:
        symbol = bars.filter(pl.col("instrument_id") == missing[0])["symbol"][0]
        raise DataFileError(
            own.path,
            f"no quote of {symbol} ({missing[0]}), whose bars {bar_path.name} holds: quotes of another instrument",
        )
    return pl.concat([f.quotes for f in files]).sort("quote_ts", "instrument_id", maintain_order=True)


def _covers(path: Path, ts_ns: int) -> bool:
    start, end = header_span_ns(path)
    return start <= ts_ns < end


def bar_quotes(bars: pl.DataFrame, bar_ns: int) -> pl.DataFrame:
    """Quotes from bars that carry the top of book at their close (quote schemas: tbbo, mbp-1, mbp-10), stamped
    at the close, in the layout of ``QuoteFile.quotes``; the next bar's open quote is then its predecessor's
    close quote where that is recent enough."""
    return (
        bars.select(
            (pl.col("ts_event") + pl.duration(nanoseconds=bar_ns)).alias("quote_ts"),
            "instrument_id",
            "bid_px",
            "ask_px",
        )
        .drop_nulls(["bid_px", "ask_px"])
        .sort("quote_ts", "instrument_id", maintain_order=True)
    )


def quotes_at_bars(rows: pl.DataFrame, quotes: pl.DataFrame, bar_ns: int) -> pl.DataFrame:
    """``rows`` (with ``ts_event``, the bar's open, and ``instrument_id``) with ``QUOTE_COLUMNS`` appended: the
    latest quote of the same instrument stamped at or before the bar's close (``bid_px``, ``ask_px``) and at
    or before its open (``open_*``), no older than ``QUOTE_MAX_AGE``; null where there is none. Row order
    is kept. A quote stamped after the instant is never used."""
    keyed = quotes.select(
        "quote_ts", pl.col("instrument_id").cast(pl.UInt32), pl.col("bid_px", "ask_px").cast(pl.Float64)
    )
    base = rows.select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"),
        pl.col("instrument_id").cast(pl.UInt32),
        "ts_event",
    )
    out = []
    for offset, prefix in ((bar_ns, ""), (0, "open_")):
        at = base.with_columns((pl.col("ts_event") + pl.duration(nanoseconds=offset)).alias("_at")).sort(
            "_at"
        )
        joined = at.join_asof(
            keyed,
            left_on="_at",
            right_on="quote_ts",
            by="instrument_id",
            strategy="backward",
            tolerance=QUOTE_MAX_AGE,
            check_sortedness=False,
        ).sort("_row")
        out += [joined["bid_px"].alias(f"{prefix}bid_px"), joined["ask_px"].alias(f"{prefix}ask_px")]
    return rows.hstack(out)
