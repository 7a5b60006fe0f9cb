"""Small synthetic DBN inputs for the tests: random-walk bars and the records that carry them.

Records are real ``databento_dbn`` messages (``OHLCVMsg``, ``TradeMsg``, ``MBP1Msg``, ``MBOMsg``), written with
marketrl.data.dbn_writer. Building one Python object per record is fine for thousands of records;
bench/speed/features.py has a vectorized writer for millions.
"""

from __future__ import annotations

import datetime as dt

import databento_dbn as dbn
import numpy as np
import polars as pl

from marketrl.data.dbn_writer import PRICE_SCALE, PUBLISHER_ID


def _to_fixed(price: float) -> int:
    return round(price * PRICE_SCALE)


def ohlcv_messages(bars: pl.DataFrame, schema: str = "ohlcv-1m") -> list[dbn.OHLCVMsg]:
    """One ``OHLCVMsg`` per row of a frame with ts_event (int ns or Datetime), instrument_id, OHLC, volume."""
    rtype = dbn.RType.from_schema(dbn.Schema.from_str(schema))
    frame = bars.with_columns(pl.col("ts_event").cast(pl.Int64)).sort("ts_event", "instrument_id")
    return [
        dbn.OHLCVMsg(
            rtype,
            PUBLISHER_ID,
            int(row["instrument_id"]),
            int(row["ts_event"]),
            _to_fixed(row["open"]),
            _to_fixed(row["high"]),
            _to_fixed(row["low"]),
            _to_fixed(row["close"]),
            int(row["volume"]),
        )
        for row in frame.iter_rows(named=True)
    ]


def trade_messages(trades: pl.DataFrame, schema: str = "trades") -> list[object]:
    """Trade-carrying records for ``trades``/``tbbo``/``mbp-1``/``mbo`` from a frame with ts_event,
    instrument_id, price, size, and optionally action (default "T") and bid_px/ask_px/bid_sz/ask_sz.
    """
    frame = trades.with_columns(pl.col("ts_event").cast(pl.Int64))
    out: list[object] = []
    for seq, row in enumerate(frame.iter_rows(named=True)):
        ts, iid = int(row["ts_event"]), int(row["instrument_id"])
        action, side = dbn.Action(row.get("action") or "T"), dbn.Side("N")
        price, size = _to_fixed(row["price"]), int(row["size"])
        if schema == "trades":
            out.append(dbn.TradeMsg(PUBLISHER_ID, iid, ts, price, size, action, side, 0, ts, sequence=seq))
        elif schema == "mbo":
            out.append(
                dbn.MBOMsg(PUBLISHER_ID, iid, ts, seq + 1, price, size, action, side, ts, sequence=seq)
            )
        elif schema in ("tbbo", "mbp-1"):
            level = dbn.BidAskPair(
                bid_px=_to_fixed(row["bid_px"]),
                ask_px=_to_fixed(row["ask_px"]),
                bid_sz=int(row["bid_sz"]),
                ask_sz=int(row["ask_sz"]),
            )
            msg = dbn.MBP1Msg(
                PUBLISHER_ID, iid, ts, price, size, action, side, 0, ts, sequence=seq, levels=level
            )
            out.append(msg)
        else:
            raise ValueError(f"schema: expected trades, mbo, tbbo or mbp-1, got {schema!r}")
    return out


def bbo_message(
    ts_recv: int,
    bid: float,
    ask: float,
    instrument_id: int = 5602,
    rtype: dbn.RType = dbn.RType.BBO_1M,
) -> dbn.BBOMsg:
    """One bbo-1s/bbo-1m record: the top of book (5 lots a side) as of ``ts_recv`` (UTC ns)."""
    return dbn.BBOMsg(
        rtype,
        PUBLISHER_ID,
        instrument_id,
        ts_recv - 1000,
        _to_fixed(bid),
        1,
        dbn.Side.NONE,
        ts_recv,
        flags=130,
        levels=dbn.BidAskPair(bid_px=_to_fixed(bid), ask_px=_to_fixed(ask), bid_sz=5, ask_sz=5),
    )


def random_walk_bars(
    n_bars: int,
    instruments: dict[int, float],
    *,
    start: dt.datetime = dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
    bar_ns: int = 60_000_000_000,
    seed: int = 0,
    gap_probability: float = 0.05,
) -> pl.DataFrame:
    """Seeded random-walk OHLCV bars for ``instruments`` (instrument_id → starting price).

    About ``gap_probability`` of the bar slots are skipped (no trades), as in real OHLCV files. Prices are on a
    0.25 tick so they round-trip the 1e-9 fixed-point encoding exactly.
    """
    rng = np.random.default_rng(seed)
    start_ns = int(start.timestamp()) * 1_000_000_000
    frames = []
    for iid, price0 in instruments.items():
        slots = np.flatnonzero(rng.random(int(n_bars * (1 + 2 * gap_probability)) + 8) >= gap_probability)[
            :n_bars
        ]
        steps = rng.normal(0.0, 2.0, len(slots))
        close = np.maximum(price0 + np.cumsum(np.round(steps * 4) / 4), 1.0)
        open_ = np.concatenate([[price0], close[:-1]])
        high = np.maximum(open_, close) + np.round(np.abs(rng.normal(0, 1.0, len(slots))) * 4) / 4
        low = np.maximum(
            np.minimum(open_, close) - np.round(np.abs(rng.normal(0, 1.0, len(slots))) * 4) / 4, 0.25
        )
        frames.append(
            pl.DataFrame(
                {
                    "ts_event": start_ns + slots.astype(np.int64) * bar_ns,
                    "instrument_id": np.full(len(slots), iid, dtype=np.uint32),
                    "open": open_,
                    "high": high,
                    "low": low,
                    "close": close,
                    "volume": rng.integers(0, 300, len(slots)).astype(np.float64),
                }
            )
        )
    return pl.concat(frames).sort("instrument_id", "ts_event")
