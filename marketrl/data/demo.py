"""Synthetic demo data: what a Databento GLBX.MDP3 ohlcv-1m batch download of ES.c.0 and NQ.c.0 looks like.

The files (documented in docs/DEMO_DATA.md) follow the exchange and the vendor: CME Globex hours (Sunday 17:00 CT
open, Friday 16:00 CT close, the daily 16:00-17:00 CT halt with no bars, early-halt holidays, DST-correct, from
marketrl.calendars.cme_hours), one zstd DBN file per UTC calendar day that has data (a session spans two of them, Sunday
files hold the weekly open), continuous symbology (``stype_in=continuous``) whose daily mappings switch from the
expiring quarterly contract to the next one (a new instrument_id, priced at the calendar spread), and a separate
``definition`` file with the contracts' InstrumentDefMsg records (tick size, multiplier, currency).

The price process is built to exercise everything downstream; by default it is not tradeable: per-minute log returns
are multivariate Student-t (fat tails) with a correlation between the two instruments, scaled by a GARCH(1,1)
variance (volatility clustering) and a U-shaped intraday profile over the session's local time with bumps at the
Asian, European and US cash opens and the US close (seasonality); the first bar after the daily halt, a weekend or a
holiday halt carries the gap's own return. Prices are rounded to the tick, OHLC are consistent, volume is
non-negative and bars with no trades are absent, as in real Databento OHLCV data.

`edge` > 0 plants a learnable signal of one of two kinds (`edge_kind`). "momentum" (the default) is 15-minute
time-series momentum: the next minute's expected log return is `phi` times the log return of the last 15 minutes
(the `ret_15` feature), the signal the momentum baseline trades too. "reversion" is 5-minute mean reversion: the next
minute's expected log return is `-phi` times the last 5 minutes' (the `ret_5` feature), a signal no baseline trades
(the momentum baseline's 30-minute sign leans the wrong way on it and loses beyond its costs). `phi` is calibrated so that the oracle that
holds the signal's sign earns an annualized net Sharpe of about `edge` (after the demo's per-instrument costs, fill
at close, one contract per instrument). A pipeline that finds no skill at `edge=2` is broken; one that finds skill
at `edge=0` is fooling itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import databento_dbn as dbn
import numpy as np
from scipy import optimize, signal

from marketrl.calendars.annual import ANNUALIZER
from marketrl.calendars.cme_hours import (
    EXCHANGE_TZ,
    DemoSession,
    cme_sessions,
    data_start_ns,
    demo_file_days,
    trading_days,
)
from marketrl.data.dbn_writer import (
    PRICE_SCALE,
    PUBLISHER_ID,
    MappingInterval,
    SymbolMapping,
    encode_dbn,
    write_dbn,
)
from marketrl.data.file_order import DEMO_DEFINITIONS_DIR as DEFINITIONS_DIR
from marketrl.data.file_order import DEMO_QUOTES_DIR as QUOTES_DIR
from marketrl.data.file_order import demo_definition_name, demo_file_name, demo_quote_file_name
from marketrl.instruments.costs import CostModel, InstrumentCosts

DATASET = "GLBX.MDP3"
SESSION_BARS = 23 * 60  # a regular CME session: 17:00 CT to 16:00 CT the next day, then the one-hour halt
BAR_NS = 60 * 1_000_000_000
_NS = 1_000_000_000


@dataclass(frozen=True)
class DemoContract:
    """One listed quarterly futures contract (what a definition record describes)."""

    raw_symbol: str  # e.g. ESH4
    instrument_id: int
    maturity_year: int
    maturity_month: int
    expiration_ns: int  # final settlement: 08:30 CT on the third Friday of the month

    @property
    def roll_date(self) -> dt.date:
        """First UTC date on which the continuous front-month symbol maps to the next contract (the day before
        expiration; docs/DEMO_DATA.md)."""
        expiry = dt.datetime.fromtimestamp(self.expiration_ns // _NS, tz=dt.UTC).date()
        return expiry - dt.timedelta(days=1)


@dataclass(frozen=True)
class DemoInstrument:
    """One futures product as its continuous front-month symbol (ES.c.0) with its contract spec.

    ``instrument_id`` is 0 for the product; the bars of each contract carry a copy with that contract's id
    (``DayBars.instrument``)."""

    symbol: str
    instrument_id: int
    start_price: float
    tick_size: float
    base_volume: float
    root: str = ""
    multiplier: float = 1.0
    currency: str = "USD"
    dividend_yield: float = 0.0  # of the index, for the calendar spread between contracts

    @property
    def tick_value(self) -> float:
        """Currency per tick per contract."""
        return self.tick_size * self.multiplier


# CME E-mini S&P 500 and E-mini Nasdaq-100: tick 0.25 index points, $50 and $20 per point ($12.50 and $5.00 a tick).
DEMO_INSTRUMENTS: tuple[DemoInstrument, ...] = (
    DemoInstrument("ES.c.0", 0, 5000.0, 0.25, 900.0, root="ES", multiplier=50.0, dividend_yield=0.0135),
    DemoInstrument("NQ.c.0", 0, 17800.0, 0.25, 350.0, root="NQ", multiplier=20.0, dividend_yield=0.0080),
)
FUNDING_RATE = 0.053  # annual rate of the cost of carry: spread = price × (rate − dividend yield) × years
_QUARTER_CODES = {3: "H", 6: "M", 9: "U", 12: "Z"}
# GLBX instrument_ids of the real contracts where the samples in ../shared/data/dbn-samples/ show them; the other
# contracts get made-up ids (documented in docs/DEMO_DATA.md).
_KNOWN_IDS = {"ESH4": 17077, "ESM4": 5602, "ESU4": 118, "NQM4": 13743, "NQU4": 4358}
LISTED_QUARTERS_AHEAD = {"ES": 9, "NQ": 5}  # quarters between a contract's listing and its expiration
DISPLAY_FACTOR = 10_000_000  # 0.01 ×1e9, GLBX's display factor of the equity index futures

# Process parameters: per-minute unconditional volatility, GARCH(1,1), tails, correlation, gaps.
MINUTE_VOL = 0.00030
GARCH_ALPHA = 0.06
GARCH_BETA = 0.92
STUDENT_DOF = 4.0
CORRELATION = 0.85
OVERNIGHT_GAP_MINUTES = (
    120.0  # the gap return over the daily halt has the variance of this many quiet minutes
)
HOLIDAY_GAP_MINUTES = 240.0  # over an early holiday halt (12:00-17:00 CT)
WEEKEND_GAP_MINUTES = 600.0
QUIET_BAR_DROP = 0.02  # chance that a low-activity bar has no trades (and so no record)

# Planted edge (data.demo.edge > 0): E[r_{t+1} | t] = sign · phi · (r_t + ... + r_{t−L+1}), phi calibrated to the
# oracle; momentum: L = 15, sign +1; reversion: L = 5, sign −1.
EDGE_LOOKBACK = 15
EDGE_KINDS: dict[str, tuple[int, float]] = {"momentum": (EDGE_LOOKBACK, 1.0), "reversion": (5, -1.0)}
#: the costs the edge is calibrated for: config.yaml's default `costs` (commission 1.0, half a tick per side) with
#: each instrument's real contract spec (tests check they agree)
CALIBRATION_COSTS = InstrumentCosts(
    {
        inst.root: CostModel(
            kind="futures",
            commission_per_contract=1.0,
            half_spread_ticks=0.5,
            tick_size=inst.tick_size,
            tick_value=inst.tick_value,
            currency=inst.currency,
        )
        for inst in DEMO_INSTRUMENTS
    }
)
CALIBRATION_DAYS = 120  # a fixed, seeded sample of the process; calibrating takes about two seconds
CALIBRATION_SEED = 20240102
MAX_EDGE = 20.0


def _third_friday(year: int, month: int) -> dt.date:
    first = dt.date(year, month, 1)
    return first + dt.timedelta(days=(4 - first.weekday()) % 7 + 14)


def demo_contract(root: str, year: int, month: int) -> DemoContract:
    """The quarterly contract of ``root`` expiring in ``month`` of ``year`` (e.g. ES, 2024, 3 -> ESH4)."""
    raw_symbol = f"{root}{_QUARTER_CODES[month]}{year % 10}"
    expiry = dt.datetime.combine(_third_friday(year, month), dt.time(8, 30), tzinfo=EXCHANGE_TZ)
    made_up = 900_000 + (year % 100) * 100 + month * 2 + (0 if root == "ES" else 1)
    return DemoContract(
        raw_symbol, _KNOWN_IDS.get(raw_symbol, made_up), year, month, int(expiry.timestamp()) * _NS
    )


def front_contract(root: str, utc_day: dt.date) -> DemoContract:
    """The contract the continuous front-month symbol maps to on ``utc_day`` (the nearest one not yet rolled)."""
    year, month = utc_day.year, 3 * ((utc_day.month - 1) // 3 + 1)
    contract = demo_contract(root, year, month)
    if utc_day >= contract.roll_date:
        year, month = (year + 1, 3) if month == 12 else (year, month + 3)
        contract = demo_contract(root, year, month)
    return contract


def _next_contract(root: str, contract: DemoContract) -> DemoContract:
    year, month = contract.maturity_year, contract.maturity_month
    return demo_contract(root, *((year + 1, 3) if month == 12 else (year, month + 3)))


def calendar_spread(inst: DemoInstrument, contract: DemoContract) -> float:
    """Log price of the next contract over ``contract`` (cost of carry between their expirations)."""
    years = (
        (_next_contract(inst.root, contract).expiration_ns - contract.expiration_ns) / _NS / (365.25 * 86400)
    )
    return math.log1p((FUNDING_RATE - inst.dividend_yield) * years)


def _intraday_profile() -> np.ndarray:
    """Relative volatility per minute of a regular session (hours since the 17:00 CT open): U-shaped over the US
    day, with bumps at the Asian open (18:00 CT), European open (02:00 CT), US cash open (08:30 CT) and close."""
    hours = np.arange(SESSION_BARS) / 60.0
    profile = (
        0.55
        + 0.35 * np.exp(-(((hours - 1.0) / 1.5) ** 2))  # Asia open
        + 0.45 * np.exp(-(((hours - 9.0) / 1.0) ** 2))  # Europe open
        + 1.20 * np.exp(-(((hours - 15.5) / 0.6) ** 2))  # US cash open
        + 0.70 * np.exp(-(((hours - 21.9) / 0.5) ** 2))  # US cash close
    )
    return profile / np.sqrt(np.mean(profile**2))


def _simulate_innovations(
    rng: np.random.Generator, n_days: int, gap_minutes: np.ndarray, session_bars: list[int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Unpredictable per-minute log-return innovations and their conditional volatility (known one minute
    ahead), both [total bars, n_instruments], for ``n_days`` sessions of ``session_bars`` minutes each (default:
    regular sessions); minute 0 of each session includes the gap."""
    n_inst = len(DEMO_INSTRUMENTS)
    lengths = [SESSION_BARS] * n_days if session_bars is None else list(session_bars)
    n = sum(lengths)
    corr = np.full((n_inst, n_inst), CORRELATION) + np.eye(n_inst) * (1.0 - CORRELATION)
    chol = np.linalg.cholesky(corr)
    gauss = rng.standard_normal((n, n_inst)) @ chol.T
    # Multivariate Student-t with unit variance: one chi-square draw per minute shared by both instruments.
    chi = rng.chisquare(STUDENT_DOF, size=(n, 1))
    shocks = gauss / np.sqrt(chi / STUDENT_DOF) * np.sqrt((STUDENT_DOF - 2.0) / STUDENT_DOF)

    profile = _intraday_profile()
    scale = np.concatenate([profile[:length] for length in lengths])
    firsts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    scale[firsts] *= np.sqrt(1.0 + np.asarray(gap_minutes))  # the break's return lands on the first bar
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


