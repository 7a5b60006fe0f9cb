"""CME Globex equity-index futures hours for the demo data: sessions, holiday halts and UTC-day files.

Standard library only (rules/common.smk calls ``demo_file_days`` at every DAG parse, through marketrl.pipeline).

A session is named after the local (America/Chicago) date on which it closes, as marketrl.sessions names it: the
session of trading day D opens at 17:00 CT on D-1 (Sunday for a Monday) and closes at 16:00 CT on D, followed by
the daily 16:00-17:00 CT halt. Times are local, so the UTC open moves from 23:00 to 22:00 when US daylight saving
time starts (2024-03-10). Holidays (2024 table below, docs/DEMO_DATA.md):

- ``EARLY_HALTS``: on a Monday holiday (and the other US holidays listed) CME Globex halts equity index futures at
  12:00 CT instead of 16:00 and reopens at 17:00 CT as usual. CME clears the halted session under the next trade
  date; marketrl's calendar has no holiday table and names it after its own date, a short session;
- ``CLOSED``: no session at all (New Year's Day, Good Friday, Christmas Day).
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from dataclasses import dataclass

__all__ = [
    "CLOSED",
    "EARLY_HALTS",
    "EXCHANGE_TZ",
    "DemoSession",
    "cme_sessions",
    "data_start_ns",
    "demo_file_days",
    "first_trading_day",
    "is_trading_day",
]

EXCHANGE_TZ = zoneinfo.ZoneInfo("America/Chicago")
SESSION_OPEN = dt.time(17, 0)  # on the local date before the trading day
SESSION_CLOSE = dt.time(16, 0)  # start of the daily halt
# 2024 US holidays on which CME Globex halts equity index futures early (12:00 CT) and reopens at 17:00 CT.
EARLY_HALTS: dict[dt.date, dt.time] = {
    dt.date(2024, 1, 15): dt.time(12, 0),  # Martin Luther King Jr. Day
    dt.date(2024, 2, 19): dt.time(12, 0),  # Presidents' Day
    dt.date(2024, 5, 27): dt.time(12, 0),  # Memorial Day
    dt.date(2024, 6, 19): dt.time(12, 0),  # Juneteenth
    dt.date(2024, 7, 4): dt.time(12, 0),  # Independence Day
    dt.date(2024, 9, 2): dt.time(12, 0),  # Labor Day
    dt.date(2024, 11, 28): dt.time(12, 0),  # Thanksgiving
}
# 2024 trading days without any session (the Globex reopen is at 17:00 CT on that day, for the next trade date).
CLOSED: frozenset[dt.date] = frozenset({dt.date(2024, 1, 1), dt.date(2024, 3, 29), dt.date(2024, 12, 25)})
_NS = 1_000_000_000


@dataclass(frozen=True)
class DemoSession:
    """One CME session: its trading day and its [open, close) in UTC nanoseconds."""

    trading_day: dt.date
    open_ns: int
    close_ns: int

    @property
    def minutes(self) -> int:
        """Length of the session in minutes (1380 on a regular day)."""
        return (self.close_ns - self.open_ns) // (60 * _NS)


def _utc_ns(day: dt.date, local: dt.time) -> int:
    moment = dt.datetime.combine(day, local, tzinfo=EXCHANGE_TZ)
    return int(moment.timestamp()) * _NS


def is_trading_day(day: dt.date) -> bool:
    """A weekday with a session (not in ``CLOSED``)."""
    return day.weekday() < 5 and day not in CLOSED


def first_trading_day(start: dt.date) -> dt.date:
    """``start`` or the first trading day after it."""
    while not is_trading_day(start):
        start += dt.timedelta(days=1)
    return start


def cme_sessions(start: dt.date, n_sessions: int) -> list[DemoSession]:
    """The first ``n_sessions`` sessions whose trading day is ``start`` or later."""
    sessions: list[DemoSession] = []
    day = first_trading_day(start)
    while len(sessions) < n_sessions:
        if is_trading_day(day):
            close = EARLY_HALTS.get(day, SESSION_CLOSE)
            opened = _utc_ns(day - dt.timedelta(days=1), SESSION_OPEN)
            sessions.append(DemoSession(day, opened, _utc_ns(day, close)))
        day += dt.timedelta(days=1)
    return sessions


def _utc_date(ts_ns: int) -> dt.date:
    return dt.datetime.fromtimestamp(ts_ns // _NS, tz=dt.UTC).date()


def data_start_ns(sessions: list[DemoSession]) -> int:
    """Where the demo's data begin: 00:00 UTC of the first trading day, like a download requested from that date
    (the first session's hour before it, Sunday 17:00-18:00 CT for a Monday, is not in the data)."""
    first = sessions[0].trading_day
    return int(dt.datetime(first.year, first.month, first.day, tzinfo=dt.UTC).timestamp()) * _NS


def demo_file_days(start: dt.date, n_sessions: int) -> list[dt.date]:
    """The UTC calendar days holding the bars of those sessions: one file each, Sundays (the 17:00 CT open)
    included; a session spans two UTC days."""
    sessions = cme_sessions(start, n_sessions)
    data_start = data_start_ns(sessions)
    days = set()
    for session in sessions:
        day, end = _utc_date(max(session.open_ns, data_start)), _utc_date(session.close_ns - 1)
        while day <= end:
            days.add(day)
            day += dt.timedelta(days=1)
    return sorted(days)
