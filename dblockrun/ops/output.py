"""Rendering for people (rich tables) and programs (JSON); the only module
that imports rich, and only when a table is drawn (``--json`` does not load it).

The tables never break a word (a job name or host id stays whole; a cell
wraps at its spaces), fit the terminal's width (``COLUMNS`` included) when
they can, and are never wrapped when piped without ``COLUMNS``, so each row
stays one line for grep. The table and ``--json`` show the same facts:
:func:`job_view` decides them once for both.
"""

from __future__ import annotations

import functools
import gc
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from dblockrun.durations import FOREVER, format_duration
from dblockrun.jobs import EVERY_HOST_SEP, Job, RunOn, loads_fields
from dblockrun.printable import printable
from dblockrun.scheduling.targeting import (
    describe,
    label_text,
    loads_after,
    loads_labels,
    loads_targets,
    matches,
)
from dblockrun.store.models import (
    WAITING,
    Drain,
    HostStatus,
    JobStatus,
    RunRecord,
    definitions,
    jobs_known,
)
from dblockrun.timetext import ago, iso, relative, short, stamp, took, zoned

if TYPE_CHECKING:
    from rich.box import Box
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Table

    from dblockrun.store.control import AuditRecord, Pause
    from dblockrun.store.models import GroupUsage

#: Bumped only on incompatible changes to the ``--json`` shapes.
JSON_VERSION = 1

