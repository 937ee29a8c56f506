"""Rendering for people (plain text tables) and programs (JSON).

The tables are laid out here rather than by rich: rich takes seconds to
measure a table of 10,000 jobs, and folds words to fit. These tables never
break a word (a job name or host id stays whole; a cell wraps at its spaces),
fit the terminal's width (``COLUMNS`` included) when they can, and are never
wrapped when piped without ``COLUMNS``, so each row stays one line for grep.
The table and ``--json`` show the same facts: :func:`job_view` decides them
once for both.
"""

from __future__ import annotations

import functools
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dblockrun.durations import format_duration
from dblockrun.store import FOREVER
from dblockrun.store.models import HostStatus, JobStatus, RunRecord, definitions

#: Bumped only on incompatible changes to the ``--json`` shapes.
JSON_VERSION = 1

#: Why a job has no next run time (the table's "next run" cell, JSON ``next_run_note``).
DISABLED = "disabled"
NO_LIVE_DAEMON = "no live daemon"
NOT_ON_LIVE_DAEMON = "no live daemon has this job"

_GAP = "  "


# -- times ------------------------------------------------------------------------


def _datetime(ts: float) -> datetime | None:
    try:
        return datetime.fromtimestamp(ts, UTC)
    except (OverflowError, OSError, ValueError):  # a timestamp edited into nonsense
        return None


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


def _ago(seconds: float) -> str:
    return f"{seconds:.1f}s" if seconds < 60 else _whole(round(seconds))


@functools.lru_cache(maxsize=4096)
def _whole(seconds: int) -> str:
    """format_duration of whole seconds: 10,000 jobs share a few hundred."""
    return format_duration(seconds)


def _short(ts: float | None, now: float) -> str:
    """``21:53:17Z (in 5.0s)``, ``2026-11-23 06:00Z (in 8h6m)``."""
    if ts is None:
        return "-"
    if ts >= FOREVER:
        return "until enabled"
    when = _datetime(ts)
    if when is None:
        return repr(ts)
    delta = ts - now
    fmt = "%H:%M:%SZ" if abs(delta) < 86400 else "%Y-%m-%d %H:%MZ"
    rel = _ago(abs(delta))
    return f"{when.strftime(fmt)} ({'in ' + rel if delta >= 0 else rel + ' ago'})"


def _stamp(ts: float | None) -> str:
    """``2026-11-22 21:53:17Z``: history's absolute times."""
    if ts is None:
        return "-"
    when = _datetime(ts) if ts < FOREVER else None
    return repr(ts) if when is None else when.strftime("%Y-%m-%d %H:%M:%SZ")


def _took(run: RunRecord) -> str:
    d = run.duration
    if d is None:
        return "-"
    return f"{d:.2f}s" if abs(d) < 60 else format_duration(round(d))


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


class Fleet:
    """The live hosts as the job views need them, worked out once."""

    def __init__(self, hosts: Sequence[HostStatus]) -> None:
        self.hosts = list(hosts)
        self.defs = definitions(self.hosts)
        #: Job names some live daemon has; None if a host did not say.
        self.known: set[str] | None = (
            set(self.defs) if all(_jobs_known(h) for h in self.hosts) else None)


def job_view(s: JobStatus, fleet: Fleet) -> JobView:
    held = s.lock.lock_until is not None and s.lock.lock_until > s.db_now
    note: str | None = None
    if s.state == "disabled":
        note = DISABLED
    elif s.lock.next_due is not None:
        if not fleet.hosts:
            note = NO_LIVE_DAEMON
        elif fleet.known is not None and s.lock.name not in fleet.known:
            note = NOT_ON_LIVE_DAEMON
    return JobView(status=s, held=held, running=s.running if held else None, next_note=note)


def _jobs_known(host: HostStatus) -> bool:
    """The host reported which jobs its file has."""
    try:
        return isinstance(json.loads(host.jobs or ""), dict)
    except ValueError:
        return False


