"""Durations as users write them (``250ms``, ``90s``, ``1h30m``, ``2d``), in seconds."""

from __future__ import annotations

import math
import re

#: Shown in every error message.
FORMS = "use e.g. 250ms, 90s, 5m, 1h30m, 2d"

#: Longest accepted duration: 100 years, far below what datetime arithmetic can hold.
MAX_SECONDS = 36_500 * 86_400.0

# Largest unit first; a duration names each unit at most once, in this order.
_UNITS = ("d", "h", "m", "s", "ms")
_SECONDS = {"d": 86_400.0, "h": 3_600.0, "m": 60.0, "s": 1.0}
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")  # "ms" before "m"


def parse_duration(text: str | int | float) -> float:
    """Return the seconds that ``text`` stands for.

    A bare number (or numeric string) is seconds. Raises :class:`ValueError`
    with the reason and the accepted forms.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"{text!r} is not a duration ({FORMS})")
    if not isinstance(text, str):
        return _checked(float(text), repr(text))
    shown = repr(text) if len(text) <= 40 else repr(text[:40] + "...")
    body = text.strip()
    if not body:
        raise ValueError(f"empty duration ({FORMS})")
    if body.startswith("-"):
        raise ValueError(f"{shown} is negative ({FORMS})")
    if _NUMBER.fullmatch(body):
        return _checked(float(body), shown)
    seconds = 0.0
    position = 0
    last_unit = -1
    while position < len(body):
        match = _PART.match(body, position)
        if match is None:
            raise ValueError(f"{shown} is not a duration ({FORMS})")
        number, unit = match.groups()
        index = _UNITS.index(unit)
        if index <= last_unit:
            raise ValueError(
                f"{shown} is not a duration: units go from largest to smallest, each once ({FORMS})"
            )
        last_unit = index
        seconds += float(number) / 1000 if unit == "ms" else float(number) * _SECONDS[unit]
        position = match.end()
    return _checked(seconds, shown)


def parse_option_duration(text: str) -> float:
    """:func:`parse_duration` of a command-line option: a number without a
    unit (``--for 3``: seconds? hours?) is refused, saying so; ``0`` is zero."""
    body = text.strip()
    if _NUMBER.fullmatch(body) and float(body) != 0:
        shown = repr(text) if len(text) <= 40 else repr(text[:40] + "...")
        raise ValueError(f"{shown} has no unit: write {body}s, {body}m, {body}h or {body}d")
    return parse_duration(text)


def _checked(seconds: float, shown: str) -> float:
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{shown} is not a duration ({FORMS})")
    if seconds < 0:
        raise ValueError(f"{shown} is negative ({FORMS})")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{shown} is too long (at most 36500d)")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest form of ``seconds`` that :func:`parse_duration` reads back.

    Rounded to the millisecond: ``5400`` -> ``1h30m``, ``0.25`` -> ``250ms``,
    ``0`` -> ``0s``. Negative durations get a leading ``-``.
    """
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"{seconds!r} is not a finite number of seconds")
    sign = "-" if seconds < 0 else ""
    millis = round(abs(seconds) * 1000)
    if millis == 0:
        return "0s"
    parts: list[str] = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        count, millis = divmod(millis, size)
        if count:
            parts.append(f"{count}{unit}")
    if millis:
        parts.append(f"{millis}ms")
    return sign + "".join(parts)



#: The least time a heartbeat must leave between sending a renewal and the
#: moment an unrenewed run is stopped: a renewal's round trip.
RENEWAL_ROOM = 0.1


def fence_margin(lease: float, kill_grace: float = 5.0) -> float:
    """How long before its lease could expire a run that cannot renew it is
    stopped: a sixth of the lease (at most ``kill_grace``, the time the
    command gets after SIGTERM) and 1 s, so that the command is gone first."""
    return min(kill_grace, lease / 6) + 1.0


def stopped_after(lease: float, kill_grace: float = 5.0) -> float:
    """Seconds after its last renewal at which a run that cannot renew its
    lease is stopped (:func:`fence_margin`)."""
    return lease - fence_margin(lease, kill_grace)


def lease_too_short(lease: float, heartbeat: float, kill_grace: float = 5.0) -> float | None:
    """When a run under ``lease``, renewed every ``heartbeat``, would be
    stopped before its next renewal could land: the seconds after its last
    renewal at which it would be (:func:`stopped_after`); None when the lease
    leaves room."""
    stop = stopped_after(lease, kill_grace)
    return None if heartbeat + RENEWAL_ROOM <= stop else stop


def too_short_message(lease: str, every: str, stop: float) -> str:
    """One line for :func:`lease_too_short`'s answer, with the options as given."""
    after = f"{format_duration(stop)} after its last renewal" if stop > 0 else "at once"
    return (f"--lease {lease} is too short for renewals every {every}: a run would be "
            f"stopped {after}, before the next renewal could land")


#: ``disable`` (and a pause) with no duration: until 9999-12-31, in seconds
#: since the epoch (the store writes it; ``timetext`` says "forever").
FOREVER = 253402300799.0
