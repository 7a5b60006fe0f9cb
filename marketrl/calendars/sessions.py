"""Exchange session calendars: which trading day a bar belongs to, and which bars fall outside any session.

A calendar is a timezone, the local time the session opens, an optional daily halt ``[halt_start, halt_end)`` in
local time (it may wrap past midnight, e.g. 16:00-09:30 for a cash equity market) and a holiday rule set
(marketrl.calendars.holidays) with optional extra dates. A session is named after the local date on which it
closes: CME Globex opens at 17:00 Chicago time and closes (the daily halt) at 16:00 the next day, so the bars from
Sunday 17:00 CT belong to Monday's trading day; Nasdaq opens 09:30 and closes 16:00 New York time on the same date.

Holidays are never trading days. A session that opened the evening before (``names_next_day``) and trades on a
holiday is cleared, as CME clears it, under the next business day: the bars from Sunday 17:00 CT to the 12:00 CT
halt on Presidents' Day belong to Tuesday, together with the session that reopens at 17:00 CT on Monday. A
same-day session (US equities) has no session on a holiday: bars dated on it are outside every session. Bars
inside the halt, and bars whose trading day would be a Saturday or Sunday (e.g. Friday after the CME close), are
outside every session too: the reader drops and counts them.

Labelling is a lookup, not a per-row wall-clock conversion: the timezone's UTC offsets over the data's span
(the tz database's transitions, found with zoneinfo, so DST changes are exact to the second) turn each UTC
timestamp into local nanoseconds with one sorted search and an add; the trading day is the local clock shifted
back by the open time, divided by one day; a per-day table (weekends, holidays and the next-business-day roll
of the days the data span, a few hundred rows at most) then gives each bar's trading day and whether it has a
session, by a gather. tests/test_sessions.py checks it against the per-row ``convert_time_zone`` path and a
zoneinfo loop over years of 1-minute timestamps.
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

from marketrl.calendars.holidays import RULE_SETS, holiday_dates, next_business_day

__all__ = [
    "DEFAULT_CALENDARS",
    "SessionCalendar",
    "SessionConfigError",
    "calendar_for",
    "session_frame",
    "utc_offsets",
]

_NS = 10**9
_NS_PER_DAY = 86_400 * _NS
# UTC offsets are sampled this far apart over the data's span and each change is bisected to the second: the tz
# database has no zone whose offset changes twice within six hours.
_OFFSET_SAMPLE_S = 6 * 3600
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


@functools.cache
def _zone(name: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(name)


def _offset_s(zone: zoneinfo.ZoneInfo, seconds: int) -> int:
    offset = dt.datetime.fromtimestamp(seconds, tz=dt.UTC).astimezone(zone).utcoffset()
    return int(offset.total_seconds()) if offset is not None else 0


def utc_offsets(timezone: str, first_ns: int, last_ns: int) -> tuple[list[int], list[int]]:
    """The UTC offsets of ``timezone`` in force from ``first_ns`` to ``last_ns`` (UTC nanoseconds): the instants
    (ns) from which each holds, the first one ``first_ns``, and the offsets (ns, local minus UTC). Transitions
    are the tz database's (zoneinfo), exact to the second."""
    zone = _zone(timezone)
    first_s, last_s = first_ns // _NS, -(-last_ns // _NS)
    starts, offsets = [first_ns], [_offset_s(zone, first_s) * _NS]
    low = first_s
    while low < last_s:
        high = min(low + _OFFSET_SAMPLE_S, last_s)
        after = _offset_s(zone, high)
        if after * _NS != offsets[-1]:  # a transition in (low, high]: the first second with the new offset
            lo, hi = low, high
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if _offset_s(zone, mid) * _NS == offsets[-1] else (lo, mid)
            starts.append(hi * _NS)
            offsets.append(after * _NS)
        low = high
    return starts, offsets


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
    holidays: a rule set of marketrl.calendars.holidays (``"us"`` or ``"none"``) plus ``extra_holidays``."""

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

    def label(self, ts: pl.Series) -> pl.DataFrame:
        """Per UTC timestamp of ``ts`` (Datetime): ``trading_day`` (Date; see ``trading_day``), ``in_halt`` (the
        local time lies inside the daily halt) and ``closed`` (the trading day has no session: a weekend day or
        a holiday)."""
        ts_ns = ts.cast(pl.Datetime("ns", "UTC")).dt.epoch("ns").alias("ts_ns")
        frame = pl.DataFrame([ts_ns])
        if frame.height == 0 or ts_ns.null_count() == frame.height:
            empty = {"trading_day": pl.Date, "in_halt": pl.Boolean, "closed": pl.Boolean}
            return pl.DataFrame(
                [pl.Series(name, [None] * frame.height, dtype) for name, dtype in empty.items()]
            )
        starts, offsets = utc_offsets(self.timezone, int(ts_ns.min()), int(ts_ns.max()))  # type: ignore[arg-type]
        if len(offsets) == 1:
            local = pl.col("ts_ns") + offsets[0]
        else:  # the offset in force at each timestamp: the last transition at or before it
            segment = pl.lit(pl.Series(starts, dtype=pl.Int64)).search_sorted(pl.col("ts_ns"), side="right")
            local = pl.col("ts_ns") + pl.lit(pl.Series(offsets, dtype=pl.Int64)).gather(
                segment.cast(pl.Int64) - 1
            )
        local_day = (local - _ns_of_day(self.open)) // _NS_PER_DAY  # days since 1970-01-01, by the open
        frame = frame.select(local_day.cast(pl.Int32).alias("day"), self._halted(local).alias("in_halt"))
        first, last = frame["day"].min(), frame["day"].max()
        days, closed = self._day_table(int(first), int(last))  # type: ignore[arg-type]
        index = pl.col("day") - first
        return frame.select(
            pl.lit(pl.Series(days, dtype=pl.Int32)).gather(index).cast(pl.Date).alias("trading_day"),
            pl.col("in_halt"),
            pl.lit(pl.Series(closed, dtype=pl.Boolean)).gather(index).alias("closed"),
        )

    def _day_table(self, first: int, last: int) -> tuple[list[int], list[bool]]:
        """For the local open-shifted days ``first..last`` (days since the epoch): the trading day each belongs to
        (days since the epoch, holidays rolled for ``names_next_day``) and whether it has no session."""
        epoch, holidays = dt.date(1970, 1, 1), self.holiday_dates
        roll = dict(zip(*self._holiday_roll, strict=True)) if self.names_next_day else {}
        days, closed = [], []
        for k in range(first, last + 1):
            day = epoch + dt.timedelta(days=k + (1 if self.names_next_day else 0))
            day = roll.get(day, day)  # only weekday holidays: Saturdays are never moved
            days.append((day - epoch).days)
            closed.append(day.weekday() >= 5 or day in holidays)
        return days, closed

    def _halted(self, local: pl.Expr) -> pl.Expr:
        """True where the local clock ``local`` (ns since 1970-01-01 local midnight) lies inside the halt."""
        if self.halt_start is None or self.halt_end is None:
            return pl.lit(False)
        time_of_day = local % _NS_PER_DAY
        start, end = _ns_of_day(self.halt_start), _ns_of_day(self.halt_end)
        if start < end:
            return (time_of_day >= start) & (time_of_day < end)
        return (time_of_day >= start) | (time_of_day < end)  # the halt wraps past midnight

    def trading_day(self, ts: pl.Expr) -> pl.Expr:
        """The trading day (Date) of each UTC timestamp in ``ts``: the local date its session closes on, moved to
        the next business day when that is a holiday and the session opened the evening before. (A same-day
        session keeps a holiday's date, and ``is_closed`` marks it; a weekend date stays, outside every session.)"""
        return ts.map_batches(lambda s: self.label(s)["trading_day"], return_dtype=pl.Date)

    def is_closed(self, day: pl.Expr) -> pl.Expr:
        """True where the trading day ``day`` (a Date) has no session: a weekend day or a holiday."""

        def closed(days: pl.Series) -> pl.Series:
            numbers = days.cast(pl.Int32)
            if numbers.null_count() == len(numbers):
                return pl.Series([None] * len(numbers), dtype=pl.Boolean)
            first, last = int(numbers.min()), int(numbers.max())  # type: ignore[arg-type]
            epoch = dt.date(1970, 1, 1)
            table = [
                (epoch + dt.timedelta(days=k)).weekday() >= 5
                or epoch + dt.timedelta(days=k) in self.holiday_dates
                for k in range(first, last + 1)
            ]
            return pl.Series(table, dtype=pl.Boolean).gather(numbers - first)

        return day.map_batches(closed, return_dtype=pl.Boolean)

    def in_halt(self, ts: pl.Expr) -> pl.Expr:
        """True where the local time of ``ts`` lies inside the daily halt."""
        return ts.map_batches(lambda s: self.label(s)["in_halt"], return_dtype=pl.Boolean)

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
    if daily_bars:
        day = bars.select(pl.col("ts_event").dt.date().alias("trading_day")).to_series()
        labels = pl.DataFrame([day]).with_columns(
            pl.lit(False).alias("in_halt"), calendar.is_closed(pl.col("trading_day")).alias("closed")
        )
    else:
        # Chunk by chunk, so that the new column has the chunks of the others (no copy of the frame into one).
        ts, offset, pieces = bars["ts_event"], 0, []
        for length in ts.chunk_lengths() or [0]:
            pieces.append(calendar.label(ts.slice(offset, length)))
            offset += length
        labels = pl.concat(pieces, how="vertical", rechunk=False)
    bars = bars.with_columns(labels["trading_day"])
    outside = labels["in_halt"] | labels["closed"]
    dropped, in_halt = int(outside.sum()), int(labels["in_halt"].sum())
    return (bars.filter(~outside) if dropped else bars), dropped, in_halt
