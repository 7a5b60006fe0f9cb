"""The fast paths of the feature stage give the straightforward results: chunked computation equals one frame,
the O(n) truncated EMAs equal the weighted windows they replace, and the streamed Parquet file holds the table."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

import marketrl.features.catalog as catalog
import marketrl.features.engine as engine
from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.features import FEATURE_NAMES, MAX_LOOKBACK, build_feature_file, feature_chunks
from tests.support.synthetic import ohlcv_messages, random_walk_bars
from tests.test_features import TOL, _prepared

MINUTE_NS = 60_000_000_000


def _chunked(bars: pl.DataFrame, chunk_bars: int) -> pl.DataFrame:
    return pl.concat(list(feature_chunks(bars, MINUTE_NS, path=Path("x"), chunk_bars=chunk_bars)))


def _two_instruments_over_days(seed: int) -> pl.DataFrame:
    # Starts at 21:00 UTC with gaps, so day boundaries and both instruments fall inside and across chunks.
    start = dt.datetime(2024, 5, 6, 21, 0, tzinfo=dt.UTC)
    return _prepared(random_walk_bars(700, {1: 4000.0, 2: 60.0}, start=start, seed=seed, gap_probability=0.3))


@pytest.mark.parametrize("chunk_bars", [7, 150, 1000])
def test_chunks_give_the_rows_of_one_frame(chunk_bars: int) -> None:
    bars = _two_instruments_over_days(seed=71)
    whole = _chunked(bars, 10**9)
    chunked = _chunked(bars, chunk_bars)
    assert whole.height == bars.height - 2 * MAX_LOOKBACK
    assert_frame_equal(chunked, whole, **TOL)
    # Day sums are handed from chunk to chunk as the same float additions: identical, not just close.
    assert chunked["vwap_dev_day"].equals(whole["vwap_dev_day"])
    assert chunked.select("bar_return", "ret_5", "rv_15", "stoch_k_14").equals(
        whole.select("bar_return", "ret_5", "rv_15", "stoch_k_14")
    )


def test_vwap_dev_day_restarts_each_utc_day() -> None:
    bars = _two_instruments_over_days(seed=72)
    table = _chunked(bars, 64)
    tp_volume = (pl.col("high") + pl.col("low") + pl.col("close")) / 3 * pl.col("volume")
    day = ("instrument_id", "trading_day")
    expected = bars.select(
        "ts_event",
        "instrument_id",
        (pl.col("close") * pl.col("volume").cum_sum().over(day) / tp_volume.cum_sum().over(day))
        .log()
        .alias("expected"),
    )
    joined = table.join(expected, on=["instrument_id", "ts_event"])
    assert joined.height == table.height and table["trading_day"].n_unique() >= 2
    np.testing.assert_allclose(
        joined["vwap_dev_day"].to_numpy(), joined["expected"].fill_nan(0.0).to_numpy(), rtol=1e-5, atol=1e-7
    )


def test_chunk_frames_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory is bounded by the chunk: no query sees more than chunk_bars + MAX_LOOKBACK bars."""
    heights: list[int] = []
    real_query = engine._feature_query

    def recording_query(frame: pl.LazyFrame, *args: object) -> pl.LazyFrame:
        heights.append(frame.collect().height)
        return real_query(frame, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "_feature_query", recording_query)
    bars = _two_instruments_over_days(seed=73)
    _chunked(bars, 200)
    assert len(heights) == math.ceil(bars.height / 200)
    assert max(heights) == 200 + MAX_LOOKBACK


def _weighted_window(x: np.ndarray, alpha: float, window: int) -> np.ndarray:
    """The truncated EMA written out: weights (1-alpha)^k on the last ``window`` values, renormalized."""
    weights = (1.0 - alpha) ** np.arange(window - 1, -1, -1)
    weights /= weights.sum()
    out = np.full(len(x), np.nan)
    for t in range(window - 1, len(x)):
        out[t] = weights @ x[t - window + 1 : t + 1]
    return out


