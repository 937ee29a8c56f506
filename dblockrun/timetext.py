"""Database-clock times as people and records read them."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(ts: float) -> str:
    """Epoch seconds as ISO 8601 in UTC (``2026-11-25T10:00:00+00:00``)."""
    return datetime.fromtimestamp(ts, UTC).isoformat()
