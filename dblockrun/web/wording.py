"""Times and durations as the pages word them: timetext's wording (the
CLI's: ``3m ago``, ``in 5.0s``, ``2m5s``), the exact UTC time on hover."""

from __future__ import annotations

from markupsafe import Markup

from dblockrun import timetext


def when(ts: float | None, now: float) -> Markup:
    """``<time datetime=... title=...>3m ago</time>``; ``-`` for no time."""
    if ts is None:
        return Markup("-")
    exact = timetext.utc(ts)
    return Markup('<time datetime="{0}" title="{0}">{1}</time>').format(
        exact, timetext.relative(ts, now))


def took(seconds: float | None) -> str:
    """A duration with its unit (``0.4s``, ``2m5s``); ``-`` for none."""
    return "-" if seconds is None else timetext.took(seconds)


FILTERS = {"when": when, "took": took}
