"""The 51 bar features (plus a book group for quote schemas), and the DBN.zst → Parquet stage that caches them.

Every feature is a polars expression over one instrument's bars, listed with its formula and lookback in
docs/FEATURES.md. Design points:

- **finite lookback**: every feature at bar t reads bars t-L..t with ``L <= MAX_LOOKBACK``. EMAs (MACD, RSI, ATR)
  are truncated to a fixed window with renormalized weights, so a row depends on a bounded history; this makes
  a day file featurized with its previous day as context give the same rows as one long file.
- **no look-ahead**: only rolling windows that end at the current row, backward shifts and running sums.
- **per instrument**: frames are sorted by (instrument_id, ts_event) and the rolling expressions run over the
  flat columns; every row whose window could reach into the previous instrument's bars is a warm-up row (fewer
  than MAX_LOOKBACK earlier bars of its own instrument) and is dropped. The cumulative day-VWAP runs
  ``.over(instrument, day)``. The equivalence with computing each instrument alone is tested.
- **bounded memory**: the table is computed in chunks of ``CHUNK_BARS`` bars (each with the MAX_LOOKBACK bars
  before it as context) and each chunk is written as one Parquet row group while the next is computed.
- **cost**: each window statistic is computed once, as a named column; truncated EMAs are O(n) differences of
  the plain EMA recursion (``_Ema``), not weighted windows. Measured in bench/features.py.
- Float64 inside, Float32 out; no NaN/inf reaches the table (checked before writing).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from marketrl.data.reader import NS_PER_DAY, DataFileError, chunked_like, read_bars
from marketrl.io import atomic_write

__all__ = [
    "BOOK_FEATURE_NAMES",
    "CHUNK_BARS",
    "DAY_CUMULATIVE_FEATURES",
    "FEATURE_NAMES",
    "FEATURE_SET_VERSION",
    "LOOKBACKS",
    "MAX_LOOKBACK",
    "PARQUET_ZSTD_LEVEL",
    "build_feature_file",
    "compute_features",
    "featurize_bars",
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
    return _Ema(source, 2.0 / (span + 1), 3 * span)


def _wilder(source: str, n: int) -> _Ema:
    """Wilder smoothing (alpha = 1/n) of a non-negative input, truncated to 5*n bars (tail weight ≈ e^-5)."""
    return _Ema(source, 1.0 / n, 5 * n, nonnegative=True)


def _levels(emas: dict[str, _Ema]) -> dict[str, pl.Expr]:
    return {f"{name}_level": ema.level() for name, ema in emas.items()}


def _truncated(emas: dict[str, _Ema]) -> dict[str, pl.Expr]:
    return {name: ema.truncated(f"{name}_level") for name, ema in emas.items()}


def _safe_div(num: pl.Expr, den: pl.Expr, fill: float = 0.0, eps: float = 0.0) -> pl.Expr:
    """num/den where |den| > eps, else ``fill`` (flat prices, zero volume, zero variance)."""
    return pl.when(den.abs() > eps).then(num / den).otherwise(fill)


def _std(x: pl.Expr, window: int) -> pl.Expr:
    # Rolling variance of a constant series can come out as a tiny negative number: clip before sqrt.
    return x.rolling_var(window).clip(lower_bound=0.0).sqrt()


def _mean(column: str, window: int) -> pl.Expr:
    """Rolling mean as rolling sum / window: the same value to the last bit or so, at half the cost in polars."""
    return _c(column).rolling_sum(window) / window


def _corr(mean_a: pl.Expr, mean_b: pl.Expr, mean_ab: pl.Expr, mean_aa: pl.Expr, mean_bb: pl.Expr) -> pl.Expr:
    """Pearson correlation from rolling moments over one window; 0 where either side is flat."""
    cov = mean_ab - mean_a * mean_b
    scale = ((mean_aa - mean_a * mean_a) * (mean_bb - mean_b * mean_b)).clip(lower_bound=0.0).sqrt()
    return pl.when(scale > 1e-30).then((cov / scale).clip(-1.0, 1.0)).otherwise(0.0)


def _columns(**exprs: pl.Expr) -> dict[str, pl.Expr]:
    return exprs


# The query runs in stages so that every window statistic is computed once, as a named column, however many
# features share it (polars does not de-duplicate rolling expressions). Lookbacks in bars are in the comments.
_INPUTS = _columns(  # elementwise, plus one-bar shifts
    _lc=_c("close").log(),  # 0
    # A frame's first row has no previous bar; it is always a warm-up/context row, so 0 is a harmless filler
    # that keeps the windows on polars' null-free path.
    _r1=_c("close").log().diff().fill_null(0.0),  # 1
    _prev_close=_c("close").shift(1).fill_null(_c("close")),  # 1
    _lhl=(_c("high") / _c("low")).log(),  # 0
    _loc=(_c("close") / _c("open")).log(),  # 0
    _lv=_c("volume").log1p(),  # 0
    _tpv=(_c("high") + _c("low") + _c("close")) / 3.0 * _c("volume"),  # 0
    _range=_c("high") - _c("low"),  # 0
)
_TERMS = _columns(  # elementwise terms of the inputs that get windowed
    _abs_r=_c("_r1").abs(),  # 1
    _r2=_c("_r1").pow(2),  # 1
    _r_lag_prod=_c("_r1") * _c("_r1").shift(1).fill_null(0.0),  # 2
    _gain=_c("_r1").clip(lower_bound=0.0),  # 1
    _loss=(-_c("_r1")).clip(lower_bound=0.0),  # 1
    _up=(_c("_r1") > 0).cast(pl.Float64),  # 1
    _signed_volume=_c("_r1").sign() * _c("volume"),  # 1
    _tr=pl.max_horizontal("high", "_prev_close") - pl.min_horizontal("low", "_prev_close"),  # 1
    _lhl2=_c("_lhl").pow(2),  # 0
    _gk=0.5 * _c("_lhl").pow(2) - (2 * _LN2 - 1) * _c("_loc").pow(2),  # 0
    _rs=(_c("high") / _c("close")).log() * (_c("high") / _c("open")).log()
    + (_c("low") / _c("close")).log() * (_c("low") / _c("open")).log(),  # 0
    _abs_r_lv=_c("_r1").abs() * _c("_lv"),  # 1
    _lv2=_c("_lv").pow(2),  # 0
)
_EMAS = {  # truncated EMAs of the inputs and terms
    "_atr_w14": _wilder("_tr", 14),  # 70
    "_gain_w6": _wilder("_gain", 6),  # 30
    "_loss_w6": _wilder("_loss", 6),  # 30
    "_gain_w14": _wilder("_gain", 14),  # 70
    "_loss_w14": _wilder("_loss", 14),  # 70
    "_ema12": _span_ema("close", 12),  # 35
    "_ema26": _span_ema("close", 26),  # 77
}
_WINDOWS = _columns(  # every rolling window, once
    _rv5=_std(_c("_r1"), 5),  # 5
    _rv15=_std(_c("_r1"), 15),  # 15
    _rv60=_std(_c("_r1"), 60),  # 60
    _lhl2_mean15=_mean("_lhl2", 15),  # 14
    _lhl2_mean60=_mean("_lhl2", 60),  # 59
    _gk_mean15=_mean("_gk", 15),  # 14
    _rs_mean15=_mean("_rs", 15),  # 14
    _sma5=_mean("close", 5),  # 4
    _sma15=_mean("close", 15),  # 14
    _sma20=_mean("close", 20),  # 19
    _sma60=_mean("close", 60),  # 59
    _sd20=_std(_c("close"), 20),  # 19
    _ll14=_c("low").rolling_min(14),  # 13
    _hh14=_c("high").rolling_max(14),  # 13
    _ll60=_c("low").rolling_min(60),  # 59
    _hh60=_c("high").rolling_max(60),  # 59
    _up_mean15=_mean("_up", 15),  # 15
    _r_mean30=_mean("_r1", 30),  # 30
    _r2_mean30=_mean("_r2", 30),  # 30
    _r_lag_prod_mean30=_mean("_r_lag_prod", 30),  # 31
    _abs_r_sum15=_c("_abs_r").rolling_sum(15),  # 15
    _r2_mean15=_mean("_r2", 15),  # 15
    _lv_mean15=_mean("_lv", 15),  # 14
    _lv_sd15=_std(_c("_lv"), 15),  # 14
    _lv2_mean15=_mean("_lv2", 15),  # 14
    _abs_r_lv_mean15=_mean("_abs_r_lv", 15),  # 15
    _volume_mean5=_mean("volume", 5),  # 4
    _volume_sum15=_c("volume").rolling_sum(15),  # 14
    _volume_sum60=_c("volume").rolling_sum(60),  # 59
    _tpv_sum15=_c("_tpv").rolling_sum(15),  # 14
    _tpv_sum60=_c("_tpv").rolling_sum(60),  # 59
    _signed_volume_sum15=_c("_signed_volume").rolling_sum(15),  # 15
)
_DERIVED = _columns(
    _macd=(_c("_ema12") - _c("_ema26")) / _c("close"),  # 77
    _stoch_k=_safe_div(_c("close") - _c("_ll14"), _c("_hh14") - _c("_ll14"), 0.5),  # 13
)
_DERIVED_EMAS = {"_macd_signal": _span_ema("_macd", 9)}  # 77 + 26
_DERIVED_WINDOWS = _columns(_stoch_d=_mean("_stoch_k", 3))  # 15


def _ret(n: int) -> pl.Expr:
    return _c("_lc") - _c("_lc").shift(n)


def _sma_ratio(n: int) -> pl.Expr:
    return _c("close") / _c(f"_sma{n}") - 1.0


def _log_ratio_to_vwap(tpv_sum: pl.Expr, volume_sum: pl.Expr) -> pl.Expr:
    """ln(close / VWAP) with VWAP = Σ(typical price·volume)/Σvolume; 0 when the window traded nothing."""
    return pl.when(volume_sum > 0).then((_c("close") * volume_sum / tpv_sum).log()).otherwise(0.0)


def _vwap_dev(n: int) -> pl.Expr:
    return _log_ratio_to_vwap(_c(f"_tpv_sum{n}"), _c(f"_volume_sum{n}"))


def _rsi(n: int) -> pl.Expr:
    gain, loss = _c(f"_gain_w{n}"), _c(f"_loss_w{n}")
    return _safe_div(gain, gain + loss, fill=0.5) - 0.5


def _bar_shape(numerator: pl.Expr, fill: float = 0.0) -> pl.Expr:
    return _safe_div(numerator, _c("_range"), fill)


@dataclass(frozen=True)
class _Feature:
    name: str
    lookback: int  # bars before t the value may read
    expr: Callable[[int], pl.Expr]  # bar_ns → expression


def _f(name: str, lookback: int, expr: pl.Expr | Callable[[int], pl.Expr]) -> _Feature:
    return _Feature(name, lookback, expr if callable(expr) else (lambda _bar_ns, e=expr: e))


_TIME_OF_DAY = (pl.col("ts_event").cast(pl.Int64) % NS_PER_DAY).cast(pl.Float64) / NS_PER_DAY * (2 * math.pi)
_DAY_OF_WEEK = (pl.col("ts_event").dt.weekday().cast(pl.Float64) - 1.0) / 7.0 * (2 * math.pi)

_FEATURES: tuple[_Feature, ...] = (
    # --- returns (log) ---
    _f("ret_1", 1, _c("_r1")),
    _f("ret_5", 5, _ret(5)),
    _f("ret_15", 15, _ret(15)),
    _f("ret_30", 30, _ret(30)),
    _f("ret_60", 60, _ret(60)),
    # --- volatility ---
    _f("rv_5", 5, _c("_rv5")),
    _f("rv_15", 15, _c("_rv15")),
    _f("rv_60", 60, _c("_rv60")),
    _f("parkinson_15", 14, (_c("_lhl2_mean15") / (4 * _LN2)).sqrt()),
    _f("parkinson_60", 59, (_c("_lhl2_mean60") / (4 * _LN2)).sqrt()),
    _f("garman_klass_15", 14, _c("_gk_mean15").clip(lower_bound=0.0).sqrt()),
    _f("rogers_satchell_15", 14, _c("_rs_mean15").clip(lower_bound=0.0).sqrt()),
    _f("rv_ratio_5_60", 60, _safe_div(_c("_rv5"), _c("_rv60"), 1.0, eps=1e-9)),
    _f("atr_14", 70, _c("_atr_w14") / _c("close")),
    # --- momentum / oscillators ---
    _f("rsi_6", 30, _rsi(6)),
    _f("rsi_14", 70, _rsi(14)),
    _f("macd", 77, _c("_macd")),
    _f("macd_signal", 77 + 26, _c("_macd_signal")),
    _f("macd_hist", 77 + 26, _c("_macd") - _c("_macd_signal")),
    _f(
        "bb_pctb_20",
        19,
        _safe_div(_c("close") - (_c("_sma20") - 2 * _c("_sd20")), 4 * _c("_sd20"), 0.5, eps=1e-12),
    ),
    _f("bb_width_20", 19, 4 * _c("_sd20") / _c("_sma20")),
    _f("stoch_k_14", 13, _c("_stoch_k")),
    _f("stoch_d_3", 15, _c("_stoch_d")),
    _f("close_sma_5", 4, _sma_ratio(5)),
    _f("close_sma_15", 14, _sma_ratio(15)),
    _f("close_sma_60", 59, _sma_ratio(60)),
    _f("dist_high_60", 59, _c("close") / _c("_hh60") - 1.0),
    _f("dist_low_60", 59, _c("close") / _c("_ll60") - 1.0),
    _f("up_frac_15", 15, _c("_up_mean15")),
    _f(
        "ret_autocorr_30",
        31,
        # The lagged side's window moments are the current side's, one bar earlier.
        _corr(
            _c("_r_mean30"),
            _c("_r_mean30").shift(1),
            _c("_r_lag_prod_mean30"),
            _c("_r2_mean30"),
            _c("_r2_mean30").shift(1),
        ),
    ),
    _f("efficiency_15", 15, _safe_div(_ret(15).abs(), _c("_abs_r_sum15"), 0.0, eps=1e-12)),
    # --- volume / VWAP ---
    _f("log_volume", 0, _c("_lv")),
    _f("volume_z_15", 14, _safe_div(_c("_lv") - _c("_lv_mean15"), _c("_lv_sd15"), 0.0, eps=1e-9)),
    _f("volume_ratio_5_60", 59, ((_c("_volume_mean5") + 1.0) / (_c("_volume_sum60") / 60 + 1.0)).log()),
    _f("vwap_dev_15", 14, _vwap_dev(15)),
    _f("vwap_dev_60", 59, _vwap_dev(60)),
    # Day-cumulative: the running day sums are handed from chunk to chunk (_with_day_sums).
    _f("vwap_dev_day", 0, _log_ratio_to_vwap(_c("_day_tpv"), _c("_day_volume"))),
    _f("signed_volume_15", 15, _safe_div(_c("_signed_volume_sum15"), _c("_volume_sum15"), 0.0)),
    _f(
        "ret_volume_corr_15",
        15,
        _corr(
            _c("_abs_r_sum15") / 15,
            _c("_lv_mean15"),
            _c("_abs_r_lv_mean15"),
            _c("_r2_mean15"),
            _c("_lv2_mean15"),
        ),
    ),
    # --- bar shape ---
    _f("bar_body", 0, _bar_shape(_c("close") - _c("open"))),
    _f("bar_upper_wick", 0, _bar_shape(_c("high") - pl.max_horizontal("open", "close"))),
    _f("bar_lower_wick", 0, _bar_shape(pl.min_horizontal("open", "close") - _c("low"))),
    _f("bar_close_loc", 0, _bar_shape(_c("close") - _c("low"), 0.5)),
    _f("bar_range", 0, _c("_lhl")),
    _f("gap_open", 1, (_c("open") / _c("_prev_close")).log()),
    _f("ret_oc", 0, _c("_loc")),
    # --- calendar (UTC) and bar spacing ---
    _f("tod_sin", 0, _TIME_OF_DAY.sin()),
    _f("tod_cos", 0, _TIME_OF_DAY.cos()),
    _f("dow_sin", 0, _DAY_OF_WEEK.sin()),
    _f("dow_cos", 0, _DAY_OF_WEEK.cos()),
    _f(
        "bars_since_prev",
        1,
        lambda bar_ns: (_c("ts_event").cast(pl.Int64).diff().cast(pl.Float64) / bar_ns).log(),
    ),
)

_BOOK_VALID = (
    pl.col("bid_px").is_not_null()
    & pl.col("ask_px").is_not_null()
    & (pl.col("bid_sz") + pl.col("ask_sz") > 0)
    & (pl.col("bid_px") > 0)
    & (pl.col("ask_px") > 0)
)
_MID = (pl.col("bid_px") + pl.col("ask_px")) / 2.0
_MICRO = (pl.col("bid_px") * pl.col("ask_sz") + pl.col("ask_px") * pl.col("bid_sz")) / (
    pl.col("bid_sz") + pl.col("ask_sz")
)
_BOOK_HELPERS: dict[str, pl.Expr] = {
    "book_valid": _BOOK_VALID.fill_null(False).cast(pl.Float64),
    "book_spread_bps": pl.when(_BOOK_VALID)
    .then((pl.col("ask_px") - pl.col("bid_px")) / _MID * 1e4)
    .otherwise(0.0),
    "book_imbalance": pl.when(_BOOK_VALID)
    .then((pl.col("bid_sz") - pl.col("ask_sz")) / (pl.col("bid_sz") + pl.col("ask_sz")))
    .otherwise(0.0),
    "book_micro_dev_bps": pl.when(_BOOK_VALID).then((_MICRO / pl.col("close") - 1.0) * 1e4).otherwise(0.0),
}
_BOOK_FEATURES: tuple[_Feature, ...] = (
    _f("book_spread_bps", 0, pl.col("book_spread_bps")),
    _f("book_spread_bps_mean_15", 14, pl.col("book_spread_bps").rolling_mean(15)),
    _f("book_imbalance", 0, pl.col("book_imbalance")),
    _f("book_imbalance_mean_15", 14, pl.col("book_imbalance").rolling_mean(15)),
    _f("book_micro_dev_bps", 0, pl.col("book_micro_dev_bps")),
    _f("book_valid", 0, pl.col("book_valid")),
)

FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in _FEATURES)
BOOK_FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in _BOOK_FEATURES)
LOOKBACKS: dict[str, int] = {f.name: f.lookback for f in (*_FEATURES, *_BOOK_FEATURES)}
MAX_LOOKBACK: int = max(LOOKBACKS.values())
# Cumulative since the instrument's first bar of the UTC day (its LOOKBACKS entry is 0: no bars before that day).
DAY_CUMULATIVE_FEATURES: tuple[str, ...] = ("vwap_dev_day",)

assert len(FEATURE_NAMES) == 51 and len(set(FEATURE_NAMES)) == 51, "the default feature set has 51 names"


def _feature_query(frame: pl.LazyFrame, bar_ns: int, with_book: bool) -> pl.LazyFrame:
    """Lazy query over bars carrying ``_bar_index`` and the day sums (``_with_day_sums``): ``BASE_COLUMNS``, the
    features, and ``_bar_index``, ``_day_tpv``, ``_day_volume`` passed through."""
    features = (*_FEATURES, *_BOOK_FEATURES) if with_book else _FEATURES
    return (
        frame.with_columns(**_INPUTS, **(_BOOK_HELPERS if with_book else {}))
        .with_columns(**_TERMS)
        .with_columns(**_levels(_EMAS))
        .with_columns(**_WINDOWS, **_truncated(_EMAS))
        .drop(*_TERMS, *_levels(_EMAS))  # only the windows read them: free them before the next stages
        .with_columns(**_DERIVED)
        .with_columns(**_levels(_DERIVED_EMAS))
        .with_columns(**_DERIVED_WINDOWS, **_truncated(_DERIVED_EMAS))
        .select(
            *[c for c in BASE_COLUMNS if c != "bar_return"],
            (_c("close") / _c("_prev_close") - 1.0).cast(pl.Float32).alias("bar_return"),
            *[f.expr(bar_ns).cast(pl.Float32).alias(f.name) for f in features],
            *_PASSED_THROUGH,
        )
    )


_PASSED_THROUGH = ("_bar_index", "_day_tpv", "_day_volume")


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
    bars: pl.DataFrame,
    bar_ns: int,
    *,
    with_book: bool,
    keep: pl.Expr,
    chunk_bars: int | None = None,
    with_bar_index: bool = False,
) -> Iterator[pl.DataFrame]:
    """Rows of ``bars`` (sorted, with ``_bar_index``) that satisfy ``keep``, with features, chunk by chunk
    (``chunk_bars`` bars each, default ``CHUNK_BARS``).

    Each chunk is computed over its own bars plus the MAX_LOOKBACK bars before it, which every window of its
    first non-warm-up row fits in. Chunk boundaries are fixed multiples of ``chunk_bars`` from the first bar, so
    bars added after a row never change how that row is computed.
    """
    chunk_bars = chunk_bars or CHUNK_BARS
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
        yield table.drop("_day_tpv", "_day_volume", *([] if with_bar_index else ["_bar_index"]))


def compute_features(bars: pl.DataFrame, bar_ns: int, *, with_book: bool = False) -> pl.DataFrame:
    """All feature columns for bars sorted by (instrument_id, ts_event), warm-up rows *included*.

    Returns the contract columns plus ``_bar_index`` (0-based position of the bar within its instrument); rows
    with ``_bar_index < MAX_LOOKBACK`` are warm-up rows whose values are not meaningful.
    """
    chunks = _feature_chunks(
        bars.with_columns(_BAR_INDEX), bar_ns, with_book=with_book, keep=pl.lit(True), with_bar_index=True
    )
    return pl.concat(list(chunks), how="vertical")


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
class _Selection:
    """Bars ready for chunked featurizing, and which of their rows make the table."""

    bars: pl.DataFrame  # sorted, with _bar_index, instruments too short to give a row left out
    keep: pl.Expr  # the table's rows: in scope (ts_event >= keep_from) and past the warm-up
    rows: int
    instruments: int  # instruments with at least one row
    dropped: list[str]  # symbols of the instruments left out (drop_short=True)


def _select_rows(bars: pl.DataFrame, *, path: Path, keep_from: Any, drop_short: bool) -> _Selection:
    """Check the bars, add ``_bar_index`` and count the table's rows per instrument before computing any."""
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
    if counts.height == short.height:
        raise DataFileError(
            path, f"too few bars for the lookbacks: no instrument has {MAX_LOOKBACK + 1} bars"
        )
    if short.height:  # instruments are independent: leave the short ones out before computing
        bars = bars.filter(~_c("instrument_id").is_in(short["instrument_id"].implode()))
    rows = int(counts["rows"].sum())
    dropped = short["symbol"].to_list() if short.height else []
    return _Selection(bars, keep, rows, counts.height - short.height, dropped)