#: Why a job has no next run time (the table's "next run" cell, JSON ``next_run_note``).
DISABLED = "disabled"
NO_LIVE_DAEMON = "no live daemon"
NOT_ON_LIVE_DAEMON = "no live daemon has this job"
#: An every-host job's own row: its runs are its hosts' rows (dblockrun/scheduling/targeting.py).
EVERY_HOST = "on every host: rows {job}@HOST"
PAUSED = "fleet paused"
#: A slot dropped by the fleet's pause (neither run nor recorded): the next
#: slot's claim publishes the next time.
DROPPED = "its next slot; the pause dropped {slot}"


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _uncollected(render: Callable[_P, _R]) -> Callable[_P, _R]:
    """``render`` with the cyclic garbage collector paused. Rendering 10,000
    jobs makes about a million short-lived objects and no cycles, and every
    700 of them the collector would walk the young objects, every few
    hundred thousand all of them (the jobs too): a quarter of the time."""

    @functools.wraps(render)
    def paused(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if not gc.isenabled():
            return render(*args, **kwargs)
        gc.disable()
        try:
            return render(*args, **kwargs)
        finally:
            gc.enable()

    return paused


# -- times ------------------------------------------------------------------------


def clock_offset(seconds: float | None) -> str:
    """``+2.1 ms``, ``-0.4 ms``; ``0.0 ms`` without a sign (never ``-0.0``)."""
    if seconds is None:
        return "-"
    millis = round(seconds * 1000, 1)
    return "0.0 ms" if millis == 0 else f"{millis:+.1f} ms"


# -- what a job shows, for the table and the JSON alike ----------------------------


@dataclass(frozen=True)
class JobView:
    status: JobStatus
    #: The lock's lease has not run out: holder and lock until are shown.
    held: bool
    #: The run holding the lock (None when the lock is free).
    running: RunRecord | None
    #: None when there is a next run time to show; else why there is none.
    next_note: str | None
    #: What the job runs after (``after extract``; job chains), if anything.
    after: str | None = None


class Fleet:
    """The live hosts as the job views need them, worked out once."""

    def __init__(self, hosts: Sequence[HostStatus], paused: Pause | None = None) -> None:
        self.hosts = list(hosts)
        #: The fleet-wide pause in effect: no job's next run comes while it lasts.
        self.paused = paused
        self.defs = definitions(self.hosts)
        self._fields = {h.id: h.fields for h in self.hosts}
        #: Job names some live daemon has; None if a host did not say.
        self.known = jobs_known(self.hosts)
        #: Each live host's labels, and the targeting of the jobs their files
        #: have (the first host's, if they differ: drift warns of that).
        self.labels = {h.id: loads_labels(h.labels) for h in self.hosts}
        self.targets: dict[str, tuple[RunOn, bool]] = {}
        #: What jobs run after (``after extract``), and the names of those
        #: jobs, as the live hosts' files say (job chains).
        self.after: dict[str, str] = {}
        self.upstream: dict[str, list[str]] = {}
        for h in self.hosts:
            for name, spec in loads_targets(h.targets).items():
                self.targets.setdefault(name, spec)
            for name, (text, upstream) in loads_after(h.targets).items():
                self.after.setdefault(name, text)
                self.upstream.setdefault(name, upstream)

    def downstream(self, name: str) -> list[str]:
        """The jobs that run after ``name`` (job chains)."""
        return sorted(job for job, ups in self.upstream.items() if name in ups)

    def drift_keys(self, name: str) -> list[str]:
        """The jobs file keys in which live hosts' definitions of ``name``
        differ (as far as their hosts wrote their fields' digests)."""
        defs = self.defs.get(name, {})
        if len(defs) < 2:
            return []
        # Here: only when hosts' definitions of a job differ is the loader (yaml) needed.
        from dblockrun.config.load import differing_keys

        seen: list[dict[str, str]] = []
        for hosts in defs.values():
            for host in hosts:
                fields = loads_fields(self._fields.get(host))
                if fields is not None and name in fields:
                    seen.append(fields[name])
                    break
        return sorted({key for i, a in enumerate(seen) for b in seen[i + 1:]
                       for key in differing_keys(a, b)})

    def target(self, name: str) -> tuple[RunOn, bool] | None:
        """The job's ``run-on`` and every-host, as live hosts' files say
        (a row ``JOB@HOST``: its every-host job's); None: no targeting."""
        if name in self.targets:
            return self.targets[name]
        spec = self.targets.get(name.split(EVERY_HOST_SEP, 1)[0])
        return spec if spec is not None and spec[1] else None

    def unmatched(self, name: str) -> str | None:
        """Why the job runs nowhere: live hosts there are, none matching its run-on."""
        spec = self.targets.get(name)
        if not self.hosts or spec is None or not spec[0]:
            return None
        if any(matches(labels, spec[0]) for labels in self.labels.values()):
            return None
        return f"no live host matches run-on {describe(spec[0])}"


def job_view(s: JobStatus, fleet: Fleet) -> JobView:
    held = s.lock.lock_until is not None and s.lock.lock_until > s.db_now
    note: str | None = None
    spec = fleet.targets.get(s.lock.name)
    if s.state == "disabled":
        note = DISABLED
    elif (nowhere := fleet.unmatched(s.lock.name)) is not None:
        note = nowhere
    elif spec is not None and spec[1]:
        note = EVERY_HOST.format(job=s.lock.name)
    elif fleet.paused is not None and s.lock.next_due is not None:
        note = PAUSED
    elif s.lock.next_due is None and s.lock.name in fleet.after:
        note = fleet.after[s.lock.name]
    elif s.lock.next_due is not None:
        if not fleet.hosts:
            note = NO_LIVE_DAEMON
        elif fleet.known is not None and s.lock.name not in fleet.known:
            note = NOT_ON_LIVE_DAEMON
        elif s.dropped is not None:  # not due: the pause dropped that slot
            note = DROPPED.format(slot=short(s.dropped, s.db_now))
    return JobView(status=s, held=held, running=s.running if held else None, next_note=note,
                   after=fleet.after.get(s.lock.name))


def warnings(jobs: Sequence[JobStatus], fleet: Fleet,
             live_within: float | None) -> list[str]:
    """What the operator should know first: no live daemon; jobs that live
    hosts define differently."""
    out: list[str] = []
    if not fleet.hosts:
        out.append(f"no live daemons: no daemon has sent {live_text(live_within)}, so no job "
                   "starts on schedule")
    names = {s.lock.name for s in jobs}
    for name, defs in sorted(fleet.defs.items()):
        if len(defs) > 1 and name in names:
            where = "; ".join(f"{d} on {', '.join(h)}" for d, h in sorted(defs.items()))
            keys = fleet.drift_keys(name)
            differ = f" ({', '.join(keys)} differ{'s' if len(keys) == 1 else ''})" if keys else ""
            out.append(f"job {name} is defined differently{differ}: {where}")
    for name in sorted(names):
        if (nowhere := fleet.unmatched(name)) is not None:
            out.append(f"job {name}: {nowhere}, so it runs nowhere")
    return out


# -- JSON --------------------------------------------------------------------------


def run_json(run: RunRecord | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "id": run.id,
        "job": run.job,
        "item": run.item,
        "host": run.host,
        "slot": iso(run.slot),
        "token": run.token,
        "attempt": run.attempt,
        "started": iso(run.started),
        "finished": iso(run.finished),
        "duration": None if run.duration is None else round(run.duration, 3),
        "exit_code": run.exit_code,
        "result": run.result,
        # after: the upstream run that started it (job chains).
        "upstream": None if run.upstream_run is None else {
            "job": run.upstream_job, "run": run.upstream_run},
        # backfill, rerun: a passed slot run again, and the run it runs again.
        "origin": None if run.origin is None else {
            "kind": run.origin, "run": run.origin_run},
    }


def host_json(h: HostStatus) -> dict[str, Any]:
    from dblockrun.store.status import live_window  # SQLAlchemy: not for `next`

    return {
        "id": h.id,
        "hostname": h.hostname,
        "pid": h.pid,
        "version": h.version,
        "started": iso(h.started),
        "last_seen": iso(h.last_seen),
        "clock_offset": h.clock_offset,
        "running": h.running,
        "labels": loads_labels(h.labels) if h.labels is not None else None,
        "heartbeat": h.heartbeat,
        "live_within": live_window(h.heartbeat),
        "drained": drain_json(h.drain),
    }


def drain_json(drain: Drain | None) -> dict[str, Any] | None:
    """A host's drain (``dblockrun drain``) in ``status --json``."""
    if drain is None:
        return None
    return {"host": drain.host, "since": iso(drain.since), "until": iso(drain.ends),
            "by": drain.who, "reason": drain.reason}


def _host_cell(h: HostStatus) -> str:
    return f"{h.id} (drained)" if h.drain is not None else h.id


def drain_line(drain: Drain, now: float) -> str:
    """What ``status`` says of a drained host, after the pause."""
    until = "until undrained" if drain.ends >= FOREVER else f"until {short(drain.ends, now)}"
    reason = f": {drain.reason}" if drain.reason else ""
    return (f"DRAINED {drain.host} {until}, by {drain.who} since {short(drain.since, now)}"
            f"{reason}; it starts nothing new (`dblockrun undrain {drain.host}` ends it)")


def live_text(live_within: float | None, hosts: Sequence[HostStatus] = ()) -> str:
    """Which hosts ``status`` calls live: ``--live-within``'s, or (None) each
    by its own heartbeat (dblockrun/store/status.py ``live_window``): the
    window the ``hosts`` listed share, if they do."""
    if live_within is None:
        from dblockrun.store.status import live_window  # SQLAlchemy: not for `next`

        windows = {live_window(h.heartbeat) for h in hosts}
        if len(windows) != 1:
            return "a heartbeat within 1.5 of its --heartbeat, 15s by default"
        live_within = windows.pop()
    return f"a heartbeat in the last {format_duration(live_within)}"


def pause_json(paused: Pause | None) -> dict[str, Any] | None:
    if paused is None:
        return None
    return {"since": iso(paused.since), "until": iso(paused.ends), "by": paused.who,
            "reason": paused.reason}


def pause_line(paused: Pause, now: float) -> str:
    """What ``status`` says first while the fleet is paused."""
    until = "until resumed" if paused.ends >= FOREVER else f"until {short(paused.ends, now)}"
    reason = f": {paused.reason}" if paused.reason else ""
    return (f"PAUSED {until}, by {paused.who} since {short(paused.since, now)}{reason}; "
            "no new run starts on any host (`dblockrun resume` ends it)")


@_uncollected
def status_json(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
                live_within: float | None = None, paused: Pause | None = None,
                groups: Sequence[GroupUsage] = ()) -> str:
    return dumps(status_doc(jobs, hosts, db_now, live_within, paused, groups))


def status_doc(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
               live_within: float | None = None, paused: Pause | None = None,
               groups: Sequence[GroupUsage] = ()) -> dict[str, Any]:
    """``status --json``'s document, before it is written (the dashboard
    keeps both: web/fleetview.py)."""
    fleet = Fleet(hosts, paused)
    defs = fleet.defs
    out = []
    for s in jobs:
        v = job_view(s, fleet)
        out.append({
            "name": s.lock.name,
            "state": s.state,
            "holder": s.lock.holder if v.held else None,
            "lock_until": iso(s.lock.lock_until) if v.held else None,
            "token": s.lock.token,
            "last_slot": iso(s.lock.last_slot),
            "next_run": None if v.next_note else iso(s.lock.next_due),
            "next_run_note": v.next_note,
            "after": v.after,
            "upstream": fleet.upstream.get(s.lock.name, []),
            "downstream": fleet.downstream(s.lock.name),
            "disabled_until": iso(s.lock.disabled_until) if s.state == "disabled" else None,
            "disabled_reason": s.lock.disabled_reason if s.state == "disabled" else None,
            "disabled_by": s.lock.disabled_by if s.state == "disabled" else None,
            "run_requested": iso(s.lock.run_requested),
            "last_run": run_json(s.last_run),
            "running": run_json(v.running),
            # overlap: allow N: every run its lanes hold.
            "runs": [run_json(run) for run in s.lane_runs],
            "items": s.items,
            "definitions": defs.get(s.lock.name, {}),
            "drift": len(defs.get(s.lock.name, {})) > 1,
            "drift_keys": fleet.drift_keys(s.lock.name),
            **_target_json(fleet.target(s.lock.name)),
        })
    return {
        "version": JSON_VERSION,
        "db_time": iso(db_now),
        "live_within": live_within,
        "paused": pause_json(paused),
        "jobs": out,
        "hosts": [host_json(h) for h in hosts],
        "groups": [{"name": g.group, "seats": g.seats, "held": len(g.held),
                    "holders": [{"job": j, "host": h} for j, h in g.held]} for g in groups],
        "waiting": [{"job": run.job, "slot": iso(run.slot), "host": run.host,
                     "since": iso(run.started), "run_id": run.id, "for": waiting_for(run)}
                    for run in waiting_slots(jobs)],
        "warnings": warnings(jobs, fleet, live_within),
    }


def waiting_slots(jobs: Sequence[JobStatus]) -> list[RunRecord]:
    """The queued slots (``when-full: queue``) of ``jobs``, oldest first."""
    found = [s.running for s in jobs
             if s.running is not None and s.running.result == WAITING and s.state == "waiting"]
    return sorted(found, key=lambda r: (r.slot if r.slot is not None else r.started, r.id))


def waiting_for(run: RunRecord) -> str:
    """What a queued slot waits for, as its record says."""
    return (run.output or "").strip()


def _target_json(spec: tuple[RunOn, bool] | None) -> dict[str, Any]:
    """A job's ``run_on`` ({label: [values]} or null) and ``every_host``."""
    run_on, every = spec if spec is not None else ((), False)
    return {"run_on": {k: list(v) for k, v in run_on} or None, "every_host": every}


@_uncollected
def history_json(runs: Sequence[RunRecord]) -> str:
    return dumps({"version": JSON_VERSION, "runs": [run_json(r) for r in runs]})


def audit_entry_json(e: AuditRecord) -> dict[str, Any]:
    return {"id": e.id, "at": iso(e.at), "who": e.who, "action": e.action, "job": e.job,
            "detail": e.detail, "reason": e.reason}


def audit_json(entries: Sequence[AuditRecord]) -> str:
    return dumps({"version": JSON_VERSION, "entries": [audit_entry_json(e) for e in entries]})


def dumps(doc: dict[str, Any]) -> str:
    """``doc`` with one key a line, and one element a line in its lists of
    objects (a job, a host, a run): easy to read and to grep, and written
    by json's C encoder (``indent`` takes the pure Python one, 1 s for
    10,000 jobs). Strict JSON: a number that is not finite (a row edited to
    NaN or Infinity) is ``null``, "not known"; JavaScript's parser takes
    no ``NaN``."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            inner = ",\n".join("    " + strict_json(v) for v in value)
            parts.append(f"  {json.dumps(key)}: [\n{inner}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {strict_json(value)}")
    return "{\n" + ",\n".join(parts) + "\n}"


def strict_json(value: Any) -> str:
    """``json.dumps`` without NaN or Infinity: null instead (the common
    case, all finite, at the C encoder's speed)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(value), allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# -- tables (rich) ------------------------------------------------------------------

#: The width piped output is laid out in when ``COLUMNS`` is not set: wide
#: enough that rich wraps no row, so each row stays one line for grep.
UNBOUNDED = 1_000_000


def terminal_width() -> int | None:
    """The width to fit, as rich's console finds it: ``COLUMNS``, else the
    terminal's. None when piped without ``COLUMNS``: never wrapped."""
    from rich.console import Console

    console = Console(file=sys.stdout)
    columns = os.environ.get("COLUMNS", "")
    if console.width > 0 and (console.is_terminal or columns.isdigit()):
        return console.width
    return None


class _Page:
    """Plain text laid out by rich (no colour, markup, highlighting or emoji:
    a job name is shown as typed) in ``width`` columns, or unbounded (None),
    lines never cropped, trailing spaces dropped."""

    def __init__(self, width: int | None) -> None:
        from rich.console import Console

        self.width = width
        self._buffer = io.StringIO()
        options: dict[str, Any] = dict(file=self._buffer, color_system=None, markup=False,
                                       emoji=False, highlight=False, legacy_windows=False)
        self.console = Console(width=width or UNBOUNDED, **options)
        #: Draws the tables, whose column widths are decided on ``console``
        #: beforehand: rich must not narrow them again when a table whose
        #: words do not fit is wider than the page.
        self._unbounded = Console(width=UNBOUNDED, **options)

    def line(self, text: str = "") -> None:
        from rich.text import Text

        self.console.print(Text(printable(text)), crop=False)

    def paragraphs(self, lines: Sequence[str]) -> None:
        """``lines`` wrapped at spaces; a word longer than the width (a job
        name) stays whole on a wider line."""
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid()
        grid.add_column(min_width=None if self.width is None else _longest_word(lines))
        for text in lines:
            grid.add_row(Text(printable(text)))
        self.console.print(grid, crop=False)

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[str]],
              whole: Collection[str]) -> None:
        """Columns two spaces apart (a cell's right padding and an empty
        divider), a dashed rule under the headers. Columns named in ``whole``
        (names, numbers) never wrap; the others wrap at spaces. To fit a
        width, each column is at least as wide as its header and its longest
        word (its whole longest cell if it never wraps): a table whose words
        do not fit is wider than the width, never broken mid-word or cut.

        rich lays a cell out on its own, about 0.1 ms a cell, whatever its
        size: 6 s for 10,000 jobs. So rich decides the column widths once, on
        a proxy of the headers and a row of each column's longest cell (it
        measures a column by its widest cell and its longest word: the
        proxy's), wraps the cells that do not fit their column
        (:func:`_column_lines`), and draws the table with the widths fixed
        (nothing measured again) and every row in one cell a column, which it
        pads line by line as it pads each cell."""
        from rich.cells import cell_len
        from rich.text import Text

        cells = [[printable(c) for c in row] for row in rows]
        columns = list(zip(*cells, strict=True)) or [() for _ in headers]
        least: list[int] | None = None
        if self.width is not None:
            least = [max(cell_len(header), max(map(cell_len, column), default=0)
                         if header in whole else _longest_word(column))
                     for header, column in zip(headers, columns, strict=True)]
        proxy = _new_table(headers, whole, least=least)
        proxy.add_row(*(Text(max(column, key=cell_len, default="")) for column in columns))
        if self.width is not None:
            proxy.width = self._fit(proxy)
        spans = self._spans(proxy)
        # A cell is its column's span less its right padding (none on the last).
        widths = [span - (index < len(spans) - 1) for index, span in enumerate(spans)]
        table = _new_table(headers, whole, spans=spans)
        if cells:  # a row of no lines would still be drawn one line high
            table.add_row(*map(_Lines, _column_lines(
                self.console, cells, widths, [header in whole for header in headers])))
        self._unbounded.print(table, crop=False)

    def _spans(self, proxy: Table) -> list[int]:
        """Each column's width with its padding as rich draws ``proxy`` on
        the page, read off the header rule: a run of dashes a column, one
        space apart."""
        from rich.segment import Segment

        for line in Segment.split_lines(self.console.render(proxy)):
            text = "".join(segment.text for segment in line)
            if "-" in text and not text.strip("- "):
                return [len(run) for run in text.split(" ")][:len(proxy.columns)]
        raise AssertionError("a table drawn without its header rule")

    def _fit(self, proxy: Table) -> int | None:
        """The table width to ask rich for (None: the page's). rich narrows
        the widest wrapping columns first, then widens again any column
        below its minimum, so at the page's width it can draw a table wider
        than the page that would have fitted; asked for too little, it drops
        columns. ``proxy`` (the table's columns and a row of their longest
        cells) is laid out as the table is, so widths are tried on it
        cheaply (bisection: the narrower the width asked, the narrower the
        drawing): the widest whose drawing fits the page, or is as narrow as
        the table can be, with every header whole."""
        from rich.segment import Segment

        assert self.width is not None
        least = self.console.measure(
            proxy, options=self.console.options.update_width(UNBOUNDED)).minimum
        bound = max(self.width, least)
        headers = [word for column in proxy.columns for word in str(column.header).split()]

        def fits(target: int | None) -> tuple[bool, bool]:
            """Whether the drawing fits, and whether it shows every header whole."""
            proxy.width = target  # a width also widens a narrower table to it
            lines = list(Segment.split_lines(self.console.render(proxy)))
            whole = "".join(segment.text for segment in lines[0]).split() == headers
            return max(map(Segment.get_line_length, lines)) <= bound, whole

        if all(fits(None)):
            return None
        low, high = 0, bound  # at 0, no column is left; at bound, too wide
        while high - low > 1:
            middle = (low + high) // 2
            fit, whole = fits(middle)
            if fit or not whole:
                low = middle
            else:
                high = middle
        return low if low and all(fits(low)) else high

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self._buffer.getvalue().splitlines()) + "\n"


