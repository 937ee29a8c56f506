"""Calendars, blackout windows and the active range: which slots of a job
are excluded, and why. Pure, like dblockrun/scheduling/cron.py: every time
is epoch seconds, passed in; nothing here reads the database.

A job's slot is excluded (recorded ``skipped`` with the reason, never run:
dblockrun/scheduling/planner.py) when, in the job's time zone,

* its day is before ``active: {from: ...}`` (``not active until DAY``) or
  after ``until`` (``not active after DAY``);
* its day is a day of a calendar the job names in ``exclude:``
  (``calendar NAME``);
* it falls in a ``blackout:`` window (``blackout sat 22:00/6h``): from the
  window's start (a wall time) for its length (elapsed time, as every
  duration of the jobs file: ``sat 22:00/6h`` ends at 03:00 on the night
  the clocks go back). A start that a spring-forward gap skips is read as
  iCalendar (RFC 5545) reads such a time: moved on by the gap (02:30 is
  03:30).

The checks come in that order; the first that holds gives the reason.

Also here, for the loader (dblockrun/config/load.py): the text of a
window (:func:`parse_window`) and an iCalendar file's all-day events
(:func:`read_ics`; the ``icalendar`` package is imported only then).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from dblockrun.durations import parse_duration
from dblockrun.jobs import Job, Window
from dblockrun.scheduling.cron import next_slot_at, zone

#: Weekday names a window may start with (three letters or whole, any case).
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_NAMES = {name: i for i, name in enumerate(WEEKDAYS)} | {
    full: i for i, full in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday",
                                      "saturday", "sunday"))}
#: A weekly window lasts at most a week (a longer one would cover every slot).
WEEK = 7 * 86400.0
#: How far :func:`next_real_slot` looks (seconds past ``after``) ...
HORIZON = 10 * 366 * 86400.0
#: ... and over at most this many exclusions.
MAX_JUMPS = 5000

_WINDOW = re.compile(r"(?:(?P<day>[A-Za-z]+)|(?P<date>\d{4}-\d{2}-\d{2}))\s+"
                     r"(?P<hour>\d{1,2}):(?P<minute>\d{2})(?::(?P<second>\d{2}))?"
                     r"\s*/\s*(?P<length>\S+)")


#: How the reason of an excluded slot begins (:func:`excluded`).
REASONS = ("calendar ", "blackout ", "not active ")


def excluded_record(output: str | None) -> bool:
    """Whether a record's stored output says its slot was excluded (a
    calendar's day, a blackout window, outside the active range): what
    the file asks for, which ``status --check`` does not page about."""
    return (output or "").startswith(tuple(f"skipped: {reason}" for reason in REASONS))


@dataclass(frozen=True)
class Exclusion:
    """Why a slot is excluded, and the first instant that reason no longer
    holds (None: never again, past ``active: {until: ...}``)."""

    reason: str
    until: float | None


def excluded(job: Job, slot: float) -> Exclusion | None:
    """Why ``slot`` of ``job`` has no run (None: it is a real slot)."""
    if not job.calendared:
        return None
    day = datetime.fromtimestamp(slot, zone(job.timezone)).date()
    active = job.active
    if active is not None:
        if active.first is not None and day < active.first:
            return Exclusion(f"not active until {active.first}", _instant(job, active.first, 0))
        if active.last is not None and day > active.last:
            return Exclusion(f"not active after {active.last}", None)
    for calendar in job.exclude:
        if day in calendar.days:
            return Exclusion(f"calendar {calendar.name}",
                             _instant(job, day + timedelta(days=1), 0))
    for window in job.blackout:
        end = _window_end(job, window, day, slot)
        if end is not None:
            return Exclusion(f"blackout {window.text}", end)
    return None


def _instant(job: Job, day: date, seconds: int) -> float:
    """The instant of wall time ``seconds`` after midnight of ``day`` in the
    job's zone (a time skipped by a gap: moved on by the gap, RFC 5545)."""
    wall = datetime(day.year, day.month, day.day, tzinfo=zone(job.timezone))
    return (wall + timedelta(seconds=seconds)).timestamp()


