"""Database-clock times as people and records read them."""

from __future__ import annotations

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
