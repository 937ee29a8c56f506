"""The fleet timeline: what ran where, and what overlapped, in one picture.

A window of time (the last hour by default; ``?window=6h``, ``?end=`` an ISO
time: in the URL, so it can be shared) as one row per host; each run a bar
from its start to its end (a run still running: to now), coloured by its
result; runs that overlap on a host stacked in lanes of its row; each passed
slot (missed, skipped) a mark at its slot's time on the row of the host that
recorded it. Drawn on the server as one SVG, built as a string (10,000 bars
through a template's loop would be its slowest part), one path per result
and host; hovering a bar says the job, run, result, duration and start
(timetext's wording), a click opens the run: the page's script finds the
run under the pointer in the data beside the SVG (app.js).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup, escape

from dblockrun import timetext
from dblockrun.store.models import PASSED, RUNNING, HostStatus, Span
from dblockrun.web.chart import result_class

#: The window shown when none is asked for, and the longest one asked.
WINDOW = 3600.0
LONGEST = 7 * 86400.0
#: The most records drawn (the rest counted: "N more not drawn").
MOST = 20_000
#: The windows offered as links.
CHOICES = ("15m", "1h", "6h", "24h", "7d")

WIDTH = 1000
#: The host names' column, the plot's right margin, the axis' height.
LABELS, RIGHT, AXIS = 150, 10, 22
LANE, GAP, ROW_PAD = 9, 2, 6
#: The most lanes of a host's row; more runs at once share the last lanes.
MOST_LANES = 8
#: Tick spacings of the time axis (seconds): the first giving at most 10 ticks.
TICKS = (60, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400,
         2 * 86400)


@dataclass(frozen=True)
class Drawn:
    """The timeline's SVG and what it shows."""

    svg: Markup
    runs: int
    passed: int
    hosts: int


def host_names(hosts: Iterable[HostStatus]) -> dict[str, str]:
    """Each daemon's (holder id's) host as the rows name it: its ``hostname``
    label (``--label hostname=...``; by default the machine's name)."""
    from dblockrun.scheduling.targeting import HOSTNAME, loads_labels

    return {h.id: loads_labels(h.labels).get(HOSTNAME) or host_of(h.id) for h in hosts}


def host_of(holder: str) -> str:
    """The host of a holder no daemon row names (``web-3:77:0b1d2e`` is ``web-3``)."""
    from dblockrun.ops.output import host_name

    return host_name(holder)


