"""Cron expressions, parsed and matched the way Debian's cron reads them.

:func:`parse_cron` reads 5 fields (minute hour day-of-month month day-of-week),
6 with a seconds field *first*, or a macro; :meth:`CronExpr.first_from` finds
the first naive wall time that matches. Time zones and daylight saving are
:mod:`dblockrun.schedule`'s business.

Debian's rules:

* a field counts as ``*`` only when it *starts* with ``*`` (``*/2`` does,
  ``1,*/12`` does not);
* when day-of-month or day-of-week starts with ``*``, a day must match both;
  when both are restricted, a day matches if either does;
* a step follows ``*`` or a range (``5/10`` is rejected, as cron does);
  ``0`` and ``7`` are Sunday; names (``jan``, ``mon``) in any case; macros in
  lower case.

Rejected although cron accepts them: a range that runs backwards (``22-2``,
``MON-SUN``: cron never runs such a line) and a step wider than its field.
Extensions (not in Debian's cron): the seconds field, and ``L``, ``LW``,
``nW`` in day-of-month, ``n#k`` and ``nL`` in day-of-week; they are list items
like any other, so ``1,L`` is the first and the last day.
"""

from __future__ import annotations

import calendar
import re
from bisect import bisect_left
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}

# The calendar (leap years and weekdays) repeats every 400 years.
_CYCLE_YEARS = 400
_HASHED_OR_RANDOM = re.compile(r"(?:^|[,/-])[hHrR](?:$|[,/(-])")
_RANGE = re.compile(r"(\*|[0-9a-z]+)(?:-([0-9a-z]+))?(?:/([0-9]+))?", re.IGNORECASE)


class NoMatch(ValueError):
    """No wall time matches before the calendar's end (or ever)."""


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


_MONTHS = tuple(calendar.month_abbr[1:])
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
SECOND = _Spec("second", 0, 59, 59, "0-59")
MINUTE = _Spec("minute", 0, 59, 59, "0-59")
HOUR = _Spec("hour", 0, 23, 23, "0-23")
DOM = _Spec("day-of-month", 1, 31, 31, "1-31, L, LW, nW")
MONTH = _Spec("month", 1, 12, 12, "1-12 or jan-dec", tuple(m.lower() for m in _MONTHS))
DOW = _Spec("day-of-week", 0, 7, 6, "0-7 or sun-sat, n#k, nL", _DAYS)


