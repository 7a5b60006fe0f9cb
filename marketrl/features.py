"""The 51 bar features (plus a book group for quote schemas), and the DBN.zst → Parquet stage that caches them.

Every feature is a polars expression over one instrument's bars, listed with its formula and lookback in
docs/FEATURES.md. Design points:

- **finite lookback**: every feature at bar t reads bars t-L..t with ``L <= MAX_LOOKBACK``. EMAs (MACD, RSI, ATR)
  are truncated to a fixed window with renormalized weights, so a row depends on a bounded history; this makes
  a day file featurized with its previous day as context give the same rows as one long file.
- **no look-ahead**: only rolling windows that end at the current row and backward shifts are used.
- **per instrument**: frames are sorted by (instrument_id, ts_event) and the rolling expressions run over the
  flat columns; every row whose window could reach into the previous instrument's bars is a warm-up row (fewer
  than MAX_LOOKBACK earlier bars of its own instrument) and is dropped. The cumulative day-VWAP runs
  ``.over(instrument, day)``. The equivalence with computing each instrument alone is tested.
- Float64 inside, Float32 out; no NaN/inf reaches the table (checked before writing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from marketrl.data.reader import NS_PER_DAY, DataFileError, read_bars
from marketrl.io import atomic_write

__all__ = [
    "BOOK_FEATURE_NAMES",
    "DAY_CUMULATIVE_FEATURES",
    "FEATURE_NAMES",
    "FEATURE_SET_VERSION",
    "LOOKBACKS",
    "MAX_LOOKBACK",
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


def _ema(x: pl.Expr, alpha: float, window: int) -> pl.Expr:
    """EMA with smoothing ``alpha`` truncated to the last ``window`` values, weights renormalized to sum 1."""
    weights = [(1.0 - alpha) ** (window - 1 - k) for k in range(window)]
    # polars' weighted window rejects nulls; the only nulls are in warm-up rows, which are dropped anyway.
    return x.fill_null(0.0).rolling_mean(window, weights=weights)


def _span_ema(x: pl.Expr, span: int) -> pl.Expr:
    """Classic EMA(span) (alpha = 2/(span+1)) truncated to 3*span bars (dropped tail weight ≈ e^-6 ≈ 0.25%)."""
    return _ema(x, 2.0 / (span + 1), 3 * span)


def _wilder(x: pl.Expr, n: int) -> pl.Expr:
    """Wilder smoothing (alpha = 1/n) truncated to 5*n bars (dropped tail weight ≈ e^-5 ≈ 0.7%)."""
    return _ema(x, 1.0 / n, 5 * n)


def _safe_div(num: pl.Expr, den: pl.Expr, fill: float = 0.0, eps: float = 0.0) -> pl.Expr:
    """num/den where |den| > eps, else ``fill`` (flat prices, zero volume, zero variance)."""
    return pl.when(den.abs() > eps).then(num / den).otherwise(fill)


def _std(x: pl.Expr, window: int) -> pl.Expr:
    # Rolling variance of a constant series can come out as a tiny negative number: clip before sqrt.
    return x.rolling_var(window).clip(lower_bound=0.0).sqrt()


def _rsi(n: int) -> pl.Expr:
    gain, loss = _wilder(pl.col("_gain"), n), _wilder(pl.col("_loss"), n)
    return _safe_div(gain, gain + loss, fill=0.5) - 0.5


_VAR_EPS = 1e-18  # variance / std below this is "flat" (log-return units)

# Helper columns shared by several features (lookback in bars in the comment).
_HELPERS: dict[str, pl.Expr] = {
    "_lc": pl.col("close").log(),  # 0
    "_r1": pl.col("close").log().diff(),  # 1
    "_lhl": (pl.col("high") / pl.col("low")).log(),  # 0
    "_loc": (pl.col("close") / pl.col("open")).log(),  # 0
    "_lv": pl.col("volume").log1p(),  # 0
    "_tpv": (pl.col("high") + pl.col("low") + pl.col("close")) / 3.0 * pl.col("volume"),  # 0
    "_range": pl.col("high") - pl.col("low"),  # 0
    "_prev_close": pl.col("close").shift(1),  # 1
}
_SECOND_HELPERS: dict[str, pl.Expr] = {
    "_gain": pl.col("_r1").clip(lower_bound=0.0),  # 1
    "_loss": (-pl.col("_r1")).clip(lower_bound=0.0),  # 1
    "_tr": pl.max_horizontal("high", "_prev_close") - pl.min_horizontal("low", "_prev_close"),  # 1
    "_ema12": _span_ema(pl.col("close"), 12),  # 35
    "_ema26": _span_ema(pl.col("close"), 26),  # 77
    "_sma20": pl.col("close").rolling_mean(20),  # 19
    "_sd20": _std(pl.col("close"), 20),  # 19
    "_ll14": pl.col("low").rolling_min(14),  # 13
    "_hh14": pl.col("high").rolling_max(14),  # 13
    "_rv5": _std(pl.col("_r1"), 5),  # 5
    "_rv60": _std(pl.col("_r1"), 60),  # 60
    # Cumulative within (instrument, UTC day): unbounded lookback, but never past the day's first bar.
    "_day_tpv": pl.col("_tpv").cum_sum().over("instrument_id", "trading_day"),
    "_day_volume": pl.col("volume").cum_sum().over("instrument_id", "trading_day"),
}
_THIRD_HELPERS: dict[str, pl.Expr] = {
    "_macd": (pl.col("_ema12") - pl.col("_ema26")) / pl.col("close"),  # 77
    "_macd_signal": _span_ema((pl.col("_ema12") - pl.col("_ema26")) / pl.col("close"), 9),  # 77 + 26
    "_stoch_k": _safe_div(pl.col("close") - pl.col("_ll14"), pl.col("_hh14") - pl.col("_ll14"), 0.5),  # 13
}


def _ret(n: int) -> pl.Expr:
    return pl.col("_lc") - pl.col("_lc").shift(n)


def _sma_ratio(n: int) -> pl.Expr:
    return pl.col("close") / pl.col("close").rolling_mean(n) - 1.0


def _log_ratio_to_vwap(tpv_sum: pl.Expr, volume_sum: pl.Expr) -> pl.Expr:
    """ln(close / VWAP) with VWAP = Σ(typical price·volume)/Σvolume; 0 when the window traded nothing."""
    return pl.when(volume_sum > 0).then((pl.col("close") * volume_sum / tpv_sum).log()).otherwise(0.0)


def _vwap_dev(n: int) -> pl.Expr:
    return _log_ratio_to_vwap(pl.col("_tpv").rolling_sum(n), pl.col("volume").rolling_sum(n))


def _rolling_corr(a: pl.Expr, b: pl.Expr, n: int) -> pl.Expr:
    """Pearson correlation over the last n rows from rolling moments; 0 where either side is flat."""
    mean_a, mean_b = a.rolling_mean(n), b.rolling_mean(n)
    cov = (a * b).rolling_mean(n) - mean_a * mean_b
    var_a = (a * a).rolling_mean(n) - mean_a * mean_a
    var_b = (b * b).rolling_mean(n) - mean_b * mean_b
    scale = (var_a * var_b).clip(lower_bound=0.0).sqrt()
    return pl.when(scale > 1e-30).then((cov / scale).clip(-1.0, 1.0)).otherwise(0.0)


def _bar_shape(numerator: pl.Expr, fill: float = 0.0) -> pl.Expr:
    return _safe_div(numerator, pl.col("_range"), fill)


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
    _f("ret_1", 1, pl.col("_r1")),
    _f("ret_5", 5, _ret(5)),
    _f("ret_15", 15, _ret(15)),
    _f("ret_30", 30, _ret(30)),
    _f("ret_60", 60, _ret(60)),
    # --- volatility ---
    _f("rv_5", 5, pl.col("_rv5")),
    _f("rv_15", 15, _std(pl.col("_r1"), 15)),
    _f("rv_60", 60, pl.col("_rv60")),
    _f("parkinson_15", 14, (pl.col("_lhl").pow(2).rolling_mean(15) / (4 * _LN2)).sqrt()),
    _f("parkinson_60", 59, (pl.col("_lhl").pow(2).rolling_mean(60) / (4 * _LN2)).sqrt()),
    _f(
        "garman_klass_15",
        14,
        (0.5 * pl.col("_lhl").pow(2) - (2 * _LN2 - 1) * pl.col("_loc").pow(2))
        .rolling_mean(15)
        .clip(lower_bound=0.0)
        .sqrt(),
    ),
    _f(
        "rogers_satchell_15",
        14,
        (
            (pl.col("high") / pl.col("close")).log() * (pl.col("high") / pl.col("open")).log()
            + (pl.col("low") / pl.col("close")).log() * (pl.col("low") / pl.col("open")).log()
        )
        .rolling_mean(15)
        .clip(lower_bound=0.0)
        .sqrt(),
    ),
    _f("rv_ratio_5_60", 60, _safe_div(pl.col("_rv5"), pl.col("_rv60"), 1.0, eps=1e-9)),
    _f("atr_14", 70, _wilder(pl.col("_tr"), 14) / pl.col("close")),
    # --- momentum / oscillators ---
    _f("rsi_6", 30, _rsi(6)),
    _f("rsi_14", 70, _rsi(14)),
    _f("macd", 77, pl.col("_macd")),
    _f("macd_signal", 77 + 26, pl.col("_macd_signal")),
    _f("macd_hist", 77 + 26, pl.col("_macd") - pl.col("_macd_signal")),
    _f(
        "bb_pctb_20",
        19,
        _safe_div(
            pl.col("close") - (pl.col("_sma20") - 2 * pl.col("_sd20")),
            4 * pl.col("_sd20"),
            0.5,
            eps=1e-12,
        ),
    ),
    _f("bb_width_20", 19, 4 * pl.col("_sd20") / pl.col("_sma20")),
    _f("stoch_k_14", 13, pl.col("_stoch_k")),
    _f("stoch_d_3", 15, pl.col("_stoch_k").rolling_mean(3)),
    _f("close_sma_5", 4, _sma_ratio(5)),
    _f("close_sma_15", 14, _sma_ratio(15)),
    _f("close_sma_60", 59, _sma_ratio(60)),
    _f("dist_high_60", 59, pl.col("close") / pl.col("high").rolling_max(60) - 1.0),
    _f("dist_low_60", 59, pl.col("close") / pl.col("low").rolling_min(60) - 1.0),
    _f("up_frac_15", 15, (pl.col("_r1") > 0).cast(pl.Float64).rolling_mean(15)),
    _f(
        "ret_autocorr_30",
        31,
        _rolling_corr(pl.col("_r1"), pl.col("_r1").shift(1), 30),
    ),
    _f(
        "efficiency_15",
        15,
        _safe_div(_ret(15).abs(), pl.col("_r1").abs().rolling_sum(15), 0.0, eps=1e-12),
    ),
    # --- volume / VWAP ---
    _f("log_volume", 0, pl.col("_lv")),
    _f(
        "volume_z_15",
        14,
        _safe_div(pl.col("_lv") - pl.col("_lv").rolling_mean(15), _std(pl.col("_lv"), 15), 0.0, eps=1e-9),
    ),
    _f(
        "volume_ratio_5_60",
        59,
        ((pl.col("volume").rolling_mean(5) + 1.0) / (pl.col("volume").rolling_mean(60) + 1.0)).log(),
    ),
    _f("vwap_dev_15", 14, _vwap_dev(15)),
    _f("vwap_dev_60", 59, _vwap_dev(60)),
    _f("vwap_dev_day", 0, _log_ratio_to_vwap(pl.col("_day_tpv"), pl.col("_day_volume"))),
    _f(
        "signed_volume_15",
        15,
        _safe_div(
            (pl.col("_r1").sign() * pl.col("volume")).rolling_sum(15), pl.col("volume").rolling_sum(15), 0.0
        ),
    ),
    _f(
        "ret_volume_corr_15",
        15,
        _rolling_corr(pl.col("_r1").abs(), pl.col("_lv"), 15),
    ),
    # --- bar shape ---
    _f("bar_body", 0, _bar_shape(pl.col("close") - pl.col("open"))),
    _f("bar_upper_wick", 0, _bar_shape(pl.col("high") - pl.max_horizontal("open", "close"))),
    _f("bar_lower_wick", 0, _bar_shape(pl.min_horizontal("open", "close") - pl.col("low"))),
    _f("bar_close_loc", 0, _bar_shape(pl.col("close") - pl.col("low"), 0.5)),
    _f("bar_range", 0, pl.col("_lhl")),
    _f("gap_open", 1, (pl.col("open") / pl.col("_prev_close")).log()),
    _f("ret_oc", 0, pl.col("_loc")),
    # --- calendar (UTC) and bar spacing ---
    _f("tod_sin", 0, _TIME_OF_DAY.sin()),
    _f("tod_cos", 0, _TIME_OF_DAY.cos()),
    _f("dow_sin", 0, _DAY_OF_WEEK.sin()),
    _f("dow_cos", 0, _DAY_OF_WEEK.cos()),
    _f(
        "bars_since_prev",
        1,
        lambda bar_ns: (pl.col("ts_event").cast(pl.Int64).diff().cast(pl.Float64) / bar_ns).log(),
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


def _feature_query(bars: pl.LazyFrame, bar_ns: int, with_book: bool) -> pl.LazyFrame:
    """Lazy query over bars carrying ``_bar_index``: ``BASE_COLUMNS``, the features, ``_bar_index``."""
    features = (*_FEATURES, *_BOOK_FEATURES) if with_book else _FEATURES
    return (
        bars.with_columns(**_HELPERS, **(_BOOK_HELPERS if with_book else {}))
        .with_columns(**_SECOND_HELPERS)
        .with_columns(**_THIRD_HELPERS)
        .select(
            *[c for c in BASE_COLUMNS if c != "bar_return"],
            (pl.col("close") / pl.col("_prev_close") - 1.0).cast(pl.Float32).alias("bar_return"),
            *[f.expr(bar_ns).cast(pl.Float32).alias(f.name) for f in features],
            "_bar_index",
        )
    )


_BAR_INDEX = pl.int_range(pl.len(), dtype=pl.UInt32).over("instrument_id").alias("_bar_index")


def compute_features(bars: pl.DataFrame, bar_ns: int, *, with_book: bool = False) -> pl.DataFrame:
    """All feature columns for bars sorted by (instrument_id, ts_event), warm-up rows *included*.

    Returns the contract columns plus ``_bar_index`` (0-based position of the bar within its instrument); rows
    with ``_bar_index < MAX_LOOKBACK`` are warm-up rows whose values are not meaningful.
    """
    return _feature_query(bars.lazy().with_columns(_BAR_INDEX), bar_ns, with_book).collect()


def _check_positive_prices(bars: pl.DataFrame, path: Path) -> None:
    bad = bars.filter(pl.min_horizontal("open", "high", "low", "close") <= 0)
    if bad.height:
        row = bad.row(0, named=True)
        raise DataFileError(
            path,
            f"non-positive price in instrument {row['symbol']} ({row['instrument_id']}) at {row['ts_event']}; "
            "log-return features need positive prices",
        )


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
    _check_positive_prices(bars, path)
    bars = bars.with_columns(_BAR_INDEX)
    in_scope = pl.lit(True) if keep_from is None else pl.col("ts_event") >= keep_from
    counts = (
        bars.group_by("instrument_id", maintain_order=True)
        .agg(
            pl.col("symbol").last(),
            pl.len().alias("total"),
            in_scope.sum().alias("bars"),
            (in_scope & (pl.col("_bar_index") >= MAX_LOOKBACK)).sum().alias("rows"),
        )
        .filter(pl.col("bars") > 0)
    )
    short = counts.filter(pl.col("rows") == 0)
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
        bars = bars.filter(~pl.col("instrument_id").is_in(short["instrument_id"].implode()))
    # Filtering inside the query avoids holding the full and the filtered table at once.
    table = (
        _feature_query(bars.lazy(), bar_ns, with_book)
        .filter(in_scope & (pl.col("_bar_index") >= MAX_LOOKBACK))
        .drop("_bar_index")
        .collect()
    )
    _check_finite(table, path)
    return table, short["symbol"].to_list()


def _check_finite(table: pl.DataFrame, path: Path) -> None:
    """Fail, naming the first offending column, if any float column holds a null, NaN or infinity."""
    value_columns = [c for c in table.columns if table.schema[c] in (pl.Float32, pl.Float64)]
    # is_finite is null for nulls and all() skips those, hence the separate null count.
    finite = table.select(pl.col(value_columns).is_finite().all()).row(0, named=True)
    offenders = [c for c in value_columns if table[c].null_count() or not finite[c]]
    if offenders:
        raise DataFileError(
            path, f"non-finite values in column {offenders[0]!r} ({len(offenders)} column(s) affected)"
        )


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
    written then.
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
        if current.bars.height:
            keep_from = current.bars["ts_event"].min()
            # Only the part of the previous file strictly before this one is context (files may overlap).
            context = prev.bars.filter(pl.col("ts_event") < keep_from)
            bars = pl.concat([context, current.bars], how="vertical").sort(
                "instrument_id", "ts_event", maintain_order=True
            )
    if current.bars.height == 0:
        raise DataFileError(
            src, f"too few bars for the lookbacks: no bars with trades in this {current.schema} file"
        )
    table, dropped = featurize_bars(
        bars,
        current.bar_ns,
        path=src,
        with_book=current.has_book,
        keep_from=keep_from,
        drop_short=drop_short,
    )
    feature_names = list(FEATURE_NAMES) + (list(BOOK_FEATURE_NAMES) if current.has_book else [])
    metadata = {
        "marketrl.feature_set_version": FEATURE_SET_VERSION,
        "marketrl.source_file": src.name,
        "marketrl.source_sha256": current.sha256,
        "marketrl.schema": current.schema,
        "marketrl.dataset": current.dataset,
        "marketrl.dbn_version": str(current.dbn_version),
        "marketrl.bar_size": bar_size,
        "marketrl.rows": str(table.height),
        "marketrl.max_lookback": str(MAX_LOOKBACK),
        "marketrl.feature_names": ",".join(feature_names),
    }
    if prev is not None:
        metadata["marketrl.prev_source_file"] = prev.path.name
        metadata["marketrl.prev_source_sha256"] = prev.sha256
    with atomic_write(dst) as tmp:
        table.write_parquet(tmp, compression="zstd", metadata=metadata)
    return {
        "rows": table.height,
        "instruments": table["instrument_id"].n_unique(),
        "schema": current.schema,
        "dataset": current.dataset,
        "dbn_version": current.dbn_version,
        "sha256": current.sha256,
        "prev_sha256": prev.sha256 if prev is not None else None,
        "bar_size": bar_size,
        "features": len(feature_names),
        "records": current.records,
        "dropped_undef_ts": current.dropped_undef_ts,
        "dropped_short_instruments": dropped,
    }
