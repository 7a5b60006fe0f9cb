"""CME Globex equity-index futures hours for the demo data: sessions, holiday halts and UTC-day files.

Standard library only (rules/common.smk calls ``demo_file_days`` at every DAG parse, through marketrl.workflow.pipeline).

A session is named after the local (America/Chicago) date on which it closes, as marketrl.calendars.sessions names it: the
session of trading day D opens at 17:00 CT on D-1 (Sunday for a Monday) and closes at 16:00 CT on D, followed by
the daily 16:00-17:00 CT halt. Times are local, so the UTC open moves from 23:00 to 22:00 when US daylight saving
time starts (2024-03-10). Holidays are marketrl.calendars.holidays' ``us`` rule set (docs/DEMO_DATA.md):

- ``CLOSED_ON`` (New Year's Day, Good Friday, Christmas Day): no session trades on that date; the exchange
  reopens at 17:00 CT that evening for the next trade date;
- every other holiday: the session that opened at 17:00 CT the evening before halts early, at ``HOLIDAY_HALT``
  (12:00 CT; ``ONE_OFF_HALT``, 08:30 CT, on a national day of mourning) and is cleared under the next business
  day's trade date, together with the session that reopens at 17:00 CT on the holiday. That trading day has two
  segments, e.g. 2024-02-20: Sunday 17:00 CT to the Presidents' Day halt, then Monday 17:00 CT to Tuesday 16:00 CT.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass

from marketrl.calendars.holidays import (
    CHRISTMAS,
    GOOD_FRIDAY,
    NEW_YEARS_DAY,
    ONE_OFF_CLOSURES,
    is_business_day,
    next_business_day,
    us_holidays,
)

__all__ = [
    "CLOSED_ON",
    "EXCHANGE_TZ",
    "HOLIDAY_HALT",
    "DemoSession",
    "cme_sessions",
    "data_start_ns",
    "demo_file_days",
    "first_trading_day",
    "holiday_close",
    "is_trading_day",
    "trading_days",
]

EXCHANGE_TZ = zoneinfo.ZoneInfo("America/Chicago")
SESSION_OPEN = dt.time(17, 0)  # on the local date before the trading day
SESSION_CLOSE = dt.time(16, 0)  # start of the daily halt
CLOSED_ON = frozenset({NEW_YEARS_DAY, GOOD_FRIDAY, CHRISTMAS})  # holidays without any equity futures session
HOLIDAY_HALT = dt.time(12, 0)  # CME's early halt of equity index futures on the other US holidays
ONE_OFF_HALT = dt.time(8, 30)  # the national days of mourning (CME's notices for 2018-12-05 and 2025-01-09)
_NS = 1_000_000_000


@dataclass(frozen=True)
class DemoSession:
    """One CME session segment: its trading day and its [open, close) in UTC nanoseconds. A trading day after
    an early-halt holiday has two segments (the holiday's halted session, then the regular one)."""

    trading_day: dt.date
    open_ns: int
    close_ns: int

    @property
    def minutes(self) -> int:
        """Length of the segment in minutes (1380 on a regular day)."""
        return (self.close_ns - self.open_ns) // (60 * _NS)


def _utc_ns(day: dt.date, local: dt.time) -> int:
    moment = dt.datetime.combine(day, local, tzinfo=EXCHANGE_TZ)
    return int(moment.timestamp()) * _NS


def _holidays(day: dt.date) -> frozenset[dt.date]:
    """The ``us`` holidays of ``day``'s year and the next (a roll crosses New Year)."""
    return frozenset(us_holidays(day.year)) | frozenset(us_holidays(day.year + 1))


def holiday_close(day: dt.date) -> dt.time | None:
    """The local time the session trading on the weekday holiday ``day`` halts, None when no session trades on
    it (``CLOSED_ON``); only for holidays."""
    name = us_holidays(day.year)[day]
    if name in CLOSED_ON:
        return None
    return ONE_OFF_HALT if day in ONE_OFF_CLOSURES else HOLIDAY_HALT


def is_trading_day(day: dt.date) -> bool:
    """A business day: a weekday that is not a holiday (holiday sessions belong to the next one)."""
    return is_business_day(day, _holidays(day))


def first_trading_day(start: dt.date) -> dt.date:
    """``start`` or the first trading day after it."""
    while not is_trading_day(start):
        start += dt.timedelta(days=1)
    return start


def _segments_from(day: dt.date) -> Iterator[DemoSession]:
    """Every session segment, in time order, of the weekdays from ``day`` on (each trades on its weekday: it opens
    at 17:00 CT the calendar day before)."""
    while True:
        if day.weekday() < 5:
            opened = _utc_ns(day - dt.timedelta(days=1), SESSION_OPEN)
            if is_trading_day(day):
                yield DemoSession(day, opened, _utc_ns(day, SESSION_CLOSE))
            elif (close := holiday_close(day)) is not None:
                yield DemoSession(next_business_day(day, _holidays(day)), opened, _utc_ns(day, close))
        day += dt.timedelta(days=1)


def cme_sessions(start: dt.date, n_sessions: int) -> list[DemoSession]:
    """The session segments of the first ``n_sessions`` trading days that are ``start`` or later, in time order."""
    first = first_trading_day(start)
    sessions: list[DemoSession] = []
    days: set[dt.date] = set()
    # a trading day's earliest segment trades at most a few days before it (a holiday, a weekend)
    for segment in _segments_from(first - dt.timedelta(days=7)):
        if segment.trading_day < first:
            continue
        if segment.trading_day not in days:
            if len(days) == n_sessions:
                break
            days.add(segment.trading_day)
        sessions.append(segment)
    return sessions


def trading_days(start: dt.date, n_sessions: int) -> list[dt.date]:
    """The first ``n_sessions`` trading days that are ``start`` or later."""
    return sorted({session.trading_day for session in cme_sessions(start, n_sessions)})


def _utc_date(ts_ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(ts_ns // _NS, tz=dt.UTC).date()


def data_start_ns(sessions: list[DemoSession]) -> int:
    """Where the demo's data begin: 00:00 UTC of the first trading day, like a download requested from that date
    (the first session's hour before it, Sunday 17:00-18:00 CT for a Monday, is not in the data; nor, when the
    first trading day follows an early-halt holiday, the holiday's segment)."""
    first = sessions[0].trading_day
    return int(dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC).timestamp()) * _NS


def demo_file_days(start: dt.date, n_sessions: int) -> list[dt.date]:
    """The UTC calendar days holding the bars of those sessions: one file each, Sundays (the 17:00 CT open)
    included; a segment spans two UTC days."""
    sessions = cme_sessions(start, n_sessions)
    data_start = data_start_ns(sessions)
    days = set()
    for session in sessions:
        day, end = _utc_date(max(session.open_ns, data_start)), _utc_date(session.close_ns - 1)
        while day <= end:
            days.add(day)
            day += dt.timedelta(days=1)
    return sorted(days)
