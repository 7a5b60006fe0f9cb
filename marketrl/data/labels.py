"""Labels that must agree across files: one instrument id keeps one symbol root (a header that maps ES's id to
``NQH4`` would price a day of ES as NQ), and one symbol keeps its price level (within ``data.max_price_jump``).

A disagreement between two files does not say which one is wrong: ``odd_file`` asks every file that has a
label for the key and names the one outside the larger group (with a tie, the group of the oldest file wins,
so with only two files the newer one is named).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from marketrl.instruments.symbols import symbol_root

__all__ = ["Conflict", "Labels", "first_conflict", "labels_of", "odd_file"]


@dataclass(frozen=True)
class Labels:
    """What one file says about its instruments: the symbol of each id, and the price level of each symbol."""

    path: Path
    symbols: dict[int, str]  # instrument_id -> symbol (ids without a mapping left out: they say nothing)
    levels: dict[str, float]  # symbol -> median close

    def value(self, kind: str, key: int | str) -> str | float | None:
        """The file's label for ``key`` (an instrument id for "root", a symbol for "level"), None if it has none."""
        if kind == "root":
            symbol = self.symbols.get(int(key))
            return None if symbol is None else symbol_root(symbol)
        return self.levels.get(str(key))


def labels_of(path: Path, bars: pl.DataFrame) -> Labels:
    """The labels of one file's bars (``read_bars`` columns)."""
    mapped = bars.filter(pl.col("symbol") != pl.col("instrument_id").cast(pl.String))
    symbols = mapped.group_by("instrument_id").agg(pl.col("symbol").first())
    levels = bars.filter(pl.col("close") > 0).group_by("symbol").agg(pl.col("close").median())
    return Labels(
        path=path,
        symbols=dict(zip(symbols["instrument_id"].to_list(), symbols["symbol"].to_list(), strict=True)),
        levels=dict(zip(levels["symbol"].to_list(), levels["close"].to_list(), strict=True)),
    )


@dataclass(frozen=True)
class Conflict:
    """Two files disagree on one key: the root of an instrument id, or the price level of a symbol."""

    kind: str  # "root" | "level"
    key: int | str


def _agree(kind: str, a: str | float, b: str | float, max_jump: float) -> bool:
    if kind == "root":
        return a == b
    return max_jump <= 0 or abs(math.log(float(a) / float(b))) <= math.log(max_jump)


def first_conflict(newer: Labels, older: Labels, max_jump: float) -> Conflict | None:
    """The first key (ids, then symbols, in sorted order) on which the two files disagree, else None."""
    for instrument_id in sorted(newer.symbols.keys() & older.symbols.keys()):
        if newer.value("root", instrument_id) != older.value("root", instrument_id):
            return Conflict("root", instrument_id)
    for symbol in sorted(newer.levels.keys() & older.levels.keys()):
        if not _agree("level", newer.levels[symbol], older.levels[symbol], max_jump):
            return Conflict("level", symbol)
    return None


def odd_file(
    conflict: Conflict, newer: Labels, older: Labels, files: Sequence[Labels], max_jump: float
) -> tuple[Labels, Labels, str]:
    """Which of ``newer`` and ``older`` (which disagree on ``conflict``) is wrong, by the vote of ``files`` (every
    file read, oldest first, the two included) that have a label for the key: returns (wrong, right, fault)."""
    kind, key = conflict.kind, conflict.key
    said_newer, said_older = newer.value(kind, key), older.value(kind, key)
    assert said_newer is not None and said_older is not None, "odd_file: both files must label the key"
    votes = [value for value in (f.value(kind, key) for f in files) if value is not None]
    with_newer = sum(_agree(kind, value, said_newer, max_jump) for value in votes)
    with_older = sum(_agree(kind, value, said_older, max_jump) for value in votes)
    older_wins = with_older > with_newer or (
        with_older == with_newer and _agree(kind, votes[0], said_older, max_jump)
    )
    wrong, right = (newer, older) if older_wins else (older, newer)
    return wrong, right, _fault(conflict, wrong, right, max(with_newer, with_older), len(votes))


def _fault(conflict: Conflict, wrong: Labels, right: Labels, agreeing: int, voting: int) -> str:
    """One line: what the wrong file says, what the others say, and the rule."""
    vote = f"{agreeing} of {voting} files"
    if conflict.kind == "root":
        instrument_id = int(conflict.key)
        return (
            f"instrument {instrument_id} is {wrong.symbols[instrument_id]} here but "
            f"{right.symbols[instrument_id]} in {right.path.name} ({vote} agree): one instrument id keeps one "
            "symbol root across files (a wrong symbology mapping in the header?)"
        )
    symbol = str(conflict.key)
    return (
        f"price level of {symbol} is {wrong.levels[symbol]:g} here but {right.levels[symbol]:g} in "
        f"{right.path.name} ({vote} agree): more than data.max_price_jump apart (a wrong symbol or price scale?)"
    )
