from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from dblockrun.cli import cli
from dblockrun.jobs import Schedule
from dblockrun.scheduling.cron import (
    describe_next,
    is_wildcard,
    next_slot,
    next_slot_at,
    upcoming,
    validate_cron,
    validate_timezone,
)

AMS = "Europe/Amsterdam"
NYC = "America/New_York"


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def wall(slots: list[datetime], zone: str) -> list[str]:
    """Slots as local ISO strings, offset included, to read the DST cases."""
    return [slot.astimezone(ZoneInfo(zone)).isoformat() for slot in slots]


# --- validate_cron -------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "*/5 * * * *",
        "0 0 1-5,10 */2 mon-fri",
        "*/10 * * * * *",
        "0 30 2 * * *",
        "0 0 29 2 *",
        "0 0 L * *",
        "0 0 * * 1#2",
        "0 0 * * 7",
        "0 0 1 jan *",
        "  */5   *\t* * *  ",
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
        "0 0 * * 5L",
        "0 0 LW * *",
        "0 0 15W * 1",
        "0 0 1,L * *",
        "0 0 31 2 1#5",
        "0 0 28W * *",
        "0 0 * * 1#2,5L",
        "0 0 * * 7L",
        "0 0 * * MON-FRI",
        "0 0 * * 5-7",
        "*/60 * * * *",
    ],
)
def test_validate_cron_accepts(expr: str) -> None:
    validate_cron(expr)