def warnings(jobs: Sequence[JobStatus], fleet: Fleet, live_within: float) -> list[str]:
    """What the operator should know first: no live daemon; jobs that live
    hosts define differently."""
    out: list[str] = []
    if not fleet.hosts:
        out.append(f"no live daemons: no daemon has sent a heartbeat in the last "
                   f"{format_duration(live_within)}, so no job starts on schedule")
    names = {s.lock.name for s in jobs}
    for name, defs in sorted(fleet.defs.items()):
        if len(defs) > 1 and name in names:
            where = "; ".join(f"{d} on {', '.join(h)}" for d, h in sorted(defs.items()))
            out.append(f"job {name} is defined differently: {where}")
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
        "duration": run.duration,
        "exit_code": run.exit_code,
        "result": run.result,
    }


def host_json(h: HostStatus) -> dict[str, Any]:
    return {
        "id": h.id,
        "hostname": h.hostname,
        "pid": h.pid,
        "version": h.version,
        "started": iso(h.started),
        "last_seen": iso(h.last_seen),
        "clock_offset": h.clock_offset,
        "running": h.running,
    }


def status_json(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
                live_within: float = 15.0) -> str:
    fleet = Fleet(hosts)
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
            "disabled_until": iso(s.lock.disabled_until) if s.state == "disabled" else None,
            "disabled_reason": s.lock.disabled_reason if s.state == "disabled" else None,
            "last_run": run_json(s.last_run),
            "running": run_json(v.running),
            "items": s.items,
            "definitions": defs.get(s.lock.name, {}),
            "drift": len(defs.get(s.lock.name, {})) > 1,
        })
    return dumps({
        "version": JSON_VERSION,
        "db_time": iso(db_now),
        "live_within": live_within,
        "jobs": out,
        "hosts": [host_json(h) for h in hosts],
        "warnings": warnings(jobs, fleet, live_within),
    })


def history_json(runs: Sequence[RunRecord]) -> str:
    return dumps({"version": JSON_VERSION, "runs": [run_json(r) for r in runs]})


def dumps(doc: dict[str, Any]) -> str:
    """``doc`` with one key a line, and one element a line in its lists of
    objects (a job, a host, a run): easy to read and to grep, and written
    by json's C encoder (``indent`` takes the pure Python one, 1 s for
    10,000 jobs)."""
    parts = []
    for key, value in doc.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            inner = ",\n".join("    " + json.dumps(v) for v in value)
            parts.append(f"  {json.dumps(key)}: [\n{inner}\n  ]")
        else:
            parts.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(parts) + "\n}"


# -- plain text tables --------------------------------------------------------------


