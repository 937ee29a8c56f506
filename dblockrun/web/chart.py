"""A job's recent runs as a bar chart, drawn on the server as inline SVG (no
script, no library): one bar a run, oldest on the left; its height the
run's duration against a y axis in seconds, minutes or hours (timetext's
wording, as the CLI's); its colour and the mark above it its result, named
in the legend with each result's count; hovering it says the run's id,
result, duration and start, and a click opens the run. The x axis says when
the first and the last shown run started. Scales to the page's width (the
``viewBox``), down to a width its words stay readable at; on a narrower
screen (a phone) it scrolls sideways in its frame, the page does not."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from markupsafe import Markup, escape

from dblockrun import timetext
from dblockrun.store.models import OK, RunRecord

WIDTH, HEIGHT = 640, 190
#: The plot area inside the axes' labels.
LEFT, RIGHT, TOP, BOTTOM = 56, 8, 22, 150
#: The least height of a bar, so a run of 0 s shows.
FLOOR = 2
#: The widest bar (a job with few runs).
WIDEST = 24
#: Tick values of the y axis, in seconds: the first at least the longest run's
#: duration is the axis' top.
STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
         3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400)


def top_of(longest: float) -> float:
    """The y axis' top: the first of :data:`STEPS` at least ``longest``."""
    return next((s for s in STEPS if s >= longest), longest)


def result_class(result: str) -> str:
    """A result as a CSS class (results are words; anything else: ``other``)."""
    return result if result.isalpha() else "other"


def duration_chart(runs: Sequence[RunRecord], now: float) -> Markup:
    """The chart of ``runs`` (newest first, as history gives them); a
    running run's bar is its time so far. Empty: no run yet."""
    shown = list(reversed(runs))
    if not shown:
        return Markup("")
    took = [max(r.duration if r.duration is not None else
                (now - r.started if r.result == "running" else 0.0), 0.0) for r in shown]
    top = top_of(max(took))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, BOTTOM - TOP
    step = min(plot_w / len(shown), WIDEST + 2)
    out = [f'<div class="figure"><svg id="chart" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" '
           f'preserveAspectRatio="xMinYMin meet" role="img" aria-label="duration and result '
           f'of the last {len(shown)} runs">']
    # The y axis: 0, half and the top, with grid lines.
    for frac in (0.0, 0.5, 1.0):
        y = round(BOTTOM - plot_h * frac, 1)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y}" x2="{WIDTH - RIGHT}" y2="{y}"/>'
                   f'<text class="tick" x="{LEFT - 4}" y="{y + 4}" text-anchor="end">'
                   f'{escape(timetext.ago(top * frac))}</text>')
    out.append(f'<text class="axis" x="4" y="{TOP - 4}">duration</text>')
    out.append(f'<line class="axis-line" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{BOTTOM}"/>'
               f'<line class="axis-line" x1="{LEFT}" y1="{BOTTOM}" x2="{WIDTH - RIGHT}" '
               f'y2="{BOTTOM}"/>')
    for i, (run, seconds) in enumerate(zip(shown, took, strict=True)):
        height = max(FLOOR, plot_h * min(seconds, top) / top)
        x, width = round(LEFT + i * step + 1, 1), round(max(step - 2, 1), 1)
        y = round(BOTTOM - height, 1)
        cls = result_class(run.result)
        took_text = (f"{timetext.ago(seconds)} so far" if run.result == "running" and
                     run.duration is None else
                     "-" if run.duration is None else timetext.took(run.duration))
        title = (f"run {run.id}: {run.result}, {took_text}, on {run.host}, started "
                 f"{timetext.relative(run.started, now)} ({timetext.stamp(run.started)})")
        out.append(f'<a href="/runs/{run.id}"><rect class="bar r-{cls}" data-run="{run.id}" '
                   f'x="{x}" y="{y}" width="{width}" height="{round(height, 1)}">'
                   f'<title>{escape(title)}</title></rect>')
        if run.result != OK:  # not by colour alone
            out.append(f'<text class="mark r-{cls}" x="{round(x + width / 2, 1)}" '
                       f'y="{y - 3}" text-anchor="middle">{_MARK.get(run.result, "•")}</text>')
        out.append("</a>")
    # The x axis: when the first and the last shown run started.
    first, last = shown[0].started, shown[-1].started
    out.append(f'<text class="tick" x="{LEFT}" y="{BOTTOM + 16}">'
               f'{escape(timetext.relative(first, now))}</text>')
    if len(shown) > 1:
        out.append(f'<text class="tick" x="{WIDTH - RIGHT}" y="{BOTTOM + 16}" '
                   f'text-anchor="end">{escape(timetext.relative(last, now))}</text>')
    out.append(f'<text class="axis" x="{LEFT + plot_w / 2}" y="{BOTTOM + 16}" '
               f'text-anchor="middle">runs by start, oldest to newest</text>')
    counts = Counter(r.result for r in shown)
    x = LEFT
    for result, count in sorted(counts.items(), key=lambda kv: (kv[0] != OK, kv[0])):
        label = f"{result} {count}"
        out.append(f'<rect class="bar r-{result_class(result)}" x="{x}" y="{HEIGHT - 12}" '
                   f'width="9" height="9"/><text class="legend" x="{x + 12}" '
                   f'y="{HEIGHT - 4}">{escape(label)}</text>')
        x += 24 + 7 * len(label)
    out.append("</svg></div>")
    return Markup("".join(out))


#: The mark above a bar whose run did not end ok.
_MARK = {"failed": "✕", "timeout": "⧗", "killed": "✕", "lost": "?", "running": "▸",
         "waiting": "…", "missed": "–", "skipped": "–"}
