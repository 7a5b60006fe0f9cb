"""Synthetic demo data: Databento-compatible ohlcv-1m DBN.zst files, one per trading day.

The price process (documented in docs/DEMO_DATA.md) is built to exercise everything downstream; by default it is
not tradeable: per-minute log returns are multivariate Student-t (fat tails) with a correlation between the two
instruments, scaled by a GARCH(1,1) variance (volatility clustering) and a U-shaped intraday profile with bumps at
the US cash open and close (seasonality). Each day is one session, 00:00-22:00 UTC, followed by a two-hour break;
weekends are skipped; the overnight and weekend gaps carry their own return. Prices are rounded to the tick, OHLC are
consistent, volume is non-negative and bars with no trades are absent, as in real Databento OHLCV data.

`edge` > 0 plants a learnable signal, 15-minute time-series momentum: the next minute's expected log return is
`phi` times the log return of the last 15 minutes (the `ret_15` feature), with `phi` calibrated so that the oracle
that holds sign(ret_15) earns an annualized net Sharpe of about `edge` (after the default costs, fill at close,
one contract per instrument). A pipeline that finds no skill at `edge=2` is broken; one that finds skill at
`edge=0` is fooling itself.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import databento_dbn as dbn
import numpy as np
from scipy import optimize, signal

from marketrl.costs import CostModel
from marketrl.data.dbn_writer import (
    PRICE_SCALE,
    PUBLISHER_ID,
    MappingInterval,
    SymbolMapping,
    encode_dbn,
    write_dbn,
)
from marketrl.pipeline import demo_file_name, weekdays
from marketrl.stats import ANNUALIZER

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

# Planted edge (data.demo.edge > 0): E[r_{t+1} | t] = phi · (r_t + ... + r_{t−14}), phi calibrated to the oracle.
EDGE_LOOKBACK = 15
#: the costs the edge is calibrated for: config.yaml's default `costs` block (tests check they agree)
CALIBRATION_COSTS = CostModel(
    kind="futures", commission_per_contract=1.0, half_spread_ticks=0.5, tick_size=0.25, tick_value=12.5
)
CALIBRATION_DAYS = 120  # a fixed, seeded sample of the process; calibrating takes about two seconds
CALIBRATION_SEED = 20240102
MAX_EDGE = 10.0


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


def _simulate_innovations(
    rng: np.random.Generator, n_days: int, gap_minutes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Unpredictable per-minute log-return innovations and their conditional volatility (known one minute
    ahead), both [n_days · SESSION_BARS, n_instruments]; minute 0 of each day includes the gap."""
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
    innovations = np.empty((n, n_inst))
    volatility = np.empty((n, n_inst))
    for i in range(n):  # GARCH recursion is sequential by nature; 40k steps take well under a second
        volatility[i] = np.sqrt(variance) * scale[i]
        innovations[i] = volatility[i] * shocks[i]
        standardized = innovations[i] / scale[i]
        variance = omega + GARCH_ALPHA * standardized**2 + GARCH_BETA * variance
    return innovations, volatility


def _plant_momentum(innovations: np.ndarray, phi: float) -> np.ndarray:
    """Log returns r_t = phi · (r_{t−1} + ... + r_{t−EDGE_LOOKBACK}) + innovation_t, along axis 0."""
    if phi == 0.0:
        return innovations  # no edge: exactly the unplanted process
    ar = np.concatenate([[1.0], np.full(EDGE_LOOKBACK, -phi)])
    return signal.lfilter([1.0], ar, innovations, axis=0)


def _trailing_sum(returns: np.ndarray) -> np.ndarray:
    """r_t + ... + r_{t−EDGE_LOOKBACK+1} along axis 0 (the oracle's signal, known at the close of bar t)."""
    cumulative = np.cumsum(returns, axis=0)
    lagged = np.zeros_like(cumulative)
    lagged[EDGE_LOOKBACK:] = cumulative[:-EDGE_LOOKBACK]
    return cumulative - lagged


def _gap_minutes(days: list[dt.date]) -> np.ndarray:
    return np.array(
        [0.0]
        + [
            WEEKEND_GAP_MINUTES if (b - a).days > 1 else OVERNIGHT_GAP_MINUTES
            for a, b in itertools.pairwise(days)
        ]
    )


