"""US exchange holidays by rule against dates written out by hand (NYSE/CME holiday calendars), and Easter."""

from __future__ import annotations

import datetime as dt

import pytest

from marketrl.calendars.holidays import (
    easter_sunday,
    holiday_dates,
    is_business_day,
    next_business_day,
    us_holidays,
)


def _dates(year: int, *month_days: tuple[int, int]) -> set[dt.date]:
    return {dt.date(year, month, day) for month, day in month_days}


# New Year, MLK, Presidents', Good Friday, Memorial, Juneteenth, Independence, Labor, Thanksgiving, Christmas
KNOWN = {
    # 2023-01-01 is a Sunday: observed Monday 01-02
    2023: _dates(
        2023, (1, 2), (1, 16), (2, 20), (4, 7), (5, 29), (6, 19), (7, 4), (9, 4), (11, 23), (12, 25)
    ),
    2024: _dates(
        2024, (1, 1), (1, 15), (2, 19), (3, 29), (5, 27), (6, 19), (7, 4), (9, 2), (11, 28), (12, 25)
    ),
    # plus 01-09, the national day of mourning for President Carter
    2025: _dates(
        2025, (1, 1), (1, 9), (1, 20), (2, 17), (4, 18), (5, 26), (6, 19), (7, 4), (9, 1), (11, 27), (12, 25)
    ),
    # 2026-07-04 is a Saturday: observed Friday 07-03
    2026: _dates(
        2026, (1, 1), (1, 19), (2, 16), (4, 3), (5, 25), (6, 19), (7, 3), (9, 7), (11, 26), (12, 25)
    ),
}


@pytest.mark.parametrize("year", sorted(KNOWN))
def test_rule_based_holidays_match_the_published_calendars(year: int) -> None:
    assert set(us_holidays(year)) == KNOWN[year]
    assert all(day.weekday() < 5 for day in us_holidays(year))


def test_observance_rules() -> None:
    # 2022: New Year's Day on a Saturday is not observed (Friday 2021-12-31 traded); Juneteenth's first year, on
    # a Sunday -> Monday 06-20; Christmas on a Sunday -> Monday 12-26.
    assert dt.date(2021, 12, 31) not in us_holidays(2021) and dt.date(2022, 1, 1) not in us_holidays(2022)
    assert {dt.date(2022, 6, 20), dt.date(2022, 12, 26)} <= set(us_holidays(2022))
    # 2021: no Juneteenth yet; Independence Day on a Sunday -> 07-05; Christmas on a Saturday -> Friday 12-24
    assert not [day for day in us_holidays(2021) if day.month == 6]
    assert {dt.date(2021, 7, 5), dt.date(2021, 12, 24)} <= set(us_holidays(2021))
    # 2027: Juneteenth and Christmas on Saturdays -> Fridays 06-18 and 12-24
    assert {dt.date(2027, 6, 18), dt.date(2027, 12, 24)} <= set(us_holidays(2027))
    assert us_holidays(2024)[dt.date(2024, 2, 19)] == "Presidents' Day"
    assert us_holidays(2018)[dt.date(2018, 12, 5)].startswith("National Day of Mourning")


def test_easter_sunday() -> None:
    known = ["1818-03-22", "1943-04-25", "2000-04-23", "2011-04-24", "2019-04-21", "2024-03-31", "2038-04-25"]
    for text in known:
        day = dt.date.fromisoformat(text)
        assert easter_sunday(day.year) == day and day.weekday() == 6


def test_rule_sets_and_business_days() -> None:
    us = holiday_dates("us", 2024, 2025)
    assert us == KNOWN[2024] | KNOWN[2025] and holiday_dates("none", 2024, 2025) == frozenset()
    with pytest.raises(ValueError, match="unknown holiday rule set 'uk'"):
        holiday_dates("uk", 2024, 2024)
    assert next_business_day(dt.date(2024, 2, 16), us) == dt.date(
        2024, 2, 20
    )  # Friday -> past Presidents' Day
    assert next_business_day(dt.date(2024, 3, 28), us) == dt.date(2024, 4, 1)  # past Good Friday
    assert not is_business_day(dt.date(2024, 11, 28), us) and is_business_day(dt.date(2024, 11, 29), us)
    assert not is_business_day(dt.date(2024, 3, 9), us)  # a Saturday
