"""Synthetic demo data: Databento-compatible ohlcv-1m DBN.zst files, one per trading day.

The price process (documented in docs/DEMO_DATA.md) is built to exercise everything downstream, not to be
tradeable: per-minute log returns are multivariate Student-t (fat tails) with a correlation between the two
instruments, scaled by a GARCH(1,1) variance (volatility clustering) and a U-shaped intraday profile with bumps at
the US cash open and close (seasonality). Each day is one session, 00:00-22:00 UTC, followed by a two-hour break;
weekends are skipped; the overnight and weekend gaps carry their own return. Prices are rounded to the tick, OHLC are
consistent, volume is non-negative and bars with no trades are absent, as in real Databento OHLCV data.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from pathlib import Path

import databento_dbn as dbn
import numpy as np

from marketrl.data.dbn_writer import (
    PRICE_SCALE,
    PUBLISHER_ID,
    MappingInterval,
    SymbolMapping,
    encode_dbn,
    write_dbn,
)
from marketrl.pipeline import demo_file_name, weekdays

DATASET = "GLBX.MDP3"
SESSION_BARS = 22 * 60  # 00:00-22:00 UTC, then a two-hour break
BAR_NS = 60 * 1_000_000_000


@dataclass(frozen=True)
class DemoInstrument:
    """One synthetic futures contract."""

    symbol: str
    instrument_id: int
    start_price: float
    tick_size: float
    base_volume: float


DEMO_INSTRUMENTS: tuple[DemoInstrument, ...] = (
    DemoInstrument("SYNTH-ES", 1001, 4750.0, 0.25, 900.0),
    DemoInstrument("SYNTH-NQ", 1002, 16800.0, 0.25, 350.0),
)

# Process parameters: per-minute unconditional volatility, GARCH(1,1), tails, correlation, gaps.
MINUTE_VOL = 0.00030
GARCH_ALPHA = 0.06
GARCH_BETA = 0.92
STUDENT_DOF = 4.0
CORRELATION = 0.85
OVERNIGHT_GAP_MINUTES = 120.0  # the gap return over the break has the variance of this many quiet minutes
WEEKEND_GAP_MINUTES = 600.0
QUIET_BAR_DROP = 0.02  # chance that a low-activity bar has no trades (and so no record)


def _intraday_profile() -> np.ndarray:
    """Relative volatility per minute of the session: U-shaped, with bumps at the US cash open and close."""
    hours = np.arange(SESSION_BARS) / 60.0
    profile = (
        0.55
        + 0.35 * np.exp(-(((hours - 1.0) / 1.5) ** 2))  # Asia open
        + 0.45 * np.exp(-(((hours - 8.0) / 1.0) ** 2))  # Europe open
        + 1.20 * np.exp(-(((hours - 14.5) / 0.6) ** 2))  # US cash open
        + 0.70 * np.exp(-(((hours - 20.9) / 0.5) ** 2))  # US cash close
    )
    return profile / np.sqrt(np.mean(profile**2))


def _simulate_log_returns(rng: np.random.Generator, n_days: int, gap_minutes: np.ndarray) -> np.ndarray:
    """Per-minute log returns [n_days, SESSION_BARS, n_instruments]; minute 0 of each day includes the gap."""
    n_inst = len(DEMO_INSTRUMENTS)
    n = n_days * SESSION_BARS
    corr = np.full((n_inst, n_inst), CORRELATION) + np.eye(n_inst) * (1.0 - CORRELATION)
    chol = np.linalg.cholesky(corr)
    gauss = rng.standard_normal((n, n_inst)) @ chol.T
    # Multivariate Student-t with unit variance: one chi-square draw per minute shared by both instruments.
    chi = rng.chisquare(STUDENT_DOF, size=(n, 1))
    shocks = gauss / np.sqrt(chi / STUDENT_DOF) * np.sqrt((STUDENT_DOF - 2.0) / STUDENT_DOF)

    scale = np.tile(_intraday_profile(), n_days)
    scale[::SESSION_BARS] *= np.sqrt(1.0 + gap_minutes)  # the break's return lands on the day's first bar
    omega = (1.0 - GARCH_ALPHA - GARCH_BETA) * MINUTE_VOL**2
    variance = np.full(n_inst, MINUTE_VOL**2)
    returns = np.empty((n, n_inst))
    for i in range(n):  # GARCH recursion is sequential by nature; 40k steps take well under a second
        returns[i] = np.sqrt(variance) * scale[i] * shocks[i]
        standardized = returns[i] / scale[i]
        variance = omega + GARCH_ALPHA * standardized**2 + GARCH_BETA * variance
    return returns.reshape(n_days, SESSION_BARS, n_inst)


def _round_to_tick(price: np.ndarray, tick: float) -> np.ndarray:
    return np.round(price / tick) * tick


def generate_demo_files(out_dir: Path, start: dt.date | str, n_days: int, seed: int) -> list[Path]:
    """Write `n_days` daily ohlcv-1m DBN.zst files for the demo instruments into `out_dir`; return their paths."""
    if n_days < 1:
        raise ValueError(f"data.demo.days must be at least 1, got {n_days}")
    days = weekdays(dt.date.fromisoformat(start) if isinstance(start, str) else start, n_days=n_days)
    rng = np.random.default_rng(seed)
    gaps = np.array(
        [0.0]
        + [
            WEEKEND_GAP_MINUTES if (b - a).days > 1 else OVERNIGHT_GAP_MINUTES
            for a, b in itertools.pairwise(days)
        ]
    )
    log_returns = _simulate_log_returns(rng, n_days, gaps)
    profile = _intraday_profile()

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    last_close = np.array([inst.start_price for inst in DEMO_INSTRUMENTS])
    for d, day in enumerate(days):
        day_bars = []
        for k, inst in enumerate(DEMO_INSTRUMENTS):
            path_log = np.log(last_close[k]) + np.cumsum(log_returns[d, :, k])
            close = _round_to_tick(np.exp(path_log), inst.tick_size)
            prev_close = np.concatenate([[last_close[k]], close[:-1]])
            # The first trade of a minute sits at the previous close or one tick away from it.
            open_ = _round_to_tick(prev_close, inst.tick_size) + inst.tick_size * rng.choice(
                [-1.0, 0.0, 1.0], size=SESSION_BARS, p=[0.2, 0.6, 0.2]
            )
            open_[0] = _round_to_tick(np.exp(path_log[0] - log_returns[d, 0, k] * 0.2), inst.tick_size)
            wick = np.abs(rng.standard_normal((2, SESSION_BARS))) * MINUTE_VOL * profile * close * 0.6
            high = np.ceil((np.maximum(open_, close) + wick[0]) / inst.tick_size) * inst.tick_size
            low = np.floor((np.minimum(open_, close) - wick[1]) / inst.tick_size) * inst.tick_size
            move = np.abs(log_returns[d, :, k]) / (MINUTE_VOL * profile)
            volume = np.floor(
                inst.base_volume * profile**1.5 * (0.6 + 0.4 * move) * rng.lognormal(0.0, 0.5, SESSION_BARS)
            )
            quiet = (profile < 0.8) & (rng.random(SESSION_BARS) < QUIET_BAR_DROP)
            keep = (volume > 0) & ~quiet
            keep[0] = True  # every session has its opening bar
            volume[0] = max(volume[0], 1.0)
            last_close[k] = close[-1]
            minutes = np.nonzero(keep)[0]
            day_bars.append((minutes, inst, open_[keep], high[keep], low[keep], close[keep], volume[keep]))
        paths.append(_write_day_file(out_dir / demo_file_name(day), day, day_bars))
    return paths


def _write_day_file(path: Path, day: dt.date, day_bars: list) -> Path:
    """Encode one day's bars as an ohlcv-1m DBN.zst file (metadata + OHLCV records), atomically."""
    day_start_ns = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
    next_day = day + dt.timedelta(days=1)
    mappings = [
        SymbolMapping(inst.symbol, [MappingInterval(day, next_day, str(inst.instrument_id))])
        for _, inst, *_ in day_bars
    ]
    records = []
    for minutes, inst, *ohlcv in day_bars:
        ts = (day_start_ns + minutes.astype(np.int64) * BAR_NS).tolist()
        open_, high, low, close = (np.rint(px * PRICE_SCALE).astype(np.int64).tolist() for px in ohlcv[:4])
        volume = ohlcv[4].astype(np.int64).tolist()
        for j, ts_event in enumerate(ts):
            msg = dbn.OHLCVMsg(
                dbn.RType.OHLCV_1M,
                PUBLISHER_ID,
                inst.instrument_id,
                ts_event,
                open_[j],
                high[j],
                low[j],
                close[j],
                volume[j],
            )
            records.append((ts_event, inst.instrument_id, msg))
    records.sort(key=lambda rec: (rec[0], rec[1]))  # Databento orders records by time, then instrument
    data = encode_dbn(
        (msg for _, _, msg in records),
        schema="ohlcv-1m",
        start_ns=day_start_ns,
        end_ns=day_start_ns + 24 * 3600 * 1_000_000_000,
        mappings=mappings,
        dataset=DATASET,
    )
    return write_dbn(path, data)
