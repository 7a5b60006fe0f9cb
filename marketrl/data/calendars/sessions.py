"""Exchange session calendars: which trading day a bar belongs to, and which bars fall outside any session.

A calendar is a timezone, the local time the session opens, an optional daily halt ``[halt_start, halt_end)`` in
local time (it may wrap past midnight, e.g. 16:00-09:30 for a cash equity market) and a holiday rule set
(marketrl.data.calendars.holidays) with optional extra dates. A session is named after the local date on which it
closes: CME Globex opens at 17:00 Chicago time and closes (the daily halt) at 16:00 the next day, so the bars from
Sunday 17:00 CT belong to Monday's trading day; Nasdaq opens 09:30 and closes 16:00 New York time on the same date.

Holidays are never trading days. A session that opened the evening before (``names_next_day``) and trades on a
holiday is cleared, as CME clears it, under the next business day: the bars from Sunday 17:00 CT to the 12:00 CT
halt on Presidents' Day belong to Tuesday, together with the session that reopens at 17:00 CT on Monday. A
same-day session (US equities) has no session on a holiday: bars dated on it are outside every session. Bars
inside the halt, and bars whose trading day would be a Saturday or Sunday (e.g. Friday after the CME close), are
outside every session too: the reader drops and counts them.

Everything is a polars expression on the UTC timestamps: the wall clock comes from ``convert_time_zone`` (the
tz database, so DST changes are exact), the trading day from shifting the wall clock back by the open time.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

from marketrl.data.calendars.holidays import RULE_SETS, holiday_dates, next_business_day

__all__ = [
    "DEFAULT_CALENDARS",
    "SessionCalendar",
    "SessionConfigError",
    "calendar_for",
    "session_frame",
]

_NS_PER_DAY = 86_400 * 10**9
HOLIDAY_YEARS = (1990, 2100)  # the years a rule set's holidays are generated for (all of Databento's history)
_HOURS_KEYS = ("timezone", "open", "halt_start", "halt_end")
_HOLIDAY_KEYS = ("holidays", "extra_holidays")
_US_EQUITY_DATASETS = (
    "XNAS.ITCH",
    "XNAS.BASIC",
    "XNYS.PILLAR",
    "XNYS.TRADES",
    "ARCX.PILLAR",
    "XASE.PILLAR",
    "XCHI.PILLAR",
    "XCIS.TRADESBBO",
    "XBOS.ITCH",
    "XPSX.ITCH",
    "BATS.PITCH",
    "BATY.PITCH",
    "EDGA.PITCH",
    "EDGX.PITCH",
    "IEXG.TOPS",
    "MEMX.MEMOIR",
    "EPRL.DOM",
    "DBEQ.BASIC",
    "EQUS.MINI",
    "EQUS.SUMMARY",
    "EQUS.ALL",
    "EQUS.PLUS",
)


class SessionConfigError(ValueError):
    """A ``data.session`` value is missing or invalid, or a dataset has no default calendar."""


def _parse_time(value: Any, key: str) -> dt.time:
    if isinstance(value, dt.time):
        return value
    try:
        hours, minutes = (int(part) for part in str(value).split(":"))
        return dt.time(hours, minutes)
    except (TypeError, ValueError):
        raise SessionConfigError(
            f"data.session.{key}: expected a local time 'HH:MM', got {value!r}"
        ) from None


def _ns_of_day(value: dt.time) -> int:
    return ((value.hour * 60 + value.minute) * 60 + value.second) * 10**9


def _given(value: Any) -> bool:
    """False for what the schema fills in for an absent key ("" or an empty list)."""
    return value not in (None, "") and not (isinstance(value, list | tuple) and not value)


def _parse_dates(value: Any) -> tuple[dt.date, ...]:
    key = "data.session.extra_holidays"
    if not isinstance(value, list | tuple):
        raise SessionConfigError(f"{key}: expected a list of dates YYYY-MM-DD, got {value!r}")
    days = []
    for item in value:
        try:
            day = dt.date.fromisoformat(str(item))  # a YAML date, or its text
        except ValueError:
            raise SessionConfigError(f"{key}: expected a date YYYY-MM-DD, got {item!r}") from None
        if day.weekday() >= 5:
            raise SessionConfigError(f"{key}: {day} is a {day:%A}; weekends are never trading days")
        days.append(day)
    return tuple(sorted(set(days)))


def _check_keys(session: Mapping[str, Any]) -> None:
    unknown = sorted(set(session) - {*_HOURS_KEYS, *_HOLIDAY_KEYS})
    if unknown:
        raise SessionConfigError(f"data.session.{unknown[0]}: unknown key")


def _holiday_fields(session: Mapping[str, Any]) -> dict[str, Any]:
    """``holidays`` and ``extra_holidays`` of a ``data.session`` mapping, where given."""
    fields: dict[str, Any] = {}
    if _given(session.get("holidays")):
        fields["holidays"] = str(session["holidays"])
    if _given(session.get("extra_holidays")):
        fields["extra_holidays"] = _parse_dates(session["extra_holidays"])
    return fields


@dataclass(frozen=True)
class SessionCalendar:
    """One market's daily session: timezone, local open time, an optional daily halt ``[start, end)``, and its
    holidays: a rule set of marketrl.data.calendars.holidays (``"us"`` or ``"none"``) plus ``extra_holidays``."""

    timezone: str
    open: dt.time
    halt_start: dt.time | None = None
    halt_end: dt.time | None = None
    holidays: str = "none"
    extra_holidays: tuple[dt.date, ...] = ()

    def __post_init__(self) -> None:
        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise SessionConfigError(
                f"data.session.timezone: unknown IANA timezone {self.timezone!r}"
            ) from None
        if (self.halt_start is None) != (self.halt_end is None):
            raise SessionConfigError("data.session: halt_start and halt_end must be given together")
        if self.halt_start is not None and self.halt_start == self.halt_end:
            raise SessionConfigError(
                "data.session: halt_start equals halt_end (an empty halt: leave both out)"
            )
        if self.holidays not in RULE_SETS:
            raise SessionConfigError(
                f"data.session.holidays: expected one of {', '.join(RULE_SETS)}, got {self.holidays!r}"
            )

    @classmethod
    def from_config(cls, session: Mapping[str, Any]) -> SessionCalendar:
        """From ``data.session`` (timezone, open 'HH:MM', optional halt_start/halt_end 'HH:MM', optional
        holidays ``us``/``none``, default none, and extra_holidays, a list of ISO dates)."""
        _check_keys(session)
        for key in ("timezone", "open"):
            if not session.get(key):
                raise SessionConfigError(f"data.session.{key}: required when data.session is set")
        halt = {
            key: _parse_time(session[key], key) if session.get(key) not in (None, "") else None
            for key in ("halt_start", "halt_end")
        }
        return cls(
            str(session["timezone"]),
            _parse_time(session["open"], "open"),
            **halt,
            **_holiday_fields(session),
        )

    @functools.cached_property
    def holiday_dates(self) -> frozenset[dt.date]:
        """The calendar's holidays (weekdays) over ``HOLIDAY_YEARS``, extra ones included."""
        return holiday_dates(self.holidays, *HOLIDAY_YEARS) | frozenset(self.extra_holidays)

    @functools.cached_property
    def _holiday_roll(self) -> tuple[list[dt.date], list[dt.date]]:
        """Each holiday and the business day its sessions are named after (``names_next_day`` calendars)."""
        holidays = sorted(self.holiday_dates)
        return holidays, [next_business_day(day, self.holiday_dates) for day in holidays]

    @property
    def names_next_day(self) -> bool:
        """True when the session closes on the local date after it opens (it is named after that date)."""
        close = self.halt_start if self.halt_start is not None else self.open
        return close <= self.open and self.open != dt.time(0, 0)

    def _local_ns(self, ts: pl.Expr) -> pl.Expr:
        """Local wall-clock time as nanoseconds since 1970-01-01 local midnight."""
        local = ts.dt.convert_time_zone(self.timezone).dt.replace_time_zone(None)
        return local.dt.cast_time_unit("ns").cast(pl.Int64)

    def trading_day(self, ts: pl.Expr) -> pl.Expr:
        """The trading day (Date) of each UTC timestamp in ``ts``: the local date its session closes on, moved to
        the next business day when that is a holiday and the session opened the evening before. (A same-day
        session keeps a holiday's date, and ``is_closed`` marks it; a weekend date stays, outside every session.)"""
        shifted = self._local_ns(ts) - _ns_of_day(self.open)
        day = ((shifted // _NS_PER_DAY) + (1 if self.names_next_day else 0)).cast(pl.Int32).cast(pl.Date)
        if self.names_next_day and self.holiday_dates:
            holidays, cleared_on = self._holiday_roll
            day = day.replace(holidays, cleared_on)  # only weekday holidays: Saturdays are never moved
        return day

    def is_closed(self, day: pl.Expr) -> pl.Expr:
        """True where the trading day ``day`` (a Date) has no session: a weekend day or a holiday."""
        weekend = day.dt.weekday() >= 6
        if not self.holiday_dates:
            return weekend
        return weekend | day.is_in(sorted(self.holiday_dates))

    def in_halt(self, ts: pl.Expr) -> pl.Expr:
        """True where the local time of ``ts`` lies inside the daily halt."""
        if self.halt_start is None or self.halt_end is None:
            return pl.lit(False)
        time_of_day = self._local_ns(ts) % _NS_PER_DAY
        start, end = _ns_of_day(self.halt_start), _ns_of_day(self.halt_end)
        if start < end:
            return (time_of_day >= start) & (time_of_day < end)
        return (time_of_day >= start) | (time_of_day < end)  # the halt wraps past midnight

    def to_config(self) -> dict[str, Any]:
        """Inverse of ``from_config`` (JSON-ready: the Parquet metadata ``marketrl.session`` stores it)."""

        def fmt(value: dt.time | None) -> str | None:
            return None if value is None else value.strftime("%H:%M")

        return {
            "timezone": self.timezone,
            "open": fmt(self.open),
            "halt_start": fmt(self.halt_start),
            "halt_end": fmt(self.halt_end),
            "holidays": self.holidays,
            "extra_holidays": [day.isoformat() for day in self.extra_holidays],
        }


_CME = SessionCalendar("America/Chicago", dt.time(17, 0), dt.time(16, 0), dt.time(17, 0), holidays="us")
_US_EQUITIES = SessionCalendar(
    "America/New_York", dt.time(9, 30), dt.time(16, 0), dt.time(9, 30), holidays="us"
)
DEFAULT_CALENDARS: dict[str, SessionCalendar] = {
    "GLBX.MDP3": _CME,
    **dict.fromkeys(_US_EQUITY_DATASETS, _US_EQUITIES),
}


def calendar_for(dataset: str, session: Mapping[str, Any] | SessionCalendar | None = None) -> SessionCalendar:
    """The calendar of ``dataset``: ``session`` (``data.session``) when it sets the hours (timezone, open, ...),
    else the dataset's default, with ``session``'s holidays / extra_holidays where given."""
    if isinstance(session, SessionCalendar):
        return session
    given = {key for key, value in (session or {}).items() if _given(value)}  # the schema fills in "" and []
    if given - set(_HOLIDAY_KEYS):
        return SessionCalendar.from_config(session or {})
    if dataset not in DEFAULT_CALENDARS:
        raise SessionConfigError(
            f"data.session: no default session calendar for dataset {dataset!r}; "
            "set data.session.timezone and data.session.open (docs/FEATURES.md)"
        )
    default = DEFAULT_CALENDARS[dataset]
    return dataclasses.replace(default, **_holiday_fields(session or {})) if given else default


def session_frame(
    bars: pl.DataFrame, calendar: SessionCalendar, *, daily_bars: bool = False
) -> tuple[pl.DataFrame, int, int]:
    """``bars`` with ``trading_day`` set from ``calendar``, the bars outside every session dropped; the count of
    dropped bars (inside the halt, or on a trading day that is a Saturday, a Sunday or a holiday without a session);
    and how many of them were in the halt.

    Daily bars (``daily_bars``) are the vendor's own UTC-dated aggregates: their date is their trading day and
    only weekend- and holiday-dated ones are dropped (a daily bar cannot be split at the halt, nor moved onto the
    next day's bar).
    """
    ts = pl.col("ts_event")
    if daily_bars:
        day, halted = ts.dt.date(), pl.lit(False)
    else:
        day, halted = calendar.trading_day(ts), calendar.in_halt(ts)
    bars = bars.with_columns(day.alias("trading_day"))
    outside = halted | calendar.is_closed(pl.col("trading_day"))
    dropped, in_halt = (int(n) for n in bars.select(outside.sum(), halted.sum().alias("in_halt")).row(0))
    return (bars.filter(~outside) if dropped else bars), dropped, in_halt
