"""Sanity checks on decoded data (corrupt frames, impossible timestamps, price-scale jumps, record order), the
data.on_bad_file decision, file order by header start (and a name order that disagrees), overlapping files vs a
CME session spanning two UTC-day files, uncompressed .dbn files and daily bars."""

from __future__ import annotations

import datetime as dt
import logging
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import zstandard
from polars.testing import assert_frame_equal

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.file_order import DbnHeaderError, dbn_stem, time_ordered
from marketrl.data.reader import DataFileError, read_bars
from marketrl.features import (
    FEATURE_NAMES,
    MAX_LOOKBACK,
    build_feature_file,
    feature_options,
    skipped_reason,
)
from marketrl.settings.config import ConfigError, validate_config
from marketrl.splits.datasets import (
    DatasetError,
    load_feature_tables,
    name_order_disagreement,
    write_feature_manifest,
)
from marketrl.workflow import pipeline
from tests.support.synthetic import ohlcv_messages, random_walk_bars, trade_messages
from tests.test_exchange_holidays import KNOWN

MINUTE_NS = 60_000_000_000
DAY_NS = 86_400 * 10**9
HOLIDAY_MBO = "nautilus_trader/esh4-glbx-mdp3-20231224.mbo.dbn.zst"  # Christmas Eve 2023: no trades


def _span(bars: pl.DataFrame) -> dict[str, int]:
    ts = bars["ts_event"].cast(pl.Int64)
    return {"start_ns": int(ts.min()), "end_ns": int(ts.max()) + 1}


def _ohlcv_file(path: Path, bars: pl.DataFrame, *, compress: bool = True) -> Path:
    data = encode_dbn(
        ohlcv_messages(bars), schema="ohlcv-1m", symbols={"ESH4": 7}, compress=compress, **_span(bars)
    )
    return write_dbn(path, data)


def _day(first_utc: dt.datetime, seed: int, scale: float = 1.0) -> pl.DataFrame:
    bars = random_walk_bars(300, {7: 4000.0}, start=first_utc, seed=seed, gap_probability=0.0)
    return bars.with_columns(pl.col("open", "high", "low", "close") * scale)


MONDAY = dt.datetime(2024, 3, 4, 0, 0, tzinfo=dt.UTC)
TUESDAY = MONDAY + dt.timedelta(days=1)


