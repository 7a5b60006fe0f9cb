"""The 51 bar features (plus a book group for quote schemas), and the DBN.zst → Parquet stage that caches them.

Every column the query computes is one entry of a catalog (``FeatureSpec``): the 51 features (``CATALOG``), the
book features (``BOOK_CATALOG``) and the named window statistics they share. An entry's expression is written
with the building blocks of ``_Reads`` (shift, diff, rolling windows, truncated EMAs), which record the columns
it reads and how many bars back; its lookback is derived from those and from the lookbacks of the entries it
reads, so ``LOOKBACKS`` and ``MAX_LOOKBACK`` follow from the formulas. docs/FEATURES.md lists every feature
with its formula and lookback (tested against the catalog). Design points:

- **finite lookback**: every feature at bar t reads bars t-L..t with ``L <= MAX_LOOKBACK``. EMAs (MACD, RSI, ATR)
  are truncated to a fixed window with renormalized weights, so a row depends on a bounded history; this makes
  a day file featurized with its previous days as context give the same rows as one long file.
- **no look-ahead**: only rolling windows that end at the current row, backward shifts and running sums.
- **per instrument**: frames are sorted by (instrument_id, ts_event) and the rolling expressions run over the
  flat columns; every row whose window could reach into the previous instrument's bars is a warm-up row (fewer
  than MAX_LOOKBACK earlier bars of its own instrument) and is dropped. The cumulative day-VWAP runs
  ``.over(instrument, day)``. The equivalence with computing each instrument alone is tested.
- **bounded memory**: the table is computed in chunks of ``CHUNK_BARS`` bars (each with the MAX_LOOKBACK bars
  before it as context) and each chunk is written as one Parquet row group while the next is computed.
- **cost**: each window statistic is computed once, as a named entry, however many features share it (polars
  does not de-duplicate rolling expressions); the query runs the entries in dependency stages and drops each
  intermediate column after its last reader. Truncated EMAs are O(n) differences of the plain EMA recursion
  (``_Ema``), not weighted windows. Measured in bench/features.py.
- Float64 inside, Float32 out; no NaN/inf reaches the table (checked before writing).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import polars as pl
import pyarrow.parquet as pq

from marketrl.data.calendars.sessions import SessionCalendar
from marketrl.data.reader import (
    DEFAULT_MAX_PRICE_JUMP,
    NS_PER_DAY,
    BarFile,
    DataConfigError,
    DataFileError,
    chunked_like,
    read_bars,
)
from marketrl.runtime.io import atomic_write

__all__ = [
    "BOOK_CATALOG",
    "BOOK_FEATURE_NAMES",
    "CATALOG",
    "CHUNK_BARS",
    "DAY_CUMULATIVE_FEATURES",
    "FEATURE_NAMES",
    "FEATURE_SET_VERSION",
    "LOOKBACKS",
    "MAX_LOOKBACK",
    "PARQUET_ZSTD_LEVEL",
    "FeatureChunks",
    "FeatureSpec",
    "build_feature_file",
    "feature_chunks",
    "feature_options",
    "non_finite_columns",
    "skipped_reason",
    "warmup_only_note",
]

FEATURE_SET_VERSION = "1.0.0"
BASE_COLUMNS = (
    "ts_event",
    "trading_day",
    "instrument_id",
    "symbol",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "bar_return",
)
# Columns of the frame the query runs on: the bars (read_bars; the book columns only for quote schemas) and the
# running day sums added per chunk (_with_day_sums). Entries read these with lookback 0.
_DAY_SUMS = ("_day_tpv", "_day_volume")
_BOOK_COLUMNS = ("bid_px", "ask_px", "bid_sz", "ask_sz")
_BAR_COLUMNS = frozenset(
    ("ts_event", "instrument_id", "open", "high", "low", "close", "volume", *_BOOK_COLUMNS, *_DAY_SUMS)
)

_LN2 = math.log(2.0)
_c = pl.col
# float64 rounding noise of the EMA difference below: values of a non-negative EMA this small relative to the
# recursion level are exactly-zero windows (the level cancels to a few hundred ulps at most).
_EMA_NOISE = 512 * 2.0**-52


@dataclass(frozen=True)
class _Ema:
    """EMA of column ``source`` with smoothing ``alpha``, truncated to its last ``window`` values, weights
    renormalized to sum 1, computed in O(n) rather than as a weighted window.

    With the untruncated recursion ``y_t = (1-a) y_{t-1} + a x_t`` (its own column, ``level``),
    ``y_t - (1-a)^w y_{t-w} = a Σ_{k<w} (1-a)^k x_{t-k}`` exactly: the window's weighted sum is a difference of two
    recursion values and everything before the window cancels. ``(1-a)^w <= e^-5`` here, so the difference
    loses no precision unless the window itself is ~0 next to the level: for ``nonnegative`` inputs such
    rounding residue is snapped to exactly 0 (flat prices then give RSI's 0/0 fallback, as a direct sum would).
    """

    source: str
    alpha: float
    window: int
    nonnegative: bool = False

    def _input(self) -> pl.Expr:
        # The only nulls are a frame's first row (diff/shift), which no output row's window reaches.
        return _c(self.source).fill_null(0.0)

    def level(self) -> pl.Expr:
        """The untruncated recursion (polars seeds y_0 = x_0)."""
        return self._input().ewm_mean(alpha=self.alpha, adjust=False)

    def truncated(self, level: str) -> pl.Expr:
        """The truncated EMA from the recursion held in column ``level``."""
        decay = (1.0 - self.alpha) ** self.window
        # y_0 = x_0 means y_{-1} = x_0: standing in for y_{t-w} at t = w-1 keeps the first full window exact.
        earlier = _c(level).shift(self.window).fill_null(self._input().first())
        windowed = _c(level) - decay * earlier
        if self.nonnegative:  # then level >= decay * earlier >= 0, so 2 * level bounds both terms
            windowed = pl.when(windowed > (2 * _EMA_NOISE) * _c(level)).then(windowed).otherwise(0.0)
        return windowed * (1.0 / (1.0 - decay))


def _span_ema(source: str, span: int) -> _Ema:
    """Classic EMA(span) (alpha = 2/(span+1)) truncated to 3*span bars (dropped tail weight ≈ e^-6 ≈ 0.25%)."""


def _span_ema(source: str, span: int) -> _Ema:
    """Classic EMA(span) (alpha = 2/(span+1)) truncated to 3*span bars (dropped tail weight ≈ e^-6 ≈ 0.25%)."""
    return _Ema(source, 2.0 / (span + 1), 3 * span)


def _wilder(source: str, n: int) -> _Ema:
    """Wilder smoothing (alpha = 1/n) of a non-negative input, truncated to 5*n bars (tail weight ≈ e^-5)."""
    return _Ema(source, 1.0 / n, 5 * n, nonnegative=True)


class _Reads:
    """The building blocks of catalog expressions. Each returns a polars expression and records the column it
    reads and how many bars before t (``back``); a truncated EMA also records the recursion column it needs one
    stage earlier (``helpers``). ``bar_ns`` is the bar size, for the one feature that measures bar spacing."""

    def __init__(self, name: str, bar_ns: int) -> None:
        self.name = name
        self.bar_ns = bar_ns
        self.back: dict[str, int] = {}
        self.helpers: dict[str, pl.Expr] = {}

    def _read(self, column: str, back: int) -> pl.Expr:
        self.back[column] = max(back, self.back.get(column, 0))
        return _c(column)

    def col(self, column: str) -> pl.Expr:
        """The column at bar t."""
        return self._read(column, 0)

    def shift(self, column: str, n: int) -> pl.Expr:
        """The column at bar t-n (null for a frame's first n rows)."""
        return self._read(column, n).shift(n)

    def diff(self, column: str) -> pl.Expr:
        """Value at t minus value at t-1."""
        return self._read(column, 1).diff()

    def rolling_sum(self, column: str, n: int) -> pl.Expr:
        """Sum over bars t-n+1..t."""
        return self._read(column, n - 1).rolling_sum(n)

    def mean(self, column: str, n: int) -> pl.Expr:
        """Rolling mean as rolling sum / n: the same value to the last bit or so, at half the cost in polars."""
        return self.rolling_sum(column, n) / n

    def rolling_mean(self, column: str, n: int) -> pl.Expr:
        """polars' own rolling mean over bars t-n+1..t."""
        return self._read(column, n - 1).rolling_mean(n)

    def std(self, column: str, n: int) -> pl.Expr:
        """Rolling sample std (ddof 1) over bars t-n+1..t."""
        # Rolling variance of a constant series can come out as a tiny negative number: clip before sqrt.
        return self._read(column, n - 1).rolling_var(n).clip(lower_bound=0.0).sqrt()

    def rolling_min(self, column: str, n: int) -> pl.Expr:
        """Minimum over bars t-n+1..t."""
        return self._read(column, n - 1).rolling_min(n)

    def rolling_max(self, column: str, n: int) -> pl.Expr:
        """Maximum over bars t-n+1..t."""
        return self._read(column, n - 1).rolling_max(n)

    def ema(self, ema: _Ema) -> pl.Expr:
        """The truncated EMA ``ema``: reads its source over its window (the recursion's earlier terms cancel)."""
        level = f"{self.name}_level"
        self.helpers[level] = ema.level()
        self._read(ema.source, ema.window - 1)
        return ema.truncated(level)


Build = Callable[[_Reads], pl.Expr]


@dataclass(frozen=True)
class FeatureSpec:
    """One column of the feature query.

    ``inputs`` maps each column the expression reads to how many bars before t it reads it; ``lookback`` is the
    most bars before t the value depends on: max over inputs of (bars back + the input's own lookback), bar
    columns counting 0. Both are recorded from ``build`` (see ``_Reads``), never written by hand.
    """

    name: str
    inputs: Mapping[str, int]
    lookback: int
    build: Build

    def expr(self, bar_ns: int) -> tuple[pl.Expr, dict[str, pl.Expr]]:
        """The expression for bars of ``bar_ns`` nanoseconds, and the helper columns it needs one stage earlier."""
        reads = _Reads(self.name, bar_ns)
        return self.build(reads).alias(self.name), reads.helpers


# Every entry by name, in definition order (an entry may read only bar columns and earlier entries).
_ENTRIES: dict[str, FeatureSpec] = {}


def _entry(name: str, build: Build) -> FeatureSpec:
    """Record ``build``'s reads, derive the lookback and register the entry."""
    if name in _ENTRIES or name in _BAR_COLUMNS:
        raise ValueError(f"feature catalog: {name!r} defined twice")
    reads = _Reads(name, bar_ns=1)  # the bar size changes no read
    build(reads)
    unknown = [column for column in reads.back if column not in _BAR_COLUMNS and column not in _ENTRIES]
    if unknown:
        raise ValueError(f"feature catalog: {name!r} reads {unknown[0]!r}, not a bar column or earlier entry")
    lookback = max(
        (
            back + (_ENTRIES[column].lookback if column in _ENTRIES else 0)
            for column, back in reads.back.items()
        ),
        default=0,
    )
    spec = FeatureSpec(name, dict(reads.back), lookback, build)
    _ENTRIES[name] = spec
    return spec


def _shared(**builds: Build) -> None:
    """Intermediate (float64) columns that several features read: each computed once, dropped after use."""
    for name, build in builds.items():
        _entry(name, build)


def _features(*entries: tuple[str, Build]) -> tuple[FeatureSpec, ...]:
    return tuple(_entry(name, build) for name, build in entries)


def _safe_div(num: pl.Expr, den: pl.Expr, fill: float = 0.0, eps: float = 0.0) -> pl.Expr:
    """num/den where |den| > eps, else ``fill`` (flat prices, zero volume, zero variance)."""
    return pl.when(den.abs() > eps).then(num / den).otherwise(fill)


def _corr(mean_a: pl.Expr, mean_b: pl.Expr, mean_ab: pl.Expr, mean_aa: pl.Expr, mean_bb: pl.Expr) -> pl.Expr:
    """Pearson correlation from rolling moments over one window; 0 where either side is flat."""
    cov = mean_ab - mean_a * mean_b
    scale = ((mean_aa - mean_a * mean_a) * (mean_bb - mean_b * mean_b)).clip(lower_bound=0.0).sqrt()
    return pl.when(scale > 1e-30).then((cov / scale).clip(-1.0, 1.0)).otherwise(0.0)


_shared(  # elementwise inputs, plus one-bar shifts
    _lc=lambda r: r.col("close").log(),
    # A frame's first row has no previous bar; it is always a warm-up/context row, so 0 is a harmless filler
    # that keeps the windows on polars' null-free path.
    _r1=lambda r: r.diff("_lc").fill_null(0.0),
    _prev_close=lambda r: r.shift("close", 1).fill_null(r.col("close")),
    _lhl=lambda r: (r.col("high") / r.col("low")).log(),
    _loc=lambda r: (r.col("close") / r.col("open")).log(),
    _lv=lambda r: r.col("volume").log1p(),
    _tpv=lambda r: (r.col("high") + r.col("low") + r.col("close")) / 3.0 * r.col("volume"),
    _range=lambda r: r.col("high") - r.col("low"),
    _ts_ns=lambda r: r.col("ts_event").cast(pl.Int64),
)
_shared(  # elementwise terms that get windowed
    _abs_r=lambda r: r.col("_r1").abs(),
    _r2=lambda r: r.col("_r1").pow(2),
    _r_lag_prod=lambda r: r.col("_r1") * r.shift("_r1", 1).fill_null(0.0),
    _gain=lambda r: r.col("_r1").clip(lower_bound=0.0),
    _loss=lambda r: (-r.col("_r1")).clip(lower_bound=0.0),
    _up=lambda r: (r.col("_r1") > 0).cast(pl.Float64),
    _signed_volume=lambda r: r.col("_r1").sign() * r.col("volume"),
    _tr=lambda r: (
        pl.max_horizontal(r.col("high"), r.col("_prev_close"))
        - pl.min_horizontal(r.col("low"), r.col("_prev_close"))
    ),
    _lhl2=lambda r: r.col("_lhl").pow(2),
    _gk=lambda r: 0.5 * r.col("_lhl").pow(2) - (2 * _LN2 - 1) * r.col("_loc").pow(2),
    _rs=lambda r: (
        (r.col("high") / r.col("close")).log() * (r.col("high") / r.col("open")).log()
        + (r.col("low") / r.col("close")).log() * (r.col("low") / r.col("open")).log()
    ),
    _abs_r_lv=lambda r: r.col("_r1").abs() * r.col("_lv"),
    _lv2=lambda r: r.col("_lv").pow(2),
)
_shared(  # truncated EMAs
    _atr_w14=lambda r: r.ema(_wilder("_tr", 14)),
    _gain_w6=lambda r: r.ema(_wilder("_gain", 6)),
    _loss_w6=lambda r: r.ema(_wilder("_loss", 6)),
    _gain_w14=lambda r: r.ema(_wilder("_gain", 14)),
    _loss_w14=lambda r: r.ema(_wilder("_loss", 14)),
    _ema12=lambda r: r.ema(_span_ema("close", 12)),
    _ema26=lambda r: r.ema(_span_ema("close", 26)),
)
_shared(  # rolling windows
    _rv5=lambda r: r.std("_r1", 5),
    _rv15=lambda r: r.std("_r1", 15),
    _rv60=lambda r: r.std("_r1", 60),
    _lhl2_mean15=lambda r: r.mean("_lhl2", 15),
    _lhl2_mean60=lambda r: r.mean("_lhl2", 60),
    _gk_mean15=lambda r: r.mean("_gk", 15),
    _rs_mean15=lambda r: r.mean("_rs", 15),
    _sma5=lambda r: r.mean("close", 5),
    _sma15=lambda r: r.mean("close", 15),
    _sma20=lambda r: r.mean("close", 20),
    _sma60=lambda r: r.mean("close", 60),
    _sd20=lambda r: r.std("close", 20),
    _ll14=lambda r: r.rolling_min("low", 14),
    _hh14=lambda r: r.rolling_max("high", 14),
    _ll60=lambda r: r.rolling_min("low", 60),
    _hh60=lambda r: r.rolling_max("high", 60),
    _up_mean15=lambda r: r.mean("_up", 15),
    _r_mean30=lambda r: r.mean("_r1", 30),
    _r2_mean30=lambda r: r.mean("_r2", 30),
    _r_lag_prod_mean30=lambda r: r.mean("_r_lag_prod", 30),
    _abs_r_sum15=lambda r: r.rolling_sum("_abs_r", 15),
    _r2_mean15=lambda r: r.mean("_r2", 15),
    _lv_mean15=lambda r: r.mean("_lv", 15),
    _lv_sd15=lambda r: r.std("_lv", 15),
    _lv2_mean15=lambda r: r.mean("_lv2", 15),
    _abs_r_lv_mean15=lambda r: r.mean("_abs_r_lv", 15),
    _volume_mean5=lambda r: r.mean("volume", 5),
    _volume_sum15=lambda r: r.rolling_sum("volume", 15),
    _volume_sum60=lambda r: r.rolling_sum("volume", 60),
    _tpv_sum15=lambda r: r.rolling_sum("_tpv", 15),
    _tpv_sum60=lambda r: r.rolling_sum("_tpv", 60),
    _signed_volume_sum15=lambda r: r.rolling_sum("_signed_volume", 15),
)
_shared(  # built on the windows
    _macd=lambda r: (r.col("_ema12") - r.col("_ema26")) / r.col("close"),
    _stoch_k=lambda r: _safe_div(r.col("close") - r.col("_ll14"), r.col("_hh14") - r.col("_ll14"), 0.5),
)
_shared(
    _macd_signal=lambda r: r.ema(_span_ema("_macd", 9)),
    _stoch_d=lambda r: r.mean("_stoch_k", 3),
)


def _ret(r: _Reads, n: int) -> pl.Expr:
    return r.col("_lc") - r.shift("_lc", n)


def _sma_ratio(r: _Reads, n: int) -> pl.Expr:
    return r.col("close") / r.col(f"_sma{n}") - 1.0


def _log_ratio_to_vwap(r: _Reads, tpv_sum: str, volume_sum: str) -> pl.Expr:
    """ln(close / VWAP) with VWAP = Σ(typical price·volume)/Σvolume; 0 when the window traded nothing."""
    volume = r.col(volume_sum)
    return pl.when(volume > 0).then((r.col("close") * volume / r.col(tpv_sum)).log()).otherwise(0.0)


def _rsi(r: _Reads, n: int) -> pl.Expr:
    gain, loss = r.col(f"_gain_w{n}"), r.col(f"_loss_w{n}")
    return _safe_div(gain, gain + loss, fill=0.5) - 0.5


def _bar_shape(r: _Reads, numerator: pl.Expr, fill: float = 0.0) -> pl.Expr:
    return _safe_div(numerator, r.col("_range"), fill)


def _time_of_day(r: _Reads) -> pl.Expr:
    return (r.col("_ts_ns") % NS_PER_DAY).cast(pl.Float64) / NS_PER_DAY * (2 * math.pi)


def _day_of_week(r: _Reads) -> pl.Expr:
    return (r.col("ts_event").dt.weekday().cast(pl.Float64) - 1.0) / 7.0 * (2 * math.pi)


# The return of the bar that just closed: a table column (BASE_COLUMNS) rather than a feature.
_BAR_RETURN = _entry("bar_return", lambda r: r.col("close") / r.col("_prev_close") - 1.0)

CATALOG: tuple[FeatureSpec, ...] = _features(
    # --- returns (log) ---
    ("ret_1", lambda r: r.col("_r1")),
    ("ret_5", lambda r: _ret(r, 5)),
    ("ret_15", lambda r: _ret(r, 15)),
    ("ret_30", lambda r: _ret(r, 30)),
    ("ret_60", lambda r: _ret(r, 60)),
    # --- volatility ---
    ("rv_5", lambda r: r.col("_rv5")),
    ("rv_15", lambda r: r.col("_rv15")),
    ("rv_60", lambda r: r.col("_rv60")),
    # polars' sliding sums can leave a tiny negative residue on a window of zeros: clamp before the sqrt.
    ("parkinson_15", lambda r: (r.col("_lhl2_mean15").clip(lower_bound=0.0) / (4 * _LN2)).sqrt()),
    ("parkinson_60", lambda r: (r.col("_lhl2_mean60").clip(lower_bound=0.0) / (4 * _LN2)).sqrt()),
    ("garman_klass_15", lambda r: r.col("_gk_mean15").clip(lower_bound=0.0).sqrt()),
    ("rogers_satchell_15", lambda r: r.col("_rs_mean15").clip(lower_bound=0.0).sqrt()),
    ("rv_ratio_5_60", lambda r: _safe_div(r.col("_rv5"), r.col("_rv60"), 1.0, eps=1e-9)),
    ("atr_14", lambda r: r.col("_atr_w14") / r.col("close")),
    # --- momentum / oscillators ---
    ("rsi_6", lambda r: _rsi(r, 6)),
    ("rsi_14", lambda r: _rsi(r, 14)),
    ("macd", lambda r: r.col("_macd")),
    ("macd_signal", lambda r: r.col("_macd_signal")),
    ("macd_hist", lambda r: r.col("_macd") - r.col("_macd_signal")),
    (
        "bb_pctb_20",
        lambda r: _safe_div(
            r.col("close") - (r.col("_sma20") - 2 * r.col("_sd20")), 4 * r.col("_sd20"), 0.5, eps=1e-12
        ),
    ),
    ("bb_width_20", lambda r: 4 * r.col("_sd20") / r.col("_sma20")),
    ("stoch_k_14", lambda r: r.col("_stoch_k")),
    ("stoch_d_3", lambda r: r.col("_stoch_d")),
    ("close_sma_5", lambda r: _sma_ratio(r, 5)),
    ("close_sma_15", lambda r: _sma_ratio(r, 15)),
    ("close_sma_60", lambda r: _sma_ratio(r, 60)),
    ("dist_high_60", lambda r: r.col("close") / r.col("_hh60") - 1.0),
    ("dist_low_60", lambda r: r.col("close") / r.col("_ll60") - 1.0),
    ("up_frac_15", lambda r: r.col("_up_mean15")),
    (
        "ret_autocorr_30",
        # The lagged side's window moments are the current side's, one bar earlier.
        lambda r: _corr(
            r.col("_r_mean30"),
            r.shift("_r_mean30", 1),
            r.col("_r_lag_prod_mean30"),
            r.col("_r2_mean30"),
            r.shift("_r2_mean30", 1),
        ),
    ),
    ("efficiency_15", lambda r: _safe_div(_ret(r, 15).abs(), r.col("_abs_r_sum15"), 0.0, eps=1e-12)),
    # --- volume / VWAP ---
    ("log_volume", lambda r: r.col("_lv")),
    (
        "volume_z_15",
        lambda r: _safe_div(r.col("_lv") - r.col("_lv_mean15"), r.col("_lv_sd15"), 0.0, eps=1e-9),
    ),
    (
        "volume_ratio_5_60",
        lambda r: ((r.col("_volume_mean5") + 1.0) / (r.col("_volume_sum60") / 60 + 1.0)).log(),
    ),
    ("vwap_dev_15", lambda r: _log_ratio_to_vwap(r, "_tpv_sum15", "_volume_sum15")),
    ("vwap_dev_60", lambda r: _log_ratio_to_vwap(r, "_tpv_sum60", "_volume_sum60")),
    # Day-cumulative: the running day sums are handed from chunk to chunk (_with_day_sums).
    ("vwap_dev_day", lambda r: _log_ratio_to_vwap(r, "_day_tpv", "_day_volume")),
    (
        "signed_volume_15",
        lambda r: _safe_div(r.col("_signed_volume_sum15"), r.col("_volume_sum15"), 0.0),
    ),
    (
        "ret_volume_corr_15",
        lambda r: _corr(
            r.col("_abs_r_sum15") / 15,
            r.col("_lv_mean15"),
            r.col("_abs_r_lv_mean15"),
            r.col("_r2_mean15"),
            r.col("_lv2_mean15"),
        ),
    ),
    # --- bar shape ---
    ("bar_body", lambda r: _bar_shape(r, r.col("close") - r.col("open"))),
    (
        "bar_upper_wick",
        lambda r: _bar_shape(r, r.col("high") - pl.max_horizontal(r.col("open"), r.col("close"))),
    ),
    (
        "bar_lower_wick",
        lambda r: _bar_shape(r, pl.min_horizontal(r.col("open"), r.col("close")) - r.col("low")),
    ),
    ("bar_close_loc", lambda r: _bar_shape(r, r.col("close") - r.col("low"), 0.5)),
    ("bar_range", lambda r: r.col("_lhl")),
    ("gap_open", lambda r: (r.col("open") / r.col("_prev_close")).log()),
    ("ret_oc", lambda r: r.col("_loc")),
    # --- calendar (UTC) and bar spacing ---
    ("tod_sin", lambda r: _time_of_day(r).sin()),
    ("tod_cos", lambda r: _time_of_day(r).cos()),
    ("dow_sin", lambda r: _day_of_week(r).sin()),
    ("dow_cos", lambda r: _day_of_week(r).cos()),
    ("bars_since_prev", lambda r: (r.diff("_ts_ns").cast(pl.Float64) / r.bar_ns).log()),
)


def _book_is_valid(r: _Reads) -> pl.Expr:
    return (
        r.col("bid_px").is_not_null()
        & r.col("ask_px").is_not_null()
        & (r.col("bid_sz") + r.col("ask_sz") > 0)
        & (r.col("bid_px") > 0)
        & (r.col("ask_px") > 0)
    )


def _mid(r: _Reads) -> pl.Expr:
    return (r.col("bid_px") + r.col("ask_px")) / 2.0


def _micro(r: _Reads) -> pl.Expr:
    return (r.col("bid_px") * r.col("ask_sz") + r.col("ask_px") * r.col("bid_sz")) / (
        r.col("bid_sz") + r.col("ask_sz")
    )


_shared(
    _book_valid=lambda r: _book_is_valid(r).fill_null(False).cast(pl.Float64),
    _book_spread_bps=lambda r: (
        pl.when(_book_is_valid(r)).then((r.col("ask_px") - r.col("bid_px")) / _mid(r) * 1e4).otherwise(0.0)
    ),
    _book_imbalance=lambda r: (
        pl.when(_book_is_valid(r))
        .then((r.col("bid_sz") - r.col("ask_sz")) / (r.col("bid_sz") + r.col("ask_sz")))
        .otherwise(0.0)
    ),
    _book_micro_dev_bps=lambda r: (
        pl.when(_book_is_valid(r)).then((_micro(r) / r.col("close") - 1.0) * 1e4).otherwise(0.0)
    ),
)
BOOK_CATALOG: tuple[FeatureSpec, ...] = _features(
    ("book_spread_bps", lambda r: r.col("_book_spread_bps")),
    ("book_spread_bps_mean_15", lambda r: r.rolling_mean("_book_spread_bps", 15)),
    ("book_imbalance", lambda r: r.col("_book_imbalance")),
    ("book_imbalance_mean_15", lambda r: r.rolling_mean("_book_imbalance", 15)),
    ("book_micro_dev_bps", lambda r: r.col("_book_micro_dev_bps")),
    ("book_valid", lambda r: r.col("_book_valid")),
)


def _reads_day_sums(spec: FeatureSpec) -> bool:
    return any(
        column in _DAY_SUMS or (column in _ENTRIES and _reads_day_sums(_ENTRIES[column]))
        for column in spec.inputs
    )


FEATURE_NAMES: tuple[str, ...] = tuple(spec.name for spec in CATALOG)
BOOK_FEATURE_NAMES: tuple[str, ...] = tuple(spec.name for spec in BOOK_CATALOG)
LOOKBACKS: dict[str, int] = {spec.name: spec.lookback for spec in (*CATALOG, *BOOK_CATALOG)}
MAX_LOOKBACK: int = max(LOOKBACKS.values())
# Context files further back than this are not context: a lookback across a gap of weeks (data of January and
# June) would mix unrelated markets. Longer than any exchange's closure (a weekend with a holiday: ~4 days).
MAX_CONTEXT_GAP = dt.timedelta(days=7)
# Cumulative since the instrument's first bar of the UTC day: their LOOKBACKS entry counts no bar before that
# day (the day sums are bar columns), the day's earlier bars they do read.
DAY_CUMULATIVE_FEATURES: tuple[str, ...] = tuple(spec.name for spec in CATALOG if _reads_day_sums(spec))

assert len(FEATURE_NAMES) == 51 and len(set(FEATURE_NAMES)) == 51, "the default feature set has 51 names"
assert not any(
    name in spec.inputs for spec in _ENTRIES.values() for name in (*FEATURE_NAMES, *BOOK_FEATURE_NAMES)
), "features are leaves: an entry that other entries read is shared, computed in float64"


@dataclass(frozen=True)
class _Stage:
    """One ``with_columns`` of the query, and the intermediate columns no later stage reads."""

    columns: tuple[pl.Expr, ...]
    drop: tuple[str, ...]


_PASSED_THROUGH = ("_bar_index", *_DAY_SUMS)


@functools.cache
def _plan(bar_ns: int, with_book: bool) -> tuple[_Stage, ...]:
    """The query's stages: every entry the outputs need, in the first stage after all it reads.

    Outputs (the features and ``bar_return``) are cast to Float32 where they are computed; the shared columns
    stay Float64 and are dropped after the stage of their last reader.
    """
    outputs = (_BAR_RETURN, *CATALOG, *(BOOK_CATALOG if with_book else ()))
    needed: dict[str, FeatureSpec] = {}
    pending = list(outputs)
    while pending:
        spec = pending.pop()
        if spec.name not in needed:
            needed[spec.name] = spec
            pending += [_ENTRIES[column] for column in spec.inputs if column in _ENTRIES]
    stage_of: dict[str, int] = {}
    columns: dict[int, list[pl.Expr]] = {}
    for spec in _ENTRIES.values():  # definition order is a topological order
        if spec.name not in needed:
            continue
        expr, helpers = spec.expr(bar_ns)
        first = 1 + max((stage_of.get(column, 0) for column in spec.inputs), default=0)
        for name, helper in helpers.items():
            columns.setdefault(first, []).append(helper.alias(name))
        stage = first + bool(helpers)  # a truncated EMA reads its recursion column (_Ema.truncated)
        is_output = spec.name in (_BAR_RETURN.name, *FEATURE_NAMES, *BOOK_FEATURE_NAMES)
        columns.setdefault(stage, []).append(expr.cast(pl.Float32) if is_output else expr)
        stage_of[spec.name] = stage
        for name in helpers:
            stage_of[name] = first
    last_read: dict[str, int] = {}
    for spec in needed.values():
        for column in spec.inputs:
            if column in needed:
                last_read[column] = max(last_read.get(column, 0), stage_of[spec.name])
        for name in spec.expr(bar_ns)[1]:
            last_read[name] = stage_of[spec.name]
    return tuple(
        _Stage(
            tuple(columns[k]),
            tuple(name for name, stage in last_read.items() if stage == k and name not in LOOKBACKS),
        )
        for k in sorted(columns)
    )


def _feature_query(frame: pl.LazyFrame, bar_ns: int, with_book: bool) -> pl.LazyFrame:
    """Lazy query over bars carrying ``_bar_index`` and the day sums (``_with_day_sums``): ``BASE_COLUMNS``, the
    features, and ``_bar_index``, ``_day_tpv``, ``_day_volume`` passed through."""
    for stage in _plan(bar_ns, with_book):
        frame = frame.with_columns(*stage.columns)
        if stage.drop:
            frame = frame.drop(*stage.drop)
    features = FEATURE_NAMES + (BOOK_FEATURE_NAMES if with_book else ())
    return frame.select(*BASE_COLUMNS, *features, *_PASSED_THROUGH)


def _starts_run(*keys: str) -> pl.Expr:
    """True on the first row of each run of equal ``keys`` (the frame is sorted by them)."""
    changed = [_c(key) != _c(key).shift(1) for key in keys]
    return pl.any_horizontal(*changed).fill_null(True)


_ROW = pl.int_range(pl.len(), dtype=pl.UInt32)
# Position of the bar within its instrument (rows sorted by instrument): row number minus the instrument's first.
_BAR_INDEX = (_ROW - pl.when(_starts_run("instrument_id")).then(_ROW).forward_fill()).alias("_bar_index")


@dataclass(frozen=True)
class _DaySums:
    """Running Σ(typical price·volume) and Σvolume of one (instrument, UTC day), up to and including some bar."""

    instrument_id: int
    trading_day: Any
    tpv: float
    volume: float

    @classmethod
    def at_end(cls, table: pl.DataFrame) -> _DaySums:
        """The sums at the last row of a feature chunk."""
        return cls(*table.select("instrument_id", "trading_day", "_day_tpv", "_day_volume").row(-1))


def _with_day_sums(frame: pl.LazyFrame, first_own: int, carry: _DaySums | None) -> pl.LazyFrame:
    """Add ``_day_tpv``, ``_day_volume`` (for ``vwap_dev_day``): Σ(typical price·volume) and Σvolume since the
    instrument's first bar of the UTC day, for a frame whose own rows start at row ``first_own``.

    Day sums are not bounded by MAX_LOOKBACK, so chunks hand them on: the context rows before ``first_own`` add
    nothing, and the previous chunk's sums (``carry``) are added to the first own row's term where that row
    continues their day. Every running sum is then the same sequence of float additions as one cumulative sum
    over the whole table.
    """
    own = _ROW >= first_own
    tpv = pl.when(own).then((_c("high") + _c("low") + _c("close")) / 3.0 * _c("volume")).otherwise(0.0)
    volume = pl.when(own).then(_c("volume")).otherwise(0.0)
    if carry is not None:
        continues = (
            (_ROW == first_own)
            & (_c("instrument_id") == carry.instrument_id)
            & (_c("trading_day") == carry.trading_day)
        )
        tpv = tpv + pl.when(continues).then(carry.tpv).otherwise(0.0)
        volume = volume + pl.when(continues).then(carry.volume).otherwise(0.0)
    day = _starts_run("instrument_id", "trading_day").cum_sum().set_sorted()  # lets polars group by slices
    # The terms are materialized first: inside .over() the row numbers above would restart at every day.
    return frame.with_columns(tpv.alias("_day_tpv"), volume.alias("_day_volume")).with_columns(
        _c("_day_tpv", "_day_volume").cum_sum().over(day)
    )


# Bars per chunk (and Parquet row group). A chunk's working set is ~0.8 KB per bar (the float64 window columns
# plus the float32 output), ~25 MB here, whatever the file's length.
CHUNK_BARS = 24576


def _feature_chunks(
    bars: pl.DataFrame, bar_ns: int, *, with_book: bool, keep: pl.Expr, chunk_bars: int
) -> Iterator[pl.DataFrame]:
    """Rows of ``bars`` (sorted, with ``_bar_index``) that satisfy ``keep``, with features, ``chunk_bars`` bars at
    a time.

    Each chunk is computed over its own bars plus the MAX_LOOKBACK bars before it, which every window of its
    first non-warm-up row fits in. Chunk boundaries are fixed multiples of ``chunk_bars`` from the first bar, so
    bars added after a row never change how that row is computed.
    """
    carry: _DaySums | None = None
    for start in range(0, bars.height, chunk_bars):
        first = max(0, start - MAX_LOOKBACK)
        frame = _with_day_sums(bars.slice(first, start + chunk_bars - first).lazy(), start - first, carry)
        table = _feature_query(frame, bar_ns, with_book).collect(
            engine="in-memory"  # the streaming engine adds ~0.1 s of set-up per query
        )
        table = table.slice(start - first)  # the chunk's own rows
        carry = _DaySums.at_end(table)
        kept = table.select(keep).to_series()
        if not kept.all():
            table = table.filter(kept)
        yield table.drop(*_PASSED_THROUGH)


def _check_positive_prices(bars: pl.DataFrame, path: Path) -> None:
    non_positive = pl.min_horizontal("open", "high", "low", "close") <= 0
    if bars.select(non_positive.any()).item():  # an aggregate first: filtering would copy the whole table
        row = bars.filter(non_positive).row(0, named=True)
        raise DataFileError(
            path,
            f"non-positive price in instrument {row['symbol']} ({row['instrument_id']}) at {row['ts_event']}; "
            "log-return features need positive prices",
        )


@dataclass(frozen=True)
class FeatureChunks:
    """The feature table of some bars, counted before any row is computed; iterate for its chunks."""

    bars: pl.DataFrame  # sorted, with _bar_index, instruments too short to give a row left out
    bar_ns: int
    with_book: bool
    keep: pl.Expr  # the table's rows: in scope (ts_event >= keep_from) and past the warm-up
    rows: int
    instruments: int  # instruments with at least one row
    dropped: list[str]  # symbols of the instruments left out (drop_short=True)
    chunk_bars: int

    def __iter__(self) -> Iterator[pl.DataFrame]:
        return _feature_chunks(
            self.bars, self.bar_ns, with_book=self.with_book, keep=self.keep, chunk_bars=self.chunk_bars
        )


def feature_chunks(
    bars: pl.DataFrame,
    bar_ns: int,
    *,
    path: Path,
    with_book: bool = False,
    keep_from: Any = None,
    drop_short: bool = False,
    chunk_bars: int | None = None,
) -> FeatureChunks:
    """Check ``bars`` (read_bars' layout, sorted by instrument and time) and count the feature table's rows:
    warm-up rows dropped, only rows with ``ts_event >= keep_from`` kept. Iterating the result computes the
    table in chunks of ``chunk_bars`` (default ``CHUNK_BARS``) bars.

    An instrument left with no rows is an error (``DataFileError`` naming ``path``), or, with
    ``drop_short=True``, left out and listed in ``dropped`` (then every instrument may be, giving no rows).
    """
    _check_positive_prices(bars, path)
    bars = bars.hstack([chunked_like(bars.select(_BAR_INDEX).to_series(), bars["ts_event"])])
    in_scope = pl.lit(True) if keep_from is None else _c("ts_event") >= keep_from
    keep = in_scope & (_c("_bar_index") >= MAX_LOOKBACK)
    counts = (
        bars.select("instrument_id", in_scope.alias("in_scope"), keep.alias("keep"))
        .group_by("instrument_id", maintain_order=True)
        .agg(pl.len().alias("total"), _c("in_scope").sum().alias("bars"), _c("keep").sum().alias("rows"))
        .filter(_c("bars") > 0)
    )
    short = counts.filter(_c("rows") == 0)
    if short.height:  # symbols only for these few (a group_by over the symbol column would copy it)
        last_rows = _c("instrument_id") != _c("instrument_id").shift(-1)
        symbols = bars.select("instrument_id", "symbol").filter(last_rows.fill_null(True))
        short = short.join(symbols, on="instrument_id", how="left", maintain_order="left")
    if short.height and not drop_short:
        row = short.row(0, named=True)
        raise DataFileError(
            path,
            f"too few bars for the lookbacks: instrument {row['symbol']} ({row['instrument_id']}) has "
            f"{row['total']} bar(s) (with context), a feature row needs {MAX_LOOKBACK} earlier bars (MAX_LOOKBACK)",
        )
    if counts.height == short.height and not drop_short:
        raise DataFileError(
            path, f"too few bars for the lookbacks: no instrument has {MAX_LOOKBACK + 1} bars"
        )
    if short.height:  # instruments are independent: leave the short ones out before computing
        bars = bars.filter(~_c("instrument_id").is_in(short["instrument_id"].implode()))
    return FeatureChunks(
        bars=bars,
        bar_ns=bar_ns,
        with_book=with_book,
        keep=keep,
        rows=int(counts["rows"].sum()),
        instruments=counts.height - short.height,
        dropped=short["symbol"].to_list() if short.height else [],
        chunk_bars=chunk_bars or CHUNK_BARS,
    )


def non_finite_columns(table: pl.DataFrame) -> list[str]:
    """The float columns of ``table`` that hold a null, NaN or ±inf, in column order."""
    value_columns = [name for name, dtype in table.schema.items() if dtype in (pl.Float32, pl.Float64)]
    # Fast path: one sum per column is finite unless a value is NaN/inf (or the sum overflows, which the exact
    # check below then clears). Null counts are metadata.
    sums = table.select(pl.col(value_columns).sum()).row(0)
    if all(math.isfinite(total) for total in sums) and not any(table[c].null_count() for c in value_columns):
        return []
    # is_finite is null for nulls and all() skips those, hence the separate null count.
    finite = table.select(pl.col(value_columns).is_finite().all()).row(0, named=True)
    return [c for c in value_columns if table[c].null_count() or not finite[c]]


def _check_finite(table: pl.DataFrame, path: Path) -> None:
    """Fail, naming the first offending column, if any float column holds a null, NaN or infinity."""
    offenders = non_finite_columns(table)
    if offenders:
        raise DataFileError(
            path, f"non-finite values in column {offenders[0]!r} ({len(offenders)} column(s) affected)"
        )


# Parquet layout (docs/FEATURES.md): float columns BYTE_STREAM_SPLIT-encoded (their bytes grouped by
# significance, which zstd compresses far better), zstd at a fast level; dictionary encoding and min/max
# statistics only on the key columns (float features have no useful dictionary or statistics).
_PARQUET_KEY_COLUMNS = ["ts_event", "trading_day", "instrument_id", "symbol"]
PARQUET_ZSTD_LEVEL = -1


def _write_chunks(chunks: Iterator[pl.DataFrame], tmp: Path, metadata: dict[str, str], path: Path) -> int:
    """Check and write each chunk as one Parquet row group; returns the rows written.

    Encoding runs on a second thread, overlapping the next chunk's features; at most one chunk waits for it.
    """
    writer: pq.ParquetWriter | None = None
    rows = 0
    try:
        with ThreadPoolExecutor(max_workers=1) as encoder:
            pending: Future[None] | None = None
            for chunk in chunks:
                if chunk.height == 0:
                    continue
                _check_finite(chunk, path)
                table = chunk.to_arrow()
                if writer is None:
                    writer = pq.ParquetWriter(
                        tmp,
                        table.schema.with_metadata(metadata),
                        compression="zstd",
                        compression_level=PARQUET_ZSTD_LEVEL,
                        use_dictionary=_PARQUET_KEY_COLUMNS,
                        write_statistics=_PARQUET_KEY_COLUMNS,
                        use_byte_stream_split=[
                            name for name, dtype in chunk.schema.items() if dtype in (pl.Float32, pl.Float64)
                        ],
                    )
                if pending is not None:
                    pending.result()
                pending = encoder.submit(writer.write_table, table)
                rows += chunk.height
            if pending is not None:
                pending.result()
    finally:
        if writer is not None:  # after the encoder thread has finished (the with block waits for it)
            writer.close()
    return rows


OnBadFile = Literal["error", "skip"]
ON_BAD_FILE_KEY = "data.on_bad_file"


def feature_options(data: Mapping[str, Any]) -> dict[str, Any]:
    """The ``build_feature_file`` keyword arguments that the ``data`` config section sets (bar_size, session,
    max_price_jump, on_bad_file); absent keys keep the defaults."""
    options: dict[str, Any] = {}
    if "bar_size" in data:
        options["bar_size"] = data["bar_size"]
    if data.get("session"):
        options["session"] = dict(data["session"])
    if "max_price_jump" in data:
        options["max_price_jump"] = float(data["max_price_jump"])
    if "on_bad_file" in data:
        if data["on_bad_file"] not in ("error", "skip"):
            raise ValueError(f"{ON_BAD_FILE_KEY}: expected 'error' or 'skip', got {data['on_bad_file']!r}")
        options["on_bad_file"] = data["on_bad_file"]
    return options


def _empty_feature_table(with_book: bool) -> pl.DataFrame:
    """A feature table with no rows: the columns and types ``build_feature_file`` writes."""
    columns: dict[str, Any] = {
        "ts_event": pl.Datetime("ns", "UTC"),
        "trading_day": pl.Date,
        "instrument_id": pl.UInt32,
        "symbol": pl.String,
        **dict.fromkeys(("open", "high", "low", "close", "volume"), pl.Float64),
        "bar_return": pl.Float32,
        **dict.fromkeys(FEATURE_NAMES + (BOOK_FEATURE_NAMES if with_book else ()), pl.Float32),
    }
    return pl.DataFrame(schema=columns)


def skipped_reason(feature_file: str | Path) -> str | None:
    """Why ``build_feature_file`` skipped the source of ``feature_file`` (``on_bad_file="skip"``), else None."""
    metadata = pq.read_schema(feature_file).metadata or {}  # tables written elsewhere may carry none
    return metadata.get(b"marketrl.skipped", b"").decode() or None


def _check_scale_continuity(
    prev: pl.DataFrame, current: pl.DataFrame, src: Path, prev_path: Path, max_jump: float
) -> None:
    """The first bar of each instrument against its last bar in the previous file: a jump beyond ``max_jump``
    is a change of price scale (e.g. a file in cents after one in dollars), not a market move."""
    if max_jump <= 0 or prev.height == 0 or current.height == 0:
        return
    last = prev.group_by("instrument_id").agg(pl.col("close").last().alias("prev_close"))
    first = current.group_by("instrument_id").agg(pl.col("open").first(), pl.col("symbol").first())
    joined = first.join(last, on="instrument_id", how="inner")
    ratio = (_c("open") / _c("prev_close")).log().abs()
    bad = joined.filter(ratio > math.log(max_jump))
    if bad.height:
        row = bad.sort("instrument_id").row(0, named=True)
        raise DataFileError(
            src,
            f"price of {row['symbol']} ({row['instrument_id']}) jumps more than {max_jump:g}x from the previous "
            f"file {prev_path.name} ({row['prev_close']} -> {row['open']}): a price-scale change between files "
            "(limit: data.max_price_jump)",
        )


def build_feature_file(
    src: Path,
    dst: Path,
    *,
    bar_size: str = "1m",
    context_srcs: Sequence[Path] = (),
    prev_src: Path | None = None,
    session: SessionCalendar | Mapping[str, Any] | None = None,
    max_price_jump: float = DEFAULT_MAX_PRICE_JUMP,
    on_bad_file: OnBadFile = "error",
) -> dict[str, Any]:
    """Decode ``src`` once, featurize it and atomically write ``dst`` (zstd Parquet with provenance metadata).

    ``context_srcs`` are the files before ``src`` of the same dataset/schema, in time order (e.g. the previous
    days; ``prev_src`` is shorthand for one): decoded newest first, only as many as the lookbacks need (see
    ``_read_context``), they let lookbacks run across file boundaries; only ``src``'s bars are written.
    ``session`` (the ``data.session`` config; None: the dataset's calendar) sets ``trading_day``;
    ``max_price_jump`` bounds price moves within a file and across each file boundary. Returns a summary
    (rows, instruments, schema, dbn_version, sha256, context, skipped, warmup_only, ...).

    Rows need ``MAX_LOOKBACK`` earlier bars of their instrument, context included: an instrument whose bars
    are all warm-up (a contract first seen near the end of the file, or the start of the data) is left out
    and listed in ``warmup_instruments``; a file with no row at all (the first file(s) of the data) gives an
    empty table whose metadata (``marketrl.warmup_only``, see ``warmup_only_note``) and summary
    (``warmup_only``) say so: its bars only serve as the next file's context.

    A bad or untradable ``src`` raises ``DataFileError`` (nothing is written) with ``on_bad_file="error"``;
    with ``"skip"`` it yields an empty feature table whose metadata (``marketrl.skipped``, see
    ``skipped_reason``) and summary (``skipped``) say why, and an unreadable context file only loses the
    context from it on back. Features are computed and written in chunks of ``CHUNK_BARS`` bars, so memory
    beyond the bars stays bounded however long the file is.
    """
    src, dst = Path(src), Path(dst)
    if on_bad_file not in ("error", "skip"):
        raise ValueError(f"{ON_BAD_FILE_KEY}: expected 'error' or 'skip', got {on_bad_file!r}")
    if prev_src is not None:
        if context_srcs:
            raise ValueError("build_feature_file: give context_srcs or prev_src, not both")
        context_srcs = [prev_src]
    options = {"session": session, "max_price_jump": max_price_jump}
    try:
        return _build_feature_file(src, dst, bar_size, [Path(p) for p in context_srcs], options, on_bad_file)
    except DataFileError as exc:
        if on_bad_file == "error" or exc.path != src or isinstance(exc, DataConfigError):
            raise
        return _write_skipped(src, dst, bar_size, exc)


def _write_skipped(src: Path, dst: Path, bar_size: str, exc: DataFileError) -> dict[str, Any]:
    """The empty feature table of a skipped file, with the reason in its metadata."""
    reason = exc.fault.removesuffix(_SKIP_HINT)
    metadata = {
        "marketrl.feature_set_version": FEATURE_SET_VERSION,
        "marketrl.source_file": src.name,
        "marketrl.bar_size": bar_size,
        "marketrl.rows": "0",
        "marketrl.skipped": reason,
    }
    table = _empty_feature_table(with_book=False).to_arrow()
    with atomic_write(dst) as tmp:
        pq.write_table(table.replace_schema_metadata(metadata), tmp, compression="zstd")
    logging.getLogger(__name__).warning("%s: skipped (%s: skip): %s", src, ON_BAD_FILE_KEY, reason)
    return {
        "rows": 0,
        "instruments": 0,
        "features": len(FEATURE_NAMES),
        "bar_size": bar_size,
        "warmup_only": None,
        "skipped": reason,
    }


_SKIP_HINT = f"; set {ON_BAD_FILE_KEY}: skip to skip such files"


def warmup_only_note(feature_file: str | Path) -> str | None:
    """Why the feature table of ``feature_file`` has no rows when every bar of its source is warm-up (the
    first file(s) of the data, kept as context for the next), else None."""
    metadata = pq.read_schema(feature_file).metadata or {}  # tables written elsewhere may carry none
    return metadata.get(b"marketrl.warmup_only", b"").decode() or None


@dataclass(frozen=True)
class _Context:
    """The bars of earlier files that a file's lookbacks reach, and the files they come from (time order)."""

    bars: list[pl.DataFrame]  # one frame per file, oldest first, each strictly before the next file's start
    files: list[dict[str, str]]  # {"file": name, "sha256": ...}, oldest first


def _read_context(
    current: BarFile,
    context_srcs: Sequence[Path],
    bar_size: str,
    options: dict[str, Any],
    on_bad_file: OnBadFile,
) -> _Context:
    """Decode ``context_srcs`` (in time order) newest first, stopping as soon as every instrument of
    ``current`` seen in the context so far has ``MAX_LOOKBACK`` context bars and the context reaches back
    before the current file's first trading day (the day-VWAP sums the whole session, which can span three
    UTC-day files after a Monday holiday), or the files run out.

    A file contributes only its bars strictly before the first bar of the next newer one (files may overlap),
    and each boundary is checked for a price-scale change. An unusable context file (``on_bad_file="skip"``)
    ends the context there, with a warning: going past it would leave a hole in the lookbacks.
    """
    log = logging.getLogger(__name__)
    src = current.path
    wanted = set(current.bars["instrument_id"].unique().to_list())
    counts: dict[int, int] = {}
    parts: list[pl.DataFrame] = []
    files: list[dict[str, str]] = []
    newer, newer_path, cutoff = current.bars, src, current.bars["ts_event"].min()
    first_day = current.bars["trading_day"].min()
    for path in reversed(context_srcs):
        try:
            earlier = read_bars(path, bar_size, **options)
        except DataFileError as exc:
            if on_bad_file == "error" or isinstance(exc, DataConfigError):
                raise
            log.warning("%s: context file unusable, no context from it on back: %s", src, exc)
            break
        if (earlier.schema, earlier.dataset) != (current.schema, current.dataset):
            raise DataFileError(
                src,
                f"context file {earlier.path} is {earlier.dataset}/{earlier.schema}, "
                f"expected {current.dataset}/{current.schema}",
            )
        part = earlier.bars.filter(_c("ts_event") < cutoff)
        if part.height and cutoff - part["ts_event"].max() > MAX_CONTEXT_GAP:
            log.info(
                "%s: no context from %s on back: more than %s before", src, earlier.path.name, MAX_CONTEXT_GAP
            )
            break
        try:
            _check_scale_continuity(part, newer, newer_path, earlier.path, options["max_price_jump"])
        except DataFileError as exc:
            if newer_path == src or on_bad_file == "error":
                raise
            log.warning("%s: no context from %s on back: %s", src, earlier.path.name, exc)
            break
        parts.append(part)
        files.append({"file": earlier.path.name, "sha256": earlier.sha256})
        if part.height:
            newer, newer_path, cutoff = part, earlier.path, part["ts_event"].min()
        for instrument, n in part.group_by("instrument_id").len().iter_rows():
            counts[instrument] = counts.get(instrument, 0) + n
        seen = [counts[i] for i in wanted if i in counts]
        day_covered = part.height > 0 and part["trading_day"].min() < first_day
        if seen and min(seen) >= MAX_LOOKBACK and day_covered:
            break
    return _Context(bars=parts[::-1], files=files[::-1])


def _build_feature_file(
    src: Path,
    dst: Path,
    bar_size: str,
    context_srcs: Sequence[Path],
    options: dict[str, Any],
    on_bad_file: OnBadFile,
) -> dict[str, Any]:
    current = read_bars(src, bar_size, **options)
    if current.bars.height == 0:
        raise DataFileError(
            src,
            f"no tradable bars in this {current.schema} file (a holiday, or snapshots only?)"
            + (_SKIP_HINT if on_bad_file == "error" else ""),
        )
    context = _read_context(current, context_srcs, bar_size, options, on_bad_file)
    bars, keep_from = current.bars, None
    if context.files:
        keep_from = bars["ts_event"].min()
        bars = pl.concat([*context.bars, bars], how="vertical").sort(
            "instrument_id", "ts_event", maintain_order=True
        )
    del context.bars[:]  # the concatenation holds them from here on
    # Instruments without a row have only warm-up bars: left out and listed, never an error (a contract
    # first traded near the end of the file gets its rows in the next file, with this one as context).
    selection = feature_chunks(
        bars, current.bar_ns, path=src, with_book=current.has_book, keep_from=keep_from, drop_short=True
    )
    del bars  # the selection holds the bars (with _bar_index) from here on
    feature_names = list(FEATURE_NAMES) + (list(BOOK_FEATURE_NAMES) if current.has_book else [])
    metadata = {
        "marketrl.feature_set_version": FEATURE_SET_VERSION,
        "marketrl.source_file": src.name,
        "marketrl.source_sha256": current.sha256,
        "marketrl.schema": current.schema,
        "marketrl.dataset": current.dataset,
        "marketrl.dbn_version": str(current.dbn_version),
        "marketrl.bar_size": bar_size,
        "marketrl.rows": str(selection.rows),
        "marketrl.max_lookback": str(MAX_LOOKBACK),
        "marketrl.feature_names": ",".join(feature_names),
        "marketrl.session": json.dumps(current.calendar.to_config() if current.calendar else None),
        "marketrl.dropped_outside_session": str(current.dropped_outside_session),
        "marketrl.dropped_in_halt": str(current.dropped_in_halt),
        "marketrl.context_files": json.dumps(context.files),
        "marketrl.warmup_instruments": json.dumps(selection.dropped),
    }
    if context.files:  # the nearest earlier file, as before multi-file context
        metadata["marketrl.prev_source_file"] = context.files[-1]["file"]
        metadata["marketrl.prev_source_sha256"] = context.files[-1]["sha256"]
    warmup_only = None
    if selection.rows == 0:
        warmup_only = (
            f"all {current.bars.height} bars are warm-up (fewer than {MAX_LOOKBACK} earlier bars per "
            f"instrument with {len(context.files)} context file(s)): context for the next file"
        )
        metadata["marketrl.warmup_only"] = warmup_only
        logging.getLogger(__name__).info("%s: no feature rows, %s", src, warmup_only)
    elif selection.dropped:
        logging.getLogger(__name__).info(
            "%s: only warm-up bars, no rows yet: %s", src, ", ".join(selection.dropped)
        )
    with atomic_write(dst) as tmp:
        if selection.rows == 0:
            table = _empty_feature_table(with_book=current.has_book).to_arrow()
            pq.write_table(table.replace_schema_metadata(metadata), tmp, compression="zstd")
        else:
            written = _write_chunks(iter(selection), tmp, metadata, src)
            if written != selection.rows:  # inside the block: a wrong file is never renamed into place
                raise RuntimeError(f"{src}: wrote {written} feature rows, counted {selection.rows}")
    return {
        "rows": selection.rows,
        "instruments": selection.instruments,
        "schema": current.schema,
        "dataset": current.dataset,
        "dbn_version": current.dbn_version,
        "sha256": current.sha256,
        "context": context.files,
        "prev_sha256": context.files[-1]["sha256"] if context.files else None,
        "bar_size": bar_size,
        "features": len(feature_names),
        "records": current.records,
        "dropped_undef_ts": current.dropped_undef_ts,
        "dropped_outside_session": current.dropped_outside_session,
        "dropped_in_halt": current.dropped_in_halt,
        "warmup_instruments": selection.dropped,
        "warmup_only": warmup_only,
        "skipped": None,
    }
