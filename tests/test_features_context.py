"""Lookback context across several earlier files: a short Sunday file (the CME open hour) in the middle of the
data loses no Monday rows, a download starting on a Sunday gives a warm-up-only table, context files are decoded
lazily (newest first, only as far as needed), and every context file used is recorded."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import marketrl.features.build as build
from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.reader import DataFileError, read_bars
from marketrl.features import MAX_LOOKBACK, build_feature_file, skipped_reason, warmup_only_note
from marketrl.settings.config import validate_config
from marketrl.splits.datasets import load_feature_tables, write_feature_manifest
from marketrl.splits.folds import trading_days_of
from marketrl.workflow import pipeline
from tests.support.synthetic import ohlcv_messages, random_walk_bars

MINUTE_NS = 60_000_000_000
DAY_NS = 86_400 * 10**9
SYMBOLS = {"ESH4": 1, "NQH4": 2}


def _utc(*args: int) -> dt.datetime:
    return dt.datetime(*args, tzinfo=dt.UTC)


# Winter UTC-day files of CME data: Friday up to the 16:00 CT close, the Sunday file with only the 17:00 CT open
# hour (23:00-24:00 UTC, 60 bars < MAX_LOOKBACK), then Monday.
THURSDAY = ("thu", _utc(2024, 1, 4, 14), 150)
FRIDAY = ("fri", _utc(2024, 1, 5, 20), 120)
SUNDAY = ("sun", _utc(2024, 1, 7, 23), 60)
MONDAY = ("mon", _utc(2024, 1, 8, 0), 120)
assert SUNDAY[2] < MAX_LOOKBACK < FRIDAY[2] + SUNDAY[2]


def _segments(segments: list[tuple[str, dt.datetime, int]], seed: int) -> pl.DataFrame:
    """One continuous random walk per instrument laid over the segments' minutes, with a `_file` column."""
    n = sum(count for _, _, count in segments)
    times = pl.DataFrame(
        {
            "_k": range(n),
            "_ts": [
                int(start.timestamp()) * 10**9 + i * MINUTE_NS
                for _, start, count in segments
                for i in range(count)
            ],
            "_file": [name for name, _, count in segments for _ in range(count)],
        }
    )
    bars = random_walk_bars(n, {1: 4000.0, 2: 15000.0}, seed=seed, gap_probability=0.0)
    return (
        bars.sort("instrument_id", "ts_event")
        .with_columns(pl.int_range(pl.len()).over("instrument_id").alias("_k"))
        .join(times, on="_k")
        .with_columns(pl.col("_ts").alias("ts_event"))
        .drop("_k", "_ts")
    )


def _file(path: Path, bars: pl.DataFrame) -> Path:
    """A UTC-day DBN file (header range: the whole UTC days its bars fall on)."""
    ts = bars["ts_event"].cast(pl.Int64)
    start, end = int(ts.min()) // DAY_NS * DAY_NS, (int(ts.max()) // DAY_NS + 1) * DAY_NS
    data = encode_dbn(ohlcv_messages(bars), schema="ohlcv-1m", start_ns=start, end_ns=end, symbols=SYMBOLS)
    return write_dbn(path, data)


def _files(tmp_path: Path, bars: pl.DataFrame, names: list[str]) -> dict[str, Path]:
    return {
        name: _file(tmp_path / f"glbx-{name}.dbn.zst", bars.filter(pl.col("_file") == name).drop("_file"))
        for name in names
    }


def _own_rows(reference: pl.DataFrame, src: Path) -> pl.DataFrame:
    return reference.filter(pl.col("ts_event").is_in(read_bars(src).bars["ts_event"].implode()))


def _one_long_file(tmp_path: Path, bars: pl.DataFrame) -> pl.DataFrame:
    whole = _file(tmp_path / "whole.dbn.zst", bars.drop("_file"))
    build_feature_file(whole, tmp_path / "whole.parquet")
    return pl.read_parquet(tmp_path / "whole.parquet")


