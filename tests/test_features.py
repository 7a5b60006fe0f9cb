"""Feature table: the output contract, no look-ahead (every feature), honest lookbacks, instruments never mix,
day files with earlier files as context, real samples, Parquet metadata and failure without partial output."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.quotes import QUOTE_COLUMNS
from marketrl.data.reader import DataFileError, read_bars
from marketrl.features import (
    BASE_COLUMNS,
    BOOK_CATALOG,
    BOOK_FEATURE_NAMES,
    CATALOG,
    DAY_CUMULATIVE_FEATURES,
    FEATURE_NAMES,
    FEATURE_SET_VERSION,
    LOOKBACKS,
    MAX_LOOKBACK,
    build_feature_file,
    feature_chunks,
    warmup_only_note,
)
from tests.support.synthetic import ohlcv_messages, random_walk_bars, trade_messages

MINUTE_NS = 60_000_000_000
REPO = Path(__file__).resolve().parents[1]
NAUTILUS = "nautilus_trader"
ESH4_MBO_1224 = f"{NAUTILUS}/esh4-glbx-mdp3-20231224.mbo.dbn.zst"
ESH4_MBO_1225 = f"{NAUTILUS}/esh4-glbx-mdp3-20231225.mbo.dbn.zst"
BARS_DIR = f"{NAUTILUS}/historical_bars_catalog/databento"
TOL = {"rel_tol": 1e-5, "abs_tol": 1e-6}


def _prepared(bars: pl.DataFrame) -> pl.DataFrame:
    """Synthetic bars in read_bars' column layout."""
    return bars.with_columns(pl.col("ts_event").cast(pl.Int64).cast(pl.Datetime("ns", "UTC"))).select(
        "ts_event",
        pl.col("ts_event").dt.date().alias("trading_day"),
        pl.col("instrument_id").cast(pl.UInt32),
        pl.col("instrument_id").cast(pl.String).alias("symbol"),
        "open",
        "high",
        "low",
        "close",
        "volume",
    )


def _span(bars: pl.DataFrame) -> dict[str, int]:
    ts = bars["ts_event"].cast(pl.Int64)
    return {"start_ns": int(ts.min()), "end_ns": int(ts.max()) + 1}


def _features(bars: pl.DataFrame, **kwargs: object) -> pl.DataFrame:
    """The feature table of synthetic bars, computed in memory."""
    return pl.concat(list(feature_chunks(_prepared(bars), MINUTE_NS, path=Path("<memory>"), **kwargs)))


def _perturb(bars: pl.DataFrame, mask: pl.Expr, seed: int) -> pl.DataFrame:
    """Replace the bars selected by ``mask`` with different, still valid OHLCV values."""
    rng = np.random.default_rng(seed)
    n = bars.height
    scale = pl.Series(rng.uniform(0.7, 1.4, n))
    wick = pl.Series(rng.uniform(0.0, 3.0, n))
    new_volume = pl.Series(rng.integers(0, 1000, n).astype(np.float64))
    return bars.with_columns(
        pl.when(mask).then(pl.col("open") * scale).otherwise(pl.col("open")).alias("open"),
        pl.when(mask).then(pl.col("close") / scale).otherwise(pl.col("close")).alias("close"),
        pl.when(mask).then(new_volume).otherwise(pl.col("volume")).alias("volume"),
    ).with_columns(
        pl.when(mask).then(pl.max_horizontal("open", "close") + wick).otherwise(pl.col("high")).alias("high"),
        pl.when(mask).then(pl.min_horizontal("open", "close") - wick).otherwise(pl.col("low")).alias("low"),
    )


# ------------------------------------------------------------------ contract


