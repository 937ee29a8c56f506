"""Times and durations on the dashboard's pages: worded by timetext (as the
CLI words them), in a ``<time>`` element whose ``title`` is the exact UTC
time (shown on hover) and whose ``datetime`` a program can read."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from markupsafe import Markup, escape

from dblockrun.timetext import ago, relative, stamp, took


def epoch(value: float | str | None) -> float | None:
    """Epoch seconds of a time as the status documents write it
    (``2026-11-22T21:53:17.123Z``), or as given; None if none or unreadable."""
    if value is None or isinstance(value, (int, float)):
        return value
    if value == "forever":
        from dblockrun.store import FOREVER

        return FOREVER
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def when(value: float | str | None, now: float | str | None) -> Markup:
    """``<time datetime="..." title="2026-11-22 21:53:17 UTC">3m ago</time>``
    (``-`` when there is no time)."""
    return _time(value, now, relative)


def left(value: float | str | None, now: float | str | None) -> Markup:
    """How long until ``value``, as the CLI's narrow table says a disable's
    end (``for 2h``: this is the ``2h``), in the same ``<time>``."""
    return _time(value, now, lambda ts, at: ago(max(0.0, ts - at)))


def _time(value: float | str | None, now: float | str | None,
          words: Callable[[float, float], str]) -> Markup:
    ts, at = epoch(value), epoch(now)
    if ts is None or at is None:
        return Markup("-") if value is None else escape(str(value))
    exact = stamp(ts)
    iso = exact.replace(" ", "T") if exact[:1].isdigit() else exact
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        iso, exact.replace("Z", " UTC"), words(ts, at))


def duration(seconds: float | None) -> str:
    """A run's duration with its unit (``0.02s``, ``1m30s``; ``-``)."""
    return took(seconds)