def expected_oracle_sharpe(innovations: np.ndarray, volatility: np.ndarray, phi: float) -> float:
    """Annualized net Sharpe of the oracle that holds sign(trailing 15-minute return) of each instrument, one
    contract, filled at the close, with CALIBRATION_COSTS: the equal-weight book's daily mean over the root of
    (variance of the daily conditional means + mean daily conditional variance), both from conditional moments
    given the information at each decision (far less noisy than a realized Sharpe of the same sample)."""
    returns = _plant_momentum(innovations, phi)
    trailing = _trailing_sum(returns)
    position = np.sign(trailing)
    start_prices = np.array([inst.start_price for inst in DEMO_INSTRUMENTS])
    cost_fraction = CALIBRATION_COSTS.cost_fraction(start_prices)
    previous = np.vstack([np.zeros((1, position.shape[1])), position[:-1]])
    # decision at t (row t) earns over t+1: drift phi · trailing_t, charged |Δposition| · cost at t
    mean_bar = (phi * np.abs(trailing) - np.abs(position - previous) * cost_fraction).mean(axis=1)[:-1]
    next_vol = volatility[1:]
    book_variance = (next_vol**2).sum(axis=1) + 2.0 * CORRELATION * position[:-1].prod(
        axis=1
    ) * next_vol.prod(axis=1)
    var_bar = book_variance / position.shape[1] ** 2
    # the bar t -> t+1 belongs to the trading day of t+1; drop day 0 (its first bar has no decision before it)
    day_mean = np.concatenate([[0.0], mean_bar]).reshape(-1, SESSION_BARS)[1:].sum(axis=1)
    day_var = np.concatenate([[0.0], var_bar]).reshape(-1, SESSION_BARS)[1:].sum(axis=1)
    return ANNUALIZER * day_mean.mean() / math.sqrt(day_mean.var() + day_var.mean())


@functools.cache
def _calibration_sample() -> tuple[np.ndarray, np.ndarray]:
    days = weekdays(dt.date(2024, 1, 2), n_days=CALIBRATION_DAYS)
    return _simulate_innovations(
        np.random.default_rng(CALIBRATION_SEED), CALIBRATION_DAYS, _gap_minutes(days)
    )


@functools.cache
def edge_coefficient(edge: float) -> float:
    """The momentum coefficient phi whose oracle earns an annualized net Sharpe of `edge` (0: no edge, phi = 0),
    solved on a fixed, seeded calibration sample of the process (so phi depends on `edge` only)."""
    if isinstance(edge, bool) or not isinstance(edge, int | float) or not 0.0 <= edge <= MAX_EDGE:
        raise ValueError(f"data.demo.edge: expected a number in [0, {MAX_EDGE:g}], got {edge!r}")
    if edge == 0:
        return 0.0
    innovations, volatility = _calibration_sample()

    def miss(phi: float) -> float:
        return expected_oracle_sharpe(innovations, volatility, phi) - float(edge)

    # the AR sum phi · EDGE_LOOKBACK stays well below 1 (a stationary process) over the whole bracket
    return float(optimize.brentq(miss, 0.0, 0.5 / EDGE_LOOKBACK, xtol=1e-7))


def _round_to_tick(price: np.ndarray, tick: float) -> np.ndarray:
    return np.round(price / tick) * tick


@dataclass(frozen=True)
class DayBars:
    """One instrument's bars of one day: minute of the session (bars with no trade are absent) and OHLCV."""

    instrument: DemoInstrument
    minutes: np.ndarray
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray


def simulate_demo_bars(
    start: dt.date | str, n_days: int, seed: int, edge: float = 0.0
) -> list[tuple[dt.date, list[DayBars]]]:
    """The demo bars of `n_days` weekdays from `start`, per day and instrument, without writing files."""
    if n_days < 1:
        raise ValueError(f"data.demo.days must be at least 1, got {n_days}")
    phi = edge_coefficient(edge)
    days = weekdays(dt.date.fromisoformat(start) if isinstance(start, str) else start, n_days=n_days)
    rng = np.random.default_rng(seed)
    innovations, _ = _simulate_innovations(rng, n_days, _gap_minutes(days))
    log_returns = _plant_momentum(innovations, phi).reshape(n_days, SESSION_BARS, len(DEMO_INSTRUMENTS))
    profile = _intraday_profile()

    simulated = []
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
            day_bars.append(
                DayBars(inst, minutes, open_[keep], high[keep], low[keep], close[keep], volume[keep])
            )
        simulated.append((day, day_bars))
    return simulated


def generate_demo_files(
    out_dir: Path, start: dt.date | str, n_days: int, seed: int, edge: float = 0.0
) -> list[Path]:
    """Write `n_days` daily ohlcv-1m DBN.zst files for the demo instruments into `out_dir`; return their paths.

    `edge`: the oracle's annualized net Sharpe the planted signal is calibrated to (0: no planted signal)."""
    simulated = simulate_demo_bars(start, n_days, seed, edge)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_write_day_file(out_dir / demo_file_name(day), day, day_bars) for day, day_bars in simulated]


def _write_day_file(path: Path, day: dt.date, day_bars: list[DayBars]) -> Path:
    """Encode one day's bars as an ohlcv-1m DBN.zst file (metadata + OHLCV records), atomically."""
    day_start_ns = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()) * 1_000_000_000
    next_day = day + dt.timedelta(days=1)
    mappings = [
        SymbolMapping(
            bars.instrument.symbol, [MappingInterval(day, next_day, str(bars.instrument.instrument_id))]
        )
        for bars in day_bars
    ]
    records = []
    for bars in day_bars:
        inst = bars.instrument
        ts = (day_start_ns + bars.minutes.astype(np.int64) * BAR_NS).tolist()
        open_, high, low, close = (
            np.rint(px * PRICE_SCALE).astype(np.int64).tolist()
            for px in (bars.open, bars.high, bars.low, bars.close)
        )
        volume = bars.volume.astype(np.int64).tolist()
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