FIELDS_HINT = "use 5 (minute hour day-of-month month day-of-week), 6 with the seconds first"


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty cron expression"),
        ("* * * *", f"4 fields; {FIELDS_HINT}, or a macro like @daily"),
        ("0 0 * * * * 2026", f"7 fields; {FIELDS_HINT}, or a macro like @daily"),
        (
            "@reboot",
            "@reboot is not supported: a fleet has no single boot (use a cron expression or rate)",
        ),
        (
            "@every",
            "'@every' is not cron: for a fixed interval write `rate: 5m (a duration)` "
            "instead of `cron:`",
        ),
        ("61 * * * *", "bad minute field '61' (allowed: 0-59)"),
        ("*/0 * * * *", "bad minute field '*/0': the step must be 1-60"),
        ("0 24 * * *", "bad hour field '24' (allowed: 0-23)"),
        ("0 0 32 * *", "bad day-of-month field '32' (allowed: 1-31, L, LW, nW)"),
        ("0 0 * 13 *", "bad month field '13' (allowed: 1-12 or jan-dec)"),
        ("0 0 * * 8", "bad day-of-week field '8' (allowed: 0-7 or sun-sat, n#k, nL)"),
        ("60 * * * * *", "bad second field '60' (allowed: 0-59)"),
        ("5,,6 * * * *", "bad minute field '5,,6' (allowed: 0-59)"),
        (
            "H * * * *",
            "minute field 'H': hashed (H) and random (R) values are not supported; "
            "every host must compute the same slots",
        ),
        (
            "0 R * * *",
            "hour field 'R': hashed (H) and random (R) values are not supported; "
            "every host must compute the same slots",
        ),
        ("0 0 30 2 *", "'0 0 30 2 *' never matches a date"),
        ("0 0 30-31 2 *", "'0 0 30-31 2 *' never matches a date"),
        # Debian's cron reads the macros in lower case only, and no step after a number.
        ("@DAILY", "unknown macro '@DAILY' (macros are lower case, as in cron: @daily)"),
        ("5/10 * * * *", "bad minute field '5/10': a step follows * or a range (write 5-59/10)"),
        ("*/1000000000000 * * * *", "bad minute field '*/1000000000000': the step must be 1-60"),
        ("0 */25 * * *", "bad hour field '*/25': the step must be 1-24"),
        ("0 0 * * L5", "bad day-of-week field 'L5' (allowed: 0-7 or sun-sat, n#k, nL)"),
        ("0 0 * * 1#6", "bad day-of-week field '1#6': in 1#6, k of n#k must be 1-5"),
        ("0 0 ? * 1", "bad day-of-month field '?': '?' is Quartz's, not cron's: write *"),
        ("0 0 32W * *", "bad day-of-month field '32W' (allowed: 1-31, L, LW, nW)"),
        # Extensions croniter reads differently from dblockrun-jobs(5): rejected.
        (  # croniter would move 31W to the last day of a 30-day month
            "0 0 31W * *",
            "bad day-of-month field '31W': in 31W, n of nW must be 1-28: some months have "
            "no day 31 (LW is the last weekday)",
        ),
        ("0 0 1,15W * *", "bad day-of-month field '1,15W': 15W must be the field's only item"),
        ("0 0 LW,1 * *", "bad day-of-month field 'LW,1': LW must be the field's only item"),
        (
            "0 0 * * 1,2#2",
            "bad day-of-week field '1,2#2': n#k and nL cannot share the field with plain days",
        ),
        (
            "0 0 * * mon,5L",
            "bad day-of-week field 'mon,5L': n#k and nL cannot share the field with plain days",
        ),
        # Ranges that run backwards: cron accepts the line and never runs it.
        (
            "0 22-2 * * *",
            "bad hour field '22-2': 22-2 runs backwards; cron accepts it and never runs it "
            "(write 22-23,0-2)",
        ),
        (
            "0 0 * * MON-SUN",
            "bad day-of-week field 'MON-SUN': MON-SUN runs backwards; cron accepts it and "
            "never runs it (write 1-6,0)",
        ),
        (
            "0 0 * * 1-0",
            "bad day-of-week field '1-0': 1-0 runs backwards; cron accepts it and never runs "
            "it (write 1-6,0)",
        ),
        (
            "0 0 * * 7-2",
            "bad day-of-week field '7-2': 7-2 runs backwards; cron accepts it and never runs "
            "it (write 0-2)",
        ),
        (
            "50-10/5 * * * *",
            "bad minute field '50-10/5': 50-10/5 runs backwards; cron accepts it and never "
            "runs it (write it as two ranges)",
        ),
        (
            "0 0 * nov-feb *",
            "bad month field 'nov-feb': nov-feb runs backwards; cron accepts it and never "
            "runs it (write 11-12,1-2)",
        ),
        ("0 0 31 4 *", "'0 0 31 4 *' never matches a date"),
    ],
)
def test_validate_cron_rejects(expr: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_cron(expr)
    assert str(info.value) == message


@given(st.text(alphabet="0123456789*/,-#?LWHRlw@ abcdefghijklmnopqrstuvwxyz\t", max_size=30))
@settings(max_examples=300, deadline=None)
def test_validate_cron_raises_only_value_error(expr: str) -> None:
    try:
        validate_cron(expr)
    except ValueError:
        pass


# --- is_wildcard ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "wildcard"),
    [
        ("*/5 * * * *", True),
        ("0 * * * *", True),
        ("@hourly", True),
        ("*/5 2 * * *", True),
        ("30 2 * * *", False),
        ("@daily", False),
        ("@weekly", False),
        ("0 0 * * * *", True),  # hour wildcard
        ("*/10 30 2 * * *", True),  # seconds wildcard
        ("0 30 2 * * *", False),
        ("0-30 2 * * *", False),  # a range is not a wildcard (Debian cron's rule)
        ("30 1,*/12 * * *", False),  # a field is `*` only when it starts with `*`
        ("30 */12,1 * * *", True),
    ],
)
def test_is_wildcard(expr: str, wildcard: bool) -> None:
    assert is_wildcard(expr) is wildcard


# --- validate_timezone ---------------------------------------------------------------


