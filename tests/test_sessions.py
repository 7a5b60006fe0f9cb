"""Session calendars: every bar's trading_day against a loop over the tz database, across CME's weekly open,
daily halt and a DST change; US equity hours; data.session overrides and their errors."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl
import pytest

from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.reader import DataConfigError, read_bars
from marketrl.datasets import write_feature_manifest
from marketrl.features import build_feature_file
from marketrl.sessions import SessionCalendar, SessionConfigError, calendar_for, session_frame
from tests.support.synthetic import ohlcv_messages

NS = 1_000_000_000
DAY_NS = 86_400 * NS
CHICAGO = ZoneInfo("America/Chicago")


def _cme_reference(ts_ns: int) -> dt.date | None:
    """Independent CME rule, one bar at a time: None inside the 16:00-17:00 CT halt or on a weekend day."""
    local = dt.datetime.fromtimestamp(ts_ns / NS, tz=dt.UTC).astimezone(CHICAGO)
    if dt.time(16, 0) <= local.time() < dt.time(17, 0):
        return None
    day = local.date() + dt.timedelta(days=1) if local.time() >= dt.time(17, 0) else local.date()
    return None if day.weekday() >= 5 else day


def _in_cme_halt(ts_ns: int) -> bool:
    """Independent: the bar opens inside 16:00-17:00 Chicago time (the count reported as dropped in the halt)."""
    local = dt.datetime.fromtimestamp(ts_ns / NS, tz=dt.UTC).astimezone(CHICAGO)
    return dt.time(16, 0) <= local.time() < dt.time(17, 0)


def _utc_day_files(tmp_path: Path, first: dt.date, days: int, step_minutes: int, dataset: str) -> list[Path]:
    """One ohlcv-1m file per UTC day, a bar every ``step_minutes`` around the clock (weekends included)."""
    paths = []
    for offset in range(days):
        day = first + dt.timedelta(days=offset)
        start = int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp()) * NS
        ts = start + np.arange(0, DAY_NS, step_minutes * 60 * NS, dtype=np.int64)
        close = 4000.0 + np.arange(len(ts)) % 8 * 0.25
        bars = pl.DataFrame(
            {
                "ts_event": ts,
                "instrument_id": np.full(len(ts), 7, dtype=np.uint32),
                "open": close,
                "high": close + 0.5,
                "low": close - 0.5,
                "close": close,
                "volume": np.full(len(ts), 3.0),
            }
        )
        data = encode_dbn(
            ohlcv_messages(bars),
            schema="ohlcv-1m",
            start_ns=start,
            end_ns=start + DAY_NS,
            symbols={"ESH4": 7},
            dataset=dataset,
        )
        paths.append(write_dbn(tmp_path / f"{day.isoformat()}.ohlcv-1m.dbn.zst", data))
    return paths


def test_cme_trading_day_matches_a_per_bar_reference_across_weekend_halt_and_dst(tmp_path: Path) -> None:
    # Thu 2024-03-07 .. Tue 2024-03-12 UTC: Friday's close, the weekend, Sunday's 17:00 CT open and the US DST
    # change at 2024-03-10 02:00 CT (the halt moves from 22:00-23:00 to 21:00-22:00 UTC).
    paths = _utc_day_files(tmp_path, dt.date(2024, 3, 7), 6, step_minutes=5, dataset="GLBX.MDP3")
    checked = 0
    for path in paths:
        bar_file = read_bars(path, "1m")
        start = int(dt.datetime.fromisoformat(path.name[:10]).replace(tzinfo=dt.UTC).timestamp()) * NS
        expected = {ts: _cme_reference(ts) for ts in range(start, start + DAY_NS, 5 * 60 * NS)}
        kept = {ts: day for ts, day in expected.items() if day is not None}
        got = dict(
            zip(
                bar_file.bars["ts_event"].dt.epoch("ns").to_list(),
                bar_file.bars["trading_day"].to_list(),
                strict=True,
            )
        )
        assert got == kept, path.name
        assert bar_file.dropped_outside_session == len(expected) - len(kept)
        halted = [ts for ts in expected if _in_cme_halt(ts)]
        assert bar_file.dropped_in_halt == len(halted) == 12  # one hour of 5-minute bars, in CST and in CDT
        checked += len(kept)
    assert checked > 1000
    days = pl.concat([read_bars(p, "1m").bars for p in paths])["trading_day"].unique().sort().to_list()
    # Sunday's 17:00 CT open belongs to Monday; Saturday and Sunday never appear as trading days.
    assert days == [dt.date(2024, 3, d) for d in (7, 8, 11, 12)] + [dt.date(2024, 3, 13)]


def test_cme_halt_and_sunday_open_edges() -> None:
    cme = calendar_for("GLBX.MDP3")

    def classify(utc: dt.datetime) -> tuple[object, bool]:
        frame = pl.DataFrame({"ts_event": [utc]}).with_columns(pl.col("ts_event").dt.cast_time_unit("ns"))
        out = frame.select(
            cme.trading_day(pl.col("ts_event")).alias("day"), cme.in_halt(pl.col("ts_event")).alias("halt")
        )
        return out.row(0)

    # Winter: CST = UTC-6; summer (after 2024-03-10): CDT = UTC-5.
    assert classify(dt.datetime(2024, 3, 8, 21, 59, tzinfo=dt.UTC)) == (dt.date(2024, 3, 8), False)
    assert classify(dt.datetime(2024, 3, 8, 22, 0, tzinfo=dt.UTC))[1] is True  # 16:00 CST Friday
    assert classify(dt.datetime(2024, 3, 10, 21, 59, tzinfo=dt.UTC))[1] is True  # 16:59 CDT Sunday
    assert classify(dt.datetime(2024, 3, 10, 22, 0, tzinfo=dt.UTC)) == (dt.date(2024, 3, 11), False)
    assert classify(dt.datetime(2024, 3, 11, 20, 59, tzinfo=dt.UTC)) == (dt.date(2024, 3, 11), False)
    assert classify(dt.datetime(2024, 3, 11, 21, 0, tzinfo=dt.UTC))[1] is True  # 16:00 CDT Monday


def test_us_equities_regular_hours_and_a_session_override(tmp_path: Path) -> None:
    (path,) = _utc_day_files(tmp_path, dt.date(2024, 7, 2), 1, step_minutes=30, dataset="XNAS.ITCH")
    bars = read_bars(path, "1m").bars
    local = bars["ts_event"].dt.convert_time_zone("America/New_York")
    # EDT = UTC-4: 09:30-16:00 local is 13:30-20:00 UTC; nothing else is kept, and the day is the local date.
    assert local.dt.time().min() == dt.time(9, 30) and local.dt.time().max() == dt.time(15, 30)
    assert bars.height == 13 and bars["trading_day"].unique().to_list() == [dt.date(2024, 7, 2)]
    utc_days = read_bars(path, "1m", session={"timezone": "UTC", "open": "00:00"})
    assert utc_days.bars.height == 48 and utc_days.dropped_outside_session == 0
    assert utc_days.calendar == SessionCalendar("UTC", dt.time(0, 0))


def test_unknown_dataset_and_bad_session_config_are_one_line_errors(tmp_path: Path) -> None:
    (path,) = _utc_day_files(tmp_path, dt.date(2024, 7, 2), 1, step_minutes=60, dataset="XEUR.EOBI")
    with pytest.raises(
        DataConfigError, match=r"data\.session: no default session calendar for dataset 'XEUR"
    ):
        read_bars(path, "1m")
    with pytest.raises(DataConfigError):  # a configuration fault, never skipped
        build_feature_file(path, tmp_path / "x.parquet", on_bad_file="skip")
    assert not (tmp_path / "x.parquet").exists()
    assert read_bars(path, "1m", session={"timezone": "Europe/Berlin", "open": "08:00"}).bars.height
    for session, key in (
        ({"timezone": "Mars/Olympus", "open": "08:00"}, "timezone"),
        ({"timezone": "UTC", "open": "8h"}, "open"),
        ({"timezone": "UTC"}, "open"),
        ({"timezone": "UTC", "open": "08:00", "halt_start": "12:00"}, "halt_start"),
        ({"timezone": "UTC", "open": "08:00", "close": "12:00"}, "close"),
    ):
        with pytest.raises(SessionConfigError, match=rf"data\.session.*{key}"):
            SessionCalendar.from_config(session)


def test_daily_bars_keep_their_date_and_drop_weekends() -> None:
    days = [dt.datetime(2024, 3, d, tzinfo=dt.UTC) for d in (8, 9, 10, 11)]  # Fri, Sat, Sun, Mon
    frame = pl.DataFrame({"ts_event": days}).with_columns(pl.col("ts_event").dt.cast_time_unit("ns"))
    out, dropped, in_halt = session_frame(frame, calendar_for("GLBX.MDP3"), daily_bars=True)
    assert out["trading_day"].to_list() == [dt.date(2024, 3, 8), dt.date(2024, 3, 11)] and dropped == 2
    assert in_halt == 0  # a daily bar cannot be split at the halt


def test_halt_drops_reach_the_feature_metadata_and_the_manifest(tmp_path: Path) -> None:
    (path,) = _utc_day_files(tmp_path, dt.date(2024, 3, 12), 1, step_minutes=5, dataset="GLBX.MDP3")
    summary = build_feature_file(path, tmp_path / "tue.parquet")
    assert summary["dropped_in_halt"] == summary["dropped_outside_session"] == 12  # a Tuesday: only the halt
    (entry,) = write_feature_manifest([tmp_path / "tue.parquet"], tmp_path / "manifest.json")["files"]
    assert entry["dropped_in_halt"] == 12 and entry["dropped_outside_session"] == 12
    assert entry["source_file"] == path.name and entry["skipped"] is None