def edge_kind_spec(kind: str) -> tuple[int, float]:
    """(lookback L, sign) of a planted edge kind; a one-line error names the config key otherwise."""
    if kind not in EDGE_KINDS:
        raise ValueError(f"data.demo.edge_kind: expected one of {', '.join(EDGE_KINDS)}, got {kind!r}")
    return EDGE_KINDS[kind]


def _plant_edge(innovations: np.ndarray, phi: float, kind: str = "momentum") -> np.ndarray:
    """Log returns r_t = sign · phi · (r_{t−1} + ... + r_{t−L}) + innovation_t, along axis 0."""
    if phi == 0.0:
        return innovations  # no edge: exactly the unplanted process
    lookback, sign = edge_kind_spec(kind)
    ar = np.concatenate([[1.0], np.full(lookback, -sign * phi)])
    return signal.lfilter([1.0], ar, innovations, axis=0)


def _trailing_sum(returns: np.ndarray, lookback: int = EDGE_LOOKBACK) -> np.ndarray:
    """r_t + ... + r_{t−lookback+1} along axis 0 (the oracle's signal, known at the close of bar t)."""
    cumulative = np.cumsum(returns, axis=0)
    lagged = np.zeros_like(cumulative)
    lagged[lookback:] = cumulative[:-lookback]
    return cumulative - lagged