def test_validate_timezone() -> None:
    validate_timezone("UTC")
    validate_timezone(AMS)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "Europe/Amsterdm",
            "unknown time zone 'Europe/Amsterdm' (did you mean 'Europe/Amsterdam'?)",
        ),
        (
            "Mars/Olympus_Mons",
            "unknown time zone 'Mars/Olympus_Mons' (use e.g. UTC, Europe/Amsterdam)",
        ),
        ("", "unknown time zone '' (use e.g. UTC, Europe/Amsterdam)"),
        (
            "../../etc/passwd",
            "unknown time zone '../../etc/passwd' (use e.g. UTC, Europe/Amsterdam)",
        ),
        ("localtime", "'localtime' depends on the host; name a zone like Europe/Amsterdam"),
    ],
)
def test_validate_timezone_rejects(name: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_timezone(name)
    assert str(info.value) == message


# --- next_slot: ordinary days --------------------------------------------------------


def test_strictly_after() -> None:
    assert next_slot("*/5 * * * *", "UTC", utc(2026, 1, 1, 10, 5)) == utc(2026, 1, 1, 10, 10)
    assert next_slot("*/5 * * * *", "UTC", utc(2026, 1, 1, 10, 4, 59)) == utc(2026, 1, 1, 10, 5)
    just_after = utc(2026, 1, 1, 10, 5) + timedelta(microseconds=1)
    assert next_slot("*/5 * * * *", "UTC", just_after) == utc(2026, 1, 1, 10, 10)


def test_result_is_utc_and_input_may_be_any_zone() -> None:
    after = datetime(2026, 6, 1, 12, 0, tzinfo=timezone(timedelta(hours=5)))  # 07:00 UTC
    slot = next_slot("0 * * * *", AMS, after)
    assert slot == utc(2026, 6, 1, 8, 0)
    assert slot.tzinfo is UTC


def test_naive_after_is_rejected() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_slot("* * * * *", "UTC", datetime(2026, 1, 1))


def test_cron_is_evaluated_in_the_job_timezone() -> None:
    # 09:00 in Amsterdam is 08:00 UTC in winter, 07:00 UTC in summer.
    assert next_slot("0 9 * * *", AMS, utc(2026, 1, 10)) == utc(2026, 1, 10, 8)
    assert next_slot("0 9 * * *", AMS, utc(2026, 7, 10)) == utc(2026, 7, 10, 7)
    assert next_slot("0 9 * * *", NYC, utc(2026, 1, 10)) == utc(2026, 1, 10, 14)


def test_six_fields_put_seconds_first() -> None:
    # croniter itself would read the last field as seconds: every second.
    after = utc(2026, 1, 1, 10, 0, 3)
    assert describe_next("*/10 * * * * *", "UTC", after, 3) == [
        utc(2026, 1, 1, 10, 0, 10),
        utc(2026, 1, 1, 10, 0, 20),
        utc(2026, 1, 1, 10, 0, 30),
    ]
    assert next_slot("15 30 2 * * *", "UTC", utc(2026, 1, 1)) == utc(2026, 1, 1, 2, 30, 15)
    assert next_slot("0 * * * * *", "UTC", utc(2026, 1, 1, 0, 0, 30)) == utc(2026, 1, 1, 0, 1)


@pytest.mark.parametrize(
    ("macro", "expected"),
    [
        ("@yearly", utc(2027, 1, 1)),
        ("@annually", utc(2027, 1, 1)),
        ("@monthly", utc(2026, 6, 1)),
        ("@weekly", utc(2026, 5, 17)),  # Sunday
        ("@daily", utc(2026, 5, 16)),
        ("@midnight", utc(2026, 5, 16)),
        ("@hourly", utc(2026, 5, 15, 13)),
    ],
)
def test_macros(macro: str, expected: datetime) -> None:
    assert next_slot(macro, "UTC", utc(2026, 5, 15, 12, 30)) == expected


def test_leap_day() -> None:
    assert describe_next("0 0 29 2 *", "UTC", utc(2026, 3, 1), 3) == [
        utc(2028, 2, 29),
        utc(2032, 2, 29),
        utc(2036, 2, 29),
    ]
    # 2100 is not a leap year.
    assert next_slot("0 0 29 2 *", "UTC", utc(2096, 3, 1)) == utc(2104, 2, 29)
    assert next_slot("0 12 29 2 *", AMS, utc(2027, 1, 1)) == utc(2028, 2, 29, 11)


def test_day_of_month_or_day_of_week() -> None:
    # Like cron: both restricted means either matches. 2026-01-05 is a Monday.
    assert next_slot("0 0 13 * 1", "UTC", utc(2026, 1, 1)) == utc(2026, 1, 5)


# --- next_slot: Debian's rules, worked out by hand ----------------------------------
# Each row: expression, zone, start (UTC), and the next fire times as local wall times,
# derived from Debian cron's documented behaviour and a calendar, not from this code.
# January 2026 starts on a Thursday, February and March on a Sunday, November 2025 on
# a Saturday; Februaries with a 29th that is a Monday: 2016, 2044, 2072.

DEBIAN = [
    # Day-of-month starts with `*`: a day must match both fields (odd days, Mon-Fri).
    ("0 22 */2 * 1-5", "UTC", utc(2026, 1, 1), [
        "2026-01-01T22:00:00+00:00", "2026-01-05T22:00:00+00:00",
        "2026-01-07T22:00:00+00:00", "2026-01-09T22:00:00+00:00",
        "2026-01-13T22:00:00+00:00",
    ]),
    ("0 0 */1 * 1", "UTC", utc(2026, 1, 1), [  # Mondays, not every day
        "2026-01-05T00:00:00+00:00", "2026-01-12T00:00:00+00:00",
        "2026-01-19T00:00:00+00:00",
    ]),
    ("0 0 1 * */1", "UTC", utc(2026, 1, 1), [  # the 1st, not every day
        "2026-02-01T00:00:00+00:00", "2026-03-01T00:00:00+00:00",
        "2026-04-01T00:00:00+00:00",
    ]),
    # Both restricted: either matches (Fridays, and Tuesday the 13th).
    ("0 0 13 * 5", "UTC", utc(2026, 1, 1), [
        "2026-01-02T00:00:00+00:00", "2026-01-09T00:00:00+00:00",
        "2026-01-13T00:00:00+00:00", "2026-01-16T00:00:00+00:00",
    ]),
    # L, LW, nW, n#k, nL: list items of their field, combined by the same rule.
    ("0 0 L * *", "UTC", utc(2026, 1, 1), [
        "2026-01-31T00:00:00+00:00", "2026-02-28T00:00:00+00:00",
        "2026-03-31T00:00:00+00:00",
    ]),
    ("0 0 LW * *", "UTC", utc(2026, 1, 1), [  # 31 Jan and 28 Feb are Saturdays
        "2026-01-30T00:00:00+00:00", "2026-02-27T00:00:00+00:00",
        "2026-03-31T00:00:00+00:00",
    ]),
    ("0 0 * * 5L", "UTC", utc(2026, 1, 1), [  # the last Friday
        "2026-01-30T00:00:00+00:00", "2026-02-27T00:00:00+00:00",
        "2026-03-27T00:00:00+00:00",
    ]),
    ("0 0 1W * *", "UTC", utc(2025, 10, 15), [  # 1 Nov 2025 is a Saturday: Monday the 3rd
        "2025-11-03T00:00:00+00:00", "2025-12-01T00:00:00+00:00",
        "2026-01-01T00:00:00+00:00", "2026-02-02T00:00:00+00:00",
    ]),
    ("0 0 LW * *", "UTC", utc(2025, 11, 1), [  # 30 Nov 2025 is a Sunday: Friday the 28th
        "2025-11-28T00:00:00+00:00", "2025-12-31T00:00:00+00:00",
        "2026-01-30T00:00:00+00:00",
    ]),
    ("0 0 28W * *", "UTC", utc(2026, 1, 1), [  # 28 Feb and 28 Mar 2026 are Saturdays
        "2026-01-28T00:00:00+00:00", "2026-02-27T00:00:00+00:00",
        "2026-03-27T00:00:00+00:00", "2026-04-28T00:00:00+00:00",
    ]),
    ("0 0 L * 5", "UTC", utc(2026, 1, 20), [  # the last day, or Fridays
        "2026-01-23T00:00:00+00:00", "2026-01-30T00:00:00+00:00",
        "2026-01-31T00:00:00+00:00", "2026-02-06T00:00:00+00:00",
    ]),
    ("0 0 * * 1#2,7L", "UTC", utc(2026, 1, 1), [  # the second Monday, the last Sunday
        "2026-01-12T00:00:00+00:00", "2026-01-25T00:00:00+00:00",
        "2026-02-09T00:00:00+00:00", "2026-02-22T00:00:00+00:00",
    ]),
    ("15 0 0 1 * 1#1", "UTC", utc(2026, 1, 1, 0, 1), [  # seconds first, either day rule
        "2026-01-05T00:00:15+00:00", "2026-02-01T00:00:15+00:00",
        "2026-02-02T00:00:15+00:00", "2026-03-01T00:00:15+00:00",
    ]),
    ("0 0 1 * 1#1", "UTC", utc(2026, 1, 1), [  # the 1st, or the first Monday
        "2026-01-05T00:00:00+00:00", "2026-02-01T00:00:00+00:00",
        "2026-02-02T00:00:00+00:00", "2026-03-01T00:00:00+00:00",
        "2026-03-02T00:00:00+00:00",
    ]),
    ("0 0 15W * 1", "UTC", utc(2026, 1, 1), [  # the weekday nearest the 15th, or Mondays
        "2026-01-05T00:00:00+00:00", "2026-01-12T00:00:00+00:00",
        "2026-01-15T00:00:00+00:00", "2026-01-19T00:00:00+00:00",
        "2026-01-26T00:00:00+00:00", "2026-02-02T00:00:00+00:00",
    ]),
    ("0 0 31 2 1#5", "UTC", utc(2026, 1, 1), [  # 31 February never; the 5th Monday does
        "2044-02-29T00:00:00+00:00", "2072-02-29T00:00:00+00:00",
    ]),
    ("0 0 * 2 1#5", AMS, utc(2026, 1, 1), [
        "2044-02-29T00:00:00+01:00", "2072-02-29T00:00:00+01:00",
    ]),
    ("0 0 * * mon-fri", "UTC", utc(2026, 1, 2), [  # names, in any case
        "2026-01-05T00:00:00+00:00", "2026-01-06T00:00:00+00:00",
    ]),
    ("0 0 * * 5-7", "UTC", utc(2026, 1, 1), [  # 7 is Sunday
        "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00",
        "2026-01-04T00:00:00+00:00", "2026-01-09T00:00:00+00:00",
    ]),
    # A field is `*` only when it starts with `*`: `1,*/12` is a fixed hour, so
    # New York's repeated 01:30 runs once; `*/12,1` runs at both.
    ("30 1,*/12 * * *", NYC, utc(2026, 10, 31, 12), [
        "2026-10-31T12:30:00-04:00", "2026-11-01T00:30:00-04:00",
        "2026-11-01T01:30:00-04:00", "2026-11-01T12:30:00-05:00",
        "2026-11-02T00:30:00-05:00",
    ]),
    ("30 */12,1 * * *", NYC, utc(2026, 10, 31, 12), [
        "2026-10-31T12:30:00-04:00", "2026-11-01T00:30:00-04:00",
        "2026-11-01T01:30:00-04:00", "2026-11-01T01:30:00-05:00",
        "2026-11-01T12:30:00-05:00",
    ]),
    # Several fixed slots in one spring-forward gap: Debian runs the job once per
    # slot right after the gap; dblockrun once (a slot is an instant).
    ("0,30 2 * * *", AMS, utc(2026, 3, 28, 12), [
        "2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]),
    # Lord Howe moves its clocks by 30 minutes: 02:00 -> 02:30 on 4 October 2026,
    # 02:00 -> 01:30 on 5 April 2026.
    ("15 2 * * *", "Australia/Lord_Howe", utc(2026, 10, 3), [
        "2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00",
    ]),
    ("45 1 * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 12), [
        "2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30",
    ]),
    ("*/15 * * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 14, 20), [
        "2026-04-05T01:30:00+11:00", "2026-04-05T01:45:00+11:00",
        "2026-04-05T01:30:00+10:30", "2026-04-05T01:45:00+10:30",
        "2026-04-05T02:00:00+10:30",
    ]),
]


@pytest.mark.parametrize(("expr", "zone", "after", "expected"), DEBIAN)
def test_debians_rules(expr: str, zone: str, after: datetime, expected: list[str]) -> None:
    assert wall(describe_next(expr, zone, after, len(expected)), zone) == expected


def test_a_rare_slot_is_found_quickly() -> None:
    # The 5th Monday of February comes every 28 years; 20 of them took seconds.
    started = time.perf_counter()
    slots = describe_next("0 0 * 2 1#5", AMS, utc(2026, 1, 1), 20)
    assert time.perf_counter() - started < 1.0
    local = [slot.astimezone(ZoneInfo(AMS)) for slot in slots]
    assert all((day.month, day.day, day.weekday(), day.hour) == (2, 29, 0, 0) for day in local)
    assert sorted(set(slots)) == slots


@pytest.mark.parametrize("after", [math.nan, math.inf, -math.inf, 1e300])
def test_next_slot_at_rejects_what_is_not_a_time(after: float) -> None:
    with pytest.raises(ValueError) as info:
        next_slot_at(Schedule(("* * * * *",), "UTC"), after)
    assert str(info.value) == f"after must be a time in epoch seconds, not {after!r}"


def test_no_slot_before_the_year_10000() -> None:
    with pytest.raises(ValueError) as info:
        next_slot("0 0 1 1 *", "UTC", utc(9999, 6, 1))
    assert str(info.value) == (
        "no slot found for '0 0 1 1 *' after 9999-06-01T00:00:00+00:00"
    )


# --- next_slot: daylight saving, Europe/Amsterdam ------------------------------------
# 2026-03-29 02:00 CET -> 03:00 CEST (01:00 UTC); 2026-10-25 03:00 CEST -> 02:00 CET (01:00 UTC)


def test_spring_fixed_job_runs_once_when_the_gap_ends() -> None:
    slots = describe_next("30 2 * * *", AMS, utc(2026, 3, 28, 12), 3)
    assert wall(slots, AMS) == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    assert slots[0] == utc(2026, 3, 29, 1)


def test_spring_fixed_gap_slots_collapse_into_one() -> None:
    slots = describe_next("0,15,30,45 2 * * *", AMS, utc(2026, 3, 28, 12), 2)
    assert wall(slots, AMS) == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"]


def test_spring_fixed_job_at_gap_end_is_not_doubled() -> None:
    # `0 2` (in the gap) and `0 3` (right after it) both land on 03:00: one slot.
    slots = describe_next("0 2,3 * * *", AMS, utc(2026, 3, 28, 12), 2)
    assert wall(slots, AMS) == ["2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"]


def test_spring_after_the_gap_end_runs_next_day() -> None:
    slot = next_slot("30 2 * * *", AMS, utc(2026, 3, 29, 1))  # exactly 03:00 CEST
    assert wall([slot], AMS) == ["2026-03-30T02:30:00+02:00"]


def test_spring_wildcard_job_skips_the_gap() -> None:
    slots = describe_next("*/30 * * * *", AMS, utc(2026, 3, 29, 0, 15), 4)
    assert wall(slots, AMS) == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]


