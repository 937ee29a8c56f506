from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dblockrun.durations import format_duration, lease_too_short, parse_duration

FORMS = "(use e.g. 250ms, 90s, 5m, 1h30m, 2d)"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("250ms", 0.25),
        ("90s", 90.0),
        ("5m", 300.0),
        ("3h", 10_800.0),
        ("2d", 172_800.0),
        ("1h30m", 5_400.0),
        ("1d2h", 93_600.0),
        ("1h30m15s", 5_415.0),
        ("1s500ms", 1.5),
        ("1.5h", 5_400.0),
        ("0s", 0.0),
        (" 5m ", 300.0),
        ("90", 90.0),
        ("2.5", 2.5),
        (90, 90.0),
        (0.25, 0.25),
        (0, 0.0),
    ],
)
def test_parse(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5x", f"'5x' is not a duration {FORMS}"),
        ("", f"empty duration {FORMS}"),
        ("   ", f"empty duration {FORMS}"),
        ("-5m", f"'-5m' is negative {FORMS}"),
        (-1, f"-1 is negative {FORMS}"),
        ("m", f"'m' is not a duration {FORMS}"),
        ("1h30", f"'1h30' is not a duration {FORMS}"),
        ("1h 30m", f"'1h 30m' is not a duration {FORMS}"),
        ("five minutes", f"'five minutes' is not a duration {FORMS}"),
        (
            "30m1h",
            f"'30m1h' is not a duration: units go from largest to smallest, each once {FORMS}",
        ),
        (
            "1h1h",
            f"'1h1h' is not a duration: units go from largest to smallest, each once {FORMS}",
        ),
        (float("nan"), f"nan is not a duration {FORMS}"),
        (float("inf"), f"inf is not a duration {FORMS}"),
        (True, f"True is not a duration {FORMS}"),
        ("36501d", "'36501d' is too long (at most 36500d)"),
    ],
)
def test_parse_rejects(text: str | int | float, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.25, "250ms"),
        (1.5, "1s500ms"),
        (90, "1m30s"),
        (5_400, "1h30m"),
        (93_600, "1d2h"),
        (86_400, "1d"),
        (-90, "-1m30s"),
        (0.0001, "0s"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_format_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="not a finite number"):
        format_duration(float("nan"))


@given(st.integers(min_value=0, max_value=36_500 * 86_400_000))
def test_format_parse_round_trip(millis: int) -> None:
    text = format_duration(millis / 1000)
    assert round(parse_duration(text) * 1000) == millis


@pytest.mark.parametrize(("lease", "heartbeat", "stopped_at"), [
    (30.0, 10.0, None),  # the defaults
    (3.0, 1.0, None),  # the tests' daemons
    (2.0, 0.5, None),
    (2.2, 2.2 / 3, None),  # exec's shortest lease (it renews every third)
    (2.0, 1.0, 2.0 - 2.0 / 6 - 1.0),  # every run stopped after 0.67 s
    (2.1, 0.7, 2.1 - 0.35 - 1.0),
    (12.0, 6.0, None),  # stopped at 9 s
    (60.0, 30.0, None),  # a sixth of 60 s is over the 5 s kill grace: stopped at 54 s
    (60.0, 54.0, 54.0),
])
def test_a_lease_must_leave_room_for_the_next_renewal(
        lease: float, heartbeat: float, stopped_at: float | None) -> None:
    found = lease_too_short(lease, heartbeat)
    assert found == (None if stopped_at is None else pytest.approx(stopped_at))