def _gap_minutes(days: list[dt.date]) -> np.ndarray:
    """Gap variance (in quiet minutes) before each of consecutive weekday sessions (the calibration sample)."""
    return np.array(
        [0.0]
        + [
            WEEKEND_GAP_MINUTES if (b - a).days > 1 else OVERNIGHT_GAP_MINUTES
            for a, b in itertools.pairwise(days)
        ]
    )


def _session_gap_minutes(sessions: list[DemoSession]) -> np.ndarray:
    """Gap variance before each session, by the length of the break before it."""
    gaps = [0.0]
    for before, after in itertools.pairwise(sessions):
        hours = (after.open_ns - before.close_ns) / _NS / 3600
        gaps.append(
            WEEKEND_GAP_MINUTES
            if hours > 24
            else HOLIDAY_GAP_MINUTES
            if hours > 1.5
            else OVERNIGHT_GAP_MINUTES
        )
    return np.array(gaps)


def expected_oracle_sharpe(
    innovations: np.ndarray, volatility: np.ndarray, phi: float, kind: str = "momentum"
) -> float:
    """Annualized net Sharpe of the oracle that holds sign · sign(trailing L-minute return) of each instrument (the
    sign of the planted drift), one contract, filled at the close, with CALIBRATION_COSTS: the equal-weight book's
    daily mean over the root of
    (variance of the daily conditional means + mean daily conditional variance), both from conditional moments
    given the information at each decision (far less noisy than a realized Sharpe of the same sample).
    ``innovations``/``volatility`` hold whole regular sessions (SESSION_BARS rows each)."""
    lookback, sign = edge_kind_spec(kind)
    returns = _plant_edge(innovations, phi, kind)
    trailing = _trailing_sum(returns, lookback)
    position = sign * np.sign(trailing)
    cost_fraction = np.array(
        [
            CALIBRATION_COSTS.for_symbol(inst.symbol).cost_fraction(inst.start_price)
            for inst in DEMO_INSTRUMENTS
        ]
    )
    previous = np.vstack([np.zeros((1, position.shape[1])), position[:-1]])
    # decision at t (row t) earns over t+1: |drift| = phi · |trailing_t|, charged |Δposition| · cost at t
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
    """A fixed sample of CALIBRATION_DAYS regular sessions (no holiday halts or rolls: the edge's strength only)
    on the demo's trading days from 2024-01-02 (their weekends and holidays set the gaps)."""
    days = trading_days(dt.date(2024, 1, 2), CALIBRATION_DAYS)
    return _simulate_innovations(
        np.random.default_rng(CALIBRATION_SEED), CALIBRATION_DAYS, _gap_minutes(days)
    )