def test_spring_wildcard_minute_fixed_hour_has_no_slot_that_day() -> None:
    slots = describe_next("*/30 2 * * *", AMS, utc(2026, 3, 28, 12), 2)
    assert wall(slots, AMS) == ["2026-03-30T02:00:00+02:00", "2026-03-30T02:30:00+02:00"]


def test_spring_hourly_is_one_hour_short() -> None:
    slots = describe_next("@hourly", AMS, utc(2026, 3, 28, 23, 30), 4)
    assert wall(slots, AMS) == [
        "2026-03-29T01:00:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T04:00:00+02:00",
        "2026-03-29T05:00:00+02:00",
    ]


def test_autumn_fixed_job_runs_at_first_occurrence_only() -> None:
    slots = describe_next("30 2 * * *", AMS, utc(2026, 10, 24, 12), 2)
    assert wall(slots, AMS) == ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]
    assert slots[0] == utc(2026, 10, 25, 0, 30)


def test_autumn_fixed_job_after_first_occurrence_skips_the_repeat() -> None:
    # 02:45 CEST, between the two 02:30s.
    slot = next_slot("30 2 * * *", AMS, utc(2026, 10, 25, 0, 45))
    assert wall([slot], AMS) == ["2026-10-26T02:30:00+01:00"]


