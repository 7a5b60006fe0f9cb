"""CME-shaped feature tables for evaluation tests and benchmarks: ES and NQ continuous symbols, sessions that
cross midnight UTC (the trading day is the date a session ends), a roll, a halt, and bars one instrument lacks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl

from marketrl.instruments.costs import costs_from_config
from tests.test_env import frame_from_bars

#: segments break at gaps over 2 hours: the daily break (1 h) does not, the halt (3 h) does
MAX_GAP = timedelta(hours=2)
COSTS = costs_from_config(
    {
        "model": "futures",
        "commission_per_contract": 1.0,
        "half_spread_ticks": 0.5,
        "instruments": {
            "ES": {"tick_size": 0.25, "tick_value": 12.5},
            "NQ": {"tick_size": 0.25, "tick_value": 5.0},
        },
    }
)


def session_bars(days: int, minutes: int, rng: np.random.Generator, halt_day: int | None) -> list[datetime]:
    """Bars every `minutes` of `days` CME sessions, Sunday 23:00 UTC to Friday 22:00 UTC, each from 23:00 UTC the
    day before to 22:00 UTC; 5% missing; a 3-hour halt in session `halt_day`."""
    stamps = []
    opens = (datetime(2024, 3, 10, 23, 0, tzinfo=UTC) + timedelta(days=d) for d in range(7 * days))
    weekday_opens = [open_ for open_ in opens if (open_ + timedelta(hours=1)).weekday() < 5][:days]
    for day, open_ in enumerate(weekday_opens):
        for b in range(23 * 60 // minutes):
            t = open_ + timedelta(minutes=minutes * b)
            halted = day == halt_day and open_ + timedelta(hours=14) <= t < open_ + timedelta(hours=17)
            if not halted and rng.random() >= 0.05:
                stamps.append(t)
    return stamps


def cme_frame(seed: int = 0, days: int = 5, minutes: int = 10, n_features: int = 2) -> pl.DataFrame:
    """ES.c.0 and NQ.c.0 over `days` sessions: ES rolls from instrument 11 to 12 after two sessions, NQ
    (instrument 21) halts in its fourth; random features f0, f1, ..."""
    rng = np.random.default_rng(seed)
    es, nq = session_bars(days, minutes, rng, None), session_bars(days, minutes, rng, 3)
    roll = datetime(2024, 3, 12, 23, 0, tzinfo=UTC)
    parts = []
    for stamps, instrument, symbol, price in (
        ([t for t in es if t < roll], 11, "ES.c.0", 5000.0),
        ([t for t in es if t >= roll], 12, "ES.c.0", 5060.0),
        (nq, 21, "NQ.c.0", 18000.0),
    ):
        n = len(stamps)
        close = price * np.exp(np.cumsum(rng.normal(0.0, 5e-4, n)))
        opens = np.append(close[0], close[:-1]) * (1 + rng.normal(0.0, 1e-4, n))
        parts.append(
            frame_from_bars(
                list(close),
                list(opens),
                timestamps=stamps,
                instrument_id=instrument,
                symbol=symbol,
                features=rng.normal(size=(n, n_features)).astype(np.float32),
            )
        )
    frame = pl.concat(parts)
    # the CME trading day is the date the session ends: 23:00 UTC belongs to the next day
    return frame.with_columns(trading_day=(pl.col("ts_event") + pl.duration(hours=1)).dt.date())