def test_corrupted_bytes_in_a_zstd_file_are_a_one_line_error(tmp_path: Path) -> None:
    good = _ohlcv_file(tmp_path / "good.dbn.zst", random_walk_bars(1300, {7: 4000.0, 9: 15000.0}, seed=1))
    data = bytearray(good.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = np.random.default_rng(3).integers(0, 256, 64, dtype=np.uint8).tobytes()
    bad = write_dbn(tmp_path / "bad.dbn.zst", bytes(data))
    with pytest.raises(DataFileError, match="corrupt zstd data") as info:
        read_bars(bad)
    assert "\n" not in str(info.value) and "bad.dbn.zst" in str(info.value)
    dst = tmp_path / "out.parquet"
    with pytest.raises(DataFileError):
        build_feature_file(bad, dst)
    assert not dst.exists()


def test_flipped_bits_in_a_checksummed_frame_fail_the_checksum(tmp_path: Path) -> None:
    good = _ohlcv_file(tmp_path / "good.dbn.zst", random_walk_bars(1300, {7: 4000.0}, seed=2))
    raw = zstandard.ZstdDecompressor().stream_reader(good.read_bytes()).read()
    data = bytearray(zstandard.ZstdCompressor(level=3, write_checksum=True).compress(raw))
    at = int(len(data) * 0.9)  # inside literals: the frame still decodes, only the checksum tells
    data[at : at + 64] = bytes(byte ^ 1 for byte in data[at : at + 64])
    with pytest.raises(DataFileError, match="corrupt zstd data"):
        read_bars(write_dbn(tmp_path / "flipped.dbn.zst", bytes(data)))


def test_trades_stamped_1970_are_outside_the_header_range(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    base = int(MONDAY.timestamp()) * 10**9 + 14 * 3600 * 10**9
    ts = base + np.sort(rng.integers(0, 60 * MINUTE_NS, 400))
    ts[:5] = np.arange(5)  # 1970-01-01T00:00:00.000000000..4
    trades = pl.DataFrame({"ts_event": ts, "instrument_id": [7] * 400, "price": 4000.25, "size": 1})
    data = encode_dbn(trade_messages(trades), schema="trades", start_ns=base, end_ns=base + 3600 * 10**9)
    path = write_dbn(tmp_path / "epoch.trades.dbn.zst", data)
    with pytest.raises(
        DataFileError, match=r"record timestamp 1970-01-01T00:00:00\.000000000Z outside"
    ) as info:
        read_bars(path)
    assert "\n" not in str(info.value)


def test_records_after_the_header_end_are_an_error(tmp_path: Path) -> None:
    # A wrong clock the other way: the last bars of a day file stamped in 2118 (the "test window in 2118").
    bars = _day(MONDAY, seed=19)
    late = int(dt.datetime(2118, 3, 4, tzinfo=dt.UTC).timestamp()) * 10**9 + MINUTE_NS * np.arange(5)
    ts = bars["ts_event"].cast(pl.Int64).to_numpy().copy()
    ts[-5:] = late
    stamped = bars.with_columns(pl.Series("ts_event", ts).cast(bars.schema["ts_event"]))
    data = encode_dbn(ohlcv_messages(stamped), schema="ohlcv-1m", symbols={"ESH4": 7}, **_span(bars))
    path = write_dbn(tmp_path / "late.dbn.zst", data)
    with pytest.raises(
        DataFileError,
        match=r"record timestamp 2118-03-04T00:04:00\.000000000Z outside the header.s range \[2024-03-04",
    ) as info:
        read_bars(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_ohlcv_records_out_of_time_order_are_an_error(tmp_path: Path) -> None:
    bars = random_walk_bars(60, {3: 100.0}, seed=9, gap_probability=0.0)
    msgs = ohlcv_messages(bars)
    msgs[10], msgs[40] = msgs[40], msgs[10]
    data = encode_dbn(msgs, schema="ohlcv-1m", **_span(bars))
    with pytest.raises(DataFileError, match="bars of instrument 3 out of time order"):
        read_bars(write_dbn(tmp_path / "order.dbn.zst", data))


def test_a_price_jump_inside_a_file_is_an_error_unless_disabled(tmp_path: Path) -> None:
    bars = _day(MONDAY, seed=4)
    row = pl.int_range(pl.len()) == 150
    spiked = bars.with_columns(
        pl.when(row).then(pl.col(c) * 100).otherwise(pl.col(c)) for c in ("open", "high", "low", "close")
    )
    path = _ohlcv_file(tmp_path / "spike.dbn.zst", spiked)
    with pytest.raises(DataFileError, match=r"ESH4 \(7\) jumps more than 10x.*data\.max_price_jump"):
        read_bars(path)
    assert read_bars(path, max_price_jump=0).bars.height == 300
    assert read_bars(path, max_price_jump=1000).bars.height == 300
    # A bad print inside the very first bar (high 50x its low) is caught too.
    first_wide = bars.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(pl.col("low") / 50).otherwise(pl.col("low"))
    )
    with pytest.raises(DataFileError, match=r"jumps more than 10x .*\(high .* vs low"):
        read_bars(_ohlcv_file(tmp_path / "wide.dbn.zst", first_wide))


def test_a_price_scale_change_between_files_is_an_error_or_a_skip(tmp_path: Path) -> None:
    monday = _ohlcv_file(tmp_path / "mon.dbn.zst", _day(MONDAY, seed=6))
    tuesday = _ohlcv_file(tmp_path / "tue.dbn.zst", _day(TUESDAY, seed=7, scale=0.01))  # prices /100
    dst = tmp_path / "tue.parquet"
    with pytest.raises(
        DataFileError, match=r"tue\.dbn\.zst: .*from the previous file mon\.dbn\.zst.*price-scale"
    ):
        build_feature_file(tuesday, dst, prev_src=monday)
    assert not dst.exists()
    summary = build_feature_file(tuesday, dst, prev_src=monday, on_bad_file="skip")
    assert summary["rows"] == 0 and "price-scale change" in summary["skipped"]
    table = pl.read_parquet(dst)
    assert table.height == 0 and table.columns[-len(FEATURE_NAMES) :] == list(FEATURE_NAMES)
    assert skipped_reason(dst) == summary["skipped"]
    manifest = write_feature_manifest([dst], tmp_path / "manifest.json")
    assert manifest["files"][0]["skipped"] == summary["skipped"] and manifest["files"][0]["rows"] == 0
    # The same day at the right scale has no reason to be skipped.
    same_scale = _ohlcv_file(tmp_path / "tue1.dbn.zst", _day(TUESDAY, seed=7))
    assert build_feature_file(same_scale, tmp_path / "ok.parquet", prev_src=monday)["skipped"] is None
    assert skipped_reason(tmp_path / "ok.parquet") is None


def test_a_holiday_file_is_an_error_naming_the_key_or_skipped_with_a_note(
    tmp_path: Path, dbn_samples: Path
) -> None:
    holiday, dst = dbn_samples / HOLIDAY_MBO, tmp_path / "holiday.parquet"
    with pytest.raises(DataFileError, match=r"no tradable bars.*set data\.on_bad_file: skip"):
        build_feature_file(holiday, dst, bar_size="1m")
    summary = build_feature_file(holiday, dst, bar_size="1m", on_bad_file="skip")
    assert summary["skipped"].startswith("no tradable bars") and "on_bad_file" not in summary["skipped"]
    assert pl.read_parquet(dst).height == 0 and skipped_reason(dst) == summary["skipped"]


def test_an_unusable_previous_file_only_loses_the_context_under_skip(tmp_path: Path) -> None:
    broken_prev = write_dbn(tmp_path / "mon.dbn.zst", b"\x28\xb5\x2f\xfd garbage")
    tuesday = _ohlcv_file(tmp_path / "tue.dbn.zst", _day(TUESDAY, seed=8))
    with pytest.raises(DataFileError, match=r"mon\.dbn\.zst"):
        build_feature_file(tuesday, tmp_path / "a.parquet", prev_src=broken_prev)
    summary = build_feature_file(tuesday, tmp_path / "a.parquet", prev_src=broken_prev, on_bad_file="skip")
    assert summary["rows"] == 300 - MAX_LOOKBACK and summary["prev_sha256"] is None


def test_feature_options_from_the_data_config() -> None:
    data = {
        "bar_size": "5m",
        "session": {"timezone": "UTC", "open": "00:00"},
        "max_price_jump": 5,
        "on_bad_file": "skip",
    }
    assert feature_options(data) == {
        "bar_size": "5m",
        "session": {"timezone": "UTC", "open": "00:00"},
        "max_price_jump": 5.0,
        "on_bad_file": "skip",
    }
    assert feature_options({"session": {}}) == {}
    with pytest.raises(ValueError, match=r"data\.on_bad_file"):
        feature_options({"on_bad_file": "ignore"})


def test_uncompressed_dbn_decodes_like_zstd(tmp_path: Path) -> None:
    bars = _day(MONDAY, seed=10)
    packed = read_bars(_ohlcv_file(tmp_path / "d.dbn.zst", bars))
    plain = read_bars(_ohlcv_file(tmp_path / "d.dbn", bars, compress=False))
    assert_frame_equal(plain.bars, packed.bars)
    summary = build_feature_file(tmp_path / "d.dbn", tmp_path / "d.parquet")
    assert summary["rows"] == 300 - MAX_LOOKBACK


def test_daily_bars_from_an_ohlcv_1d_file(tmp_path: Path) -> None:
    start = dt.datetime(2023, 1, 2, tzinfo=dt.UTC)
    bars = random_walk_bars(400, {7: 4000.0}, start=start, bar_ns=DAY_NS, seed=11, gap_probability=0.0)
    weekday = pl.col("ts_event").cast(pl.Datetime("ns", "UTC")).dt.weekday() <= 5
    bars = bars.filter(weekday)
    data = encode_dbn(
        ohlcv_messages(bars, "ohlcv-1d"), schema="ohlcv-1d", symbols={"ES.c.0": 7}, **_span(bars)
    )
    path = write_dbn(tmp_path / "es.ohlcv-1d.dbn.zst", data)
    daily = read_bars(path, "1d")
    # the US holidays' bars (e.g. 2023-01-02, observed New Year) are outside every session: no trading day
    on_holidays = (
        bars["ts_event"].cast(pl.Datetime("ns", "UTC")).dt.date().is_in(sorted(set().union(*KNOWN.values())))
    )
    assert 8 <= on_holidays.sum() == daily.dropped_outside_session
    assert daily.bars.height == bars.height - on_holidays.sum()
    assert daily.bars["trading_day"].to_list() == daily.bars["ts_event"].dt.date().to_list()
    with pytest.raises(DataFileError, match="cannot be built from ohlcv-1d"):
        read_bars(path, "1h")
    summary = build_feature_file(path, tmp_path / "es.parquet", bar_size="1d")
    assert summary["rows"] == daily.bars.height - MAX_LOOKBACK


def test_files_are_ordered_by_their_header_start_and_both_suffixes_have_stems(tmp_path: Path) -> None:
    # Names that sort the wrong way: the order must come from the headers.
    late = _ohlcv_file(tmp_path / "a-late.dbn", _day(TUESDAY, seed=12), compress=False)
    early = _ohlcv_file(tmp_path / "b-early.dbn.zst", _day(MONDAY, seed=13))
    assert time_ordered([late, early]) == [early, late]
    assert [dbn_stem(p) for p in (late, early)] == ["a-late", "b-early"]
    with pytest.raises(ValueError, match=r"\.dbn\.zst or \.dbn"):
        dbn_stem("prices.csv")
    with pytest.raises(DbnHeaderError, match=r"junk\.dbn: no complete DBN metadata header"):
        time_ordered([write_dbn(tmp_path / "junk.dbn", b"DBN junk")])


def test_the_dag_orders_input_files_by_header_start(tmp_path: Path) -> None:
    # The workflow's file list (and so each file's lookback predecessor) follows the data, not the names.
    late = _ohlcv_file(tmp_path / "a-late.dbn", _day(TUESDAY, seed=12), compress=False)
    early = _ohlcv_file(tmp_path / "b-early.dbn.zst", _day(MONDAY, seed=13))
    config = validate_config({"data": {"source": "files", "files": str(tmp_path / "*.dbn*")}})
    assert list(pipeline.raw_data_files(config).values()) == [str(early), str(late)]
    assert pipeline.previous_files(config, "a-late") == [str(early)]
    write_dbn(tmp_path / "c-junk.dbn", b"DBN junk")
    with pytest.raises(
        ConfigError, match=r"^config key 'data.files': .*c-junk\.dbn: no complete DBN metadata header"
    ):
        pipeline.raw_data_files(config)


def test_an_unreadable_header_under_skip_is_noted_and_skipped_by_its_features_job(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # data.on_bad_file: skip: the DAG still builds; the file goes last (it is no file's context), one line on
    # stderr names it and why, and its features job writes an empty table whose reason reaches the manifest.
    late = _ohlcv_file(tmp_path / "a-late.dbn", _day(TUESDAY, seed=12), compress=False)
    early = _ohlcv_file(tmp_path / "b-early.dbn.zst", _day(MONDAY, seed=13))
    junk = write_dbn(tmp_path / "0-junk.dbn", b"DBN junk")
    config = validate_config(
        {"data": {"source": "files", "files": str(tmp_path / "*.dbn*"), "on_bad_file": "skip"}}
    )
    assert list(pipeline.raw_data_files(config).values()) == [str(early), str(late), str(junk)]
    assert pipeline.raw_data_files(config)  # the DAG re-reads the list: the note is written once per process
    noted = [line for line in capfd.readouterr().err.splitlines() if "skipping input file" in line]
    assert len(noted) == 1 and f"{junk}: no complete DBN metadata header" in noted[0]
    dst = tmp_path / "junk.parquet"
    with pytest.raises(DataFileError, match=r"0-junk\.dbn"):
        build_feature_file(junk, dst, prev_src=late)
    summary = build_feature_file(junk, dst, prev_src=late, on_bad_file="skip")
    assert summary["rows"] == 0 and summary["skipped"]
    manifest = write_feature_manifest([dst], tmp_path / "manifest.json")
    assert manifest["files"][0]["skipped"] == summary["skipped"]


def test_day_month_year_names_follow_the_data_and_the_disagreement_reaches_the_manifest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 04-03-2024 sorts before 29-02-2024 by name; its data come four days later.
    first = _ohlcv_file(
        tmp_path / "29-02-2024.dbn.zst", _day(dt.datetime(2024, 2, 29, tzinfo=dt.UTC), seed=17)
    )
    second = _ohlcv_file(tmp_path / "04-03-2024.dbn.zst", _day(MONDAY, seed=18))
    config = validate_config({"data": {"source": "files", "files": str(tmp_path / "*.dbn.zst")}})
    with caplog.at_level(logging.WARNING, logger="marketrl.data.file_order"):
        assert list(pipeline.raw_data_files(config).values()) == [str(first), str(second)]
    assert "name order disagrees with the data's time order" in caplog.text
    tables = [tmp_path / "first.parquet", tmp_path / "second.parquet"]
    build_feature_file(first, tables[0])
    build_feature_file(second, tables[1], prev_src=first)
    manifest = write_feature_manifest(tables, tmp_path / "manifest.json")
    assert manifest["name_order"] == {"file": "04-03-2024.dbn.zst", "after": "29-02-2024.dbn.zst"}
    # ISO names agree with time; a file without rows (skipped, unreadable header: put last) has no place in time.
    agreeing = [
        {"source_file": "2024-02-29.dbn.zst", "rows": 197},
        {"source_file": "2024-03-04.dbn.zst", "rows": 300},
        {"source_file": "0-junk.dbn", "rows": 0},
    ]
    assert name_order_disagreement(agreeing) is None


def test_a_cme_session_spanning_two_utc_day_files_is_not_an_overlap_but_a_duplicate_file_is(
    tmp_path: Path,
) -> None:
    # Monday's UTC file ends with the first hour of Tuesday's session (17:00 CT Monday = 23:00 UTC); Tuesday's
    # UTC file holds the rest. Same trading day in two files, no bar in both: not an overlap.
    evening = random_walk_bars(
        360, {7: 4000.0}, start=MONDAY + dt.timedelta(hours=18), seed=14, gap_probability=0.0
    )
    mon = _ohlcv_file(tmp_path / "20240304.dbn.zst", evening)
    tue = _ohlcv_file(tmp_path / "20240305.dbn.zst", _day(TUESDAY, seed=15))
    tables = [tmp_path / "mon.parquet", tmp_path / "tue.parquet"]
    build_feature_file(mon, tables[0])
    build_feature_file(tue, tables[1], prev_src=mon)
    session = dt.date(2024, 3, 5)
    assert session in set(pl.read_parquet(tables[0])["trading_day"])
    assert set(pl.read_parquet(tables[1])["trading_day"]) == {session}
    table = load_feature_tables(tables)
    assert table.filter(pl.col("trading_day") == session).height == 60 + 300
    # A second download of part of Tuesday (02:00-07:00 UTC) overlaps tue's time range: duplicates, one line.
    again = _ohlcv_file(
        tmp_path / "20240305-again.dbn.zst",
        random_walk_bars(
            300, {7: 4000.0}, start=TUESDAY + dt.timedelta(hours=2), seed=16, gap_probability=0.0
        ),
    )
    build_feature_file(again, tmp_path / "again.parquet", prev_src=tue)
    with pytest.raises(
        DatasetError, match=r"overlapping data: \S+again\.parquet and \S+tue\.parquet both hold ESH4"
    ) as info:
        load_feature_tables([*tables, tmp_path / "again.parquet"])
    assert "\n" not in str(info.value)


def test_records_far_outside_the_neighbouring_files_span_are_an_error(tmp_path: Path) -> None:
    # Tuesday's header allows a century (a corrupt or careless end), and five of its bars are stamped a year later
    # (plausible on their own: not in the future): inside its own header range, but far past Wednesday's file. No
    # bar is shared, so only the spans tell.
    wednesday = TUESDAY + dt.timedelta(days=1)
    bars = _day(TUESDAY, seed=20)
    ts = bars["ts_event"].cast(pl.Int64).to_numpy().copy()
    ts[-5:] = int(dt.datetime(2025, 3, 4, tzinfo=dt.UTC).timestamp()) * 10**9 + MINUTE_NS * np.arange(5)
    stamped = bars.with_columns(pl.Series("ts_event", ts).cast(bars.schema["ts_event"]))
    end = int(dt.datetime(2119, 1, 1, tzinfo=dt.UTC).timestamp()) * 10**9
    tue = write_dbn(
        tmp_path / "tue.dbn.zst",
        encode_dbn(
            ohlcv_messages(stamped), schema="ohlcv-1m", symbols={"ESH4": 7}, start_ns=ts[0], end_ns=end
        ),
    )
    wed = _ohlcv_file(tmp_path / "wed.dbn.zst", _day(wednesday, seed=21))
    tables = [tmp_path / "tue.parquet", tmp_path / "wed.parquet"]
    build_feature_file(tue, tables[0])
    build_feature_file(wed, tables[1], prev_src=tue)
    with pytest.raises(
        DatasetError,
        match=r"overlapping files: \S+tue\.parquet holds ESH4 from 2024-03-05 01:43:00\+00:00 to "
        r"2025-03-04 00:04:00\+00:00, past the first bar of \S+wed\.parquet at 2024-03-06 00:00:00",
    ) as info:
        load_feature_tables(tables)
    assert "\n" not in str(info.value)
    assert load_feature_tables(tables[1:]).height == 300  # each file alone is fine


def test_a_whole_file_stamped_in_the_future_is_an_error(tmp_path: Path) -> None:
    # Header and records agree with each other, so the header-range check passes; the clock is still wrong.
    bars = _day(MONDAY, seed=23)
    shift = int(dt.datetime(2118, 3, 4, tzinfo=dt.UTC).timestamp()) * 10**9 - int(MONDAY.timestamp()) * 10**9
    moved = bars.with_columns((pl.col("ts_event").cast(pl.Int64) + shift).cast(bars.schema["ts_event"]))
    data = encode_dbn(ohlcv_messages(moved), schema="ohlcv-1m", symbols={"ESH4": 7}, **_span(moved))
    path = write_dbn(tmp_path / "glbx-mdp3-21180304.ohlcv-1m.dbn.zst", data)
    with pytest.raises(DataFileError, match=r"header start 2118-03-04T.* is in the future") as info:
        read_bars(path)
    assert "\n" not in str(info.value) and str(info.value).startswith(str(path))


def test_a_header_before_1990_is_an_error(tmp_path: Path) -> None:
    bars = _day(MONDAY, seed=24)
    shift = -int(MONDAY.timestamp()) * 10**9 + DAY_NS  # 1970-01-02
    moved = bars.with_columns((pl.col("ts_event").cast(pl.Int64) + shift).cast(bars.schema["ts_event"]))
    data = encode_dbn(ohlcv_messages(moved), schema="ohlcv-1m", symbols={"ESH4": 7}, **_span(moved))
    path = write_dbn(tmp_path / "epoch.dbn.zst", data)
    with pytest.raises(DataFileError, match=r"header start 1970-01-0.* is before 1990"):
        read_bars(path)