def test_autumn_wildcard_job_runs_twice_in_the_repeated_hour() -> None:
    slots = describe_next("*/30 * * * *", AMS, utc(2026, 10, 24, 23, 15), 6)
    assert wall(slots, AMS) == [
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]


def test_autumn_wildcard_minute_fixed_hour_runs_twice() -> None:
    slots = describe_next("*/30 2 * * *", AMS, utc(2026, 10, 24, 12), 5)
    assert wall(slots, AMS) == [
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-26T02:00:00+01:00",
    ]


def test_autumn_six_field_seconds_wildcard_follows_the_clock() -> None:
    after = datetime(2026, 10, 25, 2, 59, 50, tzinfo=ZoneInfo(AMS), fold=1)
    slots = describe_next("*/5 * * * * *", AMS, after, 3)
    assert wall(slots, AMS) == [
        "2026-10-25T02:59:55+01:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:00:05+01:00",
    ]


# --- next_slot: daylight saving, America/New_York ------------------------------------
# 2026-03-08 02:00 EST -> 03:00 EDT (07:00 UTC); 2026-11-01 02:00 EDT -> 01:00 EST (06:00 UTC)


def test_new_york_spring() -> None:
    fixed = describe_next("30 2 * * *", NYC, utc(2026, 3, 7, 12), 3)
    assert wall(fixed, NYC) == [
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
        "2026-03-10T02:30:00-04:00",
    ]
    assert fixed[0] == utc(2026, 3, 8, 7)
    daily = describe_next("@daily", NYC, utc(2026, 3, 7, 12), 2)
    assert wall(daily, NYC) == ["2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00"]
    wildcard = describe_next("*/20 * * * *", NYC, utc(2026, 3, 8, 6, 30), 3)
    assert wall(wildcard, NYC) == [
        "2026-03-08T01:40:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-08T03:20:00-04:00",
    ]


