"""A job's recent runs as bars (height: duration; colour: result), drawn
server-side as inline SVG: no script, no library."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dblockrun.store.models import RunRecord

WIDTH, HEIGHT = 600, 120
#: The least height of a bar, so a run of 0 s (or still running) shows.
FLOOR = 3
#: The widest bar (a job with few runs).
WIDEST = 24


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    result: str
    title: str


def bars(runs: Sequence[RunRecord]) -> list[Bar]:
    """``runs`` (newest first, as history gives them) oldest on the left."""
    shown = list(reversed(runs))
    if not shown:
        return []
    longest = max((r.duration or 0.0 for r in shown), default=0.0) or 1.0
    step = min(WIDTH / len(shown), WIDEST + 2)
    out = []
    for i, run in enumerate(shown):
        took = max(run.duration or 0.0, 0.0)
        height = max(FLOOR, (HEIGHT - FLOOR) * took / longest)
        took_text = "running" if run.duration is None else f"{took:.2f}s"
        out.append(Bar(x=round(i * step + 1, 1), y=round(HEIGHT - height, 1),
                       width=round(max(step - 2, 1), 1), height=round(height, 1),
                       result=run.result if run.result.isalpha() else "other",
                       title=f"run {run.id}: {run.result}, {took_text}"))
    return out