@functools.cache
def edge_coefficient(edge: float, kind: str = "momentum") -> float:
    """The coefficient phi of the planted `kind` whose oracle earns an annualized net Sharpe of `edge` (0: no
    edge, phi = 0), solved on a fixed, seeded calibration sample of the process (so phi depends on `edge` and
    `kind` only)."""
    if isinstance(edge, bool) or not isinstance(edge, int | float) or not 0.0 <= edge <= MAX_EDGE:
        raise ValueError(f"data.demo.edge: expected a number in [0, {MAX_EDGE:g}], got {edge!r}")
    lookback, _ = edge_kind_spec(kind)
    if edge == 0:
        return 0.0
    innovations, volatility = _calibration_sample()

    def miss(phi: float) -> float:
        return expected_oracle_sharpe(innovations, volatility, phi, kind) - float(edge)

    # the AR sum phi · L stays well below 1 (a stationary process) over the whole bracket
    return float(optimize.brentq(miss, 0.0, 0.5 / lookback, xtol=1e-7))


def _round_to_tick(price: np.ndarray, tick: float) -> np.ndarray:
    return np.round(price / tick) * tick


@dataclass(frozen=True)
class DayBars:
    """One contract's bars of one trading day: minute since the day's first open (17:00 CT; a holiday's halt is a
    jump) and UTC open time of each bar (bars with no trade are absent), OHLCV. ``instrument`` is the product
    with this contract's instrument_id."""

    instrument: DemoInstrument
    minutes: np.ndarray
    open: np.ndarray
    high: np.ndarray
    low: np.ndarray
    close: np.ndarray
    volume: np.ndarray
    ts_event: np.ndarray  # int64 UTC nanoseconds of each bar's open
    contract: DemoContract | None = None


def _utc_dates(ts_ns: np.ndarray) -> np.ndarray:
    return ts_ns.astype("datetime64[ns]").astype("datetime64[D]")