def test_a_short_sunday_file_in_the_middle_loses_no_monday_rows(tmp_path: Path) -> None:
    # The invariant: a day file featurized with its previous days as context gives the same rows as one long
    # file. With only the 60-bar Sunday file as context, Monday's first 43 bars would be warm-up rows.
    bars = _segments([FRIDAY, SUNDAY, MONDAY], seed=1)
    files = _files(tmp_path, bars, ["fri", "sun", "mon"])
    reference = _one_long_file(tmp_path, bars)
    dst = tmp_path / "mon.parquet"
    summary = build_feature_file(files["mon"], dst, context_srcs=[files["fri"], files["sun"]])
    monday = pl.read_parquet(dst)
    assert monday.height == summary["rows"] == len(SYMBOLS) * MONDAY[2]
    assert_frame_equal(monday, _own_rows(reference, files["mon"]), check_exact=True)
    # Control: the Sunday file alone is too little context.
    build_feature_file(files["mon"], tmp_path / "sun-only.parquet", prev_src=files["sun"])
    lost = (MAX_LOOKBACK - SUNDAY[2]) * len(SYMBOLS)
    assert pl.read_parquet(tmp_path / "sun-only.parquet").height == monday.height - lost


def test_context_files_used_are_recorded(tmp_path: Path) -> None:
    bars = _segments([FRIDAY, SUNDAY, MONDAY], seed=2)
    files = _files(tmp_path, bars, ["fri", "sun", "mon"])
    dst = tmp_path / "mon.parquet"
    summary = build_feature_file(files["mon"], dst, context_srcs=[files["fri"], files["sun"]])
    used = [{"file": files[n].name, "sha256": read_bars(files[n]).sha256} for n in ("fri", "sun")]
    meta = pl.read_parquet_metadata(dst)
    assert summary["context"] == json.loads(meta["marketrl.context_files"]) == used
    # The nearest earlier file keeps its old keys.
    assert meta["marketrl.prev_source_file"] == files["sun"].name
    assert meta["marketrl.prev_source_sha256"] == summary["prev_sha256"] == used[-1]["sha256"]
    assert summary["warmup_only"] is None and warmup_only_note(dst) is None
    build_feature_file(files["fri"], tmp_path / "fri.parquet")
    assert json.loads(pl.read_parquet_metadata(tmp_path / "fri.parquet")["marketrl.context_files"]) == []


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    real = build.read_bars

    def counting(path: Path, *args: object, **kwargs: object) -> object:
        reads.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(build, "read_bars", counting)
    return reads


def test_context_files_are_decoded_newest_first_and_only_as_far_as_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bars = _segments([THURSDAY, FRIDAY, SUNDAY, MONDAY], seed=3)
    files = _files(tmp_path, bars, ["thu", "fri", "sun", "mon"])
    reads = _count_reads(monkeypatch)
    build_feature_file(files["fri"], tmp_path / "fri.parquet", context_srcs=[files["thu"]])
    build_feature_file(files["sun"], tmp_path / "sun.parquet", context_srcs=[files["thu"], files["fri"]])
    assert reads == [files[n].name for n in ("fri", "thu", "sun", "fri")]  # Friday's 120 bars suffice
    reads.clear()
    summary = build_feature_file(
        files["mon"], tmp_path / "mon.parquet", context_srcs=[files["thu"], files["fri"], files["sun"]]
    )
    assert reads == [files[n].name for n in ("mon", "sun", "fri")]  # Thursday is never decoded
    assert [c["file"] for c in summary["context"]] == [files["fri"].name, files["sun"].name]
    # An unreadable file beyond the context needed costs nothing, even with data.on_bad_file: error.
    files["thu"].write_bytes(b"garbage")
    again = build_feature_file(
        files["mon"], tmp_path / "mon2.parquet", context_srcs=[files["thu"], files["fri"], files["sun"]]
    )
    assert again["rows"] == summary["rows"] == len(SYMBOLS) * MONDAY[2]


