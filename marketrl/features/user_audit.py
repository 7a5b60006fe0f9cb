"""The look-ahead audit of a ``features.user`` file (docs/FEATURES.md, "Your own features").

``audit_user_features`` evaluates every expression on a generated CME-shaped window of the demo's two instruments
through the engine, then again with every bar after t perturbed and with the window cut after t (the value at t
must not change: no look-ahead) and with every bar more than the declared lookback before t perturbed (it must
not change either: an honest lookback); ``write_user_audit`` is the ``user_features_audit`` job and
``audited_user_features`` what the features job loads. Apart from ``marketrl.features.user`` because the audit
runs the engine, and the engine runs the user's expressions.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from marketrl.features.catalog import (
    MAX_LOOKBACK,
    _c,
)
from marketrl.features.engine import feature_chunks
from marketrl.features.user import (
    SESSION_VWAP,
    UserFeatures,
    _fail,
    load_user_features,
)

__all__ = ["audit_user_features", "audited_user_features", "write_user_audit"]

# The generated window: the demo's ES and NQ bars of two CME trading days (the daily halt between them, thin
# quiet bars left out), always the same.
_AUDIT_START, _AUDIT_DAYS, _AUDIT_SEED = dt.date(2024, 1, 9), 2, 20260101
# Bars t probed, relative to the second trading day's first bar of the instrument: the last bars of the first
# day, the session open and the opening hour, later in the day; the first probe is past the warm-up and the
# largest lookback. Probes alternate between the instruments.
_PROBE_OFFSETS = (-2, 0, 1, 10, 45, 400)


def _audit_bars() -> pl.DataFrame:
    """The audit window in read_bars' layout, sorted by (instrument_id, ts_event)."""
    from marketrl.data.demo import simulate_demo_bars

    rows: dict[str, list[Any]] = {k: [] for k in ("ts_event", "trading_day", "instrument_id", "symbol")}
    prices: dict[str, list[np.ndarray]] = {k: [] for k in ("open", "high", "low", "close", "volume")}
    for trading_day, day_bars in simulate_demo_bars(_AUDIT_START, _AUDIT_DAYS, _AUDIT_SEED):
        for bars in day_bars:
            n = len(bars.ts_event)
            rows["ts_event"].append(bars.ts_event)
            rows["trading_day"] += [trading_day] * n
            rows["instrument_id"] += [bars.instrument.instrument_id] * n
            rows["symbol"] += [bars.instrument.symbol] * n
            for key in prices:
                prices[key].append(getattr(bars, key))
    frame = pl.DataFrame(
        {
            "ts_event": pl.Series(np.concatenate(rows["ts_event"])).cast(pl.Datetime("ns", "UTC")),
            "trading_day": pl.Series(rows["trading_day"], dtype=pl.Date),
            "instrument_id": pl.Series(rows["instrument_id"], dtype=pl.UInt32),
            "symbol": pl.Series(rows["symbol"], dtype=pl.String),
            **{key: pl.Series(np.concatenate(parts)).cast(pl.Float64) for key, parts in prices.items()},
        }
    )
    return frame.sort("instrument_id", "ts_event", maintain_order=True)


def _with_book(bars: pl.DataFrame) -> pl.DataFrame:
    """Plausible top-of-book columns (one tick around the close) for features that read the book."""
    sizes = pl.Series(
        np.random.default_rng(5).integers(1, 50, (2, bars.height)).astype(np.float64).T.tolist()
    )
    return bars.with_columns(
        (_c("close") - 0.25).alias("bid_px"),
        (_c("close") + 0.25).alias("ask_px"),
        sizes.list.get(0).alias("bid_sz"),
        sizes.list.get(1).alias("ask_sz"),
    )


