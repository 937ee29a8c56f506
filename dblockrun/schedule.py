"""Cron slots in a job's time zone, with Debian cron's daylight-saving rules.

Pure functions: the current time is always passed in, nothing is read from the
host. A cron expression has 5 fields (minute hour day-of-month month
day-of-week), 6 with a seconds field *first*, or is one of the macros in
:data:`MACROS`.

Daylight saving, as Debian's cron does it:

* a *wildcard* job (``*`` in its minute or hour field, or in its seconds
  field) follows the wall clock: wall times skipped by a spring-forward gap
  have no slot, wall times of a repeated autumn hour have two (one per real
  instant);
* a *fixed* job (minute and hour both fixed, e.g. ``30 2 * * *``, ``@daily``)
  runs once for slots in a gap, at the instant the gap ends (several such
  slots collapse into that one instant), and once for a slot in the repeated
  hour, at its first occurrence.

How: the UTC time line is cut into segments of constant UTC offset. Inside a
segment wall time and real time move together, so croniter (given naive wall
times) finds the next match directly; only the segment's end, the next
offset transition, needs care.
"""

from __future__ import annotations

import difflib
import functools
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

from croniter import croniter

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_ALLOWED = {
    "second": "0-59",
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31, L, nW",
    "month": "1-12 or jan-dec",
    "day-of-week": "0-7 or sun-sat, n#k, nL",
}
# Hashed (H) and random (R) values differ between hosts: the fleet must agree on slots.
_HASHED_OR_RANDOM = re.compile(r"(?:^|[,/-])[hHrR](?:$|[,/(-])")
# Offsets stay constant for months; sample the UTC offset this often to find changes.
_SCAN_STEP = timedelta(hours=6)
_FOREVER_START = datetime(2000, 1, 1)


@dataclass(frozen=True)
class _Cron:
    expr: str  # croniter's form: 5 fields, or 6 with the seconds LAST
    wildcard: bool


def validate_cron(expr: str) -> None:
    """Raise :class:`ValueError` with the reason if ``expr`` is not a usable cron expression."""
    _parse(expr)


def is_wildcard(cron: str) -> bool:
    """Whether ``cron`` has a ``*`` in its minute, hour or seconds field (see module doc)."""
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
    start = after.astimezone(UTC)
    inclusive = False  # whether a slot exactly at `start` counts
    for _ in range(10_000):
        offset = _offset(zone, start)
        wall = _first_match(parsed, _naive(start + offset), inclusive)
        candidate = (wall - offset).replace(tzinfo=UTC)
        transition = _next_transition(zone, start, candidate)
        if transition is None:  # `wall` is a real wall time of this segment
            if not parsed.wildcard and _offset_at_wall(zone, wall) != offset:
                start, inclusive = candidate, False  # repeated hour, second time: skip
                continue
            return candidate
        new_offset = _offset(zone, transition)
        if not parsed.wildcard and new_offset > offset and wall < _naive(transition + new_offset):
            return transition  # `wall` was skipped by the gap: run as the gap ends
        start, inclusive = transition, True
    raise ValueError(f"no slot found for {cron!r} after {after.isoformat()}")


@functools.lru_cache(maxsize=8192)
def next_slot_at(cron: str, timezone: str, after: float) -> float:
    """:func:`next_slot` on epoch seconds, remembered: a fleet's jobs often
    share a schedule, and thousands due at once then cost one computation."""
    return next_slot(cron, timezone, datetime.fromtimestamp(after, UTC)).timestamp()


def describe_next(cron: str, timezone: str, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` slots after ``after`` (aware UTC datetimes)."""
    slots: list[datetime] = []
    for _ in range(count):
        after = next_slot(cron, timezone, after)
        slots.append(after)
    return slots


def _parse(expr: str) -> _Cron:
    if not isinstance(expr, str):
        raise ValueError(f"a cron expression must be a string, not {type(expr).__name__}")
    return _parse_text(expr)


@functools.lru_cache(maxsize=1024)
def _parse_text(expr: str) -> _Cron:
    text = expr.strip()
    if not text:
        raise ValueError("empty cron expression")
    if text.startswith("@"):
        macro = text.lower()
        if macro == "@reboot":
            raise ValueError(
                "@reboot is not supported: a fleet has no single boot "
                "(use a cron expression or rate)"
            )
        if macro not in MACROS:
            raise ValueError(f"unknown macro {text!r} (use {', '.join(MACROS)})")
        text = MACROS[macro]
    fields = text.split()
    names: tuple[str, ...]
    if len(fields) == 5:
        names = _FIELDS
    elif len(fields) == 6:
        names = ("second", *_FIELDS)
    else:
        raise ValueError(
            f"{len(fields)} fields; use 5 (minute hour day-of-month month day-of-week), "
            "6 with the seconds first, or a macro like @daily"
        )
    for name, field in zip(names, fields, strict=True):
        _check_field(name, field, len(fields))
    # croniter puts a 6-field expression's seconds LAST; ours come first.
    ordered = fields[1:] + fields[:1] if len(fields) == 6 else fields
    parsed = _Cron(" ".join(ordered), any("*" in field for field in fields[: len(fields) - 3]))
    try:
        croniter(parsed.expr, _FOREVER_START).get_next(datetime)
    except Exception as exc:
        raise ValueError(f"{expr.strip()!r} never matches a date") from exc
    return parsed


def _check_field(name: str, field: str, count: int) -> None:
    if _HASHED_OR_RANDOM.search(field):
        raise ValueError(
            f"{name} field {field!r}: hashed (H) and random (R) values are not supported; "
            "every host must compute the same slots"
        )
    # Validate the field alone, with every other field a wildcard.
    fields = ["*"] * count
    fields[_position(name, count)] = field
    try:
        croniter(" ".join(fields), _FOREVER_START)
    except Exception as exc:
        raise ValueError(f"bad {name} field {field!r} (allowed: {_ALLOWED[name]})") from exc


def _position(name: str, count: int) -> int:
    """Where croniter expects field ``name`` in an expression of ``count`` fields."""
    if name == "second":
        return 5
    return _FIELDS.index(name)


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


def _first_match(parsed: _Cron, wall: datetime, inclusive: bool) -> datetime:
    """The first naive wall time matching ``parsed`` after ``wall`` (or at it)."""
    if inclusive and wall.microsecond == 0:
        wall -= timedelta(seconds=1)  # matches fall on whole seconds
    try:
        match = croniter(parsed.expr, wall).get_next(datetime)
    except Exception as exc:
        raise ValueError(f"no slot after {wall.isoformat()}") from exc
    assert isinstance(match, datetime)
    return match


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
