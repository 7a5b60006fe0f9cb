"""Polars side of the env: read a feature table's columns for `MarketData`, and label per-bar results.

The only env module that imports polars at module level; `MarketData.from_frame` and the frame outputs of
`marketrl.env.rollout` import it on first use.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from marketrl.env.config import QUOTE_KEYS, REQUIRED_COLUMNS, EnvDataError

ROW_LABELS = ("ts_event", "trading_day", "instrument_id", "symbol")
_EXTRA_TYPES = {"quote_fallback": pl.Boolean}  # extra per-bar columns that are not Float32 (null: NaN)


def frame_columns(df: pl.DataFrame, feature_names: list[str]) -> dict[str, Any]:
    """The host arrays `MarketData.from_arrays` takes (besides features), after checking columns and types;
    ``quotes`` where the table carries the quote columns (`QUOTE_KEYS`).

    Row order and prices are checked by `from_arrays` itself, for frames and arrays alike.
    """
    missing = [name for name in (*REQUIRED_COLUMNS, *feature_names) if name not in df.columns]
    if missing:
        raise EnvDataError(f"feature table: column {missing[0]!r} is missing")
    if not isinstance(df.schema["ts_event"], pl.Datetime):
        raise EnvDataError(
            f"feature table: column 'ts_event' must be a Datetime, got {df.schema['ts_event']}"
        )
    if df["ts_event"].null_count() or df["instrument_id"].null_count():
        raise EnvDataError("feature table: ts_event and instrument_id must not contain nulls")
    quoted = all(name in df.columns for name in QUOTE_KEYS)
    return {
        # the quotes of quote-aware fills (marketrl.data.quotes), null (no quote) as NaN
        **(
            {"quotes": {name: df[name].cast(pl.Float64).fill_null(np.nan).to_numpy() for name in QUOTE_KEYS}}
            if quoted
            else {}
        ),
        # nulls become NaN, which the price check rejects
        "opens": df["open"].cast(pl.Float64).to_numpy(),
        "closes": df["close"].cast(pl.Float64).to_numpy(),
        "instrument_id": df["instrument_id"].cast(pl.Int64).to_numpy(),
        "ts_event_ns": df["ts_event"].dt.epoch("ns").to_numpy(),
        "symbols": df["symbol"].to_numpy(),
    }


def row_labels(df: pl.DataFrame) -> pl.DataFrame:
    """The per-row labels kept on the host for per-bar outputs."""
    return df.select(ROW_LABELS)


def bar_frame(
    rows: pl.DataFrame,
    decision_rows: np.ndarray,
    columns: dict[str, Any],
    extra: dict[str, np.ndarray] | None = None,
) -> pl.DataFrame:
    """One row per decision bar t, labelled by the bar it earns over (t+1); `columns` are per decision row, and
    so are the `extra` columns appended last."""
    earning = rows[decision_rows + 1]
    decided = rows[decision_rows]
    return pl.DataFrame(
        {
            "ts_event": earning["ts_event"],
            "trading_day": earning["trading_day"],
            "symbol": decided["symbol"],
            "instrument_id": decided["instrument_id"],
            "decision_ts_event": decided["ts_event"],
            "segment": pl.Series(columns["segment"], dtype=pl.UInt32),
            "position": columns["position"],
            "gross_return": columns["gross_return"],
            "cost": columns["cost"],
        }
    ).with_columns(
        net_return=pl.col("gross_return") - pl.col("cost"),
        **{
            name: pl.Series(values, nan_to_null=True).cast(_EXTRA_TYPES.get(name, pl.Float32))
            for name, values in (extra or {}).items()
        },
    )
