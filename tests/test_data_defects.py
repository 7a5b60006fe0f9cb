"""Damaged copies of the real ESH4 MBO sample (tests/support/damaged.py): a header that labels ES as NQH4, a price
level far from the other files', a zero price in a context file, and records out of time order. Each is an error
naming the file the fault came from, or (re-sorted records) a note in the metadata, the manifest and the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import databento
import numpy as np
import polars as pl
import pytest

from marketrl.data.reader import DataFileError, read_bars
from marketrl.features import MAX_LOOKBACK, build_feature_file, resorted_note, skipped_reason
from marketrl.splits.datasets import write_feature_manifest
from tests.support.damaged import damaged_copy

ESH4_MBO = "nautilus_trader/esh4-glbx-mdp3-20231225.mbo.dbn.zst"  # 988 one-second bars of ESH4 (id 17077)
PRICE_SCALE = 1_000_000_000


@pytest.fixture
def days(tmp_path: Path, dbn_samples: Path) -> list[Path]:
    """Three good day files: the real sample, and copies of it one and two days later."""
    src = dbn_samples / ESH4_MBO
    return [damaged_copy(src, tmp_path / f"day{n}.mbo.dbn.zst", shift_days=n) for n in range(3)]


def _one_line(exc: pytest.ExceptionInfo[DataFileError], path: Path) -> str:
    message = str(exc.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and exc.value.path == path
    return message


# ------------------------------------------------------------------ 1. one id keeps one symbol root


def test_an_id_relabelled_as_another_product_is_an_error_naming_the_file(
    tmp_path: Path, dbn_samples: Path, days: list[Path]
) -> None:
    # ES's id 17077 labelled NQH4 in the second day's header: ran without a word, pricing ES with NQ's spec.
    bad = damaged_copy(
        dbn_samples / ESH4_MBO, tmp_path / "nq.mbo.dbn.zst", mappings={"ESH4": "NQH4"}, shift_days=1
    )
    assert read_bars(bad, "1s").bars["symbol"].unique().to_list() == ["NQH4"]  # the damage itself
    dst = tmp_path / "nq.parquet"
    with pytest.raises(DataFileError) as info:
        build_feature_file(bad, dst, bar_size="1s", context_srcs=[days[0]])
    message = _one_line(info, bad)
    assert "instrument 17077 is NQH4 here but ESH4 in day0.mbo.dbn.zst" in message
    assert "one instrument id keeps one symbol root" in message and not dst.exists()
    # With on_bad_file: skip, the bad file (and only it) is skipped.
    build_feature_file(bad, dst, bar_size="1s", context_srcs=[days[0]], on_bad_file="skip")
    assert "one instrument id keeps one symbol root" in (skipped_reason(dst) or "")


def test_a_relabelled_context_file_is_named_and_skip_keeps_the_good_file(
    tmp_path: Path, dbn_samples: Path, days: list[Path], caplog: pytest.LogCaptureFixture
) -> None:
    # day0, bad, day2: day2's job reads the bad file as context; the files before it outvote it.
    bad = damaged_copy(
        dbn_samples / ESH4_MBO, tmp_path / "nq.mbo.dbn.zst", mappings={"ESH4": "NQH4"}, shift_days=1
    )
    dst = tmp_path / "day2.parquet"
    with pytest.raises(DataFileError) as info:
        build_feature_file(days[2], dst, bar_size="1s", context_srcs=[days[0], bad])
    assert "is NQH4 here but ESH4 in day2.mbo.dbn.zst (2 of 3 files agree)" in _one_line(info, bad)
    assert not dst.exists()
    with caplog.at_level(logging.WARNING):
        summary = build_feature_file(
            days[2], dst, bar_size="1s", context_srcs=[days[0], bad], on_bad_file="skip"
        )
    assert summary["skipped"] is None and summary["context"] == []  # the context drops the bad file and day0
    assert summary["rows"] == 988 - MAX_LOOKBACK
    assert any("no context from nq.mbo.dbn.zst on back" in r.getMessage() for r in caplog.records)


def test_a_price_level_far_from_the_other_files_is_an_error_naming_the_file(
    tmp_path: Path, dbn_samples: Path, days: list[Path]
) -> None:
    # Same symbol, another instrument id (so the bar-to-bar check per id never compares them), 100x the prices.
    def scaled(records: np.ndarray) -> np.ndarray:
        records["instrument_id"] = 99
        traded = records["price"] != np.iinfo(np.int64).max
        records["price"][traded] *= 100
        return records

    src = dbn_samples / ESH4_MBO
    bad = tmp_path / "scaled.mbo.dbn.zst"
    store = databento.DBNStore.from_file(src)
    assert store.metadata.mappings["ESH4"][0]["symbol"] == "17077"
    damaged_copy(src, bad, records=scaled, shift_days=1, ids={"17077": "99"})
    with pytest.raises(DataFileError) as info:
        build_feature_file(bad, tmp_path / "s.parquet", bar_size="1s", context_srcs=[days[0]])
    message = _one_line(info, bad)
    assert "price level of ESH4 is " in message and "data.max_price_jump" in message


# ------------------------------------------------------------------ 2. a fault is the fault of its own file


def _zero_price(records: np.ndarray) -> np.ndarray:
    trades = np.flatnonzero(records["action"] == b"T")
    records["price"][trades[len(trades) // 2]] = 0
    return records


def test_a_zero_price_in_a_context_file_names_that_file_and_skip_keeps_the_good_one(
    tmp_path: Path, dbn_samples: Path, days: list[Path]
) -> None:
    bad = damaged_copy(
        dbn_samples / ESH4_MBO, tmp_path / "zero.mbo.dbn.zst", records=_zero_price, shift_days=1
    )
    good, dst = days[2], tmp_path / "good.parquet"
    with pytest.raises(DataFileError, match="non-positive price in instrument ESH4") as info:
        build_feature_file(good, dst, bar_size="1s", context_srcs=[days[0], bad])
    _one_line(info, bad)
    assert not dst.exists()
    # skip: the bad file's own job is skipped; the good file's job succeeds, its context dropping the bad file.
    skipped = build_feature_file(bad, tmp_path / "bad.parquet", bar_size="1s", on_bad_file="skip")
    assert "non-positive price" in skipped["skipped"]
    summary = build_feature_file(good, dst, bar_size="1s", context_srcs=[days[0], bad], on_bad_file="skip")
    assert summary["skipped"] is None and skipped_reason(dst) is None
    assert summary["context"] == [] and summary["rows"] == pl.read_parquet(dst).height == 988 - MAX_LOOKBACK


# ------------------------------------------------------------------ 3. records out of time order


def _fully_tied_bars(src: Path) -> set[object]:
    """The 1s bars holding trades of different prices that agree on ts_event, ts_recv and sequence: no key can
    restore their order once reversed."""
    records = databento.DBNStore.from_file(src).to_ndarray()
    trades = records[records["action"] == b"T"]
    frame = pl.DataFrame(
        {k: trades[k].astype(np.int64) for k in ("ts_event", "ts_recv", "sequence", "price")}
    )
    tied = (
        frame.group_by("ts_event", "ts_recv", "sequence").agg(pl.col("price").n_unique() > 1).filter("price")
    )
    bars = (tied["ts_event"] // PRICE_SCALE * PRICE_SCALE).cast(pl.Datetime("ns", "UTC"))
    return set(bars.to_list())


def test_records_out_of_time_order_are_noted_and_ties_broken_by_ts_recv_and_sequence(
    tmp_path: Path, dbn_samples: Path, caplog: pytest.LogCaptureFixture
) -> None:
    src = dbn_samples / ESH4_MBO
    reversed_src = damaged_copy(src, tmp_path / "reversed.mbo.dbn.zst", records=lambda r: r[::-1].copy())
    dst, good = tmp_path / "reversed.parquet", tmp_path / "good.parquet"
    with caplog.at_level(logging.WARNING):
        summary = build_feature_file(reversed_src, dst, bar_size="1s")
    note = summary["resorted"]
    assert note is not None and "records of instrument 17077 out of time order" in note
    assert "re-sorted by ts_event, ts_recv, sequence" in note and "\n" not in note
    assert resorted_note(dst) == note
    assert any(str(reversed_src) in r.getMessage() and note in r.getMessage() for r in caplog.records)
    assert build_feature_file(src, good, bar_size="1s")["resorted"] is None and resorted_note(good) is None
    manifest = write_feature_manifest([good, dst], tmp_path / "manifest.json")
    assert [e["resorted"] for e in manifest["files"]] == [None, note]
    assert json.loads((tmp_path / "manifest.json").read_text())["files"][1]["resorted"] == note
    # The bars: those of the file in order, but where trades tie on every key (30 bars moved without the keys).
    original, resorted = read_bars(src, "1s").bars, read_bars(reversed_src, "1s").bars
    moved = original.filter((original["open"] != resorted["open"]) | (original["close"] != resorted["close"]))
    assert set(moved["ts_event"].to_list()) <= _fully_tied_bars(src)
    assert 0 < moved.height < 30
