"""Database-clock times and durations as people and records read them: the
one home of their wording, for the CLI's tables (ops/output.py) and the
dashboard's pages (web/timehtml.py) alike.

``ago(90)`` is ``1m30s``; ``relative(ts, now)`` is ``in 9.0s`` or ``3m ago``;
``took(0.024)`` is ``0.02s``; ``stamp(ts)`` is ``2026-11-22 21:53:17Z``;
``short(ts, now)`` is ``21:53:17Z (in 5.0s)``.
"""

from __future__ import annotations

import functools
import math
import time
from datetime import UTC, datetime

from dblockrun.durations import FOREVER, format_duration


def utc(ts: float) -> str:
    """Epoch seconds as ISO 8601 in UTC (``2026-11-25T10:00:00+00:00``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat()


def zoned(ts: float, timezone: str) -> str:
    """Epoch seconds as ISO 8601 in ``timezone`` (``2026-12-24T06:00:00+01:00``):
    a job's slot as `next` shows it."""
    from zoneinfo import ZoneInfo

    return datetime.fromtimestamp(ts, ZoneInfo(timezone)).isoformat()


def clock(ts: float, with_date: bool = False) -> str:
    """``14:05Z`` (``2026-11-28 14:05Z``): a time axis' label, in UTC."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ" if with_date else "%H:%MZ")


def second(ts: float) -> str:
    """``14:05:09Z``: a time of day to the second, in UTC (the timeline's
    10,000 bars share their seconds: cached)."""
    return _second(int(ts))


@functools.lru_cache(maxsize=8192)
def _second(whole: int) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(whole))


def parse_time(text: str, what: str = "--until", zone: str | None = None) -> float:
    """An ISO 8601 time (``2026-12-01T06:00:00Z``; without a zone, this
    host's, or the time zone ``zone``: a job's, for ``backfill``) as epoch
    seconds: ``disable --until``, and the dashboard's."""
    from dblockrun.errors import UsageError

    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"{what}: {text!r} is not an ISO 8601 time "
                         "(e.g. 2026-12-01T06:00:00Z)") from exc
    if dt.tzinfo is None:
        if zone is None:
            dt = dt.astimezone()
        else:
            from zoneinfo import ZoneInfo

            dt = dt.replace(tzinfo=ZoneInfo(zone))
    return dt.timestamp()


def ago(seconds: float) -> str:
    """A span of time: ``9.0s`` under a minute, else whole seconds
    (``3m``, ``1h30m``, ``2d4h``)."""
    return f"{seconds:.1f}s" if seconds < 60 else _whole(round(seconds))


@functools.lru_cache(maxsize=4096)
def _whole(seconds: int) -> str:
    """format_duration of whole seconds: 10,000 jobs share a few hundred."""
    return format_duration(seconds)


def relative(ts: float | None, now: float) -> str:
    """``in 5m``, ``2d ago`` (``-``: no time; ``never``: forever)."""
    if ts is None:
        return "-"
    if ts >= FOREVER:
        return "never"
    delta = ts - now
    return f"in {ago(delta)}" if delta >= 0 else f"{ago(-delta)} ago"


def took(seconds: float | None) -> str:
    """A run's duration: ``0.02s``, ``12.50s``, ``1m30s`` (``-``: not known)."""
    if seconds is None:
        return "-"
    return f"{seconds:.2f}s" if abs(seconds) < 60 else format_duration(round(seconds))


def when(ts: float) -> datetime | None:
    """``ts`` as a UTC datetime; None for a timestamp edited into nonsense."""
    try:
        return datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def stamp(ts: float | None) -> str:
    """``2026-11-22 21:53:17Z``: an exact time (history's; the pages' hover)."""
    if ts is None:
        return "-"
    at = when(ts) if ts < FOREVER else None
    return repr(ts) if at is None else at.strftime("%Y-%m-%d %H:%M:%SZ")


def short(ts: float | None, now: float) -> str:
    """``21:53:17Z (in 5.0s)``, ``2026-11-23 06:00Z (in 8h6m)``."""
    if ts is None:
        return "-"
    if ts >= FOREVER:
        return "until enabled"
    at = when(ts)
    if at is None:
        return repr(ts)
    delta = ts - now
    fmt = "%H:%M:%SZ" if abs(delta) < 86400 else "%Y-%m-%d %H:%MZ"
    rel = ago(abs(delta))
    return f"{at.strftime(fmt)} ({'in ' + rel if delta >= 0 else rel + ' ago'})"


def iso(ts: float | None) -> str | None:
    """``2026-11-22T21:53:17.123Z`` (what ``datetime.isoformat`` gives, at a
    third of its cost: ``status --json`` writes 30,000 for 10,000 jobs)."""
    if ts is None:
        return None
    if ts >= FOREVER:
        return "forever"
    try:
        whole = math.floor(ts)
        micros = round((ts - whole) * 1_000_000)  # as datetime rounds, then cuts to ms
        if micros == 1_000_000:
            whole, micros = whole + 1, 0
        return f"{_iso_second(whole)}.{micros // 1000:03d}Z"
    except (OverflowError, OSError, ValueError):  # a timestamp edited into nonsense
        return repr(ts)


@functools.lru_cache(maxsize=4096)
def _iso_second(whole: int) -> str:
    t = time.gmtime(whole)
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}"
            f"T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}")