def _clean(text: str) -> str:
    """Control characters (newlines too) from the database shown escaped: never
    sent to the terminal, and a row stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def terminal_width() -> int | None:
    """The width to fit: the terminal's (``COLUMNS`` first); piped output
    only when ``COLUMNS`` is set, else None (never wrapped)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else None


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]],
                 width: int | None) -> str:
    """Columns two spaces apart, headers underlined with dashes. When wider
    than ``width``, the widest columns wrap at spaces; a word is never broken,
    so a table whose longest words do not fit is wider than ``width``."""
    table = [list(headers), *([_clean(c) for c in row] for row in rows)]
    n = len(headers)
    widths = [max(len(r[i]) for r in table) for i in range(n)]
    if width is not None and sum(widths) + len(_GAP) * (n - 1) > width:
        least = [max(_longest_word(r[i]) for r in table) for i in range(n)]
        excess = sum(widths) + len(_GAP) * (n - 1) - width
        while excess > 0:
            i = max(range(n), key=lambda k: (widths[k] > least[k], widths[k]))
            if widths[i] <= least[i]:
                break
            widths[i] -= 1
            excess -= 1
    lines: list[str] = []
    for index, row in enumerate(table):
        if all(len(c) <= w for c, w in zip(row, widths, strict=True)):
            lines.append(_GAP.join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        else:
            wrapped = [_wrap(c, w) for c, w in zip(row, widths, strict=True)]
            for k in range(max(len(c) for c in wrapped)):
                parts = [(c[k] if k < len(c) else "").ljust(w)
                         for c, w in zip(wrapped, widths, strict=True)]
                lines.append(_GAP.join(parts).rstrip())
        if index == 0:
            lines.append(_GAP.join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def _wrap(cell: str, width: int) -> list[str]:
    """``cell`` in lines of at most ``width``, broken at spaces only."""
    if len(cell) <= width:
        return [cell]
    lines: list[str] = []
    line = ""
    for word in cell.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line]


def _state_cell(v: JobView, now: float) -> str:
    s = v.status
    text = s.state
    if s.state == "disabled":
        until = _short(s.lock.disabled_until, now)
        text += " " + until if until == "until enabled" else f" until {until}"
        if s.lock.disabled_reason:
            text += f": {s.lock.disabled_reason}"
    if s.items is not None:
        c = s.items
        text += (f"; items {c['done']}/{c['total']} done, {c['running']} running, "
                 f"{c['waiting']} waiting, {c['failed']} failed")
    return text


def _last_run_cell(run: RunRecord | None, now: float) -> str:
    if run is None:
        return "-"
    code = "" if run.exit_code is None else f" exit {run.exit_code}"
    took = "" if run.duration is None else f" in {_took(run)}"
    return f"{run.result}{code}{took}, {_short(run.started, now)} on {run.host}"


def _next_run_cell(v: JobView, now: float) -> str:
    if v.next_note is not None:
        return v.next_note
    due = v.status.lock.next_due
    if due is not None and due <= now:
        return f"due since {_short(due, now)}"
    return _short(due, now)


def status_text(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
                live_within: float = 15.0, width: int | None = None) -> str:
    fleet = Fleet(hosts)
    rows = []
    for s in jobs:
        v = job_view(s, fleet)
        holder = "-"
        if v.held:
            holder = f"{s.lock.holder or '(none)'} until {_short(s.lock.lock_until, db_now)}"
        rows.append([s.lock.name, _state_cell(v, db_now), holder, str(s.lock.token),
                     _last_run_cell(s.last_run, db_now), _next_run_cell(v, db_now)])
    out = "jobs\n" + render_table(
        ("job", "state", "holder", "token", "last run", "next run"), rows, width)
    within = format_duration(live_within)
    if hosts:
        out += f"\nlive hosts (a heartbeat in the last {within})\n" + render_table(
            ("host", "pid", "version", "last seen", "clock offset", "running"),
            [[h.id, str(h.pid), h.version, _short(h.last_seen, db_now),
              clock_offset(h.clock_offset), str(h.running)] for h in hosts],
            width)
    else:
        out += f"\nlive hosts (a heartbeat in the last {within}): none\n"
    found = warnings(jobs, fleet, live_within)
    if found:
        out += "\n" + "".join(
            "\n".join(_wrap(f"warning: {_clean(line)}", width or len(line) + 9)) + "\n"
            for line in found)
    return out


def print_status(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float,
                 live_within: float = 15.0) -> None:
    sys.stdout.write(status_text(jobs, hosts, db_now, live_within, terminal_width()))


def history_text(runs: Sequence[RunRecord], width: int | None = None) -> str:
    rows = [
        [str(r.id), r.job, r.item if r.item is not None else "-", r.host, _stamp(r.slot),
         "-" if r.token is None else str(r.token), str(r.attempt), _stamp(r.started),
         _took(r), "-" if r.exit_code is None else str(r.exit_code), r.result]
        for r in runs
    ]
    headers = ("id", "job", "item", "host", "slot", "token", "attempt", "started",
               "duration", "exit", "result")
    return "runs\n" + render_table(headers, rows, width)


def print_history(runs: Sequence[RunRecord], db_now: float) -> None:
    del db_now  # history shows absolute times
    sys.stdout.write(history_text(runs, terminal_width()))