def test_feature_set_constants_and_docs() -> None:
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == len(CATALOG)
    assert not set(FEATURE_NAMES) & set(BOOK_FEATURE_NAMES)
    assert [spec.name for spec in (*CATALOG, *BOOK_CATALOG)] == [*FEATURE_NAMES, *BOOK_FEATURE_NAMES]
    assert LOOKBACKS == {spec.name: spec.lookback for spec in (*CATALOG, *BOOK_CATALOG)}
    assert MAX_LOOKBACK == max(LOOKBACKS.values())
    doc = (REPO / "docs" / "FEATURES.md").read_text()
    # The numbered table of CATALOG and the book table: `name` | formula | lookback, in column order.
    numbered = re.findall(r"^\|\s*\d+\s*\|\s*`([a-z0-9_]+)`\s*\|.*\|\s*(\d+)[^|]*\|\s*$", doc, flags=re.M)
    book = re.findall(r"^\|\s*`(book_[a-z0-9_]+)`\s*\|.*\|\s*(\d+)[^|]*\|\s*$", doc, flags=re.M)
    assert [name for name, _ in numbered] == list(FEATURE_NAMES)
    assert [name for name, _ in book] == list(BOOK_FEATURE_NAMES)
    assert {name: int(lookback) for name, lookback in numbered + book} == LOOKBACKS
    assert FEATURE_SET_VERSION in doc and f"MAX_LOOKBACK = {MAX_LOOKBACK}" in doc
    assert "(day-cumulative)" in doc and list(DAY_CUMULATIVE_FEATURES) == ["vwap_dev_day"]


def test_build_writes_the_documented_table(tmp_path: Path) -> None:
    bars = random_walk_bars(400, {7: 4000.0, 9: 15000.0}, seed=1)
    start, end = int(bars["ts_event"].min()), int(bars["ts_event"].max()) + 1
    src = write_dbn(
        tmp_path / "es-nq.dbn.zst",
        encode_dbn(
            ohlcv_messages(bars),
            schema="ohlcv-1m",
            start_ns=start,
            end_ns=end,
            symbols={"ESH4": 7, "NQH4": 9},
        ),
    )
    dst = tmp_path / "out" / "es-nq.parquet"
    summary = build_feature_file(src, dst)
    table = pl.read_parquet(dst)

    assert table.columns == [*BASE_COLUMNS, *FEATURE_NAMES]
    assert table.schema["ts_event"] == pl.Datetime("ns", "UTC") and table.schema["trading_day"] == pl.Date
    assert table.schema["instrument_id"] == pl.UInt32 and table.schema["symbol"] == pl.String
    assert all(table.schema[c] == pl.Float64 for c in ("open", "high", "low", "close", "volume"))
    assert all(table.schema[c] == pl.Float32 for c in ("bar_return", *FEATURE_NAMES))
    assert table.equals(table.sort("instrument_id", "ts_event"))
    values = table.select(pl.exclude("ts_event", "trading_day", "instrument_id", "symbol")).to_numpy()
    assert np.isfinite(values).all()
    # Warm-up: exactly MAX_LOOKBACK bars per instrument are dropped.
    assert table.group_by("symbol").len().sort("symbol").rows() == [
        ("ESH4", 400 - MAX_LOOKBACK),
        ("NQH4", 400 - MAX_LOOKBACK),
    ]
    es = table.filter(pl.col("symbol") == "ESH4")
    es_bars = bars.filter(pl.col("instrument_id") == 7)
    close = es_bars["close"].to_numpy()
    np.testing.assert_allclose(
        es["bar_return"].to_numpy(), (close[1:] / close[:-1] - 1)[MAX_LOOKBACK - 1 :], rtol=1e-5
    )
    np.testing.assert_allclose(
        es["ret_1"].to_numpy(), np.diff(np.log(close))[MAX_LOOKBACK - 1 :], rtol=1e-5, atol=1e-9
    )

    meta = pl.read_parquet_metadata(dst)
    assert meta["marketrl.feature_set_version"] == FEATURE_SET_VERSION
    assert meta["marketrl.source_sha256"] == summary["sha256"] and len(summary["sha256"]) == 64
    assert meta["marketrl.schema"] == "ohlcv-1m" and meta["marketrl.dbn_version"] == "3"
    assert meta["marketrl.rows"] == str(table.height) == str(summary["rows"])
    assert meta["marketrl.feature_names"].split(",") == list(FEATURE_NAMES)
    assert summary["instruments"] == 2 and summary["features"] == len(CATALOG)
    assert [p.name for p in dst.parent.iterdir()] == ["es-nq.parquet"]  # no temp file left