def featurize_bars(
    bars: pl.DataFrame,
    bar_ns: int,
    *,
    path: Path,
    with_book: bool = False,
    keep_from: Any = None,
    drop_short: bool = False,
) -> tuple[pl.DataFrame, list[str]]:
    """Feature table for ``bars``: warm-up rows dropped, only rows with ``ts_event >= keep_from`` kept.

    An instrument left with no rows is an error (``DataFileError`` naming ``path``), or, with
    ``drop_short=True``, left out and listed in the second return value.
    """
    selection = _select_rows(bars, path=path, keep_from=keep_from, drop_short=drop_short)
    chunks = _feature_chunks(selection.bars, bar_ns, with_book=with_book, keep=selection.keep)
    table = pl.concat(list(chunks), how="vertical", rechunk=False)
    _check_finite(table, path)
    return table, selection.dropped


def _check_finite(table: pl.DataFrame, path: Path) -> None:
    """Fail, naming the first offending column, if any float column holds a null, NaN or infinity."""
    value_columns = [name for name, dtype in table.schema.items() if dtype in (pl.Float32, pl.Float64)]
    # Fast path: one sum per column is finite unless a value is NaN/inf (or the sum overflows, which the exact
    # check below then clears). Null counts are metadata.
    sums = table.select(pl.col(value_columns).sum()).row(0)
    if all(math.isfinite(total) for total in sums) and not any(table[c].null_count() for c in value_columns):
        return
    # is_finite is null for nulls and all() skips those, hence the separate null count.
    finite = table.select(pl.col(value_columns).is_finite().all()).row(0, named=True)
    offenders = [c for c in value_columns if table[c].null_count() or not finite[c]]
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


