"""Bring-your-own features (``features.user``): a Python file whose ``FEATURES`` dict maps names to polars
expressions over the bar columns and the catalog's features, checked for look-ahead before any job uses them.

- ``load_user_features``: import the file and check its names, expressions, ``LOOKBACK`` and ``REFERENCE``
  (a bad file is one ``UserFeatureError`` line naming ``features.user``);
- ``audit_user_features`` (``marketrl.features.user_audit``): evaluate every expression on a generated CME-shaped window of the demo's two
  instruments, then again with every bar after t perturbed and with the window cut after t (the value at t must
  not change: no look-ahead) and with every bar more than the declared lookback before t perturbed (it must not
  change either: an honest lookback, which the engine's context and warm-up rely on); a non-finite value past
  the warm-up fails too;
- ``user_columns``, ``with_reference``: what the engine (marketrl.features.engine) adds to its query;
- the audit lives in ``marketrl.features.user_audit`` (it runs the engine, which runs these expressions).

The expressions run in the engine's query after the catalog's features, on each chunk of bars sorted by
(instrument, time), so they see what a catalog entry sees: one instrument's bars in time order, its rows more
than ``MAX_LOOKBACK`` bars into the data. Two extra columns exist for them: ``session_vwap`` (the running VWAP
of the instrument's trading day, handed from chunk to chunk like ``vwap_dev_day``'s sums) and, with
``REFERENCE = "<symbol>"``, ``ref_close`` (that symbol's close at the latest bar at or before each bar).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from marketrl.features.catalog import (
    _BAR_COLUMNS,
    _BOOK_COLUMNS,
    _DAY_SUMS,
    _ENTRIES,
    BASE_COLUMNS,
    BOOK_FEATURE_NAMES,
    FEATURE_NAMES,
    MAX_LOOKBACK,
    _c,
)

__all__ = [
    "REF_CLOSE",
    "SESSION_VWAP",
    "USER_KEY",
    "UserFeatureError",
    "UserFeatures",
    "load_user_features",
    "user_columns",
    "with_reference",
]

USER_KEY = "features.user"
SESSION_VWAP = "session_vwap"
REF_CLOSE = "ref_close"
# What an expression may read: the bars, the table's key columns, the catalog's features and the two columns above.
_READABLE = frozenset(
    (*BASE_COLUMNS, *(c for c in _BAR_COLUMNS if c not in _DAY_SUMS), *FEATURE_NAMES, *BOOK_FEATURE_NAMES)
) | {SESSION_VWAP}
_BOOK_READS = frozenset((*_BOOK_COLUMNS, *BOOK_FEATURE_NAMES))


class UserFeatureError(ValueError):
    """A ``features.user`` file that cannot be used, or a feature that fails the look-ahead audit (one line)."""


@dataclass(frozen=True)
class UserFeatures:
    """The checked contents of a ``features.user`` file."""

    path: Path
    sha256: str
    features: Mapping[str, pl.Expr]
    lookbacks: Mapping[str, int]  # declared, or MAX_LOOKBACK where the file declares none
    reference: str | None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.features)

    def reads(self, name: str) -> frozenset[str]:
        """The columns feature ``name`` reads."""
        return frozenset(self.features[name].meta.root_names())

    @property
    def reads_book(self) -> bool:
        return any(self.reads(name) & _BOOK_READS for name in self.names)

    def record(self) -> dict[str, Any]:
        """What the feature tables' metadata and the manifest say about these features."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "names": list(self.names),
            "lookbacks": dict(self.lookbacks),
            "reference": self.reference,
        }


def _fail(fault: str) -> UserFeatureError:
    return UserFeatureError(f"{USER_KEY}: {fault}".splitlines()[0])


