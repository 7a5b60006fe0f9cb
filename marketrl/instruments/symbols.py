"""Symbol roots of Databento symbols, without the cost models (whose torch import the features jobs do not need)."""

from __future__ import annotations

import re

__all__ = ["is_continuous", "symbol_root"]

# CME-style outright: root, one month code, a 1- or 2-digit year (ESH4, NQZ24, 6EM5); continuous ES.c.0,
# ES.v.1, ES.n.0; parent ES.FUT / ES.OPT.
_OUTRIGHT = re.compile(r"^(?P<root>[A-Z0-9]+?)[FGHJKMNQUVXZ][0-9]{1,2}$")
_CONTINUOUS = re.compile(r"^(?P<root>[A-Za-z0-9]+)\.[cnv]\.[0-9]+$")
_PARENT = re.compile(r"^(?P<root>[A-Za-z0-9]+)\.(?:FUT|OPT)$")


def is_continuous(symbol: str) -> bool:
    """True for a Databento continuous symbol (ES.c.0, ES.v.1, ES.n.0): one series whose contract rolls."""
    return _CONTINUOUS.match(symbol) is not None


def symbol_root(symbol: str) -> str:
    """The contract root of a symbol: ESH4 -> ES, NQZ24 -> NQ, 6EM5 -> 6E, ES.c.0 -> ES, ES.FUT -> ES; any other
    symbol (an equity ticker, an instrument_id) is its own root."""
    for pattern in (_CONTINUOUS, _PARENT, _OUTRIGHT):
        match = pattern.match(symbol)
        if match:
            return match.group("root")
    return symbol