def test_new_york_autumn() -> None:
    fixed = describe_next("30 1 * * *", NYC, utc(2026, 10, 31, 12), 2)
    assert wall(fixed, NYC) == ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
    wildcard = describe_next("30 * * * *", NYC, utc(2026, 11, 1, 4), 4)
    assert wall(wildcard, NYC) == [
        "2026-11-01T00:30:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-01T01:30:00-05:00",
        "2026-11-01T02:30:00-05:00",
    ]


# --- properties ---------------------------------------------------------------------


def _field(text: str, low: int, high: int) -> set[int]:
    """The values of a plain field (``*``, ``*/n``, ``a``, ``a-b``, lists), as cron sets them."""
    values: set[int] = set()
    for item in text.split(","):
        span, _, step = item.partition("/")
        first, _, last = span.partition("-")
        start, end = (low, high) if span == "*" else (int(first), int(last or first))
        values |= set(range(start, end + 1, int(step or 1)))
    return values


def cron_match(cron: str, moment: datetime) -> bool:
    """A brute-force check of a plain 5- or 6-field expression (no names, L, W, #)."""
    fields = cron.split()
    second = fields.pop(0) if len(fields) == 6 else "0"
    minute, hour, dom, month, dow = fields
    days = _field(dom, 1, 31), {d % 7 for d in _field(dow, 0, 6)}
    weekday = (moment.weekday() + 1) % 7
    if dom.startswith("*") or dow.startswith("*"):
        day = moment.day in days[0] and weekday in days[1]
    else:
        day = moment.day in days[0] or weekday in days[1]
    return (
        day
        and moment.second in _field(second, 0, 59)
        and moment.minute in _field(minute, 0, 59)
        and moment.hour in _field(hour, 0, 23)
        and moment.month in _field(month, 1, 12)
    )