def test_a_download_starting_on_a_sunday_gives_a_warm_up_only_first_table(tmp_path: Path) -> None:
    # The features stage as the DAG runs it: each file with its pipeline.previous_files as context.
    bars = _segments([SUNDAY, MONDAY], seed=4)
    _files(tmp_path, bars, ["sun", "mon"])
    config = validate_config({"data": {"source": "files", "files": str(tmp_path / "glbx-*.dbn.zst")}})
    tables, summaries = [], []
    for stem, src in pipeline.raw_data_files(config).items():
        context = [Path(p) for p in pipeline.previous_files(config, stem)]
        tables.append(tmp_path / f"{stem}.parquet")
        summaries.append(build_feature_file(Path(src), tables[-1], context_srcs=context))
    sunday, monday = summaries
    assert sunday["rows"] == 0 and sunday["skipped"] is None and sunday["context"] == []
    assert (
        sunday["warmup_only"] == warmup_only_note(tables[0])
        and "context for the next file" in sunday["warmup_only"]
    )
    assert skipped_reason(tables[0]) is None  # warm-up only is no bad file
    empty = pl.read_parquet(tables[0])
    assert empty.height == 0 and empty.columns == pl.read_parquet(tables[1]).columns
    # Monday: 60 Sunday bars of history, so each instrument's first 43 Monday bars are still warm-up rows.
    assert monday["rows"] == len(SYMBOLS) * (MONDAY[2] - (MAX_LOOKBACK - SUNDAY[2]))
    assert [c["file"] for c in monday["context"]] == ["glbx-sun.dbn.zst"]
    reference = _one_long_file(tmp_path, bars)
    assert_frame_equal(pl.read_parquet(tables[1]), reference, check_exact=True)
    manifest = write_feature_manifest(tables, tmp_path / "manifest.json")
    assert [e["warmup_only"] for e in manifest["files"]] == [sunday["warmup_only"], None]
    assert [e["skipped"] for e in manifest["files"]] == [None, None]
    assert_frame_equal(load_feature_tables(tables), reference.sort("instrument_id", "ts_event"))
    assert trading_days_of(tables) == sorted(reference["trading_day"].unique().to_list())


def test_an_unusable_context_file_ends_the_context_there(tmp_path: Path) -> None:
    bars = _segments([FRIDAY, SUNDAY, MONDAY], seed=5)
    files = _files(tmp_path, bars, ["fri", "sun", "mon"])
    files["sun"].write_bytes(b"\x28\xb5\x2f\xfd garbage")
    context = [files["fri"], files["sun"]]
    with pytest.raises(DataFileError, match=r"glbx-sun\.dbn\.zst"):
        build_feature_file(files["mon"], tmp_path / "a.parquet", context_srcs=context)
    # Friday is not used past the broken Sunday: that would leave a hole in the lookbacks.
    summary = build_feature_file(
        files["mon"], tmp_path / "a.parquet", context_srcs=context, on_bad_file="skip"
    )
    assert summary["context"] == [] and summary["rows"] == len(SYMBOLS) * (MONDAY[2] - MAX_LOOKBACK)


def test_a_price_scale_change_between_context_files(tmp_path: Path) -> None:
    bars = _segments([FRIDAY, SUNDAY, MONDAY], seed=6)
    cents = pl.col("_file") == "fri"
    bars = bars.with_columns(
        pl.when(cents).then(pl.col(c) * 100).otherwise(pl.col(c)) for c in ("open", "high", "low", "close")
    )
    files = _files(tmp_path, bars, ["fri", "sun", "mon"])
    context = [files["fri"], files["sun"]]
    with pytest.raises(
        DataFileError, match=r"glbx-sun\.dbn\.zst: .*from the previous file glbx-fri\.dbn\.zst"
    ):
        build_feature_file(files["mon"], tmp_path / "a.parquet", context_srcs=context)
    summary = build_feature_file(
        files["mon"], tmp_path / "a.parquet", context_srcs=context, on_bad_file="skip"
    )
    assert [c["file"] for c in summary["context"]] == [files["sun"].name] and summary["skipped"] is None
    assert summary["rows"] == len(SYMBOLS) * (MONDAY[2] - (MAX_LOOKBACK - SUNDAY[2]))