@dataclass(frozen=True)
class _Days:
    """Which days match: day-of-month items, day-of-week items, and how they combine."""

    both: bool  # Debian: either field starts with `*`, so a day must match both
    dom: frozenset[int]
    last: bool = False  # L
    last_weekday: bool = False  # LW
    nearest: frozenset[int] = frozenset()  # nW
    dow: frozenset[int] = frozenset()  # 0 (Sunday) - 6
    nth: frozenset[tuple[int, int]] = frozenset()  # n#k: (weekday, k)
    last_dow: frozenset[int] = frozenset()  # nL

    def match(self, day: date) -> bool:
        dom, dow = self._dom(day), self._dow(day)
        return (dom and dow) if self.both else (dom or dow)

    def _dom(self, day: date) -> bool:
        if day.day in self.dom:
            return True
        if not (self.last or self.last_weekday or self.nearest):
            return False
        length = calendar.monthrange(day.year, day.month)[1]
        if self.last and day.day == length:
            return True
        if self.last_weekday and day.day == _nearest_weekday(day, length, length):
            return True
        return any(day.day == _nearest_weekday(day, n, length) for n in self.nearest)

    def _dow(self, day: date) -> bool:
        weekday = (day.weekday() + 1) % 7  # cron's: Sunday is 0
        if weekday in self.dow:
            return True
        if (weekday, (day.day - 1) // 7 + 1) in self.nth:
            return True
        if weekday in self.last_dow:
            return day.day + 7 > calendar.monthrange(day.year, day.month)[1]
        return False


def _nearest_weekday(day: date, n: int, length: int) -> int:
    """The weekday (Monday-Friday) nearest day ``n`` of ``day``'s month, in that month."""
    if n > length:
        return 0  # no day n this month: nothing matches
    weekday = day.replace(day=n).weekday()
    if weekday == 5:  # Saturday: the Friday before, or Monday the 3rd
        return n - 1 if n > 1 else n + 2
    if weekday == 6:  # Sunday: the Monday after, or the Friday before at the month's end
        return n + 1 if n < length else n - 2
    return n


@dataclass(frozen=True)
class CronExpr:
    """A parsed cron expression; values are sorted tuples."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    months: frozenset[int]
    days: _Days
    wildcard: bool  # seconds, minute or hour starts with `*` (Debian's DST rule)

    def first_from(self, wall: datetime) -> datetime:
        """The first matching naive wall time at or after ``wall`` (a whole second)."""
        day, start = wall.date(), wall.time()
        end = day.year + _CYCLE_YEARS
        try:
            while day.year <= end:
                if day.month not in self.months:
                    day, start = self._next_month(day), time()
                    continue
                if self.days.match(day):
                    found = self._time_from(start)
                    if found is not None:
                        return datetime.combine(day, found)
                day, start = day + timedelta(days=1), time()
        except (OverflowError, ValueError):  # past the year 9999
            raise NoMatch(f"no match from {wall.isoformat()} to the year 9999") from None
        raise NoMatch(f"no match in the {_CYCLE_YEARS} years from {wall.isoformat()}")

    def _next_month(self, day: date) -> date:
        later = [month for month in self.months if month > day.month]
        if later:
            return date(day.year, min(later), 1)
        return date(day.year + 1, min(self.months), 1)

    def _time_from(self, start: time) -> time | None:
        for hour in self.hours[bisect_left(self.hours, start.hour) :]:
            if hour > start.hour:
                return time(hour, self.minutes[0], self.seconds[0])
            for minute in self.minutes[bisect_left(self.minutes, start.minute) :]:
                if minute > start.minute:
                    return time(hour, minute, self.seconds[0])
                index = bisect_left(self.seconds, start.second)
                if index < len(self.seconds):
                    return time(hour, minute, self.seconds[index])
        return None


def parse_cron(text: str) -> CronExpr:
    """Parse ``text``; :class:`ValueError` says why it is not a cron expression."""
    text = text.strip()
    if not text:
        raise ValueError("empty cron expression")
    if text.startswith("@"):
        text = _macro(text)
    fields = text.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    elif len(fields) != 6:
        raise ValueError(
            f"{len(fields)} fields; use 5 (minute hour day-of-month month day-of-week), "
            "6 with the seconds first, or a macro like @daily"
        )
    for spec, field in zip((SECOND, MINUTE, HOUR, DOM, MONTH, DOW), fields, strict=True):
        if _HASHED_OR_RANDOM.search(field):
            raise ValueError(
                f"{spec.name} field {field!r}: hashed (H) and random (R) values are not "
                "supported; every host must compute the same slots"
            )
    second, minute, hour, dom, month, dow = fields
    return CronExpr(
        seconds=tuple(sorted(_values(SECOND, second))),
        minutes=tuple(sorted(_values(MINUTE, minute))),
        hours=tuple(sorted(_values(HOUR, hour))),
        months=frozenset(_values(MONTH, month)),
        days=_days(dom, dow),
        wildcard=any(field.startswith("*") for field in (second, minute, hour)),
    )


def _macro(text: str) -> str:
    if text in MACROS:
        return MACROS[text]
    if text.lower() == "@reboot":
        raise ValueError(
            "@reboot is not supported: a fleet has no single boot (use a cron expression or rate)"
        )
    if text.lower() in MACROS:
        raise ValueError(f"unknown macro {text!r} (macros are lower case, as in cron: "
                         f"{text.lower()})")
    raise ValueError(f"unknown macro {text!r} (use {', '.join(MACROS)})")


def _values(spec: _Spec, field: str) -> set[int]:
    values: set[int] = set()
    for item in field.split(","):
        values |= _item(spec, field, item)
    return values


def _item(spec: _Spec, field: str, item: str) -> set[int]:
    if item == "?":
        raise spec.bad(field, "'?' is Quartz's, not cron's: write *")
    match = _RANGE.fullmatch(item)
    if match is None:
        raise spec.bad(field)
    first, last, step = match.groups()
    if first == "*":
        if last is not None:
            raise spec.bad(field)
        low, high = spec.low, spec.star_high
    else:
        low = _number(spec, field, first)
        if last is None:
            if step is not None:
                raise spec.bad(field, f"a step follows * or a range (write {first}-"
                                      f"{spec.star_high}/{step})")
            return {low}
        high = _number(spec, field, last)
        if low > high:
            raise spec.bad(field, _backwards(spec, item, low, high, step))
    size = spec.star_high - spec.low + 1
    every = 1 if step is None else int(step) if len(step) < 10 else size + 1
    if not 1 <= every <= size:
        raise spec.bad(field, f"the step must be 1-{size}")
    return set(range(low, high + 1, every))


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


def _days(dom_field: str, dow_field: str) -> _Days:
    dom: set[int] = set()
    last = last_weekday = False
    nearest: set[int] = set()
    for item in dom_field.split(","):
        upper = item.upper()
        if upper == "L":
            last = True
        elif upper == "LW":
            last_weekday = True
        elif upper.endswith("W") and item[:-1].isdigit():
            nearest.add(_number(DOM, dom_field, item[:-1]))
        else:
            dom |= _item(DOM, dom_field, item)
    dow: set[int] = set()
    nth: set[tuple[int, int]] = set()
    last_dow: set[int] = set()
    for item in dow_field.split(","):
        day, hash_, k = item.partition("#")
        if hash_:
            if not (k.isdigit() and 1 <= int(k) <= 5):
                raise DOW.bad(dow_field, f"in {item}, k of n#k must be 1-5")
            nth.add((_number(DOW, dow_field, day) % 7, int(k)))
        elif len(item) > 1 and item[-1] in "lL":
            last_dow.add(_number(DOW, dow_field, item[:-1]) % 7)
        else:
            dow |= {value % 7 for value in _item(DOW, dow_field, item)}
    return _Days(
        both=dom_field.startswith("*") or dow_field.startswith("*"),
        dom=frozenset(dom),
        last=last,
        last_weekday=last_weekday,
        nearest=frozenset(nearest),
        dow=frozenset(dow),
        nth=frozenset(nth),
        last_dow=frozenset(last_dow),
    )
