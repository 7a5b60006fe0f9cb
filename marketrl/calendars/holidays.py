"""US exchange holidays by rule, for any year, plus the one-off closures: the days with no trade date.

Standard library only: marketrl.calendars.cme_hours (called at every Snakemake DAG parse) uses it as well as
marketrl.calendars.sessions.

Rule set ``"us"`` is the holiday calendar the US exchanges (NYSE, Nasdaq) follow and CME Group's US equity index
and interest rate futures settle by: New Year's Day, Martin Luther King Jr. Day (3rd Monday of January, from
1998), Presidents' Day (3rd Monday of February), Good Friday, Memorial Day (last Monday of May), Juneteenth (from
2022), Independence Day, Labor Day (1st Monday of September), Thanksgiving (4th Thursday of November) and
Christmas Day. A fixed-date holiday on a Saturday is observed on the Friday before, on a Sunday on the Monday
after; New Year's Day on a Saturday is not observed (the Friday before closes the year's books). The rules are
today's; the rule changes before 1998 are not modelled. ``ONE_OFF_CLOSURES`` adds unscheduled closures.
Rule set ``"none"``: no holidays.
"""

from __future__ import annotations

import datetime as dt
import functools

__all__ = [
    "CHRISTMAS",
    "GOOD_FRIDAY",
    "NEW_YEARS_DAY",
    "ONE_OFF_CLOSURES",
    "RULE_SETS",
    "easter_sunday",
    "holiday_dates",
    "is_business_day",
    "next_business_day",
    "us_holidays",
]

NEW_YEARS_DAY = "New Year's Day"
MLK_DAY = "Martin Luther King Jr. Day"
PRESIDENTS_DAY = "Presidents' Day"
GOOD_FRIDAY = "Good Friday"
MEMORIAL_DAY = "Memorial Day"
JUNETEENTH = "Juneteenth"
INDEPENDENCE_DAY = "Independence Day"
LABOR_DAY = "Labor Day"
THANKSGIVING = "Thanksgiving Day"
CHRISTMAS = "Christmas Day"

RULE_SETS = ("us", "none")

# Unscheduled full-day closures of NYSE and Nasdaq: the national days of mourning, on which CME's US equity index
# futures traded only an abbreviated overnight session, to 08:30 CT (CME's notices); like a holiday's, marketrl
# names that session after the next business day. Other closures (Hurricane Sandy, 2012-10-29/30, when CME's
# equity futures traded on) are left to data.session.extra_holidays.
ONE_OFF_CLOSURES: dict[dt.date, str] = {
    dt.date(2018, 12, 5): "National Day of Mourning (George H. W. Bush)",
    dt.date(2025, 1, 9): "National Day of Mourning (Jimmy Carter)",
}

_MONDAY, _THURSDAY = 0, 3


def easter_sunday(year: int) -> dt.date:
    """Easter Sunday of the Gregorian calendar (the anonymous Gregorian computus: epact from the Metonic cycle
    and the century corrections, then the Sunday after the paschal full moon)."""
    golden = year % 19  # position in the 19-year Metonic cycle
    century, year_of_century = divmod(year, 100)
    leap_skips, century_rest = divmod(century, 4)
    moon_correction = (century - (century + 8) // 25 + 1) // 3
    # days from March 21 to the paschal full moon (mod 30)
    full_moon = (19 * golden + century - leap_skips - moon_correction + 15) % 30
    quarter, year_rest = divmod(year_of_century, 4)
    # days from the full moon to the next Sunday
    to_sunday = (32 + 2 * century_rest + 2 * quarter - full_moon - year_rest) % 7
    late = (golden + 11 * full_moon + 22 * to_sunday) // 451  # the two exceptional late full moons
    month, day = divmod(full_moon + to_sunday - 7 * late + 114, 31)
    return dt.date(year, month, day + 1)


def _nth_weekday(year: int, month: int, weekday: int, n: int) -> dt.date:
    """The ``n``-th ``weekday`` (0 = Monday) of the month; ``n = -1``: the last one."""
    if n > 0:
        first = dt.date(year, month, 1)
        return first + dt.timedelta(days=(weekday - first.weekday()) % 7 + 7 * (n - 1))
    following = dt.date(year + month // 12, month % 12 + 1, 1)
    last = following - dt.timedelta(days=1)
    return last - dt.timedelta(days=(last.weekday() - weekday) % 7)


def _observed(day: dt.date) -> dt.date:
    """Saturday -> the Friday before, Sunday -> the Monday after."""
    return day + dt.timedelta(days={5: -1, 6: 1}.get(day.weekday(), 0))


def us_holidays(year: int) -> dict[dt.date, str]:
    """The ``"us"`` rule set's holidays of ``year`` (observed dates, all weekdays) with their names, in date
    order, including ``ONE_OFF_CLOSURES``."""
    return dict(_us_holidays(year))


@functools.cache
def _us_holidays(year: int) -> tuple[tuple[dt.date, str], ...]:
    fixed = {
        INDEPENDENCE_DAY: dt.date(year, 7, 4),
        CHRISTMAS: dt.date(year, 12, 25),
        **({JUNETEENTH: dt.date(year, 6, 19)} if year >= 2022 else {}),
    }
    days = {_observed(day): name for name, day in fixed.items()}
    new_year = dt.date(year, 1, 1)
    if new_year.weekday() != 5:  # on a Saturday it is not observed (the Friday is in the old year)
        days[_observed(new_year)] = NEW_YEARS_DAY
    if year >= 1998:
        days[_nth_weekday(year, 1, _MONDAY, 3)] = MLK_DAY
    days[_nth_weekday(year, 2, _MONDAY, 3)] = PRESIDENTS_DAY
    days[easter_sunday(year) - dt.timedelta(days=2)] = GOOD_FRIDAY
    days[_nth_weekday(year, 5, _MONDAY, -1)] = MEMORIAL_DAY
    days[_nth_weekday(year, 9, _MONDAY, 1)] = LABOR_DAY
    days[_nth_weekday(year, 11, _THURSDAY, 4)] = THANKSGIVING
    days.update({day: name for day, name in ONE_OFF_CLOSURES.items() if day.year == year})
    return tuple(sorted(days.items()))


def holiday_dates(rule_set: str, first_year: int, last_year: int) -> frozenset[dt.date]:
    """Every holiday of ``rule_set`` (one of ``RULE_SETS``) in the years ``first_year`` to ``last_year``."""
    if rule_set == "none":
        return frozenset()
    if rule_set != "us":
        raise ValueError(f"unknown holiday rule set {rule_set!r}, expected one of {', '.join(RULE_SETS)}")
    return frozenset(day for year in range(first_year, last_year + 1) for day, _ in _us_holidays(year))


def is_business_day(day: dt.date, holidays: frozenset[dt.date] | set[dt.date]) -> bool:
    """A weekday that is not in ``holidays``."""
    return day.weekday() < 5 and day not in holidays


def next_business_day(day: dt.date, holidays: frozenset[dt.date] | set[dt.date]) -> dt.date:
    """The first business day after ``day``."""
    day += dt.timedelta(days=1)
    while not is_business_day(day, holidays):
        day += dt.timedelta(days=1)
    return day
