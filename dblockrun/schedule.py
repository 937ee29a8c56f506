"""Cron slots in a job's time zone, with Debian cron's daylight-saving rules.

Pure functions: the current time is always passed in, nothing is read from the
host. Expressions are parsed and matched by :mod:`dblockrun.cronexpr` (Debian's
field rules); this module maps wall times to instants.

Daylight saving, as Debian's cron does it:

* a *wildcard* job (its minute or hour field, or its seconds field, starts
  with ``*``) follows the wall clock: wall times skipped by a spring-forward gap
  have no slot, wall times of a repeated autumn hour have two (one per real
  instant);
* a *fixed* job (e.g. ``30 2 * * *``, ``0 1,*/12 * * *``, ``@daily``) runs
  once for slots in a gap, at the instant the gap ends, and once for a slot in
  the repeated hour, at its first occurrence. Debian's cron runs a fixed job
  once per slot it missed in the gap (``0,30 2 * * *``: twice, both right after
  the gap); here the slots of one gap collapse into that one instant, because
  a slot is an instant and each runs at most once.

How: the UTC time line is cut into segments of constant UTC offset. Inside a
segment wall time and real time move together, so the next matching wall time
is found directly; only the segment's end, the next offset transition, needs
care. A match days away skips ahead (see :func:`next_slot`), so a rare slot
(``0 0 * 2 1#5``, every 28 years or so) costs no more than a daily one.
"""

from __future__ import annotations

import difflib
import functools
import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

from dblockrun.cronexpr import MACROS, CronExpr, NoMatch, parse_cron

__all__ = [
    "MACROS",
    "describe_next",
    "is_wildcard",
    "next_slot",
    "next_slot_at",
    "validate_cron",
    "validate_timezone",
]

# Offsets stay constant for months; sample the UTC offset this often to find changes.
_SCAN_STEP = timedelta(hours=6)
# A match further than this from the segment's start is looked for from a day before it.
_NEAR = timedelta(days=2)
_FOREVER_START = datetime(2000, 1, 1)


def validate_cron(expr: str) -> None:
    """Raise :class:`ValueError` with the reason if ``expr`` is not a usable cron expression."""
    _parse(expr)


def is_wildcard(cron: str) -> bool:
    """Whether ``cron``'s minute, hour or seconds field starts with ``*`` (see module doc)."""
    return _parse(cron).wildcard


def validate_timezone(name: str) -> None:
    """Raise :class:`ValueError` if ``name`` is not a known IANA time zone."""
    _zone(name)


def next_slot(cron: str, timezone: str, after: datetime) -> datetime:
    """The first slot of ``cron`` strictly after ``after``, as an aware UTC datetime.

    ``cron`` is evaluated in the wall-clock time of ``timezone``; ``after`` must
    be timezone-aware.
    """
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("after must be a timezone-aware datetime")
    parsed = _parse(cron)
    zone = _zone(timezone)
    try:
        return _next_slot(parsed, zone, after.astimezone(UTC))
    except (NoMatch, OverflowError):
        raise ValueError(f"no slot found for {cron!r} after {after.isoformat()}") from None


def _next_slot(parsed: CronExpr, zone: ZoneInfo, start: datetime) -> datetime:
    inclusive = False  # whether a slot exactly at `start` counts
    for _ in range(10_000):
        offset = _offset(zone, start)
        wall = _first_match(parsed, _naive(start + offset), inclusive)
        candidate = (wall - offset).replace(tzinfo=UTC)
        transition = _next_transition(zone, start, min(candidate, start + _NEAR))
        if transition is None and candidate > start + _NEAR:
            # No match for days, and no offset change near `start`: whatever the offsets
            # (hours apart) until a day before `candidate`, no wall time there matches.
            start, inclusive = candidate - timedelta(days=1), True
            continue
        if transition is None:  # `wall` is a real wall time of this segment
            if not parsed.wildcard and _offset_at_wall(zone, wall) != offset:
                start, inclusive = candidate, False  # repeated hour, second time: skip
                continue
            return candidate
        new_offset = _offset(zone, transition)
        if not parsed.wildcard and new_offset > offset and wall < _naive(transition + new_offset):
            return transition  # `wall` was skipped by the gap: run as the gap ends
        start, inclusive = transition, True
    raise NoMatch("too many offset changes")