def load_user_features(path: str | Path) -> UserFeatures:
    """Import ``path`` (relative paths from the working directory) and check what it defines:
    ``FEATURES: dict[str, pl.Expr]`` (new names only), optional ``LOOKBACK: dict[str, int]`` (0..MAX_LOOKBACK,
    default MAX_LOOKBACK) and optional ``REFERENCE: str`` (the symbol ``ref_close`` follows)."""
    path = Path(path)
    if not path.is_file():
        raise _fail(
            f"{path}: no such file (a Python file defining FEATURES, relative to the working directory)"
        )
    source = path.read_bytes()
    module_name = f"_marketrl_user_features_{hashlib.sha256(source).hexdigest()[:12]}"
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and the like look their module up while it runs
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: any error is the file's fault
        raise _fail(f"{path}: cannot import it: {type(exc).__name__}: {exc}") from exc
    features = getattr(module, "FEATURES", None)
    if not isinstance(features, dict) or not features:
        raise _fail(f"{path}: expected a non-empty dict FEATURES = {{name: polars expression}}")
    reference = getattr(module, "REFERENCE", None)
    if reference is not None and (not isinstance(reference, str) or not reference):
        raise _fail(f"{path}: REFERENCE: expected a symbol such as 'ES.c.0', got {reference!r}")
    readable = _READABLE | ({REF_CLOSE} if reference else set())
    for name, expr in features.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise _fail(f"{path}: FEATURES key {name!r}: expected a name of letters, digits and underscores")
        if name in _ENTRIES or name in readable or name in (SESSION_VWAP, REF_CLOSE):
            raise _fail(
                f"{path}: feature {name!r}: the name of a catalog feature or bar column; choose another"
            )
        if not isinstance(expr, pl.Expr):
            raise _fail(f"{path}: feature {name!r}: expected a polars expression, got {type(expr).__name__}")
        unknown = sorted(set(expr.meta.root_names()) - readable)
        if unknown:
            raise _fail(
                f"{path}: feature {name!r} reads {unknown[0]!r}: not a bar column or catalog feature"
                + (" (ref_close needs REFERENCE)" if unknown[0] == REF_CLOSE else "")
            )
    declared = getattr(module, "LOOKBACK", {})
    if not isinstance(declared, dict):
        raise _fail(
            f"{path}: LOOKBACK: expected a dict {{feature name: bars}}, got {type(declared).__name__}"
        )
    for name, bars in declared.items():
        if name not in features:
            raise _fail(f"{path}: LOOKBACK names {name!r}, which is not in FEATURES")
        if isinstance(bars, bool) or not isinstance(bars, int) or not 0 <= bars <= MAX_LOOKBACK:
            raise _fail(
                f"{path}: LOOKBACK[{name!r}]: expected an integer 0..{MAX_LOOKBACK} (MAX_LOOKBACK), got {bars!r}"
            )
    return UserFeatures(
        path=path,
        sha256=hashlib.sha256(source).hexdigest(),
        features=dict(features),
        lookbacks={name: declared.get(name, MAX_LOOKBACK) for name in features},
        reference=reference,
    )


def user_columns(user: UserFeatures) -> tuple[list[pl.Expr], list[pl.Expr]]:
    """The helper columns (``session_vwap``) and the Float32 feature columns the engine adds after the catalog's
    features, each a list for one ``with_columns``."""
    volume = _c("_day_volume")
    vwap = pl.when(volume > 0).then(_c("_day_tpv") / volume).otherwise(_c("close")).alias(SESSION_VWAP)
    features = [expr.cast(pl.Float64).cast(pl.Float32).alias(name) for name, expr in user.features.items()]
    return [vwap], features


def with_reference(bars: pl.DataFrame, reference: str, path: Path) -> pl.DataFrame:
    """``bars`` (sorted by instrument and time) with ``ref_close``: the close of symbol ``reference`` at its latest
    bar at or before each bar's ``ts_event`` (null before its first bar); no later bar is ever read."""
    ref = (
        bars.filter(_c("symbol") == reference)
        .select("ts_event", _c("close").alias(REF_CLOSE))
        .unique("ts_event", keep="last", maintain_order=True)
        .sort("ts_event")
    )
    if ref.height == 0:
        raise _fail(f"REFERENCE symbol {reference!r} has no bars in {path} (symbols: {_symbols(bars)})")
    order = "_ref_row"
    joined = (
        bars.with_row_index(order)
        .sort("ts_event", order)
        .join_asof(ref, on="ts_event", strategy="backward", check_sortedness=False)
        .sort(order)
        .drop(order)
    )
    return joined


def _symbols(bars: pl.DataFrame) -> str:
    return ", ".join(sorted(bars["symbol"].unique().to_list()))
