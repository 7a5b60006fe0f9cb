"""Quotes for the fills: the top of book as of each bar's open and close, from a quote file of the same days
(``data.quotes``: ``bbo-1s``, ``bbo-1m`` or ``mbp-1``) or from the bars of a quote schema themselves.

A quote is stamped with the time it was known: ``ts_recv`` (a bbo-1s/1m record's ``ts_recv`` is the end of its
interval, the instant its book is sampled; an mbp-1 record's is when the book change arrived). The join is as of
each bar's close (``ts_event + bar``) and open (``ts_event``), per instrument (contract), backward, never later
than that instant and never older than ``QUOTE_MAX_AGE`` (a quote from before the daily halt is no quote).
Where a bar has none, its columns are null and the env falls back to the configured half-spread (docs/ENV.md).

``env.fill_delay`` (seconds, shorter than a bar) moves both instants that many seconds later: the columns then
hold the quote the fill meets after the delay (``quotes_at_bars(..., delay_ns=...)``). That needs quotes at 1 s
resolution or finer (``FINE_QUOTE_SCHEMAS``; ``check_fill_delay``); bars of a quote schema then take their quotes
from the file's own records (``read_quotes`` on the bar file) rather than from the bars' closes.

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

from marketrl.data.checks import DataConfigError, DataFileError, check_timestamps
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
    "FILL_DELAY_KEY",
    "FINE_QUOTE_SCHEMAS",
    "MAX_BAD_QUOTE_SHARE",
    "QUOTE_COLUMNS",
    "QUOTE_MAX_AGE",
    "QuoteFile",
    "bar_quotes",
    "check_fill_delay",
    "fill_delay_ns",
    "load_quotes",
    "quotes_at_bars",
    "read_quotes",
]

#: Feature-table columns (Float64, null where no quote): the quote as of the bar's close and as of its open.
QUOTE_COLUMNS = ("bid_px", "ask_px", "open_bid_px", "open_ask_px")
QUOTE_MAX_AGE = timedelta(minutes=15)
#: Crossed (bid > ask) or zero/negative quotes beyond this share of a file's two-sided quotes: a broken file.
MAX_BAD_QUOTE_SHARE = 0.01
#: Quote schemas at 1 s resolution or finer: the ones a non-zero ``env.fill_delay`` can read its quote from
#: (bbo-1s, mbp-1 quote files; tbbo, mbp-1, mbp-10 bar files' own records). A bbo-1m record is a minute's sample.
FINE_QUOTE_SCHEMAS = ("bbo-1s", "mbp-1", "tbbo", "mbp-10")
FILL_DELAY_KEY = "env.fill_delay"


@dataclass(frozen=True)
class QuoteFile:
    """One quote file's two-sided quotes: ``quote_ts`` (ts_recv, Datetime ns UTC), ``instrument_id`` (UInt32),
    ``bid_px``, ``ask_px`` (Float64), sorted by time; and the symbol roots its header maps each id to."""

    path: Path
    schema: str
    quotes: pl.DataFrame
    roots: dict[int, set[str]]


def read_quotes(path: str | Path, schemas: Sequence[str] = QUOTE_FILE_SCHEMAS) -> QuoteFile:
    """Decode a ``bbo-1s``/``bbo-1m``/``mbp-1`` file's top of book (``schemas``: the schemas accepted; a bar
    file of a quote schema, tbbo/mbp-1/mbp-10, reads the same way); one-sided or undefined quotes are left out.

    Errors (``DataFileError`` naming the file): another schema, records outside the header's range, more than
    ``MAX_BAD_QUOTE_SHARE`` of the quotes crossed or zero."""
    opened = _open_dbn(Path(path), schemas)
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


def load_quotes(
    paths: Sequence[str | Path], bars: pl.DataFrame, bar_path: Path, bar_ns: int, fill_delay: float = 0.0
) -> pl.DataFrame:
    """The quotes of ``paths`` (the quote files paired with the bar file ``bar_path``: its own day's, and its
    neighbours' for the quotes around its first and last bar), checked against ``bars``, in one frame.
    A non-zero ``fill_delay`` (``env.fill_delay``) must be shorter than a bar and every file of a schema at
    1 s resolution or finer (``check_fill_delay``, naming the file).

    Errors name the quote file: an instrument id that the quote file maps to another symbol root than the bars
    do (quotes of another instrument); the file whose header covers the bars' first bar holding no quote inside
    the bars' span (quotes of another day), or it and the other files whose headers overlap the span none of an
    instrument of the bars."""
    files = [read_quotes(path) for path in paths]
    if not files:
        raise DataFileError(bar_path, "data.quotes: no quote file paired with this bar file")
    for quote_file in files:
        check_fill_delay(fill_delay, bar_ns, quote_file.schema, quote_file.path)
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
    # every instrument quoted in the span by the files whose headers overlap it (a new file of several days, whose
    # next contract trades only after a roll, takes that contract's quotes from a later day's file)
    last_ns = int(bars["ts_event"].cast(pl.Int64).max()) + bar_ns if bars.height else 0  # type: ignore[arg-type]
    spanning = [f for f in files if f is not own and _overlaps(f.path, int(first_ns), last_ns)]  # type: ignore[arg-type]
    quoted = set(
        pl.concat([inside, *(f.quotes.filter(span) for f in spanning)])["instrument_id"].unique().to_list()
    )
    missing = sorted(set(bar_roots) - quoted)
    if missing:
        symbol = bars.filter(pl.col("instrument_id") == missing[0])["symbol"][0]
        raise DataFileError(
            own.path,
            f"no quote of {symbol} ({missing[0]}), whose bars {bar_path.name} holds: quotes of another instrument",
        )
    return pl.concat([f.quotes for f in files]).sort("quote_ts", "instrument_id", maintain_order=True)


def _overlaps(path: Path, start_ns: int, end_ns: int) -> bool:
    start, end = header_span_ns(path)
    return start < end_ns and start_ns < end


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


def fill_delay_ns(seconds: float) -> int:
    """``env.fill_delay`` (seconds) in whole nanoseconds."""
    return round(float(seconds) * 1e9)


def check_fill_delay(seconds: float, bar_ns: int, quote_schema: str | None, path: Path) -> None:
    """A non-zero ``env.fill_delay`` must be shorter than a bar (the delayed fill precedes the next decision)
    and needs quotes at 1 s resolution or finer; ``quote_schema`` is the schema the quotes come from (None: no
    quotes). Raises ``DataConfigError`` naming ``path`` and the key."""
    delay = fill_delay_ns(seconds)
    if delay == 0:
        return
    if delay >= bar_ns:
        raise DataConfigError(
            path,
            f"config key '{FILL_DELAY_KEY}': {seconds:g} s is not shorter than a bar ({bar_ns / 1e9:g} s); the "
            "delayed fill must come before the next decision",
        )
    if quote_schema not in FINE_QUOTE_SCHEMAS:
        found = f"{quote_schema} quotes" if quote_schema else "no quotes (trade-only bars, data.quotes unset)"
        raise DataConfigError(
            path,
            f"config key '{FILL_DELAY_KEY}': {seconds:g} s needs quotes at 1 s resolution or finer "
            f"({', '.join(FINE_QUOTE_SCHEMAS)}), found {found}",
        )


def quotes_at_bars(rows: pl.DataFrame, quotes: pl.DataFrame, bar_ns: int, delay_ns: int = 0) -> pl.DataFrame:
    """``rows`` (with ``ts_event``, the bar's open, and ``instrument_id``) with ``QUOTE_COLUMNS`` appended: the
    latest quote of the same instrument stamped at or before the bar's close (``bid_px``, ``ask_px``) and at
    or before its open (``open_*``), each instant moved ``delay_ns`` later (``env.fill_delay``; shorter than a
    bar), no older than ``QUOTE_MAX_AGE``; null where there is none. Row order is kept. A quote stamped after
    the instant is never used."""
    keyed = quotes.select(
        "quote_ts", pl.col("instrument_id").cast(pl.UInt32), pl.col("bid_px", "ask_px").cast(pl.Float64)
    )
    base = rows.select(
        pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"),
        pl.col("instrument_id").cast(pl.UInt32),
        "ts_event",
    )
    out = []
    for offset, prefix in ((bar_ns + delay_ns, ""), (delay_ns, "open_")):
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