def brute_next(cron: str, after: datetime) -> datetime:
    """The first UTC second after ``after`` that ``cron`` matches, one step at a time."""
    moment = after.replace(microsecond=0) + timedelta(seconds=1)
    step = timedelta(seconds=1)
    if len(cron.split()) == 5:  # whole minutes only
        moment += timedelta(seconds=-moment.second % 60)
        step = timedelta(minutes=1)
    while not cron_match(cron, moment):
        moment += step
    return moment


ZONES = ["UTC", AMS, NYC, "Australia/Lord_Howe", "Asia/Kolkata", "Pacific/Apia"]
CRONS = ["*/7 * * * *", "30 2 * * *", "0 */3 * * *", "0 0 * * 0", "15 1,2,3 * * *"]


@given(
    cron=st.sampled_from(CRONS),
    zone=st.sampled_from(ZONES),
    after=st.datetimes(
        min_value=datetime(2010, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
    ),
)
@settings(max_examples=150, deadline=None)
def test_slots_increase_and_match_the_wall_clock(cron: str, zone: str, after: datetime) -> None:
    slots = describe_next(cron, zone, after, 4)
    assert all(slot.tzinfo is UTC for slot in slots)
    assert after < slots[0] < slots[1] < slots[2] < slots[3]
    assert slots[0] - after <= timedelta(days=8)
    for slot in slots:
        local = slot.astimezone(ZoneInfo(zone)).replace(tzinfo=None)
        if is_wildcard(cron):
            assert cron_match(cron, local)
        else:  # on its wall time, or right after a gap that swallowed it
            gap_end = (
                slot.astimezone(ZoneInfo(zone)).utcoffset()
                != (slot - timedelta(seconds=1)).astimezone(ZoneInfo(zone)).utcoffset()
            )
            assert cron_match(cron, local) or gap_end


@given(
    cron=st.sampled_from(
        [*CRONS, "*/10 * * * * *", "0 0 29 2 *", "0 22 */2 * 1-5", "0 12 1,15 * 1", "0 0 1 * */2"]
    ),
    after=st.datetimes(
        min_value=datetime(2010, 1, 1), max_value=datetime(2035, 1, 1), timezones=st.just(UTC)
    ),
)
@settings(max_examples=60, deadline=None)
def test_utc_agrees_with_a_brute_force_search(cron: str, after: datetime) -> None:
    if cron == "0 0 29 2 *":  # years apart: too far to walk minute by minute
        assert next_slot(cron, "UTC", after).strftime("%m-%d %H:%M") == "02-29 00:00"
        return
    assert next_slot(cron, "UTC", after) == brute_next(cron, after)


# --- the words a user sees ------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "why"),
    [
        (
            "0 22-2 * * *",
            "bad hour field '22-2': 22-2 runs backwards; cron accepts it and never runs it "
            "(write 22-23,0-2)",
        ),
        ("@DAILY", "unknown macro '@DAILY' (macros are lower case, as in cron: @daily)"),
        ("*/1000000000000 * * * *", "bad minute field '*/1000000000000': the step must be 1-60"),
    ],
)
def test_validate_names_the_file_line_job_and_fix(tmp_path: Path, cron: str, why: str) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(f'jobs:\n  nightly:\n    cron: "{cron}"\n    command: ./run\n')
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == f"dblockrun: {path}:3: job 'nightly': cron: {why}\n"