def simulate_demo_bars(
    start: dt.date | str, n_days: int, seed: int, edge: float = 0.0, edge_kind: str = "momentum"
) -> list[tuple[dt.date, list[DayBars]]]:
    """The demo bars of the first `n_days` CME trading days that are `start` or later, per trading day and
    contract (a session that the roll crosses has two per product), without writing files. The data begin at
    00:00 UTC of the first trading day, as a download from that date does. A trading day after an early-halt
    holiday is two segments (cme_hours), simulated one after the other and merged per contract."""
    if n_days < 1:
        raise ValueError(f"data.demo.days must be at least 1, got {n_days}")
    phi = edge_coefficient(edge, edge_kind)
    sessions = cme_sessions(dt.date.fromisoformat(start) if isinstance(start, str) else start, n_days)
    lengths = [session.minutes for session in sessions]
    rng = np.random.default_rng(seed)
    innovations, _ = _simulate_innovations(
        rng, len(sessions), _session_gap_minutes(sessions), session_bars=lengths
    )
    log_returns = _plant_edge(innovations, phi, edge_kind)
    profile = _intraday_profile()
    data_start = data_start_ns(sessions)
    first_day = _utc_dates(np.array([data_start]))[0].astype(dt.date)

    simulated: list[tuple[dt.date, list[DayBars]]] = []
    last_close = np.array([inst.start_price for inst in DEMO_INSTRUMENTS])
    current = [front_contract(inst.root, first_day) for inst in DEMO_INSTRUMENTS]
    offset = 0
    day_opens: dict[dt.date, int] = {}
    for session, n in zip(sessions, lengths, strict=True):
        returns, shape = log_returns[offset : offset + n], profile[:n]
        offset += n
        day_offset = (session.open_ns - day_opens.setdefault(session.trading_day, session.open_ns)) // BAR_NS
        ts = session.open_ns + np.arange(n, dtype=np.int64) * BAR_NS
        dates = _utc_dates(ts)
        day_bars = []
        for k, inst in enumerate(DEMO_INSTRUMENTS):
            # the contract of each bar, by its UTC date, as the continuous symbology maps it
            day_index = np.unique(dates, return_inverse=True)[1]
            day_contracts = [front_contract(inst.root, d.astype(dt.date)) for d in np.unique(dates)]
            rolled = np.zeros(n)
            for j in np.flatnonzero(np.diff(day_index, prepend=-1)):  # the first bar of each UTC day
                if day_contracts[day_index[j]] != current[k]:
                    rolled[j] = calendar_spread(inst, current[k])
                    current[k] = day_contracts[day_index[j]]
            level = np.cumsum(rolled)  # log price of the current contract over the one at the session's start
            path_log = np.log(last_close[k]) + np.cumsum(returns[:, k]) + level
            close = _round_to_tick(np.exp(path_log), inst.tick_size)
            prev_close = np.concatenate([[last_close[k]], close[:-1]]) * np.exp(rolled)
            # The first trade of a minute sits at the previous close or one tick away from it.
            open_ = _round_to_tick(prev_close, inst.tick_size) + inst.tick_size * rng.choice(
                [-1.0, 0.0, 1.0], size=n, p=[0.2, 0.6, 0.2]
            )
            open_[0] = _round_to_tick(np.exp(path_log[0] - returns[0, k] * 0.2), inst.tick_size)
            wick = np.abs(rng.standard_normal((2, n))) * MINUTE_VOL * shape * close * 0.6
            high = np.ceil((np.maximum(open_, close) + wick[0]) / inst.tick_size) * inst.tick_size
            low = np.floor((np.minimum(open_, close) - wick[1]) / inst.tick_size) * inst.tick_size
            move = np.abs(returns[:, k]) / (MINUTE_VOL * shape)
            volume = np.floor(inst.base_volume * shape**1.5 * (0.6 + 0.4 * move) * rng.lognormal(0.0, 0.5, n))
            quiet = (shape < 0.8) & (rng.random(n) < QUIET_BAR_DROP)
            keep = (volume > 0) & ~quiet
            keep[0] = True  # every session has its opening bar
            volume[0] = max(volume[0], 1.0)
            last_close[k] = close[-1]
            keep &= ts >= data_start  # before the first trading day's 00:00 UTC: not in the download
            contract_ids = np.array([c.instrument_id for c in day_contracts])[day_index]
            for contract in dict.fromkeys(day_contracts):  # one DayBars per contract of the session
                rows = keep & (contract_ids == contract.instrument_id)
                if rows.any():
                    day_bars.append(
                        DayBars(
                            dataclasses.replace(inst, instrument_id=contract.instrument_id),
                            np.nonzero(rows)[0] + day_offset,
                            open_[rows],
                            high[rows],
                            low[rows],
                            close[rows],
                            volume[rows],
                            ts[rows],
                            contract,
                        )
                    )
        if simulated and simulated[-1][0] == session.trading_day:
            simulated[-1] = (session.trading_day, _merge_segments(simulated[-1][1], day_bars))
        else:
            simulated.append((session.trading_day, day_bars))
    return simulated