def _window_end(job: Job, window: Window, day: date, slot: float) -> float | None:
    """The end of the occurrence of ``window`` that holds ``slot`` (on the
    local ``day``), None if none does."""
    if window.day is not None:
        starts = [window.day]
    else:
        # The occurrences that may still last on `day`: those that began at most
        # the window's length (a week at most) before it.
        back = int((window.start + window.length) // 86400) + 1
        starts = [d for d in (day - timedelta(days=n) for n in range(back + 1))
                  if d.weekday() == window.weekday]
    for start_day in starts:
        start = _instant(job, start_day, window.start)
        if start <= slot < start + window.length:
            return start + window.length
    return None


def next_real_slot(job: Job, after: float) -> float | None:
    """The job's first slot after ``after`` that is not excluded (None:
    none within :data:`HORIZON`, or none ever: the active range is over).
    Jumps over each exclusion to its end, so a job every second in a
    six-hour blackout costs no more than one due daily."""
    slot = next_slot_at(job.schedule, after)
    if not job.calendared:
        return slot
    for _ in range(MAX_JUMPS):
        exclusion = excluded(job, slot)
        if exclusion is None:
            return slot
        if exclusion.until is None or slot > after + HORIZON:
            return None
        slot = next_slot_at(job.schedule, max(slot, exclusion.until - 0.001))
    return None


@dataclass(frozen=True)
class Upcoming:
    """A slot `next` shows: a real one (``reason`` None), or an excluded one
    with its reason; ``through``: the exclusion also takes every slot after
    it before then (None: just this one; ``math.inf``: every later slot)."""

    slot: float
    reason: str | None = None
    through: float | None = None


def upcoming(job: Job, after: float, count: int, *, shown: int = 20) -> list[Upcoming]:
    """The job's next ``count`` real slots after ``after`` and, in order
    among them, the excluded ones (at most ``shown`` entries; the slots of
    one exclusion as one entry)."""
    out: list[Upcoming] = []
    real = skipped = 0
    slot = next_slot_at(job.schedule, after)
    while real < count and skipped < shown and slot <= after + HORIZON:
        exclusion = excluded(job, slot)
        if exclusion is None:
            out.append(Upcoming(slot))
            real += 1
            slot = next_slot_at(job.schedule, slot)
            continue
        skipped += 1
        if exclusion.until is None:
            out.append(Upcoming(slot, exclusion.reason, math.inf))
            break
        following = next_slot_at(job.schedule, slot)
        if following < exclusion.until:  # more slots in it: one entry for them all
            out.append(Upcoming(slot, exclusion.reason, exclusion.until))
            slot = next_slot_at(job.schedule, exclusion.until - 0.001)
        else:
            out.append(Upcoming(slot, exclusion.reason))
            slot = following
    return out


# -- the loader's parts ---------------------------------------------------------------


def parse_window(text: str) -> Window:
    """A blackout window's text: ``sat 22:00/6h`` (weekly) or ``2026-12-31
    18:00/12h`` (dated); raises ValueError saying what is wrong."""
    shown = " ".join(text.split())
    match = _WINDOW.fullmatch(shown)
    if match is None:
        raise ValueError(f"{text!r} is not a window: write DAY HH:MM/DURATION (sat 22:00/6h) "
                         "or YYYY-MM-DD HH:MM/DURATION (2026-12-31 18:00/12h)")
    hour, minute = int(match["hour"]), int(match["minute"])
    second = int(match["second"] or 0)
    if hour > 23 or minute > 59 or second > 59:
        raise ValueError(f"{text!r}: {match['hour']}:{match['minute']} is not a time of day "
                         "(00:00 to 23:59)")
    try:
        length = parse_duration(match["length"])
    except ValueError as exc:
        raise ValueError(f"{text!r}: {exc}") from None
    if length <= 0:
        raise ValueError(f"{text!r}: the window must last more than zero")
    start = hour * 3600 + minute * 60 + second
    if match["date"] is not None:
        try:
            day = date.fromisoformat(match["date"])
        except ValueError as exc:
            raise ValueError(f"{text!r}: {match['date']} is not a date ({exc})") from None
        return Window(shown, start, length, day=day)
    weekday = _DAY_NAMES.get(match["day"].lower())
    if weekday is None:
        raise ValueError(f"{text!r}: {match['day']!r} is not a day: use mon, tue, wed, thu, "
                         "fri, sat or sun")
    if length > WEEK:
        raise ValueError(f"{text!r}: a weekly window lasts at most 7d (longer, it would cover "
                         "every slot)")
    return Window(shown, start, length, weekday=weekday)


def read_ics(text: str | bytes) -> frozenset[date]:
    """The days of an iCalendar file's all-day events (``DTSTART;VALUE=DATE``,
    to ``DTEND``, exclusive, or for ``DURATION``, or the one day; a yearly
    or other ``RRULE`` expanded, ``EXDATE`` left out, within
    :data:`HORIZON` of its start); cancelled events left out. Raises
    ValueError saying what is wrong (not iCalendar, an event with a time)."""
    import icalendar  # here: only a jobs file that names a calendar file pays for it

    try:
        calendars = icalendar.Calendar.from_ical(text, multiple=True)
    except ValueError as exc:
        raise ValueError(f"not an iCalendar file ({exc})") from None
    except Exception as exc:  # noqa: BLE001 (any text: its parser's other errors too)
        raise ValueError(f"not an iCalendar file ({type(exc).__name__}: {exc})") from None
    days: set[date] = set()
    for calendar in calendars:
        for event in calendar.walk("VEVENT"):
            if str(event.get("STATUS", "")).upper() == "CANCELLED":
                continue
            days.update(_event_days(event))
    return frozenset(days)


def _event_days(event: object) -> set[date]:
    import icalendar

    assert isinstance(event, icalendar.Event)
    summary = str(event.get("SUMMARY", "")) or "an event"
    start = event.get("DTSTART")
    if start is None:
        raise ValueError(f"{summary!r} has no DTSTART")
    first = start.dt
    if isinstance(first, datetime) or not isinstance(first, date):
        raise ValueError(f"{summary!r} starts at {first}: only all-day events exclude days "
                         "(DTSTART;VALUE=DATE)")
    end = event.get("DTEND")
    if end is not None:
        if isinstance(end.dt, datetime) or not isinstance(end.dt, date):
            raise ValueError(f"{summary!r} ends at {end.dt}: only all-day events exclude days")
        length = max((end.dt - first).days, 1)
    elif event.get("DURATION") is not None:
        length = max(event.get("DURATION").dt.days, 1)
    else:
        length = 1
    starts = [first]
    rule = event.get("RRULE")
    if rule is not None:
        from dateutil.rrule import rrulestr

        moment = datetime(first.year, first.month, first.day)
        horizon = moment + timedelta(seconds=HORIZON)
        try:
            recurring = rrulestr(rule.to_ical().decode(), dtstart=moment)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{summary!r}: RRULE {rule.to_ical().decode()!r}: {exc}") from None
        starts = [when.date() for when in recurring.between(moment, horizon, inc=True)]
        skipped = event.get("EXDATE")
        for entry in skipped if isinstance(skipped, list) else [skipped] if skipped else []:
            for value in entry.dts:
                day = value.dt.date() if isinstance(value.dt, datetime) else value.dt
                if day in starts:
                    starts.remove(day)
    return {day + timedelta(days=n) for day in starts for n in range(length)}