def test_known_values_of_a_few_features() -> None:
    bars = random_walk_bars(300, {1: 500.0}, seed=11)
    table = _features(bars)
    row = table.row(-1, named=True)
    c = bars["close"].to_numpy()
    h, low, v = bars["high"].to_numpy(), bars["low"].to_numpy(), bars["volume"].to_numpy()
    r = np.diff(np.log(c))
    assert row["ret_15"] == pytest.approx(np.log(c[-1] / c[-16]), rel=1e-5)
    assert row["rv_15"] == pytest.approx(np.std(r[-15:], ddof=1), rel=1e-4)
    assert row["parkinson_15"] == pytest.approx(
        np.sqrt(np.mean(np.log(h[-15:] / low[-15:]) ** 2) / (4 * np.log(2))), rel=1e-4
    )
    assert row["stoch_k_14"] == pytest.approx(
        (c[-1] - low[-14:].min()) / (h[-14:].max() - low[-14:].min()), rel=1e-5
    )
    tp = (h + low + c) / 3
    assert row["vwap_dev_15"] == pytest.approx(
        np.log(c[-1] / (np.sum(tp[-15:] * v[-15:]) / v[-15:].sum())), rel=1e-4, abs=1e-7
    )
    ts = bars["ts_event"].to_numpy()
    assert row["bars_since_prev"] == pytest.approx(np.log((ts[-1] - ts[-2]) / MINUTE_NS), abs=1e-6)
    # Truncated EMA(26) vs the textbook recursive EMA: within the documented truncation error.
    alpha = 2 / 27
    ema = c[0]
    for x in c[1:]:
        ema = alpha * x + (1 - alpha) * ema
    w = (1 - alpha) ** np.arange(77, -1, -1)
    truncated = np.sum(w * c[-78:]) / w.sum()
    assert abs(truncated - ema) / c[-1] < 5e-3


# ------------------------------------------------------------------ no look-ahead


@pytest.mark.parametrize("cut", [MAX_LOOKBACK + 5, 180, 290])
def test_no_feature_reads_future_bars(cut: int) -> None:
    bars = random_walk_bars(320, {1: 800.0, 2: 60.0}, seed=cut)
    base = _features(bars)
    cut_ts = bars.filter(pl.col("instrument_id") == 1)["ts_event"][cut]
    perturbed = _features(_perturb(bars, pl.col("ts_event") > cut_ts, seed=cut + 1))
    past = pl.col("ts_event").cast(pl.Int64) <= cut_ts
    before, after = base.filter(past), perturbed.filter(past)
    assert before.height > 0
    for name in ("bar_return", *FEATURE_NAMES):
        assert before[name].equals(after[name]), f"{name} at t changed when bars after t changed (look-ahead)"
    # The perturbation is real: rows after the cut do change for the price/volume features.
    changed = [n for n in FEATURE_NAMES if not base.filter(~past)[n].equals(perturbed.filter(~past)[n])]
    assert len(changed) >= 45
    # Removing the future entirely gives the same past too.
    truncated = _features(bars.filter(pl.col("ts_event") <= cut_ts), drop_short=True)
    assert_frame_equal(
        truncated,
        before.filter(pl.col("instrument_id").is_in(truncated["instrument_id"].unique().implode())),
        **TOL,
    )


def _at(table: pl.DataFrame, ts: int) -> dict[str, float]:
    return table.filter(pl.col("ts_event").cast(pl.Int64) == ts).row(0, named=True)


def _shifted_bar(bars: pl.DataFrame, index: int, factor: float) -> pl.DataFrame:
    """Bar ``index`` with prices scaled by ``factor``, its range widened, volume changed and its time moved
    20 s earlier."""
    moved = pl.when(pl.int_range(pl.len()) == index)
    widen = {"open": 0.0, "close": 0.0, "high": 3.0, "low": -3.0}
    return bars.with_columns(
        *(moved.then(pl.col(c) * factor + d).otherwise(pl.col(c)).alias(c) for c, d in widen.items()),
        moved.then(pl.col("volume") * 3 + 7).otherwise(pl.col("volume")).alias("volume"),
        moved.then(pl.col("ts_event") - 20_000_000_000).otherwise(pl.col("ts_event")).alias("ts_event"),
    )