@functools.lru_cache(maxsize=8192)
def next_slot_at(cron: str, timezone: str, after: float) -> float:
    """:func:`next_slot` on epoch seconds, remembered: a fleet's jobs often
    share a schedule, and thousands due at once then cost one computation."""
    try:
        moment = datetime.fromtimestamp(after, UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"after must be a time in epoch seconds, not {after!r}") from None
    return next_slot(cron, timezone, moment).timestamp()


def describe_next(cron: str, timezone: str, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` slots after ``after`` (aware UTC datetimes)."""
    slots: list[datetime] = []
    for _ in range(count):
        after = next_slot(cron, timezone, after)
        slots.append(after)
    return slots


def _parse(expr: str) -> CronExpr:
    if not isinstance(expr, str):
        raise ValueError(f"a cron expression must be a string, not {type(expr).__name__}")
    return _parse_text(expr)


@functools.lru_cache(maxsize=1024)
def _parse_text(expr: str) -> CronExpr:
    parsed = parse_cron(expr)
    try:
        parsed.first_from(_FOREVER_START)
    except NoMatch:
        raise ValueError(f"{expr.strip()!r} never matches a date") from None
    return parsed


def _zone(name: str) -> ZoneInfo:
    if not isinstance(name, str):
        raise ValueError(f"a time zone must be a string, not {type(name).__name__}")
    return _zone_named(name)


@functools.lru_cache(maxsize=256)
def _zone_named(name: str) -> ZoneInfo:
    if name == "localtime":
        raise ValueError("'localtime' depends on the host; name a zone like Europe/Amsterdam")
    try:
        return ZoneInfo(name)
    except Exception as exc:
        close = difflib.get_close_matches(name, available_timezones(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else " (use e.g. UTC, Europe/Amsterdam)"
        raise ValueError(f"unknown time zone {name!r}{hint}") from exc


def _naive(moment: datetime) -> datetime:
    return moment.replace(tzinfo=None)


def _offset(zone: ZoneInfo, moment: datetime) -> timedelta:
    """The UTC offset of ``zone`` at the instant ``moment``."""
    offset = moment.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _offset_at_wall(zone: ZoneInfo, wall: datetime) -> timedelta:
    """The offset of the first occurrence of the naive wall time ``wall``."""
    offset = wall.replace(tzinfo=zone, fold=0).utcoffset()
    assert offset is not None
    return offset


def _first_match(parsed: CronExpr, wall: datetime, inclusive: bool) -> datetime:
    """The first naive wall time matching ``parsed`` after ``wall`` (or at it)."""
    second = wall.replace(microsecond=0)
    if not inclusive or second != wall:  # matches fall on whole seconds
        second += timedelta(seconds=1)
    return parsed.first_from(second)


def _next_transition(zone: ZoneInfo, start: datetime, end: datetime) -> datetime | None:
    """The first instant in (start, end] whose UTC offset differs from ``start``'s."""
    offset = _offset(zone, start)
    low = start
    while low < end:
        high = min(low + _SCAN_STEP, end)
        if _offset(zone, high) != offset:
            # Transitions fall on whole seconds: bisect on POSIX seconds.
            low_s, high_s = math.floor(low.timestamp()), math.ceil(high.timestamp())
            while high_s - low_s > 1:
                middle = (low_s + high_s) // 2
                if _offset(zone, datetime.fromtimestamp(middle, UTC)) == offset:
                    low_s = middle
                else:
                    high_s = middle
            return datetime.fromtimestamp(high_s, UTC)
        low = high
    return None
