"""Database-clock times as people and records read them."""

from __future__ import annotations

import functools
import time
from datetime import UTC, datetime


def utc(ts: float) -> str:
    """Epoch seconds as ISO 8601 in UTC (``2026-11-25T10:00:00+00:00``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat()


def parse_time(text: str, what: str = "--until") -> float:
    """An ISO 8601 time (``2026-12-01T06:00:00Z``; without a zone, this
    host's) as epoch seconds: ``disable --until``, and the dashboard's."""
    from dblockrun.errors import UsageError

    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"{what}: {text!r} is not an ISO 8601 time "
                         "(e.g. 2026-12-01T06:00:00Z)") from exc
    if dt.tzinfo is None:
        dt = dt.astimezone()
    return dt.timestamp()


def took(seconds: float) -> str:
    """A duration as the CLI words it: ``0.4s``, ``12.0s`` under a minute,
    then whole seconds (``2m5s``, ``1h30m``)."""
    if seconds < 60:
        return f"{max(seconds, 0.0):.1f}s"
    return _whole(round(seconds))


@functools.lru_cache(maxsize=4096)
def _whole(seconds: int) -> str:
    """format_duration of whole seconds (a page of 10,000 runs shares a few hundred)."""
    from dblockrun.config.durations import format_duration

    return format_duration(seconds)


@functools.lru_cache(maxsize=8192)
def _second(whole: int) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(whole))


def second(ts: float) -> str:
    """``14:05:09Z``: a time of day to the second, in UTC."""
    return _second(int(ts))


def relative(ts: float, now: float) -> str:
    """``ts`` from ``now`` as the CLI words it: ``in 5.0s``, ``3m ago``."""
    delta = ts - now
    return f"in {took(delta)}" if delta >= 0 else f"{took(-delta)} ago"


def clock(ts: float, with_date: bool = False) -> str:
    """``14:05Z`` (``2026-11-28 14:05Z``): a time axis' label, in UTC."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ" if with_date else "%H:%MZ")