def build_feature_file(
    src: Path,
    dst: Path,
    *,
    bar_size: str = "1m",
    prev_src: Path | None = None,
    drop_short: bool = False,
) -> dict[str, Any]:
    """Decode ``src`` once, featurize it and atomically write ``dst`` (zstd Parquet with provenance metadata).

    ``prev_src`` is the previous file of the same dataset/schema (e.g. the previous day): it is decoded as
    context so lookbacks run across the file boundary; only ``src``'s bars are written. Returns a summary
    (rows, instruments, schema, dbn_version, sha256, ...). Raises ``DataFileError`` on bad input; nothing is
    written then. Features are computed and written in chunks of ``CHUNK_BARS`` bars, so memory beyond the
    bars stays bounded however long the file is.
    """
    src, dst = Path(src), Path(dst)
    current = read_bars(src, bar_size)
    bars, keep_from, prev = current.bars, None, None
    if prev_src is not None:
        prev = read_bars(Path(prev_src), bar_size)
        if (prev.schema, prev.dataset) != (current.schema, current.dataset):
            raise DataFileError(
                src,
                f"prev_src {prev.path} is {prev.dataset}/{prev.schema}, expected {current.dataset}/{current.schema}",
            )
        if bars.height:
            keep_from = bars["ts_event"].min()
            # Only the part of the previous file strictly before this one is context (files may overlap).
            context = prev.bars.filter(_c("ts_event") < keep_from)
            bars = pl.concat([context, bars], how="vertical").sort(
                "instrument_id", "ts_event", maintain_order=True
            )
            del context
    if current.bars.height == 0:
        raise DataFileError(
            src, f"too few bars for the lookbacks: no bars with trades in this {current.schema} file"
        )
    selection = _select_rows(bars, path=src, keep_from=keep_from, drop_short=drop_short)
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
    }
    if prev is not None:
        metadata["marketrl.prev_source_file"] = prev.path.name
        metadata["marketrl.prev_source_sha256"] = prev.sha256
    chunks = _feature_chunks(selection.bars, current.bar_ns, with_book=current.has_book, keep=selection.keep)
    with atomic_write(dst) as tmp:
        written = _write_chunks(chunks, tmp, metadata, src)
        if written != selection.rows:  # inside the block: a wrong file is never renamed into place
            raise RuntimeError(f"{src}: wrote {written} feature rows, counted {selection.rows}")
    return {
        "rows": selection.rows,
        "instruments": selection.instruments,
        "schema": current.schema,
        "dataset": current.dataset,
        "dbn_version": current.dbn_version,
        "sha256": current.sha256,
        "prev_sha256": prev.sha256 if prev is not None else None,
        "bar_size": bar_size,
        "features": len(feature_names),
        "records": current.records,
        "dropped_undef_ts": current.dropped_undef_ts,
        "dropped_short_instruments": selection.dropped,
    }