def _longest_word(texts: Iterable[str]) -> int:
    """The width of the longest word in ``texts``, as rich measures a text's minimum."""
    from rich.cells import cell_len

    return max((cell_len(word) for text in texts for word in text.split()), default=0)


def _new_table(headers: Sequence[str], whole: Collection[str], *,
               least: Sequence[int] | None = None,
               spans: Sequence[int] | None = None) -> Table:
    """The table: columns at least ``least`` wide, with one space of padding
    on their right (not the last one's), rich deciding the widths; or
    exactly ``spans`` wide, padding included, rich measuring nothing."""
    from rich.table import Table

    table = Table(box=_header_rule(), show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0) if spans is None else 0,
                  header_style=None, highlight=False)
    for index, header in enumerate(headers):
        table.add_column(header, no_wrap=header in whole, overflow="fold",
                         min_width=None if least is None else least[index],
                         width=None if spans is None else spans[index])
    return table


def _column_lines(console: Console, cells: Sequence[Sequence[str]], widths: Sequence[int],
                  no_wrap: Sequence[bool]) -> list[list[str]]:
    """Each column's lines, row after row, in columns of cells ``widths``
    wide: a cell that fits is one line, the others rich wraps as it wraps a
    table's cell; a row is as many lines as its tallest cell, the others
    aligned to its top (as rich's table aligns them)."""
    from rich.cells import cell_len
    from rich.text import Text

    out: list[list[str]] = [[] for _ in widths]
    for row in cells:
        lines = [[cell] if cell_len(cell) <= width else
                 [line.plain for line in Text(cell).wrap(console, width, justify="left",
                                                          overflow="fold", no_wrap=keep)]
                 for cell, width, keep in zip(row, widths, no_wrap, strict=True)]
        height = max(map(len, lines))
        for column, cell_lines in zip(out, lines, strict=True):
            column.extend(cell_lines)
            if len(cell_lines) < height:
                column.extend([""] * (height - len(cell_lines)))
    return out


