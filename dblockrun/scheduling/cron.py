"""Cron slots in a job's time zone, with Debian cron's daylight-saving rules.

Pure functions: the current time is always passed in, nothing is read from the
host. A cron expression has 5 fields (minute hour day-of-month month
day-of-week), 6 with a seconds field *first*, or is one of the macros in
:data:`MACROS`.

Who does what:

* dblockrun validates the text (:func:`validate_cron`): its policy, stricter
  than croniter's, with the fix written out. Rejected: backward ranges
  (``22-2``: cron never runs them), a step after a single value (``5/10``) or
  wider than its field, macros not in lower case, Quartz's ``?``, random
  values (``R``), hashed values (``H``) without a job name or not a field's
  only item, and the extensions croniter would read differently from
  dblockrun-jobs(5): ``nW`` past day 28, ``W`` in a list, ``n#k``/``nL``
  listed with plain days.
* ``H`` is Jenkins' hashed value: ``H``, ``H/n``, ``H(a-b)``, ``H(a-b)/n``,
  a value (or a start) picked from the field's range by a hash of the job's
  name (croniter's ``hash_id``: CRC-32, the same on every host and in every
  Python), so jobs written alike spread over the range and every host
  computes the same slots. As in Jenkins, ``H`` in the day-of-month field
  picks from 1-28 (every month has those days), and in day-of-week from 0-6.
  For the daylight-saving rule below, ``H/n`` counts as starting with ``*``.
* croniter finds the next matching naive wall time, with
  ``day_or=True, implement_cron_bug=True``: Debian's day rule (a day field
  counts as ``*`` only when it *starts* with ``*``; then a day must match
  both fields, otherwise either). croniter keeps ``n#k``, ``nL`` and ``nW``
  as an intersection even then, so when both day fields are restricted and
  one holds such an item, the expression is handed to croniter as two, one
  per day field, and the earlier match wins.
* this module maps wall times to instants (daylight saving, below).

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
segment wall time and real time move together, so croniter (given naive wall
times) finds the next match directly; only the segment's end, the next offset
transition, needs care. A match days away skips ahead (see :func:`next_slot`),
so a rare slot (``0 0 * 2 1#5``, every 28 years or so) costs no more than a
daily one.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

from croniter import CroniterBadDateError, croniter

from dblockrun.jobs import Schedule

__all__ = [
    "MACROS",
    "describe_next",
    "is_wildcard",
    "next_slot",
    "next_slot_at",
    "upcoming",
    "validate_cron",
    "validate_timezone",
    "zone",
]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# Offsets stay constant for months; sample the UTC offset this often to find changes.
_SCAN_STEP = timedelta(hours=6)
# A match further than this from the segment's start is looked for from a day before it.
_NEAR = timedelta(days=2)
_FOREVER_START = datetime(2000, 1, 1)
# The calendar (leap years and weekdays) repeats every 400 years: a day rule that
# matches at all matches within that many years.
_CYCLE_YEARS = 400
_HASHED_OR_RANDOM = re.compile(r"(?:^|[,/-])[hHrR](?:$|[,/(-])")
_ANY_HASHED_OR_RANDOM = re.compile(r"(?:^|[\s,/-])[hHrR](?:$|[\s,/(-])")
_HASHED = re.compile(r"H(?:\((\w+)-(\w+)\))?(?:/([0-9]+))?")
_RANGE = re.compile(r"(\*|[0-9a-z]+)(?:-([0-9a-z]+))?(?:/([0-9]+))?", re.IGNORECASE)
_NEAREST = re.compile(r"([0-9]+)W", re.IGNORECASE)


class _NoMatch(ValueError):
    """No wall time matches before the year 10000."""


@dataclass(frozen=True)
class _Spec:
    name: str
    low: int
    high: int  # the highest value one may write
    star_high: int  # `*` covers low..star_high (day-of-week: 0-6; 7 is Sunday again)
    allowed: str
    names: tuple[str, ...] = ()  # names[i] is the value low + i

    def bad(self, field: str, why: str = "") -> ValueError:
        if why:
            return ValueError(f"bad {self.name} field {field!r}: {why}")
        return ValueError(f"bad {self.name} field {field!r} (allowed: {self.allowed})")


_SECOND = _Spec("second", 0, 59, 59, "0-59")
_MINUTE = _Spec("minute", 0, 59, 59, "0-59")
_HOUR = _Spec("hour", 0, 23, 23, "0-23")
_DOM = _Spec("day-of-month", 1, 31, 31, "1-31, L, LW, nW")
# Names in English whatever the locale (calendar.month_abbr follows LC_TIME).
_MONTH_NAMES = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH = _Spec("month", 1, 12, 12, "1-12 or jan-dec", _MONTH_NAMES)
_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
_DOW = _Spec("day-of-week", 0, 7, 6, "0-7 or sun-sat, n#k, nL", _DAY_NAMES)


@dataclass(frozen=True)
class _Cron:
    """A validated expression as croniter reads it (seconds first when 6 fields)."""

    exprs: tuple[str, ...]  # a wall time matches if any of these matches
    seconds: bool
    wildcard: bool  # seconds, minute or hour starts with `*` or `H/` (Debian's DST rule)
    hash_id: str | None = None  # the job's name when a field is hashed (H)


def validate_cron(expr: str, hash_id: str | None = None) -> None:
    """Raise :class:`ValueError` with the reason if ``expr`` is not a usable
    cron expression; ``hash_id`` (the job's name) allows ``H``."""
    _parse(expr, hash_id)


def is_wildcard(cron: str, hash_id: str | None = None) -> bool:
    """Whether ``cron``'s minute, hour or seconds field starts with ``*`` or
    ``H/`` (see module doc)."""
    return _parse(cron, hash_id).wildcard


def validate_timezone(name: str) -> None:
    """Raise :class:`ValueError` if ``name`` is not a known IANA time zone."""
    _zone(name)


def next_slot(cron: str, timezone: str, after: datetime, hash_id: str | None = None) -> datetime:
    """The first slot of ``cron`` strictly after ``after``, as an aware UTC datetime.

    ``cron`` is evaluated in the wall-clock time of ``timezone``; ``after`` must
    be timezone-aware; ``hash_id`` (the job's name) gives ``H`` its values.
    """
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError("after must be a timezone-aware datetime")
    parsed = _parse(cron, hash_id)
    zone = _zone(timezone)
    try:
        return _next_slot(parsed, zone, after.astimezone(UTC))
    except (_NoMatch, OverflowError):
        raise ValueError(f"no slot found for {cron!r} after {after.isoformat()}") from None


def _next_slot(parsed: _Cron, zone: ZoneInfo, start: datetime) -> datetime:
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
    raise _NoMatch("too many offset changes")


@functools.lru_cache(maxsize=8192)
def next_slot_at(schedule: Schedule, after: float) -> float:
    """The first slot of ``schedule`` strictly after ``after``, in epoch
    seconds: the earliest of its expressions' next slots (a slot two of them
    share is one slot). Remembered: a fleet's jobs often share a schedule,
    and thousands due at once then cost one computation."""
    try:
        moment = datetime.fromtimestamp(after, UTC)
    except (OverflowError, OSError, ValueError):
        raise ValueError(f"after must be a time in epoch seconds, not {after!r}") from None
    hash_id = schedule.hash_id or None
    return min(next_slot(cron, schedule.timezone, moment, hash_id)
               for cron in schedule.crons).timestamp()


def upcoming(schedule: Schedule, after: datetime, count: int,
             until: datetime | None = None) -> list[datetime]:
    """The next ``count`` slots of ``schedule`` after ``after`` (aware UTC
    datetimes), none after ``until`` (`next`, `plan`)."""
    slots: list[datetime] = []
    moment = after.timestamp()
    end = None if until is None else until.timestamp()
    for _ in range(count):
        moment = next_slot_at(schedule, moment)
        if end is not None and moment > end:
            break
        slots.append(datetime.fromtimestamp(moment, UTC))
    return slots


def describe_next(cron: str, timezone: str, after: datetime, count: int) -> list[datetime]:
    """The next ``count`` slots of one expression after ``after`` (aware UTC datetimes)."""
    slots: list[datetime] = []
    for _ in range(count):
        after = next_slot(cron, timezone, after)
        slots.append(after)
    return slots


# --- matching: croniter ----------------------------------------------------------------


def _croniter(parsed: _Cron, expr: str, start: datetime) -> croniter:
    return croniter(
        expr,
        start,
        day_or=True,
        implement_cron_bug=True,  # Debian: a day field starting with `*` means "both"
        second_at_beginning=parsed.seconds,
        max_years_between_matches=_CYCLE_YEARS,
        hash_id=parsed.hash_id,
    )


def _first_match(parsed: _Cron, wall: datetime, inclusive: bool) -> datetime:
    """The first naive wall time matching ``parsed`` after ``wall`` (or at it)."""
    if inclusive and wall.microsecond == 0:
        wall -= timedelta(seconds=1)  # matches fall on whole seconds
    matches: list[datetime] = []
    for expr in parsed.exprs:
        try:
            match = _croniter(parsed, expr, wall).get_next(datetime)
        except (ValueError, OverflowError):  # croniter's "no date", or past the year 9999
            continue
        assert isinstance(match, datetime)
        matches.append(match)
    if not matches:
        raise _NoMatch(f"no match after {wall.isoformat()}")
    return min(matches)


# --- validation: dblockrun's policy ----------------------------------------------------


def _parse(expr: str, hash_id: str | None = None) -> _Cron:
    if not isinstance(expr, str):
        raise ValueError(f"a cron expression must be a string, not {type(expr).__name__}")
    if hash_id is not None and not _ANY_HASHED_OR_RANDOM.search(expr):
        hash_id = None  # one parse for every job that shares the expression
    return _parse_text(expr, hash_id)


@functools.lru_cache(maxsize=1024)
def _parse_text(expr: str, hash_id: str | None) -> _Cron:
    text = expr.strip()
    if not text:
        raise ValueError("empty cron expression")
    if text.startswith("@"):
        text = _macro(text)
    fields = text.split()
    if len(fields) not in (5, 6):
        raise ValueError(
            f"{len(fields)} fields; use 5 (minute hour day-of-month month day-of-week), "
            "6 with the seconds first, or a macro like @daily"
        )
    full = fields if len(fields) == 6 else ["0", *fields]
    specs = (_SECOND, _MINUTE, _HOUR, _DOM, _MONTH, _DOW)
    hashed = [False] * 6
    for i, (spec, field) in enumerate(zip(specs, full, strict=True)):
        if hash_id is not None and field.startswith("H"):
            full[i] = _hashed(spec, field)
            hashed[i] = True
        elif _HASHED_OR_RANDOM.search(field):
            raise ValueError(_unhashable(spec, field, hash_id is not None))
    second, minute, hour, dom_field, month, dow_field = full
    for i, spec, field in ((0, _SECOND, second), (1, _MINUTE, minute), (2, _HOUR, hour),
                           (4, _MONTH, month)):
        for item in field.split(",") if not hashed[i] else ():
            _check_item(spec, field, item)
    dom, dom_special = (dom_field, False) if hashed[3] else _day_of_month(dom_field)
    dow, dow_special = (dow_field, False) if hashed[5] else _day_of_week(dow_field)
    either = not (dom_field.startswith("*") or dow_field.startswith("*"))
    days = [(dom, "*"), ("*", dow)] if either and (dom_special or dow_special) else [(dom, dow)]
    times = full[6 - len(fields): 3]  # as written: 5 fields have no seconds
    parsed = _Cron(
        exprs=tuple(" ".join([*times, day, month, weekday]) for day, weekday in days),
        seconds=len(fields) == 6,
        wildcard=any(field.startswith(("*", "H/")) for field in times),
        hash_id=hash_id if any(hashed) else None,
    )
    # A day rule that never matches (31 February) adds nothing to the other one.
    live = tuple(e for e in parsed.exprs if _ever_matches(parsed, expr, e))
    if not live:
        raise ValueError(f"{expr.strip()!r} never matches a date")
    return _Cron(live, parsed.seconds, parsed.wildcard, parsed.hash_id)


def _unhashable(spec: _Spec, field: str, named: bool) -> str:
    """Why ``field``'s hashed or random value is refused."""
    if not named:
        return (f"{spec.name} field {field!r}: hashed (H) and random (R) values are not "
                "supported; every host must compute the same slots")
    if re.search(r"(?:^|[,/-])[rR](?:$|[,/(-])", field):
        return (f"{spec.name} field {field!r}: random (R) values are not supported; "
                "every host must compute the same slots (H spreads jobs by their names)")
    return (f"bad {spec.name} field {field!r}: a hashed value is H, H/n, H(a-b) or "
            "H(a-b)/n (a capital H), the field's only item")


def _hashed(spec: _Spec, field: str) -> str:
    """A hashed field (``H``, ``H/n``, ``H(a-b)``, ``H(a-b)/n``) checked, as
    croniter reads it: Jenkins' ranges for the day fields made explicit."""
    match = _HASHED.fullmatch(field)
    if match is None:
        raise ValueError(_unhashable(spec, field, True))
    first, last, step = match.groups()
    # Jenkins: day-of-month 1-28 (in every month), day-of-week 0-6 (7 is 0 again).
    low, high = (spec.low, 28) if spec is _DOM else (spec.low, spec.star_high)
    if first is not None and last is not None:
        low, high = _number(spec, field, first), _number(spec, field, last)
        if low >= high:
            raise spec.bad(field, f"in H({first}-{last}) the range must run upwards")
        if high > spec.star_high:  # day-of-week 7: Sunday is 0 here
            raise spec.bad(field, f"in H(a-b) the range is {spec.low}-{spec.star_high}")
    if step is not None and not (len(step) < 10 and 1 <= int(step) <= high - low + 1):
        raise spec.bad(field, f"the step must be 1-{high - low + 1}")
    written = f"H({low}-{high})" if (first is not None or spec in (_DOM, _DOW)) else "H"
    return written + (f"/{step}" if step is not None else "")


def _ever_matches(parsed: _Cron, original: str, expr: str) -> bool:
    try:
        _croniter(parsed, expr, _FOREVER_START).get_next(datetime)
    except CroniterBadDateError:
        return False
    except ValueError as exc:  # croniter refuses what dblockrun let through
        raise ValueError(f"{original.strip()!r}: {exc}") from exc
    return True


def _macro(text: str) -> str:
    if text in MACROS:
        return MACROS[text]
    if text.lower() == "@reboot":
        raise ValueError(
            "@reboot is not supported: a fleet has no single boot (use a cron expression or rate)"
        )
    if text.lower() in MACROS:
        raise ValueError(
            f"unknown macro {text!r} (macros are lower case, as in cron: {text.lower()})"
        )
    every, _, interval = text.partition(" ")
    if every.lower() == "@every":  # robfig/cron's (Go: dkron, supercronic)
        rate = interval.strip() or "5m (a duration)"
        raise ValueError(f"{text!r} is not cron: for a fixed interval write `rate: {rate}` "
                         "instead of `cron:`")
    raise ValueError(f"unknown macro {text!r} (use {', '.join(MACROS)})")


def _day_of_month(field: str) -> tuple[str, bool]:
    """``field`` as croniter writes it, and whether it holds a W (see module doc)."""
    items = field.split(",")
    written: list[str] = []
    nearest = False
    for item in items:
        match = _NEAREST.fullmatch(item)
        if item.upper() == "LW" or match:
            if match:
                day = _number(_DOM, field, match.group(1))
                if day > 28:
                    raise _DOM.bad(
                        field,
                        f"in {item}, n of nW must be 1-28: some months have no day {day} "
                        "(LW is the last weekday)",
                    )
            if len(items) > 1:
                raise _DOM.bad(field, f"{item} must be the field's only item")
            nearest = True
            written.append(item if match else "31W")  # croniter: day 31 or the month's last
        elif item.upper() == "L":
            written.append(item)
        else:
            _check_item(_DOM, field, item)
            written.append(item)
    return ",".join(written), nearest


def _day_of_week(field: str) -> tuple[str, bool]:
    """``field`` as croniter writes it, and whether it holds n#k or nL."""
    written: list[str] = []
    plain = nth = False
    for item in field.split(","):
        day, hash_, k = item.partition("#")
        if hash_:
            if not (k.isdigit() and 1 <= int(k) <= 5):
                raise _DOW.bad(field, f"in {item}, k of n#k must be 1-5")
            written.append(f"{_number(_DOW, field, day) % 7}#{int(k)}")
            nth = True
        elif len(item) > 1 and item[-1] in "lL":
            written.append(f"L{_number(_DOW, field, item[:-1]) % 7}")  # croniter's order
            nth = True
        else:
            _check_item(_DOW, field, item)
            written.append(item)
            plain = True
    if nth and plain:
        raise _DOW.bad(field, "n#k and nL cannot share the field with plain days")
    return ",".join(written), nth


def _check_item(spec: _Spec, field: str, item: str) -> None:
    if item == "?":
        raise spec.bad(field, "'?' is Quartz's, not cron's: write *")
    match = _RANGE.fullmatch(item)
    if match is None:
        raise spec.bad(field)
    first, last, step = match.groups()
    if first == "*":
        if last is not None:
            raise spec.bad(field)
    else:
        low = _number(spec, field, first)
        if last is None:
            if step is not None:
                raise spec.bad(
                    field, f"a step follows * or a range (write {first}-{spec.star_high}/{step})"
                )
            return
        high = _number(spec, field, last)
        if low > high:
            raise spec.bad(field, _backwards(spec, item, low, high, step))
    size = spec.star_high - spec.low + 1
    if step is not None and not (len(step) < 10 and 1 <= int(step) <= size):
        raise spec.bad(field, f"the step must be 1-{size}")


def _backwards(spec: _Spec, item: str, low: int, high: int, step: str | None) -> str:
    why = f"{item} runs backwards; cron accepts it and never runs it"
    if step is not None:
        return f"{why} (write it as two ranges)"
    if low > spec.star_high:  # day-of-week 7-n: Sunday is 0 too
        return f"{why} (write {spec.low}-{high})"
    head = f"{low}" if low == spec.star_high else f"{low}-{spec.star_high}"
    tail = f"{spec.low}" if high == spec.low else f"{spec.low}-{high}"
    return f"{why} (write {head},{tail})"


def _number(spec: _Spec, field: str, text: str) -> int:
    lowered = text.lower()
    if lowered in spec.names:
        return spec.low + spec.names.index(lowered)
    if not text.isdigit() or len(text) > 9 or not spec.low <= int(text) <= spec.high:
        raise spec.bad(field)
    return int(text)


# --- time zones --------------------------------------------------------------------------


def zone(name: str) -> ZoneInfo:
    """The time zone ``name`` (remembered); raises ValueError if unknown."""
    return _zone(name)


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
        import difflib  # here: a mistake's hint only (a daemon keeps what it imports)

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
