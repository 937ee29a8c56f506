"""``dblockrun plan``'s output: text for people (per job its changed keys,
a before/after slot table, the hosts, the passed slots; then the warnings)
and ``--json`` for tools (:func:`plan_doc`, its shape in docs/commands.md).
Text from a jobs file or the database is made safe for a terminal here."""

from __future__ import annotations

from itertools import zip_longest
from typing import Any

from dblockrun.ops.output import JSON_VERSION, dumps
from dblockrun.ops.plan import (
    RUNS_CURRENT,
    RUNS_NEW,
    RUNS_NONE,
    RUNS_OTHER,
    DeployPlan,
    HostDefinition,
    JobPlan,
    Passed,
    Slots,
)
from dblockrun.printable import printable
from dblockrun.timetext import iso, stamp, utc

#: How each host's definition of a job reads.
RUNS_TEXT = {RUNS_NEW: "NEW's definition already", RUNS_CURRENT: "the current definition",
             RUNS_OTHER: "another definition", RUNS_NONE: "nothing yet"}
#: Slots named one by one in the passed slots' lines; then a count.
NAMED = 5


def plan_text(plan: DeployPlan, new: str, where: str) -> list[str]:
    """The lines ``plan`` prints for people."""
    hosts = len(plan.hosts)
    lines = [f"plan: {new} against {where}, {hosts} live daemon(s), at {stamp(plan.now)}"]
    lines += [f"note: {note}" for note in plan.notes]
    for job in plan.jobs:
        lines.append("")
        lines += _job_lines(job)
    if plan.warnings:
        lines.append("")
    for warning in plan.warnings:
        lines.append(f"warning: {warning.text}{' (new with this file)' if warning.new else ''}")
    lines.append("")
    counts = {kind: sum(j.change == kind for j in plan.jobs)
              for kind in ("added", "removed", "changed")}
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items() if n)
    lines.append(f"{summary or 'no change'}; {len(plan.unchanged)} unchanged")
    return [printable(line) for line in lines]


def _job_lines(job: JobPlan) -> list[str]:
    keys = ", ".join(k.key for k in job.keys)
    lines = [f"{job.change} {job.name}{': ' + keys if keys else ''}"]
    width = max((len(k.key) for k in job.keys), default=0)
    for k in job.keys:
        old = "?" if not k.known else "(not set)" if k.before is None else k.before
        new = "(not set)" if k.after is None else k.after
        lines.append(f"  {k.key.ljust(width)}  {old} -> {new}")
    lines += _slot_table(job.before, job.after)
    if job.passed is not None:
        lines += _passed_lines(job.passed)
    lines += [f"  {note}" for note in job.notes]
    lines += _host_lines(job.hosts)
    return lines


def _slot_table(before: Slots | None, after: Slots | None) -> list[str]:
    """Before and after, a column each, every slot in its job's zone."""
    if before is None and after is None:
        return []
    left = before.shown() if before is not None else []
    right = after.shown() if after is not None else []
    if not left and not right:
        also = [s.also for s in (before, after) if s is not None and s.also]
        return [f"  no cron slots: {' -> '.join(also)}"] if also else []
    head = (f"before ({before.timezone})" if before is not None else "before: none",
            f"after ({after.timezone})" if after is not None else "after: none")
    width = max(len(head[0]), *(len(t) for t in left), 0) if left else len(head[0])
    lines = ["  next slots:", f"    {head[0].ljust(width)}  {head[1]}"]
    lines += [f"    {a.ljust(width)}  {b}" for a, b in zip_longest(left, right, fillvalue="-")]
    for side, slots in (("before", before), ("after", after)):
        if slots is not None and slots.more:
            lines.append(f"    ({side}: more slots within --days)")
        if slots is not None and slots.also:
            lines.append(f"    ({side}: also {slots.also})")
    return lines


def _passed_lines(p: Passed) -> list[str]:
    lines = [f"  passed since its last recorded slot ({utc(p.last_slot)}), as a daemon started "
             "with NEW decides them:"]
    if p.run:
        lines.append(f"    runs (catch-up): {_named(p.run)}")
    count = len(p.recorded) + (p.summary.count if p.summary is not None else 0)
    if count:
        more = "more than " if p.summary is not None and p.summary.more else ""
        first = p.summary.first if p.summary is not None else p.recorded[0]
        last = p.recorded[-1] if p.recorded else p.summary.last if p.summary else first
        span = f"{utc(first)}" if count == 1 else f"{utc(first)} to {utc(last)}"
        lines.append(f"    recorded {p.result}: {more}{count} slot(s), {span}")
    lines.append(f"    ({p.reason})")
    return lines


def _named(slots: tuple[float, ...]) -> str:
    shown = ", ".join(utc(s) for s in slots[:NAMED])
    return shown + (f" and {len(slots) - NAMED} more" if len(slots) > NAMED else "")


def _host_lines(hosts: tuple[HostDefinition, ...]) -> list[str]:
    out = []
    for d in hosts:
        then = "keeps it with NEW" if d.keeps else "drops it with NEW"
        if d.runs == RUNS_NONE:
            then = "starts it with NEW"
        digest = f" ({d.digest})" if d.digest else ""
        out.append(f"  host {d.hostname} ({d.host}): runs {RUNS_TEXT[d.runs]}{digest}; {then}")
    return out


# -- JSON ------------------------------------------------------------------------


def plan_doc(plan: DeployPlan, new: str, current: str | None, where: str) -> dict[str, Any]:
    """``plan --json``: ``changed`` says what the exit status says."""
    return {
        "version": JSON_VERSION,
        "database": where,
        "new": new,
        "current": current,
        "now": iso(plan.now),
        "changed": plan.changed,
        "jobs": [_job_doc(j) for j in plan.jobs],
        "unchanged": list(plan.unchanged),
        "hosts": [{"id": h.id, "hostname": h.hostname, "publishes": h.job_hashes() is not None}
                  for h in plan.hosts],
        "warnings": [{"text": w.text, "new": w.new} for w in plan.warnings],
        "notes": list(plan.notes),
    }


def plan_json(plan: DeployPlan, new: str, current: str | None, where: str) -> str:
    return dumps(plan_doc(plan, new, current, where))


def _job_doc(job: JobPlan) -> dict[str, Any]:
    return {
        "name": job.name,
        "change": job.change,
        "keys": [{"key": k.key, "before": k.before, "after": k.after, "known": k.known}
                 for k in job.keys],
        "before": _slots_doc(job.before),
        "after": _slots_doc(job.after),
        "passed": _passed_doc(job.passed),
        "hosts": [{"id": d.host, "hostname": d.hostname, "row": d.row, "runs": d.runs,
                   "hash": d.digest, "keeps": d.keeps} for d in job.hosts],
        "notes": list(job.notes),
    }


def _slots_doc(slots: Slots | None) -> dict[str, Any] | None:
    if slots is None:
        return None
    return {"timezone": slots.timezone, "slots": slots.shown(), "more": slots.more,
            "also": slots.also or None}


def _passed_doc(p: Passed | None) -> dict[str, Any] | None:
    if p is None:
        return None
    summary = None if p.summary is None else {
        "first": iso(p.summary.first), "last": iso(p.summary.last), "count": p.summary.count,
        "more": p.summary.more}
    return {"last_slot": iso(p.last_slot), "run": [iso(s) for s in p.run],
            "recorded": [iso(s) for s in p.recorded], "summary": summary, "result": p.result,
            "reason": p.reason}