def test_previous_files_are_the_k_files_before_in_time_order(tmp_path: Path) -> None:
    bars = _segments([THURSDAY, FRIDAY, SUNDAY, MONDAY], seed=7)
    files = _files(tmp_path, bars, ["thu", "fri", "sun", "mon"])
    config = validate_config({"data": {"source": "files", "files": str(tmp_path / "glbx-*.dbn.zst")}})
    name = {str(path): key for key, path in files.items()}
    assert [name[p] for p in pipeline.previous_files(config, "glbx-mon")] == ["thu", "fri", "sun"]
    assert [name[p] for p in pipeline.previous_files(config, "glbx-mon", k=2)] == ["fri", "sun"]
    assert [name[p] for p in pipeline.previous_files(config, "glbx-fri")] == ["thu"]
    assert pipeline.previous_files(config, "glbx-thu") == []
    assert pipeline.CONTEXT_FILES >= 2  # a short Sunday file needs the Friday before it


def test_a_trading_day_over_three_files_after_a_monday_holiday_is_whole_in_its_last_file(
    tmp_path: Path,
) -> None:
    # Presidents' Day 2024: Sunday 17:00 CT -> Monday 12:00 CT and the Monday 17:00 CT reopen are all cleared under
    # Tuesday 2024-02-20, so Tuesday's session spans the Sunday, Monday and Tuesday UTC-day files. Monday alone
    # is enough context for the lookbacks, but the day-VWAP sums the whole session: the context must reach back
    # past Tuesday's first bar of the session, to Friday.
    segments = [
        ("fri", _utc(2024, 2, 16, 20), 120),
        ("sun", _utc(2024, 2, 18, 23), 60),
        ("mon", _utc(2024, 2, 19, 0), 150),
        ("mon-reopen", _utc(2024, 2, 19, 23), 60),
        ("tue", _utc(2024, 2, 20, 0), 120),
    ]
    bars = _segments(segments, seed=5).with_columns(pl.col("_file").replace({"mon-reopen": "mon"}))
    files = _files(tmp_path, bars, ["fri", "sun", "mon", "tue"])
    assert read_bars(files["sun"]).bars["trading_day"].unique().to_list() == [dt.date(2024, 2, 20)]
    reference = _one_long_file(tmp_path, bars)
    dst = tmp_path / "tue.parquet"
    summary = build_feature_file(files["tue"], dst, context_srcs=[files[n] for n in ("fri", "sun", "mon")])
    assert [entry["file"] for entry in summary["context"]] == [files[n].name for n in ("fri", "sun", "mon")]
    assert_frame_equal(pl.read_parquet(dst), _own_rows(reference, files["tue"]), check_exact=True)
    # Control: with Monday's file alone the lookbacks are covered but the session's Sunday hour is missing.
    build_feature_file(files["tue"], tmp_path / "mon-only.parquet", prev_src=files["mon"])
    partial = pl.read_parquet(tmp_path / "mon-only.parquet")
    assert partial.height == summary["rows"]
    assert not partial["vwap_dev_day"].equals(pl.read_parquet(dst)["vwap_dev_day"])


def test_a_file_weeks_before_is_not_context(tmp_path: Path) -> None:
    # Data of early January and of February, nothing between: February's lookbacks do not reach into January.
    segments = [("jan", _utc(2024, 1, 5, 20), 120), ("feb", _utc(2024, 2, 5, 0), 150)]
    bars = _segments(segments, seed=6)
    files = _files(tmp_path, bars, ["jan", "feb"])
    summary = build_feature_file(files["feb"], tmp_path / "feb.parquet", prev_src=files["jan"])
    assert summary["context"] == []
    assert summary["rows"] == len(SYMBOLS) * (150 - MAX_LOOKBACK)  # its own warm-up, as a first file