# --- H (hashed values) and several schedules -----------------------------------------


def minutes(cron: str, name: str, count: int = 4) -> list[str]:
    after = utc(2026, 1, 1)
    return [s.strftime("%d %H:%M:%S") for s in upcoming(Schedule((cron,), "UTC", name), after,
                                                          count)]


def test_h_is_a_value_hashed_from_the_job_name_the_same_in_every_process() -> None:
    # Pinned values: CRC-32 of the name (Python's hash() would differ per process).
    assert minutes("H * * * *", "backup") == ["01 00:24:00", "01 01:24:00", "01 02:24:00",
                                               "01 03:24:00"]
    assert minutes("H/15 * * * *", "backup") == ["01 00:09:00", "01 00:24:00", "01 00:39:00",
                                                  "01 00:54:00"]
    assert minutes("H(0-29)/10 * * * *", "backup") == ["01 00:04:00", "01 00:14:00",
                                                        "01 00:24:00", "01 01:04:00"]
    assert minutes("30 H(0-29) * * * *", "backup", 1) == ["01 00:24:30"]
    # Names spread: 200 jobs written alike land on many minutes, each in range.
    spread = {minutes("H(0-29) * * * *", f"job-{i}", 1)[0] for i in range(200)}
    assert len(spread) == 30 and all(int(s[6:8]) < 30 for s in spread)


def test_h_in_day_of_month_picks_a_day_every_month_has() -> None:
    days = {next_slot("0 0 H * *", "UTC", utc(2026, 1, 1), f"j{i}").day for i in range(300)}
    assert days == set(range(1, 29))


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("1,H * * * *", "bad minute field '1,H': a hashed value is H, H/n, H(a-b) or H(a-b)/n "
                        "(a capital H), the field's only item"),
        ("h * * * *", "bad minute field 'h': a hashed value is H, H/n, H(a-b) or H(a-b)/n "
                      "(a capital H), the field's only item"),
        ("H(5-5) * * * *", "bad minute field 'H(5-5)': in H(5-5) the range must run upwards"),
        ("H(0-70) * * * *", "bad minute field 'H(0-70)' (allowed: 0-59)"),
        ("H(0-29)/31 * * * *", "bad minute field 'H(0-29)/31': the step must be 1-30"),
        ("0 0 * * H(1-7)", "bad day-of-week field 'H(1-7)': in H(a-b) the range is 0-6"),
        ("R * * * *", "minute field 'R': random (R) values are not supported; every host "
                      "must compute the same slots (H spreads jobs by their names)"),
    ],
)
def test_bad_hashed_values(expr: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        validate_cron(expr, "backup")
    assert str(info.value) == message


def test_several_schedules_are_the_union_of_their_slots() -> None:
    # 2026-01-02 is a Friday: 09:00 weekdays, 12:00 Saturdays; Monday 09:00 twice is one slot.
    schedule = Schedule(("0 9 * * 1-5", "0 12 * * 6", "0 9 * * 1"), "UTC")
    assert [s.strftime("%a %H:%M") for s in upcoming(schedule, utc(2026, 1, 2), 4)] == [
        "Fri 09:00", "Sat 12:00", "Mon 09:00", "Tue 09:00"]
    # Each expression keeps its own daylight-saving rule.
    both = Schedule(("30 2 * * *", "*/30 * * * *"), AMS)
    slots = upcoming(both, utc(2026, 3, 29, 0, 15), 4)
    assert slots == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1), utc(2026, 3, 29, 1, 30),
                     utc(2026, 3, 29, 2)]