def _perturbed(bars: pl.DataFrame, mask: pl.Series, seed: int) -> pl.DataFrame:
    """``bars`` with the rows in ``mask`` replaced by different, still valid OHLCV (and book) values."""
    rng = np.random.default_rng(seed)
    n = bars.height
    scale = pl.Series(rng.uniform(0.8, 1.25, n))
    wick = pl.Series(rng.uniform(0.0, 3.0, n))
    volume = pl.Series(rng.integers(1, 2000, n).astype(np.float64))
    changed = bars.with_columns(
        (_c("open") * scale).alias("open"), (_c("close") / scale).alias("close"), volume.alias("volume")
    ).with_columns(
        (pl.max_horizontal("open", "close") + wick).alias("high"),
        (pl.min_horizontal("open", "close") - wick).alias("low"),
    )
    if "bid_px" in bars.columns:
        changed = _with_book(changed.drop("bid_px", "ask_px", "bid_sz", "ask_sz"))
        changed = changed.with_columns((_c("bid_sz") * scale).alias("bid_sz"))
    values = [c for c in bars.columns if c not in ("ts_event", "trading_day", "instrument_id", "symbol")]
    return bars.with_columns(pl.when(pl.lit(mask)).then(changed[c]).otherwise(_c(c)).alias(c) for c in values)


def _evaluate(bars: pl.DataFrame, user: UserFeatures, with_book: bool) -> pl.DataFrame:
    """The user features of the whole window (one chunk), keyed by instrument and time."""
    selection = feature_chunks(
        bars,
        60_000_000_000,
        path=Path("<audit window>"),
        with_book=with_book,
        user=user,
        chunk_bars=bars.height,
    )
    try:
        tables = list(selection)
    except pl.exceptions.PolarsError as exc:
        raise _fail(f"{user.path}: cannot evaluate the features on bars: {exc}") from exc
    return pl.concat(tables).select("instrument_id", "ts_event", "trading_day", "symbol", *user.names)


def _same(a: Any, b: Any) -> bool:
    """Exact equality, NaN equal to NaN."""
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def audit_user_features(user: UserFeatures) -> dict[str, Any]:
    """Run the look-ahead, lookback and finiteness audit; raise ``UserFeatureError`` naming the first feature
    that fails and the first bar where it does; return a summary (window, probes, per-feature lookback)."""
    with_book = user.reads_book
    bars = _audit_bars()
    if with_book:
        bars = _with_book(bars)
    base = _evaluate(bars, user, with_book)
    ts_all = bars["ts_event"]
    probes = _probes(bars)
    for position, (_, t) in enumerate(probes):  # in time order: the first failure is the earliest one
        later = _perturbed(bars, ts_all > t["ts_event"], seed=position)
        changed = _changed(base, _evaluate(later, user, with_book), t, user.names)
        if changed:
            raise _fail(
                f"feature {changed[0]!r} reads the future: its value at {_where(t)} of the audit window changed "
                "when only later bars changed (shift(-n), a centred window or a whole-column statistic?)"
            )
        # Perturbing values misses a feature that reads only whether or when later bars exist (the time to the
        # next bar, a position or count over the whole window): the window cut after t must give t's value too.
        cut = bars.filter(ts_all <= t["ts_event"])
        changed = _changed(base, _evaluate(cut, user, with_book), t, user.names)
        if changed:
            raise _fail(
                f"feature {changed[0]!r} reads the future: its value at {_where(t)} of the audit window changed "
                "when the bars after it were removed (shift(-n) of a timestamp, the time to the next bar, or a "
                "count or position over the whole window?)"
            )
    # Lookback: perturb every bar more than the declared lookback before t (a feature that reads the running
    # session VWAP may read its whole trading day back, as vwap_dev_day does: only earlier days' bars then).
    groups: dict[tuple[int, bool], list[str]] = {}
    for name in user.names:
        groups.setdefault((user.lookbacks[name], SESSION_VWAP in user.reads(name)), []).append(name)
    for position, (own, t) in enumerate(probes):
        for (lookback, session), names in sorted(groups.items()):
            start = own.row(t["_row"] - lookback, named=True)
            mask = ts_all < start["ts_event"]
            if session:
                mask &= bars["trading_day"] < t["trading_day"]
            changed = _changed(
                base, _evaluate(_perturbed(bars, mask, seed=7 + position), user, with_book), t, names
            )
            if changed:
                raise _fail(
                    f"feature {changed[0]!r} reads more than its lookback of {lookback} bars: its value at "
                    f"{_where(t)} of the audit window changed when only bars before {start['ts_event']:%H:%M} "
                    "changed (declare LOOKBACK up to MAX_LOOKBACK; no cumulative or whole-column statistics)"
                )
    for name in user.names:  # last: a look-ahead often leaves nulls at the window's end
        bad = base.filter(~_c(name).is_finite() | _c(name).is_null())
        if bad.height:
            row = bad.row(0, named=True)
            raise _fail(
                f"feature {name!r} is not finite ({row[name]}) at {_where(row)} of the audit window (valid bars); "
                "guard divisions and logs"
            )
    return {
        "path": str(user.path),
        "sha256": user.sha256,
        "features": list(user.names),
        "lookbacks": dict(user.lookbacks),
        "reference": user.reference,
        "window": {"start": str(_AUDIT_START), "days": _AUDIT_DAYS, "bars": bars.height, "book": with_book},
        "probes": [f"{t['ts_event'].isoformat()} {t['symbol']}" for _, t in probes],
        "passed": True,
    }