class _Lines:
    """A table cell of lines that fit its column, for rich to pad (a
    renderable by rich's console protocol)."""

    def __init__(self, lines: Sequence[str]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        from rich.segment import Segment

        new_line = Segment.line()
        for line in self.lines:
            yield Segment(line)
            yield new_line


@functools.cache
def _header_rule() -> Box:
    """No borders; a dashed rule under each header. ASCII, so the text is the
    same whatever the terminal's encoding."""
    from rich.box import Box

    return Box("    \n"
               "    \n"
               " -  \n"
               "    \n"
               "    \n"
               "    \n"
               "    \n"
               "    \n", ascii=True)


def _lanes_text(s: JobStatus, *, ids: bool) -> str:
    """``overlap: allow N``: its runs going, and where (``; 2 runs: web-1,
    web-2``; ``ids``, the wide table: ``12 on web-1:77:0b1d2e, ...``, the
    holders as the holder column names them); empty for the other jobs."""
    if not s.lane_runs:
        return ""
    each = ", ".join(f"{run.id} on {run.host}" if ids else host_name(run.host)
                     for run in s.lane_runs)
    count = len(s.lane_runs)
    return f"; {count} run{'s' if count > 1 else ''}: {each}"


def _state_cell(v: JobView, now: float) -> str:
    s = v.status
    text = s.state + _lanes_text(s, ids=True)
    if s.state == "disabled":
        until = short(s.lock.disabled_until, now)
        text += " " + until if until == "until enabled" else f" until {until}"
        if s.lock.disabled_by:
            text += f" by {s.lock.disabled_by}"
        if s.lock.disabled_reason:
            text += f": {s.lock.disabled_reason}"
    if s.lock.run_requested is not None:  # dblockrun run: filed, not yet started
        text += f"; run requested {ago(max(0.0, now - s.lock.run_requested))} ago"
    if s.items is not None:
        c = s.items
        text += (f"; items {c['done']}/{c['total']} done, {c['running']} running, "
                 f"{c['waiting']} waiting, {c['failed']} failed")
    return text


def _last_run_cell(run: RunRecord | None, now: float) -> str:
    if run is None:
        return "-"
    code = "" if run.exit_code is None else f" exit {run.exit_code}"
    spent = "" if run.duration is None else f" in {took(run.duration)}"
    return f"{run.result}{code}{spent}, {short(run.started, now)} on {run.host}"


def _labels_cell(labels: dict[str, str]) -> str:
    return label_text(labels) or "-"


def _next_run_text(v: JobView, now: float, when: Callable[[float | None, float], str],
                   passed: str) -> str:
    """The next run's cell: the note if any, else its time as ``when``
    writes it, after ``passed`` if it is due already."""
    if v.next_note is not None:
        return v.next_note
    due = v.status.lock.next_due
    text = when(due, now)
    text = f"{passed} {text}" if due is not None and due <= now else text
    return text if v.after is None else f"{text}, {v.after}"


def _next_run_cell(v: JobView, now: float) -> str:
    return _next_run_text(v, now, short, "due since")


# -- the narrow table (status without --wide): relative times, no holder or token --


def host_name(holder: str) -> str:
    """The host name of a holder id (``web-3:77:0b1d2e`` is ``web-3``)."""
    return holder.rsplit(":", 2)[0] if holder.count(":") >= 2 else holder


def _narrow_state(v: JobView, now: float) -> str:
    s = v.status
    text = s.state
    if s.lane_runs:
        text += _lanes_text(s, ids=False)
    elif v.running is not None:
        text += f" on {host_name(v.running.host)}"
    if s.state == "disabled":
        until = s.lock.disabled_until
        text += (" until enabled" if until is None or until >= FOREVER
                 else f" for {ago(until - now)}")
        if s.lock.disabled_reason:
            text += f": {s.lock.disabled_reason}"
    if s.lock.run_requested is not None:
        text += "; run requested"
    if s.items is not None:
        text += f"; items {s.items['done']}/{s.items['total']}"
    return text


def _narrow_last_run(run: RunRecord | None, now: float) -> str:
    if run is None:
        return "-"
    code = "" if run.exit_code in (None, 0) else f" exit {run.exit_code}"
    return f"{run.result}{code}, {relative(run.started, now)}"


def _narrow_next_run(v: JobView, now: float) -> str:
    return _next_run_text(v, now, relative, "due")


@_uncollected
def status_text(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
                live_within: float | None = None, width: int | None = None,
                paused: Pause | None = None, groups: Sequence[GroupUsage] = (),
                *, wide: bool = True, limits: Mapping[str, str] | None = None) -> str:
    """The status tables; ``wide``: every fact (holder, token, absolute
    times, pid, version, labels; ``limits``: each job's ``limits:`` in the
    jobs file read, by name, a column once one has them), else what fits
    80 columns: relative times, the running host's name."""
    fleet = Fleet(hosts, paused)
    limits = limits or {}
    # An every-host job's rows (JOB@HOST) have its limits.
    limited = wide and any(limits.get(s.lock.name.split("@", 1)[0]) for s in jobs)
    rows = []
    for s in jobs:
        v = job_view(s, fleet)
        if not wide:
            rows.append([s.lock.name, _narrow_state(v, db_now),
                         _narrow_last_run(s.last_run, db_now), _narrow_next_run(v, db_now)])
            continue
        holder = "-"
        if v.held:
            holder = f"{s.lock.holder or '(none)'} until {short(s.lock.lock_until, db_now)}"
        rows.append([s.lock.name, _state_cell(v, db_now), holder, str(s.lock.token),
                     _last_run_cell(s.last_run, db_now), _next_run_cell(v, db_now)]
                    + ([limits.get(s.lock.name.split("@", 1)[0]) or "-"] if limited else []))
    page = _Page(width)
    if paused is not None:
        page.paragraphs([pause_line(paused, db_now)])
        page.line()
    drained = {h.drain.host: h.drain for h in hosts if h.drain is not None}
    if drained:
        page.paragraphs([drain_line(d, db_now) for _, d in sorted(drained.items())])
        page.line()
    page.line("jobs")
    if wide:
        page.table(("job", "state", "holder", "token", "last run", "next run")
                   + (("limits",) if limited else ()), rows, ("job", "token"))
    else:
        page.table(("job", "state", "last run", "next run"), rows, ("job",))
    page.line()
    within = live_text(live_within, hosts)
    if hosts and not wide:
        page.line(f"live hosts ({within})")
        page.table(("host", "last seen", "clock offset", "running"),
                   [[_host_cell(h), relative(h.last_seen, db_now), clock_offset(h.clock_offset),
                     str(h.running)] for h in hosts], ("host", "clock offset", "running"))
    elif hosts:
        page.line(f"live hosts ({within})")
        # Labels (host targeting), once a host publishes them.
        labelled = any(h.labels is not None for h in hosts)
        page.table(("host", "pid", "version", "last seen", "clock offset", "running")
                   + (("labels",) if labelled else ()),
                   [[_host_cell(h), str(h.pid), h.version, short(h.last_seen, db_now),
                     clock_offset(h.clock_offset), str(h.running)]
                    + ([_labels_cell(fleet.labels[h.id])] if labelled else []) for h in hosts],
                   ("host", "pid", "version", "clock offset", "running"))
    else:
        page.line(f"live hosts ({within}): none")
    if groups:  # dblockrun/scheduling/limits.py
        page.line()
        page.line("groups")
        page.table(("group", "in use", "held by"),
                   [[g.group, f"{len(g.held)}/{g.seats}",
                     ", ".join(f"{j} on {h}" for j, h in g.held) or "-"] for g in groups],
                   ("group", "in use"))
    queued = waiting_slots(jobs)
    if queued:  # when-full: queue (dblockrun/scheduling/limits.py)
        page.line()
        page.line("waiting slots (oldest first)")
        page.table(("job", "slot", "host", "waiting since", "for"),
                   [[run.job, short(run.slot, db_now),
                     run.host, short(run.started, db_now), waiting_for(run)]
                    for run in queued], ("job",))
    found = warnings(jobs, fleet, live_within)
    if found:
        page.line()
        page.paragraphs([f"warning: {line}" for line in found])
    return page.text()


def print_status(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
                 live_within: float | None = None, paused: Pause | None = None,
                 groups: Sequence[GroupUsage] = (), *, wide: bool = False,
                 limits: Mapping[str, str] | None = None) -> None:
    text = status_text(jobs, hosts, db_now, live_within, terminal_width(), paused, groups,
                       wide=wide, limits=limits)
    sys.stdout.write(coloured(text) if use_colour() else text)


#: Cursor home and clear to the end of the screen: ``status --watch`` draws
#: each table over the last.
REDRAW = "\x1b[H\x1b[J"


# -- colours ---------------------------------------------------------------------

#: Words coloured on a terminal: what needs the operator's eye.
_RED, _YELLOW, _RESET = "\x1b[31m", "\x1b[33m", "\x1b[0m"
_COLOURED = {"failed": _RED, "lost": _RED, "timeout": _RED, "disabled": _YELLOW,
             "paused": _YELLOW, "PAUSED": _YELLOW, "DRAINED": _YELLOW, "drained": _YELLOW}
_COLOURED_WORD = re.compile(r"(?<![\w.:@-])(" + "|".join(_COLOURED) + r")(?![\w:@-])")


def use_colour() -> bool:
    """Colours on a terminal, unless ``NO_COLOR`` is set (https://no-color.org)
    or the terminal is ``dumb``."""
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return sys.stdout.isatty()


def coloured(text: str) -> str:
    """``text`` with the words of :data:`_COLOURED` in their colour (after
    the layout: escape codes take no columns)."""
    return _COLOURED_WORD.sub(lambda m: f"{_COLOURED[m[1]]}{m[1]}{_RESET}", text)


def _slot_cell(run: RunRecord) -> str:
    """A run's slot, or the upstream run that started it (``after extract 12``);
    a slot run again, so (``backfill 2026-11-28 10:00:00Z``, ``rerun of 41``)."""
    if run.upstream_run is not None:
        return f"after {run.upstream_job} {run.upstream_run}"
    if run.origin == "rerun":
        return f"rerun of {run.origin_run}"
    if run.origin is not None:
        return f"{run.origin} {stamp(run.slot)}"
    return stamp(run.slot)


@_uncollected
def history_text(runs: Sequence[RunRecord], width: int | None = None) -> str:
    rows = [
        [str(r.id), r.job, r.item if r.item is not None else "-", r.host, _slot_cell(r),
         "-" if r.token is None else str(r.token), str(r.attempt), stamp(r.started),
         took(r.duration), "-" if r.exit_code is None else str(r.exit_code), r.result]
        for r in runs
    ]
    page = _Page(width)
    page.line("runs")
    page.table(("id", "job", "item", "host", "slot", "token", "attempt", "started", "duration",
                "exit", "result"), rows,
               ("id", "job", "item", "host", "token", "attempt", "duration", "exit", "result"))
    return page.text()


def output_text(text: str, *, raw: bool = False) -> str:
    """A run's stored output as ``history --output`` prints it: credentials
    hidden as in the log (a tail stored by an older daemon, which kept the
    output as printed, too: dblockrun/redact.py ``tail``), control
    characters escaped (lines and tabs kept) unless ``raw``."""
    from dblockrun import redact
    from dblockrun.store.schema import OUTPUT_TAIL

    # A tail of the window's size was cut (its start is not the output's);
    # under a quarter of it in characters, it is under it in UTF-8 bytes.
    cut = (len(text) >= OUTPUT_TAIL // 4
           and len(text.encode("utf-8", "replace")) >= OUTPUT_TAIL - 3)
    text = redact.tail(text, cut)
    return text if raw else printable(text, lines=True)


def print_history(runs: Sequence[RunRecord], db_now: float) -> None:
    del db_now  # history shows absolute times
    sys.stdout.write(history_text(runs, terminal_width()))


@_uncollected
def audit_text(entries: Sequence[AuditRecord], width: int | None = None) -> str:
    rows = [[str(e.id), stamp(e.at), e.who, e.action, e.job or "-",
             "; ".join(part for part in (e.detail, e.reason) if part) or "-"]
            for e in entries]
    page = _Page(width)
    page.line("operator actions")
    page.table(("id", "at", "who", "action", "job", "detail"), rows,
               ("id", "who", "action", "job"))
    return page.text()


def print_audit(entries: Sequence[AuditRecord]) -> None:
    sys.stdout.write(audit_text(entries, terminal_width()))


def next_lines(jobs: Iterable[Job], now: float, count: int) -> list[str]:
    """`next`: each job's next ``count`` slots after ``now`` on one line, in
    its time zone; a job with slots excluded among them (a calendar, a
    blackout window, its active range) one slot a line, those marked
    ``skipped:`` with the reason; a rate job's rate; a chain's upstream."""
    from dblockrun.scheduling.calendars import next_real_slot, upcoming

    out: list[str] = []
    for job in jobs:
        # after: a chain's job runs after another's runs, besides any schedule.
        after = "" if job.after is None else job.after.text()
        if job.cron is None:
            rate = f"every {format_duration(job.rate)} (rate)" if job.rate is not None else ""
            out.append(f"{job.name}: {', '.join(t for t in (rate, after) if t)}")
            continue
        slots = upcoming(job, now, count)
        tail = f"; {after}" if after else ""
        if all(s.reason is None for s in slots):
            out.append(f"{job.name}: {', '.join(zoned(s.slot, job.timezone) for s in slots)}"
                       f"{tail}")
            continue
        out.append(f"{job.name}:{tail}")
        for s in slots:
            when = zoned(s.slot, job.timezone)
            if s.reason is None:
                out.append(f"  {when}")
            elif s.through is None:
                out.append(f"  {when}  skipped: {s.reason}")
            elif math.isinf(s.through):
                out.append(f"  {when}  skipped: {s.reason} (and every slot after it)")
            else:
                out.append(f"  {when}  skipped: {s.reason} (and every slot until "
                           f"{zoned(s.through, job.timezone)})")
        if slots and sum(s.reason is None for s in slots) < count \
                and slots[-1].through != math.inf:
            more = next_real_slot(job, slots[-1].slot)
            out.append("  (no more slots to run in the next 10 years)" if more is None else
                       f"  (more skipped slots; the next to run: {zoned(more, job.timezone)})")
    return out