def test_derived_lookbacks_are_the_measured_ones() -> None:
    """Each catalog lookback L is exact: changing bar t-L changes the feature at t, changing t-L-1 does not."""
    bars = random_walk_bars(300, {1: 800.0}, seed=21, gap_probability=0.0)
    t = 280
    target_ts = bars["ts_event"][t]
    base = _at(_features(bars), target_ts)
    # Two directions, so that windowed minima and maxima see the change as well as sums.
    changed_at = {
        back: [_at(_features(_shifted_bar(bars, t - back, factor)), target_ts) for factor in (0.5, 2.0)]
        for back in {L for n in FEATURE_NAMES for L in (LOOKBACKS[n], LOOKBACKS[n] + 1) if L > 0}
    }
    for name in FEATURE_NAMES:
        if name in DAY_CUMULATIVE_FEATURES:  # reads the whole UTC day by design
            continue
        lookback = LOOKBACKS[name]
        for row in changed_at[lookback + 1]:
            assert row[name] == base[name], f"{name} (lookback {lookback}) depends on bar t-{lookback + 1}"
        if lookback:
            assert any(row[name] != base[name] for row in changed_at[lookback]), (
                f"{name}: bar t-{lookback} does not matter, its lookback is shorter than {lookback}"
            )
    assert max(LOOKBACKS[n] for n in FEATURE_NAMES) == MAX_LOOKBACK


def test_instruments_never_mix() -> None:
    """Two interleaved instruments give the same rows as each featurized alone."""
    bars = random_walk_bars(260, {1: 4000.0, 2: 12.5}, seed=31)
    together = _features(bars)
    for iid in (1, 2):
        alone = _features(bars.filter(pl.col("instrument_id") == iid))
        assert_frame_equal(together.filter(pl.col("instrument_id") == iid), alone, **TOL)
    # Control: the instruments do differ, so mixing would show.
    assert not np.allclose(
        together.filter(pl.col("instrument_id") == 1)["rv_15"].to_numpy(),
        together.filter(pl.col("instrument_id") == 2)["rv_15"].to_numpy(),
    )


# ------------------------------------------------------------------ day files


def _day_files(tmp_path: Path, bars: pl.DataFrame, prefix: str = "day") -> list[Path]:
    paths = []
    days = bars.with_columns(pl.col("ts_event").cast(pl.Datetime("ns", "UTC")).dt.date().alias("_day"))
    for day, frame in sorted(days.partition_by("_day", as_dict=True).items()):
        frame = frame.drop("_day")
        start = int(dt.datetime.combine(day[0], dt.time(), tzinfo=dt.UTC).timestamp()) * 1_000_000_000
        data = encode_dbn(
            ohlcv_messages(frame),
            schema="ohlcv-1m",
            start_ns=start,
            end_ns=start + 86_400 * 10**9,
            symbols={"A": 1, "B": 2},
        )
        paths.append(write_dbn(tmp_path / f"{prefix}-{day[0]:%Y%m%d}.dbn.zst", data))
    return paths


def _three_days(seed: int) -> pl.DataFrame:
    # ~500 bars a day per instrument, starting 15:00 UTC so each day is partly filled.
    start = dt.datetime(2024, 5, 6, 15, 0, tzinfo=dt.UTC)
    bars = random_walk_bars(2100, {1: 5000.0, 2: 180.0}, start=start, seed=seed, gap_probability=0.6)
    return bars.filter(pl.col("ts_event") < int(dt.datetime(2024, 5, 9, tzinfo=dt.UTC).timestamp()) * 10**9)