def _probes(bars: pl.DataFrame) -> list[tuple[pl.DataFrame, dict[str, Any]]]:
    """The probed bars t in time order, each with the rows of its instrument (``_row``: position among them)."""
    instruments = bars["instrument_id"].unique(maintain_order=True).to_list()
    probes = []
    for k, offset in enumerate(_PROBE_OFFSETS):
        own = bars.filter(_c("instrument_id") == instruments[k % len(instruments)]).with_row_index("_row")
        second_day = own["trading_day"].arg_max() or 0  # first row of the later day
        position = min(max(second_day + offset, 2 * MAX_LOOKBACK + 1), own.height - 1)
        probes.append((own, own.row(position, named=True)))
    return sorted(probes, key=lambda probe: probe[1]["ts_event"])


def _where(row: Mapping[str, Any]) -> str:
    return f"bar {row['ts_event']:%Y-%m-%d %H:%M} UTC of {row['symbol']}"


def _changed(base: pl.DataFrame, other: pl.DataFrame, t: Mapping[str, Any], names: list[str]) -> list[str]:
    """The features in ``names`` whose value at bar ``t`` differs between two evaluations."""
    at = (_c("instrument_id") == t["instrument_id"]) & (_c("ts_event") == t["ts_event"])
    before, after = base.filter(at).row(0, named=True), other.filter(at).row(0, named=True)
    return [name for name in names if not _same(before[name], after[name])]


# ------------------------------------------------------------------------------------------- the pipeline's jobs


def write_user_audit(path: str | Path, config: Mapping[str, Any], out_path: str | Path) -> dict[str, Any]:
    """The ``user_features_audit`` job: load and audit ``path``, then write the summary with provenance to
    ``out_path`` (nothing is written when the audit fails)."""
    from marketrl.runtime.io import write_json_atomic
    from marketrl.runtime.provenance import collect

    user = load_user_features(path)
    summary = audit_user_features(user)
    summary["provenance"] = collect(dict(config), inputs={str(user.path): user.sha256})
    write_json_atomic(out_path, summary)
    return summary


def audited_user_features(path: str | Path, audit_path: str | Path | None = None) -> UserFeatures:
    """The features of ``path`` for a features job: audited already when ``audit_path`` (the audit job's
    summary) records this very content, else audited here, before any bar is featurized."""
    import json

    user = load_user_features(path)
    if audit_path is not None:
        try:
            audited = json.loads(Path(audit_path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise _fail(f"{audit_path}: cannot read the audit summary: {exc}") from exc
        if audited.get("passed") and audited.get("sha256") == user.sha256:
            return user
    audit_user_features(user)
    return user
