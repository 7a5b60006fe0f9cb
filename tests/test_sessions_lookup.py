"""The session labelling lookup (UTC offsets over the data's span + a per-day table) against the per-row path it
replaced: ``convert_time_zone`` on every timestamp, kept here only as the test oracle. Years of 1-minute
timestamps across DST changes, holidays (rolled to the next business day), weekends and the daily halt."""

from __future__ import annotations

import datetime as dt

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_series_equal

from marketrl.calendars.sessions import SessionCalendar, calendar_for, session_frame, utc_offsets

NS = 1_000_000_000
DAY_NS = 86_400 * NS


def _ns_of_day(value: dt.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * NS


def _oracle(calendar: SessionCalendar, ts: pl.Expr) -> tuple[pl.Expr, pl.Expr, pl.Expr]:
    """The per-row path of marketrl.calendars.sessions before the lookup: trading day, in halt, closed."""
    local = ts.dt.convert_time_zone(calendar.timezone).dt.replace_time_zone(None)
    local_ns = local.dt.cast_time_unit("ns").cast(pl.Int64)
    shifted = local_ns - _ns_of_day(calendar.open)
    day = ((shifted // DAY_NS) + (1 if calendar.names_next_day else 0)).cast(pl.Int32).cast(pl.Date)
    holidays = sorted(calendar.holiday_dates)
    if calendar.names_next_day and holidays:
        from marketrl.calendars.holidays import next_business_day

        day = day.replace(holidays, [next_business_day(h, calendar.holiday_dates) for h in holidays])
    closed = (day.dt.weekday() >= 6) | (day.is_in(holidays) if holidays else pl.lit(False))
    if calendar.halt_start is None or calendar.halt_end is None:
        halted = pl.lit(False)
    else:
        tod = local_ns % DAY_NS
        start, end = _ns_of_day(calendar.halt_start), _ns_of_day(calendar.halt_end)
        halted = (tod >= start) & (tod < end) if start < end else (tod >= start) | (tod < end)
    return day, halted, closed


def _minutes(first: dt.datetime, last: dt.datetime, step_minutes: int = 1) -> pl.DataFrame:
    start, stop = int(first.timestamp()) * NS, int(last.timestamp()) * NS
    ts = np.arange(start, stop, step_minutes * 60 * NS, dtype=np.int64)
    return pl.DataFrame({"ts_event": pl.Series(ts).cast(pl.Datetime("ns", "UTC"))})


CALENDARS = {
    "cme": calendar_for("GLBX.MDP3"),
    "us_equities": calendar_for("XNAS.ITCH"),  # same-day session, a halt that wraps past midnight
    "london": SessionCalendar("Europe/London", dt.time(8, 0), dt.time(16, 30), dt.time(8, 0), holidays="us"),
    "lord_howe": SessionCalendar("Australia/Lord_Howe", dt.time(10, 0)),  # 30-minute DST shifts
    "utc": SessionCalendar("UTC", dt.time(0, 0)),
    # The open and a halt at the hour Chicago's clocks change: an offset one hour off, or applied from the wrong
    # instant, flips these labels at every transition.
    "chicago_2am": SessionCalendar("America/Chicago", dt.time(3, 0), dt.time(1, 30), dt.time(2, 30)),
}


@pytest.mark.parametrize("name", list(CALENDARS))
def test_lookup_equals_the_per_row_path_over_years_of_minutes(name: str) -> None:
    calendar = CALENDARS[name]
    # 2022-12-20 .. 2025-03-15 for CME (1-minute: 1.2M timestamps, 5 DST changes, ~22 holidays, Juneteenth,
    # the 2025-01-09 day of mourning); a shorter, coarser span for the other zones.
    if name in ("cme", "chicago_2am"):
        bars = _minutes(dt.datetime(2022, 12, 20, tzinfo=dt.UTC), dt.datetime(2025, 3, 15, tzinfo=dt.UTC))
    else:
        bars = _minutes(dt.datetime(2023, 1, 1, tzinfo=dt.UTC), dt.datetime(2025, 1, 10, tzinfo=dt.UTC), 7)
    labels = calendar.label(bars["ts_event"])
    day, halted, closed = _oracle(calendar, pl.col("ts_event"))
    expected = bars.select(day.alias("trading_day"), halted.alias("in_halt"), closed.alias("closed"))
    for column in ("trading_day", "in_halt", "closed"):
        assert_series_equal(labels[column], expected[column])
    assert labels["closed"].any() and (~labels["closed"]).any()
    kept, dropped, in_halt = session_frame(bars, calendar)
    outside = expected["in_halt"] | expected["closed"]
    assert (dropped, in_halt) == (int(outside.sum()), int(expected["in_halt"].sum()))
    assert_series_equal(kept["trading_day"], expected["trading_day"].filter(~outside))


def test_expressions_equal_the_lookup_and_handle_chunks_and_nulls() -> None:
    cme = CALENDARS["cme"]
    first = _minutes(dt.datetime(2024, 3, 8, tzinfo=dt.UTC), dt.datetime(2024, 3, 12, tzinfo=dt.UTC))
    second = _minutes(dt.datetime(2024, 11, 1, tzinfo=dt.UTC), dt.datetime(2024, 11, 5, tzinfo=dt.UTC))
    bars = pl.concat([first, second], rechunk=False)
    assert len(bars["ts_event"].chunk_lengths()) == 2
    day, halted, _ = _oracle(cme, pl.col("ts_event"))
    got = bars.select(cme.trading_day(pl.col("ts_event")), cme.in_halt(pl.col("ts_event")).alias("h"))
    want = bars.select(day, halted.alias("h"))
    assert got.equals(want)
    kept, dropped, _ = session_frame(bars, cme)
    assert kept["trading_day"].chunk_lengths() == kept["ts_event"].chunk_lengths() and dropped > 0
    with_null = pl.DataFrame(
        {"ts_event": pl.Series([None, 1_710_000_000 * NS]).cast(pl.Datetime("ns", "UTC"))}
    )
    assert with_null.select(cme.trading_day(pl.col("ts_event"))).to_series().to_list() == [
        None,
        dt.date(2024, 3, 9),  # Saturday 10:00 CST: a weekend trading day, outside every session
    ]
    empty = with_null.clear()
    assert session_frame(empty, cme)[1:] == (0, 0)


def test_utc_offsets_find_each_transition_to_the_second() -> None:
    start = int(dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp()) * NS
    end = int(dt.datetime(2025, 1, 1, tzinfo=dt.UTC).timestamp()) * NS
    starts, offsets = utc_offsets("America/Chicago", start, end)
    march, november = (
        int(dt.datetime(*d, tzinfo=dt.UTC).timestamp()) * NS for d in ((2024, 3, 10, 8), (2024, 11, 3, 7))
    )
    assert starts == [start, march, november]
    assert offsets == [-6 * 3600 * NS, -5 * 3600 * NS, -6 * 3600 * NS]
    assert utc_offsets("UTC", start, end) == ([start], [0])
