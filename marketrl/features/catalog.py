"""The one catalog of the bar features: the default set (``CATALOG``), the book group for quote schemas
(``BOOK_CATALOG``) and the named window statistics they share, each a ``FeatureSpec`` with its lookback.

An entry's expression is written with the building blocks of ``_Reads`` (shift, diff, rolling windows, truncated
EMAs), which record the columns it reads and how many bars back; its lookback is derived from those and from the
lookbacks of the entries it reads, so ``LOOKBACKS`` and ``MAX_LOOKBACK`` follow from the formulas.
docs/FEATURES.md lists every feature with its formula and lookback (tested against the catalog).

- **finite lookback**: every feature at bar t reads bars t-L..t with ``L <= MAX_LOOKBACK``. EMAs (MACD, RSI, ATR)
  are truncated to a fixed window with renormalized weights, so a row depends on a bounded history; this makes
  a day file featurized with its previous days as context give the same rows as one long file.
- **no look-ahead**: only rolling windows that end at the current row, backward shifts and running sums.
- **cost**: each window statistic is computed once, as a named entry, however many features share it (polars
  does not de-duplicate rolling expressions). Truncated EMAs are O(n) differences of the plain EMA recursion
  (``_Ema``), not weighted windows.
- Float64 inside, Float32 out (marketrl.features.engine casts the outputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import polars as pl

from marketrl.data.reader import NS_PER_DAY

__all__ = [
    "BASE_COLUMNS",
    "BOOK_CATALOG",
    "BOOK_FEATURE_NAMES",
    "CATALOG",
    "DAY_CUMULATIVE_FEATURES",
    "FEATURE_NAMES",
    "FEATURE_SET_VERSION",
    "LOOKBACKS",
    "MAX_LOOKBACK",
    "FeatureSpec",
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
# Cumulative since the instrument's first bar of the UTC day: their LOOKBACKS entry counts no bar before that
# day (the day sums are bar columns), the day's earlier bars they do read.
DAY_CUMULATIVE_FEATURES: tuple[str, ...] = tuple(spec.name for spec in CATALOG if _reads_day_sums(spec))

assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES), "feature names are unique"
assert not any(
    name in spec.inputs for spec in _ENTRIES.values() for name in (*FEATURE_NAMES, *BOOK_FEATURE_NAMES)
), "features are leaves: an entry that other entries read is shared, computed in float64"
