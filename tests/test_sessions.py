"""Session calendars: every bar's trading_day against a loop over the tz database and a hand-written holiday list,
across CME's weekly open, daily halt, DST changes and holidays (cleared under the next business day); US equity
hours and holidays; data.session overrides, their round trip and their errors."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from marketrl.calendars.sessions import SessionCalendar, SessionConfigError, calendar_for, session_frame
from marketrl.data.dbn_writer import encode_dbn, write_dbn
from marketrl.data.reader import BarFile, DataConfigError, read_bars
from marketrl.features import build_feature_file
from marketrl.settings.config import ConfigError, validate_config
from marketrl.splits.datasets import write_feature_manifest
from tests.support.synthetic import ohlcv_messages
from tests.test_exchange_holidays import KNOWN

NS = 1_000_000_000
DAY_NS = 86_400 * NS
CHICAGO = ZoneInfo("America/Chicago")
HOLIDAYS = set().union(*KNOWN.values())  # 2023-2026, written out by hand


def _cme_reference(ts_ns: int) -> dt.date | None:
    """Independent CME rule, one bar at a time: None inside the 16:00-17:00 CT halt or on a weekend day; a
    session closing on a holiday is cleared under the next weekday that is not one."""
    local = dt.datetime.fromtimestamp(ts_ns / NS, tz=dt.UTC).astimezone(CHICAGO)
    if dt.time(16, 0) <= local.time() < dt.time(17, 0):
        return None
    day = local.date() + dt.timedelta(days=1) if local.time() >= dt.time(17, 0) else local.date()
    if day.weekday() >= 5:
        return None
    while day in HOLIDAYS or day.weekday() >= 5:
        day += dt.timedelta(days=1)
    return day


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


def _checked_against_reference(path: Path) -> tuple[BarFile, dict[int, dt.date | None]]:
    """Read a 5-minute UTC-day file and check every bar's trading day, and the dropped count, against
    ``_cme_reference``; the read and the reference (None = outside every session) of each 5-minute slot."""
    bar_file = read_bars(path, "1m")
    start = int(dt.datetime.fromisoformat(path.name[:10]).replace(tzinfo=dt.UTC).timestamp()) * NS
    expected = {ts: _cme_reference(ts) for ts in range(start, start + DAY_NS, 5 * 60 * NS)}
    kept = {ts: day for ts, day in expected.items() if day is not None}
    got = dict(
        zip(bar_file.bars["ts_event"].dt.epoch("ns").to_list(), bar_file.bars["trading_day"], strict=True)
    )
    assert got == kept, path.name
    assert bar_file.dropped_outside_session == len(expected) - len(kept)
    return bar_file, expected


def test_cme_trading_day_matches_a_per_bar_reference_across_weekend_halt_and_dst(tmp_path: Path) -> None:
    # Thu 2024-03-07 .. Tue 2024-03-12 UTC: Friday's close, the weekend, Sunday's 17:00 CT open and the US DST
    # change at 2024-03-10 02:00 CT (the halt moves from 22:00-23:00 to 21:00-22:00 UTC).
    paths = _utc_day_files(tmp_path, dt.date(2024, 3, 7), 6, step_minutes=5, dataset="GLBX.MDP3")
    checked = 0
    for path in paths:
        bar_file, expected = _checked_against_reference(path)
        halted = [ts for ts in expected if _in_cme_halt(ts)]
        assert bar_file.dropped_in_halt == len(halted) == 12  # one hour of 5-minute bars, in CST and in CDT
        checked += bar_file.bars.height
    assert checked > 1000
    days = pl.concat([read_bars(p, "1m").bars for p in paths])["trading_day"].unique().sort().to_list()
    # Sunday's 17:00 CT open belongs to Monday; Saturday and Sunday never appear as trading days.
    assert days == [dt.date(2024, 3, d) for d in (7, 8, 11, 12)] + [dt.date(2024, 3, 13)]


@pytest.mark.parametrize(
    ("first", "n_files", "trading_days"),
    [
        # Presidents' Day: Sunday 17:00 CT -> the Monday halt belongs to Tuesday, with Monday 17:00 CT onwards
        ("2024-02-16", 6, ["2024-02-16", "2024-02-20", "2024-02-21", "2024-02-22"]),
        # Good Friday: Thursday 17:00 CT onwards -> Monday; Friday after 17:00 CT is a Saturday, dropped
        ("2024-03-27", 7, ["2024-03-27", "2024-03-28", "2024-04-01", "2024-04-02", "2024-04-03"]),
        # DST ends on Sunday 2024-11-03 (the open moves from 22:00 to 23:00 UTC)
        ("2024-11-01", 4, ["2024-11-01", "2024-11-04", "2024-11-05"]),
        # Thanksgiving: Wednesday 17:00 CT -> Thursday's 12:00 CT halt belongs to Friday 11-29
        ("2024-11-26", 5, ["2024-11-26", "2024-11-27", "2024-11-29"]),
        # Christmas on a Wednesday: Tuesday 17:00 CT onwards -> Thursday
        ("2024-12-23", 5, ["2024-12-23", "2024-12-24", "2024-12-26", "2024-12-27"]),
    ],
)
def test_cme_holidays_are_cleared_under_the_next_business_day(
    tmp_path: Path, first: str, n_files: int, trading_days: list[str]
) -> None:
    paths = _utc_day_files(
        tmp_path, dt.date.fromisoformat(first), n_files, step_minutes=5, dataset="GLBX.MDP3"
    )
    frames = []
    for path in paths:
        bar_file, expected = _checked_against_reference(path)
        assert bar_file.dropped_in_halt == sum(_in_cme_halt(ts) for ts in expected)
        frames.append(bar_file.bars)
    days = pl.concat(frames)["trading_day"].unique().sort().to_list()
    assert days == [dt.date.fromisoformat(day) for day in trading_days]
    assert not set(days) & HOLIDAYS


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


def test_us_equities_have_no_session_on_a_holiday(tmp_path: Path) -> None:
    holiday, after = _utc_day_files(tmp_path, dt.date(2024, 7, 4), 2, step_minutes=30, dataset="XNAS.ITCH")
    closed = read_bars(holiday, "1m")
    assert (
        closed.bars.height == 0 and closed.dropped_outside_session == 48
    )  # 13 in regular hours, 35 in the halt
    assert closed.dropped_in_halt == 35
    assert read_bars(after, "1m").bars["trading_day"].unique().to_list() == [dt.date(2024, 7, 5)]
    kept = read_bars(holiday, "1m", session={"holidays": "none"}).bars  # the rule set switched off
    assert kept.height == 13 and kept["trading_day"].unique().to_list() == [dt.date(2024, 7, 4)]


def test_holiday_overrides_keep_the_dataset_hours() -> None:
    def day_of(utc: dt.datetime, session: dict) -> dt.date:
        frame = pl.DataFrame({"ts_event": [utc]}).with_columns(pl.col("ts_event").dt.cast_time_unit("ns"))
        return frame.select(calendar_for("GLBX.MDP3", session).trading_day(pl.col("ts_event"))).item()

    presidents_day = dt.datetime(2024, 2, 19, 15, 0, tzinfo=dt.UTC)  # 09:00 CT on the holiday
    assert day_of(presidents_day, {}) == dt.date(2024, 2, 20)
    assert day_of(presidents_day, {"holidays": "none", "extra_holidays": []}) == dt.date(2024, 2, 19)
    extra = {"extra_holidays": ["2024-03-12"]}
    assert day_of(dt.datetime(2024, 3, 11, 23, 30, tzinfo=dt.UTC), extra) == dt.date(2024, 3, 13)
    assert day_of(dt.datetime(2024, 3, 12, 14, 0, tzinfo=dt.UTC), extra) == dt.date(2024, 3, 13)
    cme = calendar_for("GLBX.MDP3", extra)
    assert (cme.timezone, cme.open, cme.holidays) == ("America/Chicago", dt.time(17, 0), "us")
    # a calendar of its own has no holidays unless it names a rule set
    assert calendar_for("GLBX.MDP3", {"timezone": "UTC", "open": "00:00"}).holidays == "none"


def test_session_config_round_trips_through_json_and_the_feature_metadata(tmp_path: Path) -> None:
    calendars = [
        calendar_for("GLBX.MDP3"),
        calendar_for("XNAS.ITCH"),
        calendar_for("GLBX.MDP3", {"holidays": "none", "extra_holidays": ["2012-10-30", "2012-10-29"]}),
        SessionCalendar.from_config({"timezone": "Europe/Berlin", "open": "08:00", "holidays": "us"}),
    ]
    for calendar in calendars:
        assert SessionCalendar.from_config(json.loads(json.dumps(calendar.to_config()))) == calendar
    assert calendars[2].extra_holidays == (dt.date(2012, 10, 29), dt.date(2012, 10, 30))
    (path,) = _utc_day_files(tmp_path, dt.date(2024, 2, 19), 1, step_minutes=5, dataset="GLBX.MDP3")
    build_feature_file(path, tmp_path / "mon.parquet")
    stored = json.loads(pq.read_schema(tmp_path / "mon.parquet").metadata[b"marketrl.session"])
    assert stored["holidays"] == "us" and SessionCalendar.from_config(stored) == calendar_for("GLBX.MDP3")


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
        ({"timezone": "UTC", "open": "08:00", "holidays": "uk"}, "holidays"),
    ):
        with pytest.raises(SessionConfigError, match=rf"data\.session.*{key}"):
            SessionCalendar.from_config(session)
    for session, message in (
        ({"holidays": "uk"}, r"data\.session\.holidays: expected one of us, none, got 'uk'"),
        (
            {"extra_holidays": ["2024-02-30"]},
            r"data\.session\.extra_holidays: expected a date YYYY-MM-DD, got '2024-02-30'",
        ),
        (
            {"extra_holidays": ["2024-03-09"]},
            r"data\.session\.extra_holidays: 2024-03-09 is a Saturday; weekends",
        ),
        ({"extra_holidays": "2024-03-08"}, r"data\.session\.extra_holidays: expected a list of dates"),
    ):
        with pytest.raises(SessionConfigError, match=rf"^{message}"):
            calendar_for("GLBX.MDP3", session)
    with pytest.raises(ConfigError, match=r"^config key 'data\.session\.holidays': 'uk' is not one of"):
        validate_config({"data": {"session": {"holidays": "uk"}}})
    with pytest.raises(ConfigError, match=r"^config key 'data\.session\.extra_holidays\[0\]': '19 Feb'"):
        validate_config({"data": {"session": {"extra_holidays": ["19 Feb"]}}})


def test_daily_bars_keep_their_date_and_drop_weekends_and_holidays() -> None:
    days = [
        dt.datetime(2024, 2, d, tzinfo=dt.UTC) for d in (16, 17, 18, 19, 20)
    ]  # Fri, Sat, Sun, Mon (holiday), Tue
    frame = pl.DataFrame({"ts_event": days}).with_columns(pl.col("ts_event").dt.cast_time_unit("ns"))
    out, dropped, in_halt = session_frame(frame, calendar_for("GLBX.MDP3"), daily_bars=True)
    assert out["trading_day"].to_list() == [dt.date(2024, 2, 16), dt.date(2024, 2, 20)] and dropped == 3
    assert in_halt == 0  # a daily bar cannot be split at the halt (nor moved onto Tuesday's)


def test_halt_drops_reach_the_feature_metadata_and_the_manifest(tmp_path: Path) -> None:
    (path,) = _utc_day_files(tmp_path, dt.date(2024, 3, 12), 1, step_minutes=5, dataset="GLBX.MDP3")
    summary = build_feature_file(path, tmp_path / "tue.parquet")
    assert summary["dropped_in_halt"] == summary["dropped_outside_session"] == 12  # a Tuesday: only the halt
    (entry,) = write_feature_manifest([tmp_path / "tue.parquet"], tmp_path / "manifest.json")["files"]
    assert entry["dropped_in_halt"] == 12 and entry["dropped_outside_session"] == 12
    assert entry["source_file"] == path.name and entry["skipped"] is None
