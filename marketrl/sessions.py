"""Exchange session calendars: which trading day a bar belongs to, and which bars fall outside any session.

A calendar is a timezone, the local time the session opens, and an optional daily halt ``[halt_start,
halt_end)`` in local time (it may wrap past midnight, e.g. 16:00-09:30 for a cash equity market). A session is
named after the local date on which it closes: CME Globex opens at 17:00 Chicago time and closes (the daily halt)
at 16:00 the next day, so the bars from Sunday 17:00 CT belong to Monday's trading day; Nasdaq opens 09:30 and
closes 16:00 New York time on the same date. Bars inside the halt, and bars whose trading day would be a Saturday
or Sunday (e.g. Friday after the CME close), are outside every session: the reader drops and counts them.

Everything is a polars expression on the UTC timestamps: the wall clock comes from ``convert_time_zone`` (the
tz database, so DST changes are exact), the trading day from shifting the wall clock back by the open time.
"""

from __future__ import annotations

import datetime as dt
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

__all__ = [
    "DEFAULT_CALENDARS",
    "SessionCalendar",
    "SessionConfigError",
    "calendar_for",
    "session_frame",
]

_NS_PER_DAY = 86_400 * 10**9
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


@dataclass(frozen=True)
class SessionCalendar:
    """One market's daily session: timezone, local open time and an optional daily halt ``[start, end)``."""

    timezone: str
    open: dt.time
    halt_start: dt.time | None = None
    halt_end: dt.time | None = None

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

    @classmethod
    def from_config(cls, session: Mapping[str, Any]) -> SessionCalendar:
        """From ``data.session`` (timezone, open 'HH:MM', optional halt_start/halt_end 'HH:MM')."""
        unknown = sorted(set(session) - {"timezone", "open", "halt_start", "halt_end"})
        if unknown:
            raise SessionConfigError(f"data.session.{unknown[0]}: unknown key")
        for key in ("timezone", "open"):
            if not session.get(key):
                raise SessionConfigError(f"data.session.{key}: required when data.session is set")
        halt = {
            key: _parse_time(session[key], key) if session.get(key) not in (None, "") else None
            for key in ("halt_start", "halt_end")
        }
        return cls(str(session["timezone"]), _parse_time(session["open"], "open"), **halt)

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
        """The trading day (Date) of each UTC timestamp in ``ts``."""
        shifted = self._local_ns(ts) - _ns_of_day(self.open)
        day = (shifted // _NS_PER_DAY) + (1 if self.names_next_day else 0)
        return day.cast(pl.Int32).cast(pl.Date)

    def in_halt(self, ts: pl.Expr) -> pl.Expr:
        """True where the local time of ``ts`` lies inside the daily halt."""
        if self.halt_start is None or self.halt_end is None:
            return pl.lit(False)
        time_of_day = self._local_ns(ts) % _NS_PER_DAY
        start, end = _ns_of_day(self.halt_start), _ns_of_day(self.halt_end)
        if start < end:
            return (time_of_day >= start) & (time_of_day < end)
        return (time_of_day >= start) | (time_of_day < end)  # the halt wraps past midnight

    def to_config(self) -> dict[str, str | None]:
        """Inverse of ``from_config``."""

        def fmt(value: dt.time | None) -> str | None:
            return None if value is None else value.strftime("%H:%M")

        return {
            "timezone": self.timezone,
            "open": fmt(self.open),
            "halt_start": fmt(self.halt_start),
            "halt_end": fmt(self.halt_end),
        }


_CME = SessionCalendar("America/Chicago", dt.time(17, 0), dt.time(16, 0), dt.time(17, 0))
_US_EQUITIES = SessionCalendar("America/New_York", dt.time(9, 30), dt.time(16, 0), dt.time(9, 30))
DEFAULT_CALENDARS: dict[str, SessionCalendar] = {
    "GLBX.MDP3": _CME,
    **dict.fromkeys(_US_EQUITY_DATASETS, _US_EQUITIES),
}


def calendar_for(dataset: str, session: Mapping[str, Any] | SessionCalendar | None = None) -> SessionCalendar:
    """The calendar of ``dataset``: ``session`` (``data.session``) when given, else the dataset's default."""
    if isinstance(session, SessionCalendar):
        return session
    if session and any(value not in (None, "") for value in session.values()):  # the schema fills in ""
        return SessionCalendar.from_config(session)
    if dataset not in DEFAULT_CALENDARS:
        raise SessionConfigError(
            f"data.session: no default session calendar for dataset {dataset!r}; "
            "set data.session.timezone and data.session.open (docs/FEATURES.md)"
        )
    return DEFAULT_CALENDARS[dataset]


def session_frame(
    bars: pl.DataFrame, calendar: SessionCalendar, *, daily_bars: bool = False
) -> tuple[pl.DataFrame, int, int]:
    """``bars`` with ``trading_day`` set from ``calendar``, the bars outside every session dropped; the count of
    dropped bars (inside the halt, or on a Saturday/Sunday trading day); and how many of them were in the halt.

    Daily bars (``daily_bars``) are the vendor's own UTC-dated aggregates: their date is their trading day and
    only weekend-dated ones are dropped (a daily bar cannot be split at the halt).
    """
    ts = pl.col("ts_event")
    if daily_bars:
        day, halted = ts.dt.date(), pl.lit(False)
    else:
        day, halted = calendar.trading_day(ts), calendar.in_halt(ts)
    bars = bars.with_columns(day.alias("trading_day"))
    outside = halted | (pl.col("trading_day").dt.weekday() >= 6)
    dropped, in_halt = (int(n) for n in bars.select(outside.sum(), halted.sum().alias("in_halt")).row(0))
    return (bars.filter(~outside) if dropped else bars), dropped, in_halt