def _merge_segments(first: list[DayBars], second: list[DayBars]) -> list[DayBars]:
    """One trading day's bars from its two segments: one DayBars per contract, in time order."""
    merged = {bars.instrument.instrument_id: bars for bars in first}
    for bars in second:
        earlier = merged.get(bars.instrument.instrument_id)
        if earlier is None:
            merged[bars.instrument.instrument_id] = bars
            continue
        columns = ("minutes", "open", "high", "low", "close", "volume", "ts_event")
        merged[bars.instrument.instrument_id] = dataclasses.replace(
            earlier,
            **{name: np.concatenate([getattr(earlier, name), getattr(bars, name)]) for name in columns},
        )
    return list(merged.values())


def generate_demo_files(
    out_dir: Path,
    start: dt.date | str,
    n_days: int,
    seed: int,
    edge: float = 0.0,
    edge_kind: str = "momentum",
) -> list[Path]:
    """Write the ohlcv-1m DBN.zst files (one per UTC day with data) of `n_days` CME trading days from `start` into
    `out_dir`, a bbo-1m file of each of their days into `out_dir/bbo-1m/` (`_quote_records`), and their
    definition file into `out_dir/definitions/`; return the ohlcv-1m paths in time order.

    `edge`: the oracle's annualized net Sharpe the planted signal is calibrated to (0: no planted signal);
    `edge_kind`: "momentum" or "reversion" (the module docstring)."""
    start = dt.date.fromisoformat(start) if isinstance(start, str) else start
    simulated = simulate_demo_bars(start, n_days, seed, edge, edge_kind)
    out_dir.mkdir(parents=True, exist_ok=True)
    records = sorted(
        (int(ts), bars.instrument.instrument_id, _ohlcv_msg(bars, j))
        for _, day_bars in simulated
        for bars in day_bars
        for j, ts in enumerate(bars.ts_event)
    )  # Databento orders records by time, then instrument
    by_day: dict[dt.date, list[dbn.OHLCVMsg]] = {}
    for ts, _, msg in records:
        by_day.setdefault(dt.datetime.fromtimestamp(ts // _NS, tz=dt.UTC).date(), []).append(msg)
    days = demo_file_days(start, n_days)
    if sorted(by_day) != days:
        raise RuntimeError("demo data: the simulated bars and the CME file calendar disagree")
    paths = [_write_day_file(out_dir / demo_file_name(day), day, by_day[day]) for day in days]
    quotes_by_day: dict[dt.date, list[dbn.BBOMsg]] = {}
    for ts, _, msg in sorted(_quote_records(simulated, seed), key=lambda record: record[:2]):
        quotes_by_day.setdefault(dt.datetime.fromtimestamp(ts // _NS, tz=dt.UTC).date(), []).append(msg)
    (out_dir / QUOTES_DIR).mkdir(exist_ok=True)
    for day in days:  # a quote stamped at the end of the last day lies past the data: not in the download
        _write_day_file(
            out_dir / QUOTES_DIR / demo_quote_file_name(day), day, quotes_by_day.get(day, []), "bbo-1m"
        )
    contracts = {bars.contract for _, day_bars in simulated for bars in day_bars}
    write_definition_file(
        out_dir / DEFINITIONS_DIR / demo_definition_name(days[0], days[-1]), days, contracts
    )
    return paths


# The demo's quotes (bbo-1m, docs/DEMO_DATA.md): spread = 1 tick + Poisson(extra) ticks, the expected extra ticks
# by session phase (minutes since the 17:00 CT open), per product; plus some at a roll and with the bar's move.
SPREAD_OPEN_MINUTES = 30  # the session open: the extra decays over about this many minutes
SPREAD_EXTRA = {  # (open, overnight 17:00-08:30 CT, day session 08:30-15:15 CT, late 15:15-16:00 CT)
    "ES": (2.0, 0.15, 0.02, 0.10),
    "NQ": (3.0, 0.50, 0.15, 0.30),
}
SPREAD_ROLL_EXTRA = 0.5  # on the UTC day before a roll and the roll day itself
SPREAD_VOL_EXTRA = 0.2  # per minute-volatility unit of the bar's |return| beyond 3
DAY_SESSION_MINUTES = (930, 1335)  # 08:30 and 15:15 CT, in minutes since the 17:00 CT open
QUOTE_SEED_STREAM = 0xB0  # the quotes' own random stream: the bars are the same with or without them


def quote_spread_ticks(
    root: str, minutes: np.ndarray, move: np.ndarray, roll_day: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Spreads in ticks (int, >= 1) of quotes at ``minutes`` since the session's 17:00 CT open, for bars whose
    |log return| is ``move`` minute-volatility units (MINUTE_VOL), on a roll day or not."""
    at_open, overnight, day, late = SPREAD_EXTRA[root]
    phase = np.where(
        minutes < DAY_SESSION_MINUTES[0], overnight, np.where(minutes < DAY_SESSION_MINUTES[1], day, late)
    )
    extra = (
        phase
        + at_open * np.exp(-minutes / (SPREAD_OPEN_MINUTES / 3))
        + SPREAD_ROLL_EXTRA * roll_day
        + SPREAD_VOL_EXTRA * np.maximum(move - 3.0, 0.0)
    )
    return 1 + rng.poisson(extra)


def _quote_records(
    simulated: list[tuple[dt.date, list[DayBars]]], seed: int
) -> list[tuple[int, int, dbn.BBOMsg]]:
    """(ts_recv, instrument_id, record) of the demo's bbo-1m quotes: one at each bar's close (the interval's
    end) whose bid and ask bracket the close, and one at the open of each bar that follows a minute without a
    bar of its contract (the session open, a quiet minute, a new contract), bracketing the open."""
    rng = np.random.default_rng([seed, QUOTE_SEED_STREAM])
    roll_dates = {bars.contract.roll_date for _, day_bars in simulated for bars in day_bars if bars.contract}
    roll_days = {d - dt.timedelta(days=k) for d in roll_dates for k in (0, 1)}
    records = []
    for _, day_bars in simulated:
        for bars in day_bars:
            inst, tick = bars.instrument, bars.instrument.tick_size
            dates = _utc_dates(bars.ts_event).astype(dt.date)
            on_roll = np.array([d in roll_days for d in dates], dtype=float)
            move = np.abs(np.log(bars.close / bars.open)) / MINUTE_VOL
            after_gap = np.diff(bars.minutes, prepend=-2) != 1
            for stamp, price, rows in (
                (bars.ts_event + BAR_NS, bars.close, np.arange(bars.close.size)),
                (bars.ts_event, bars.open, np.flatnonzero(after_gap)),
            ):
                spread = quote_spread_ticks(inst.root, bars.minutes[rows], move[rows], on_roll[rows], rng)
                below = rng.integers(0, spread + 1)  # ticks from the bid up to the price
                bid = price[rows] - below * tick
                sizes = rng.integers(5, 60, size=(2, rows.size))
                for k, row in enumerate(rows):
                    ts_recv = int(stamp[row])
                    records.append(
                        (
                            ts_recv,
                            inst.instrument_id,
                            _bbo_msg(
                                inst.instrument_id,
                                ts_recv,
                                price[row],
                                bid[k],
                                bid[k] + spread[k] * tick,
                                sizes[:, k],
                            ),
                        )
                    )
    return records


def _bbo_msg(
    instrument_id: int, ts_recv: int, price: float, bid: float, ask: float, sizes: np.ndarray
) -> dbn.BBOMsg:
    def px(value: float) -> int:
        return int(np.rint(value * PRICE_SCALE))

    return dbn.BBOMsg(
        dbn.RType.BBO_1M,
        PUBLISHER_ID,
        instrument_id,
        ts_recv - 1_000_000,  # the last book update, just before the sample
        px(price),
        1,
        dbn.Side.NONE,
        ts_recv,
        flags=130,
        levels=dbn.BidAskPair(
            bid_px=px(bid), ask_px=px(ask), bid_sz=int(sizes[0]), ask_sz=int(sizes[1]), bid_ct=1, ask_ct=1
        ),
    )


def _ohlcv_msg(bars: DayBars, j: int) -> dbn.OHLCVMsg:
    def px(values: np.ndarray) -> int:
        return int(np.rint(values[j] * PRICE_SCALE))

    return dbn.OHLCVMsg(
        dbn.RType.OHLCV_1M,
        PUBLISHER_ID,
        bars.instrument.instrument_id,
        int(bars.ts_event[j]),
        px(bars.open),
        px(bars.high),
        px(bars.low),
        px(bars.close),
        int(bars.volume[j]),
    )


def _day_ns(day: dt.date) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()) * _NS


def _write_day_file(path: Path, day: dt.date, messages: list, schema: str = "ohlcv-1m") -> Path:
    """Encode one UTC day's bars (or quotes: ``schema`` bbo-1m) as a DBN.zst file with continuous symbology,
    atomically."""
    next_day = day + dt.timedelta(days=1)
    mappings = [
        SymbolMapping(
            inst.symbol, [MappingInterval(day, next_day, str(front_contract(inst.root, day).instrument_id))]
        )
        for inst in DEMO_INSTRUMENTS
    ]
    data = encode_dbn(
        messages,
        schema=schema,
        start_ns=_day_ns(day),
        end_ns=_day_ns(next_day),
        mappings=mappings,
        dataset=DATASET,
        stype_in="continuous",
    )
    return write_dbn(path, data)


def _root_of(contract: DemoContract) -> DemoInstrument:
    return next(inst for inst in DEMO_INSTRUMENTS if contract.raw_symbol.startswith(inst.root))


def definition_record(contract: DemoContract, ts_recv: int) -> dbn.InstrumentDefMsg:
    """The InstrumentDefMsg of a demo contract, with the fields a GLBX futures definition carries."""
    inst = _root_of(contract)
    # listed when the contract LISTED_QUARTERS_AHEAD quarters before it expired (as the samples' ESM4 and NQM4 were)
    quarters = (
        contract.maturity_year * 4 + contract.maturity_month // 3 - 1 - LISTED_QUARTERS_AHEAD[inst.root]
    )
    listed = demo_contract(inst.root, quarters // 4, (quarters % 4 + 1) * 3)
    return dbn.InstrumentDefMsg(
        publisher_id=PUBLISHER_ID,
        instrument_id=contract.instrument_id,
        ts_event=ts_recv - 13 * 3600 * _NS,  # the weekly definition refresh, Sunday morning
        ts_recv=ts_recv,
        min_price_increment=round(inst.tick_size * PRICE_SCALE),
        display_factor=DISPLAY_FACTOR,
        raw_symbol=contract.raw_symbol,
        asset=inst.root,
        security_type="FUT",
        instrument_class=dbn.InstrumentClass.FUTURE,
        security_update_action=dbn.SecurityUpdateAction.ADD,
        expiration=contract.expiration_ns,
        activation=listed.expiration_ns,
        unit_of_measure_qty=round(inst.multiplier * PRICE_SCALE),
        # CME's MinPriceIncrementAmount comes in display-factor units (ES: 0.125 for $12.50), as in the samples
        min_price_increment_amount=round(inst.tick_value * DISPLAY_FACTOR),
        raw_instrument_id=contract.instrument_id,
        maturity_year=contract.maturity_year,
        maturity_month=contract.maturity_month,
        currency=inst.currency,
        group=inst.root,
        exchange="XCME",
        cfi="FFIXSX",
        unit_of_measure="IPNT",
        min_trade_vol=1,
        market_depth=10,
    )


def write_definition_file(path: Path, days: list[dt.date], contracts: set[DemoContract | None]) -> Path:
    """The definition-schema DBN.zst file of ``contracts``, covering the UTC ``days`` of the data, atomically."""
    first, end = days[0], days[-1] + dt.timedelta(days=1)
    listed = sorted((c for c in contracts if c is not None), key=lambda c: (c.expiration_ns, c.raw_symbol))
    data = encode_dbn(
        (definition_record(contract, _day_ns(first)) for contract in listed),
        schema="definition",
        start_ns=_day_ns(first),
        end_ns=_day_ns(end),
        mappings=[
            SymbolMapping(c.raw_symbol, [MappingInterval(first, end, str(c.instrument_id))]) for c in listed
        ],
        dataset=DATASET,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_dbn(path, data)


def demo_definition_path(out_dir: Path, start: dt.date | str, n_days: int) -> Path:
    """Where ``generate_demo_files`` writes the definition file for this window."""
    days = demo_file_days(dt.date.fromisoformat(start) if isinstance(start, str) else start, n_days)
    return out_dir / DEFINITIONS_DIR / demo_definition_name(days[0], days[-1])