def draw(records: Sequence[Span], start: float, end: float, now: float,
         hosts: Iterable[str] = (), names: Mapping[str, str] | None = None) -> Drawn:
    """The timeline of ``records`` (runs_between's) from ``start`` to ``end``;
    ``hosts``: rows shown even without a record (the live hosts); ``names``:
    the host of each holder id (:func:`host_names`), else :func:`host_of`."""
    names = names or {}
    span = end - start
    plot = WIDTH - LABELS - RIGHT
    scale = plot / span

    def px(ts: float) -> float:
        return LABELS + (min(max(ts, start), end) - start) * scale

    by_host: dict[str, list[Span]] = defaultdict(list)
    for name in hosts:
        by_host.setdefault(name, [])
    known = dict(names)
    for run in records:
        host = known.get(run.host)
        if host is None:
            host = known[run.host] = host_of(run.host)
        by_host[host].append(run)
    body: list[str] = []
    #: Each bar's run: (id, x, width, y, what hovering says).
    shown: list[tuple[int, float, float, int, str]] = []
    y = AXIS
    ran = passed = 0
    for host in sorted(by_host):
        runs = by_host[host]
        bars, marks = [], []
        lane_end: list[float] = []
        for run in sorted(runs, key=lambda r: r.started):
            if run.result in PASSED:
                marks.append(run)
                continue
            x0 = px(run.started)
            x1 = px(run.finished if run.finished is not None else
                    (now if run.result == RUNNING else run.started))
            lane = next((i for i, e in enumerate(lane_end) if e <= x0), None)
            if lane is None:
                if len(lane_end) < MOST_LANES:
                    lane = len(lane_end)
                    lane_end.append(0.0)
                else:
                    lane = min(range(MOST_LANES), key=lane_end.__getitem__)
            lane_end[lane] = max(x1, x0 + 1)
            bars.append((run, x0, x1, lane))
        lanes = max(len(lane_end), 1)
        height = lanes * (LANE + GAP) + 2 * ROW_PAD
        body.append(f'<g class="host" data-host="{escape(host)}">'
                    f'<rect class="row" x="0" y="{y}" width="{WIDTH}" height="{height}"/>'
                    f'<text class="host" x="4" y="{y + ROW_PAD + LANE}">{escape(host)}</text>')
        # Each run a rectangle of the path of its result's colour: 10,000
        # elements (with a <title> each) took chromium 0.8 s to lay out, 20
        # paths 0.4 s. What a hover says and where a click goes is in the
        # page's data (the script finds the run under the pointer).
        shapes: dict[str, list[str]] = defaultdict(list)
        for run, x0, x1, lane in bars:
            top = y + ROW_PAD + lane * (LANE + GAP)
            width = max(x1 - x0, 1.0)
            shapes[result_class(run.result)].append(
                f"M{x0:.1f} {top}h{width:.1f}v{LANE}h-{width:.1f}z")
            if run.finished is None and run.result == RUNNING:
                took_text = f"{timetext.ago(now - run.started)} so far"
            else:
                took_text = timetext.took(run.duration)
            said = (f"{run.job}{' [' + run.item + ']' if run.item else ''}: run {run.id}, "
                    f"{run.result}, {took_text}, from {timetext.second(run.started)}")
            shown.append((run.id, round(x0, 1), round(width, 1), top, said))
        body.extend(f'<path class="bar r-{cls}" d="{"".join(d)}"/>'
                    for cls, d in sorted(shapes.items()))
        for run in marks:
            at = run.slot if run.slot is not None else run.started
            x = px(at)
            title = (f"{run.job}: the slot of {timetext.stamp(at)} "
                     f"({timetext.relative(at, now)}) {run.result}")
            body.append(f'<path class="passed r-{run.result}" data-run="{run.id}" '
                        f'd="M{x - 4:.1f} {y + 1}h8l-4 {ROW_PAD + 2}z">'
                        f'<title>{escape(title)}</title></path>')
        body.append("</g>")
        ran += len(bars)
        passed += len(marks)
        y += height
    if not by_host:
        body.append(f'<text class="axis" x="{LABELS}" y="{y + 16}">no run in this window</text>')
        y += 24
    total = y + 4
    axis = [f'<line class="axis-line" x1="{LABELS}" y1="{AXIS - 2}" x2="{WIDTH - RIGHT}" '
            f'y2="{AXIS - 2}"/>']
    every = next((t for t in TICKS if span / t <= 10), TICKS[-1])
    tick = (start // every + 1) * every
    dated = span > 86400
    while tick < end:
        x = px(tick)
        axis.append(f'<line class="grid" x1="{x:.1f}" y1="{AXIS - 6}" x2="{x:.1f}" '
                    f'y2="{total}"/><text class="tick" x="{x:.1f}" y="{AXIS - 8}" '
                    f'text-anchor="middle">{timetext.clock(tick, dated)}</text>')
        tick += every
    if start <= now <= end:
        axis.append(f'<line class="now" x1="{px(now):.1f}" y1="{AXIS - 2}" x2="{px(now):.1f}" '
                    f'y2="{total}"><title>now ({timetext.stamp(now)})</title></line>')
    svg = (f'<svg id="timeline" class="timeline" viewBox="0 0 {WIDTH} {total}" '
           f'preserveAspectRatio="xMinYMin meet" data-lane="{LANE}" role="img" '
           f'aria-label="runs per host from {timetext.utc(start)} to {timetext.utc(end)}">'
           f'{"".join(axis)}{"".join(body)}</svg>')
    # Data, not script (the Content-Security-Policy runs none inline):
    # escaped for an HTML <script> element as Jinja's tojson escapes.
    data = Markup('<script type="application/json" id="timeline-runs">{}</script>').format(
        htmlsafe_json_dumps(shown, separators=(",", ":")))
    return Drawn(Markup(svg) + data, ran, passed, len(by_host))