@pytest.mark.parametrize(("alpha", "window"), [(2 / 13, 36), (2 / 27, 78), (1 / 14, 70), (1 / 6, 30)])
def test_truncated_ema_equals_the_weighted_window(alpha: float, window: int) -> None:
    rng = np.random.default_rng(window)
    x = np.concatenate([4000 + np.cumsum(rng.normal(0, 2, 400)), np.full(50, 3990.0)])
    ema = catalog._Ema("x", alpha, window)
    got = (
        pl.DataFrame({"x": x})
        .with_columns(ema.level().alias("level"))
        .select(ema.truncated("level"))
        .to_series()
        .to_numpy()
    )
    expected = _weighted_window(x, alpha, window)
    # Exact algebra; only float64 rounding differs (the first full window included).
    np.testing.assert_allclose(got[window - 1 :], expected[window - 1 :], rtol=1e-12)


def test_non_negative_ema_is_exactly_zero_over_an_all_zero_window() -> None:
    rng = np.random.default_rng(5)
    gains = np.concatenate([np.abs(rng.normal(0, 1e-3, 200)), np.zeros(80), [2e-4]])
    ema = catalog._Ema("x", 1 / 14, 70, nonnegative=True)
    got = pl.DataFrame({"x": gains}).with_columns(ema.level().alias("level")).select(ema.truncated("level"))
    values = got.to_series().to_numpy()
    expected = _weighted_window(gains, 1 / 14, 70)
    assert (values[270:280] == 0.0).all()  # the float64 recursion alone leaves ~1e-20 residue here
    np.testing.assert_allclose(values[69:270], expected[69:270], rtol=1e-10)
    assert values[-1] == pytest.approx(expected[-1], rel=1e-10) and values[-1] > 0
    # Residue of either sign is snapped: a level that decays a hair slower than (1-alpha)^w leaves +1e-18.
    decay = (1 - 1 / 14) ** 70
    level = np.concatenate([np.full(70, 1e-3), np.full(5, 1e-3 * decay + 1e-18)])
    residue = pl.DataFrame({"x": np.zeros(75), "level": level}).select(ema.truncated("level")).to_series()
    assert (residue.to_numpy()[70:] == 0.0).all()


def test_flat_prices_give_the_documented_fallbacks() -> None:
    """After 80 bars without a price change the RSI/ATR windows hold only zeros: 0/0 fallbacks, not noise."""
    moving = random_walk_bars(200, {1: 100.0}, seed=8, gap_probability=0.0)
    last = moving.row(-1, named=True)
    flat_ts = last["ts_event"] + MINUTE_NS * np.arange(1, 81)
    flat = pl.DataFrame(
        {
            "ts_event": flat_ts,
            "instrument_id": np.full(80, 1, dtype=np.uint32),
            **{name: np.full(80, last["close"]) for name in ("open", "high", "low", "close")},
            "volume": np.full(80, 10.0),
        }
    )
    table = _chunked(_prepared(pl.concat([moving, flat])), 10**9)
    end = table.row(-1, named=True)
    assert end["rsi_6"] == 0.0 and end["rsi_14"] == 0.0 and end["atr_14"] == 0.0
    assert end["rv_60"] == 0.0 and end["bb_pctb_20"] == 0.5


def test_streamed_parquet_holds_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups per chunk, float columns byte-stream-split + zstd, statistics on the key columns only."""
    monkeypatch.setattr(engine, "CHUNK_BARS", 128)
    raw = random_walk_bars(500, {7: 4000.0, 9: 15000.0}, seed=75)
    start, end = int(raw["ts_event"].min()), int(raw["ts_event"].max()) + 1
    src = write_dbn(
        tmp_path / "x.dbn.zst",
        encode_dbn(
            ohlcv_messages(raw), schema="ohlcv-1m", start_ns=start, end_ns=end, symbols={"A": 7, "B": 9}
        ),
    )
    dst = tmp_path / "x.parquet"
    summary = build_feature_file(src, dst)
    table = pl.read_parquet(dst)
    from marketrl.data.reader import read_bars

    expected = pl.concat(list(feature_chunks(read_bars(src).bars, MINUTE_NS, path=src)))
    assert table.equals(expected) and summary["rows"] == table.height == 2 * (500 - MAX_LOOKBACK)

    meta = pq.ParquetFile(dst).metadata
    assert meta.num_row_groups == math.ceil(1000 / 128) and meta.num_rows == table.height
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    column = meta.row_group(0).column
    for i, name in enumerate(names):
        chunk = column(i)
        assert chunk.compression == "ZSTD"
        if name in FEATURE_NAMES or name in ("open", "close", "bar_return"):
            assert "BYTE_STREAM_SPLIT" in chunk.encodings and not chunk.is_stats_set
        if name in ("ts_event", "instrument_id"):
            assert chunk.is_stats_set