def test_prev_src_context_equals_one_long_file(tmp_path: Path) -> None:
    bars = _three_days(seed=41)
    day_paths = _day_files(tmp_path, bars)
    assert len(day_paths) == 3
    whole = write_dbn(
        tmp_path / "whole.dbn.zst",
        encode_dbn(ohlcv_messages(bars), schema="ohlcv-1m", **_span(bars), symbols={"A": 1, "B": 2}),
    )
    build_feature_file(whole, tmp_path / "whole.parquet")
    reference = pl.read_parquet(tmp_path / "whole.parquet")
    sessions_per_file = []
    for i, path in enumerate(day_paths):
        prev = day_paths[i - 1] if i else None
        summary = build_feature_file(path, tmp_path / f"{i}.parquet", prev_src=prev)
        table = pl.read_parquet(tmp_path / f"{i}.parquet")
        # A UTC-day file holds the end of one CME session and the start of the next: its own rows are its bars'
        # timestamps, and they (day-cumulative VWAP included) equal the long file's rows at those times.
        own = read_bars(path).bars["ts_event"]
        assert table["ts_event"].is_in(own.implode()).all()
        sessions_per_file.append(table["trading_day"].n_unique())
        assert_frame_equal(table, reference.filter(pl.col("ts_event").is_in(own.implode())), **TOL)
        if prev is not None:
            meta = pl.read_parquet_metadata(tmp_path / f"{i}.parquet")
            assert meta["marketrl.prev_source_sha256"] == summary["prev_sha256"] == read_bars(prev).sha256
            # All of this day's bars are kept: the lookback did not restart at the file boundary.
            assert table.height == read_bars(path).bars.height
    assert sessions_per_file[1:] == [2, 2]  # 17:00 CT opens the next trading day inside each UTC day
    build_feature_file(day_paths[2], tmp_path / "alone.parquet")
    no_context = pl.read_parquet(tmp_path / "alone.parquet")
    assert no_context.height == read_bars(day_paths[2]).bars.height - 2 * MAX_LOOKBACK


