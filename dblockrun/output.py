"""Rendering for people (rich tables) and programs (JSON). The only module
that imports rich."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from dblockrun.durations import format_duration
from dblockrun.store import FOREVER
from dblockrun.store.models import HostStatus, JobStatus, RunRecord, definitions

#: Bumped only on incompatible changes to the ``--json`` shapes.
JSON_VERSION = 1


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    if ts >= FOREVER:
        return "forever"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z"
    )


def _short(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    if ts >= FOREVER:
        return "until enabled"
    delta = ts - now
    fmt = "%H:%M:%SZ" if abs(delta) < 86400 else "%Y-%m-%d %H:%MZ"
    when = datetime.fromtimestamp(ts, UTC).strftime(fmt)
    rel = f"{abs(delta):.1f}s" if abs(delta) < 60 else format_duration(round(abs(delta)))
    return f"{when} ({'in ' + rel if delta >= 0 else rel + ' ago'})"


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


def status_json(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float) -> str:
    defs = definitions(list(hosts))
    doc = {
        "version": JSON_VERSION,
        "db_time": iso(db_now),
        "jobs": [
            {
                "name": s.lock.name,
                "state": s.state,
                "holder": s.lock.holder,
                "lock_until": iso(s.lock.lock_until),
                "token": s.lock.token,
                "last_slot": iso(s.lock.last_slot),
                "next_run": iso(s.lock.next_due),
                "disabled_until": iso(s.lock.disabled_until)
                if s.state == "disabled" else None,
                "disabled_reason": s.lock.disabled_reason if s.state == "disabled" else None,
                "last_run": run_json(s.last_run),
                "running": run_json(s.running),
                "items": s.items,
                "definitions": defs.get(s.lock.name, {}),
                "drift": len(defs.get(s.lock.name, {})) > 1,
            }
            for s in jobs
        ],
        "hosts": [host_json(h) for h in hosts],
    }
    return json.dumps(doc, indent=2)


def history_json(runs: Sequence[RunRecord]) -> str:
    return json.dumps({"version": JSON_VERSION, "runs": [run_json(r) for r in runs]}, indent=2)


def _console() -> Any:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped or captured: don't squeeze to 80 columns
    return console


def print_status(jobs: Sequence[JobStatus], hosts: Sequence[HostStatus], db_now: float) -> None:
    from rich.table import Table

    console = _console()
    table = Table(title="jobs", title_justify="left")
    for col in ("job", "state", "holder", "lock until", "token", "last run", "next run",
                "disabled"):
        table.add_column(col, overflow="fold")
    for s in jobs:
        last = s.last_run
        last_txt = "-"
        if last is not None:
            took = "" if last.duration is None else f" {last.duration:.1f}s"
            code = "" if last.exit_code is None else f" exit {last.exit_code}"
            last_txt = f"{last.result}{code}{took} {_short(last.started, db_now)}"
        disabled = "-"
        if s.state == "disabled":
            disabled = _short(s.lock.disabled_until, db_now)
            if s.lock.disabled_reason:
                disabled += f": {s.lock.disabled_reason}"
        locked = s.state in ("running", "locked")
        state = s.state
        if s.items is not None:
            c = s.items
            state += (f"\nitems: {c['done']}/{c['total']} done, {c['running']} running, "
                      f"{c['waiting']} waiting, {c['failed']} failed")
        table.add_row(
            s.lock.name,
            state,
            (s.lock.holder or "-") if locked else "-",
            _short(s.lock.lock_until, db_now) if locked else "-",
            str(s.lock.token),
            last_txt,
            _short(s.lock.next_due, db_now),
            disabled,
        )
    console.print(table)
    htable = Table(title="hosts", title_justify="left")
    for col in ("host", "pid", "version", "last seen", "clock offset", "running"):
        htable.add_column(col)
    for h in hosts:
        offset = "-" if h.clock_offset is None else f"{h.clock_offset * 1000:+.1f} ms"
        htable.add_row(h.id, str(h.pid), h.version, _short(h.last_seen, db_now), offset,
                       str(h.running))
    console.print(htable)
    for name, defs in sorted(definitions(list(hosts)).items()):
        if len(defs) > 1 and any(s.lock.name == name for s in jobs):
            where = "; ".join(f"{d} on {', '.join(h)}" for d, h in sorted(defs.items()))
            console.print(f"[yellow]warning:[/] job {name} is defined differently: {where}")


def print_history(runs: Sequence[RunRecord], db_now: float) -> None:
    from rich.table import Table

    table = Table(title="runs", title_justify="left")
    for col in ("id", "job", "host", "slot", "token", "started", "result", "exit", "duration"):
        table.add_column(col, overflow="fold")
    for r in runs:
        table.add_row(
            str(r.id), r.job + (f"[{r.item}]" if r.item else ""), r.host, iso(r.slot) or "-",
            "-" if r.token is None else str(r.token), _short(r.started, db_now), r.result,
            "-" if r.exit_code is None else str(r.exit_code),
            "-" if r.duration is None else f"{r.duration:.2f}s",
        )
    _console().print(table)