def test_no_look_ahead_across_day_files(tmp_path: Path) -> None:
    bars = _three_days(seed=43)
    first, second, _ = _day_files(tmp_path, bars)
    build_feature_file(second, tmp_path / "a.parquet", prev_src=first)
    base = pl.read_parquet(tmp_path / "a.parquet")
    cut_ts = base["ts_event"].cast(pl.Int64).sort()[base.height // 2]
    day2 = bars.filter(pl.col("ts_event").cast(pl.Datetime("ns", "UTC")).dt.date() == base["trading_day"][0])
    (tmp_path / "p").mkdir()
    (perturbed_second,) = _day_files(tmp_path / "p", _perturb(day2, pl.col("ts_event") > cut_ts, seed=5))
    build_feature_file(perturbed_second, tmp_path / "b.parquet", prev_src=first)
    after = pl.read_parquet(tmp_path / "b.parquet")
    past = pl.col("ts_event").cast(pl.Int64) <= cut_ts
    for name in ("bar_return", *FEATURE_NAMES):
        assert base.filter(past)[name].equals(after.filter(past)[name]), f"{name} looked ahead across files"
    assert not base.filter(~past)["rv_15"].equals(after.filter(~past)["rv_15"])


def test_prev_src_of_another_schema_is_refused(tmp_path: Path, dbn_samples: Path) -> None:
    bars = _three_days(seed=45)
    first, *_ = _day_files(tmp_path, bars)
    with pytest.raises(DataFileError, match=r"context file .* expected GLBX\.MDP3/ohlcv-1m"):
        build_feature_file(
            first,
            tmp_path / "x.parquet",
            prev_src=dbn_samples / f"{BARS_DIR}/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst",
        )
    assert not (tmp_path / "x.parquet").exists()


# ------------------------------------------------------------------ book features


def test_quote_schema_adds_book_features(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    n = 700
    base = 1_704_153_600 * 1_000_000_000
    ts = base + np.sort(rng.integers(0, 240 * MINUTE_NS, n))
    price = 100 + np.round(np.cumsum(rng.normal(0, 0.1, n)) * 4) / 4
    spread = rng.choice([0.25, 0.5], n)
    trades = pl.DataFrame(
        {
            "ts_event": ts,
            "instrument_id": [5] * n,
            "price": price,
            "size": rng.integers(1, 20, n),
            "action": ["T"] * n,
            "bid_px": price - spread / 2,
            "ask_px": price + spread / 2,
            "bid_sz": rng.integers(1, 50, n),
            "ask_sz": rng.integers(1, 50, n),
        }
    )
    src = write_dbn(
        tmp_path / "q.dbn.zst",
        encode_dbn(
            trade_messages(trades, "mbp-1"),
            schema="mbp-1",
            start_ns=base,
            end_ns=int(ts.max()) + 1,
            symbols={"Q": 5},
        ),
    )
    summary = build_feature_file(src, tmp_path / "q.parquet")
    table = pl.read_parquet(tmp_path / "q.parquet")
    # the quote columns of quote-aware fills come last (marketrl.data.quotes); they are no features
    assert table.columns == [*BASE_COLUMNS, *FEATURE_NAMES, *BOOK_FEATURE_NAMES, *QUOTE_COLUMNS]
    assert summary["features"] == len(CATALOG) + len(BOOK_CATALOG)
    assert table["bid_px"][-1] == read_bars(src).bars["bid_px"][-1]  # the book at the bar's close
    assert table.select(pl.col(BOOK_FEATURE_NAMES).is_finite().all()).row(0) == (True,) * len(
        BOOK_FEATURE_NAMES
    )
    assert (table["book_valid"] == 1.0).all()
    bars = read_bars(src).bars.tail(1).row(0, named=True)
    mid = (bars["bid_px"] + bars["ask_px"]) / 2
    assert table["book_spread_bps"][-1] == pytest.approx(
        (bars["ask_px"] - bars["bid_px"]) / mid * 1e4, rel=1e-5
    )
    assert table["book_imbalance"][-1] == pytest.approx(
        (bars["bid_sz"] - bars["ask_sz"]) / (bars["bid_sz"] + bars["ask_sz"]), rel=1e-5, abs=1e-7
    )


# ------------------------------------------------------------------ real samples


def test_real_mbo_featurizes_with_1s_bars(tmp_path: Path, dbn_samples: Path) -> None:
    dst = tmp_path / "esh4.parquet"
    summary = build_feature_file(dbn_samples / ESH4_MBO_1225, dst, bar_size="1s")
    table = pl.read_parquet(dst)
    assert summary["dbn_version"] == 1 and summary["schema"] == "mbo"
    assert table.height == 988 - MAX_LOOKBACK and table["symbol"].unique().to_list() == ["ESH4"]
    # Most 1s bars of a real MBO day are flat (high == low): the windows that made parkinson_15/60 NaN.
    assert (table["high"] == table["low"]).mean() > 0.75
    assert np.isfinite(table.select(FEATURE_NAMES).to_numpy()).all()
    assert 4500 < table["close"].min() < table["close"].max() < 5200  # ES in Dec 2023
    # The previous day's file has no trades: as context it changes nothing.
    build_feature_file(
        dbn_samples / ESH4_MBO_1225,
        tmp_path / "ctx.parquet",
        bar_size="1s",
        prev_src=dbn_samples / ESH4_MBO_1224,
    )
    assert_frame_equal(pl.read_parquet(tmp_path / "ctx.parquet"), table)


@pytest.mark.parametrize(
    ("name", "bar_size"),
    [
        (
            f"{BARS_DIR}/futures_ohlcv-1m_2024-07-01T23-40_2024-07-02T00-10.dbn.zst",
            "1m",
        ),  # ESU4 + NQU4, 30 bars
        (f"{BARS_DIR}/futures_mbp-1_2024-07-01T23-58_2024-07-02T00-02.dbn.zst", "1s"),  # ESU4, 44 bars
        (f"{BARS_DIR}/futures_trades_2024-07-01T23-58_2024-07-02T00-02.dbn.zst", "1s"),
        (
            f"{NAUTILUS}/order_book_deltas_catalog/databento/orderbooks_mbo_2024-05-08T00-00-00_2024-05-08T00-00-02.dbn.zst",
            "1s",
        ),
        (ESH4_MBO_1225, "1m"),  # 60 one-minute bars
        (ESH4_MBO_1224, "1s"),  # no trades at all (a holiday): its own message, naming data.on_bad_file
    ],
)
def test_real_short_files_without_context_are_warm_up_only(
    tmp_path: Path, dbn_samples: Path, name: str, bar_size: str
) -> None:
    # Fewer bars than the lookbacks and nothing earlier: not an error but an empty table noting that the file
    # is warm-up only (the next file's context); a file without a trade stays an error naming data.on_bad_file.
    dst = tmp_path / "short.parquet"
    if name == ESH4_MBO_1224:
        with pytest.raises(DataFileError, match=r"no tradable bars.*data\.on_bad_file") as info:
            build_feature_file(dbn_samples / name, dst, bar_size=bar_size)
        assert "\n" not in str(info.value) and Path(name).name in str(info.value)
        assert not dst.exists()
        return
    summary = build_feature_file(dbn_samples / name, dst, bar_size=bar_size)
    bars = read_bars(dbn_samples / name, bar_size).bars.height
    assert summary["rows"] == 0 and summary["skipped"] is None and summary["context"] == []
    assert summary["warmup_only"] == warmup_only_note(dst)
    assert summary["warmup_only"].startswith(f"all {bars} bars are warm-up")
    assert pl.read_parquet(dst).height == 0


def test_a_short_instrument_is_warm_up_only(tmp_path: Path) -> None:
    # A contract that first trades near the end of a file (a roll) has only warm-up bars there: it gets no
    # row, is listed, and the other instruments' rows are unaffected.
    long = random_walk_bars(200, {1: 100.0}, seed=51)
    short = random_walk_bars(40, {2: 100.0}, seed=52)
    bars = pl.concat([long, short])
    src = write_dbn(
        tmp_path / "mixed.dbn.zst",
        encode_dbn(ohlcv_messages(bars), schema="ohlcv-1m", **_span(bars), symbols={"LONG": 1, "SHORT": 2}),
    )
    summary = build_feature_file(src, tmp_path / "a.parquet")
    assert summary["warmup_instruments"] == ["SHORT"] and summary["instruments"] == 1
    assert summary["rows"] == 200 - MAX_LOOKBACK and summary["warmup_only"] is None
    meta = pl.read_parquet_metadata(tmp_path / "a.parquet")
    assert meta["marketrl.warmup_instruments"] == '["SHORT"]' and "marketrl.warmup_only" not in meta
    with pytest.raises(DataFileError, match=r"instrument 2 \(2\) has 40 bar"):  # the library-level check
        feature_chunks(_prepared(bars).sort("instrument_id", "ts_event"), MINUTE_NS, path=src)


def test_failure_leaves_previous_output_untouched(tmp_path: Path, dbn_samples: Path) -> None:
    dst = tmp_path / "out.parquet"
    dst.write_bytes(b"previous good output")
    with pytest.raises(DataFileError):
        build_feature_file(dbn_samples / ESH4_MBO_1224, dst, bar_size="1m")  # no tradable bars
    with pytest.raises(DataFileError, match="empty file"):
        build_feature_file(write_dbn(tmp_path / "e.dbn.zst", b""), dst)
    assert dst.read_bytes() == b"previous good output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.dbn.zst", "out.parquet"]


def test_non_finite_values_are_refused_naming_the_column() -> None:
    bars = random_walk_bars(150, {1: 100.0}, seed=61, gap_probability=0.0)
    bad = bars.with_columns(
        pl.when(pl.int_range(pl.len()) == 140).then(0.0).otherwise(pl.col("low")).alias("low")
    )
    with pytest.raises(DataFileError, match="non-positive price in instrument 1"):
        _features(bad)
    from marketrl.features.engine import _check_finite

    table = _features(bars).with_columns(
        pl.when(pl.int_range(pl.len()) == 3).then(float("inf")).otherwise(pl.col("rsi_6")).alias("rsi_6")
    )
    with pytest.raises(DataFileError, match="non-finite values in column 'rsi_6'"):
        _check_finite(table, Path("x.dbn.zst"))
