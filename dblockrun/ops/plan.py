"""``dblockrun plan NEW``: what deploying a changed jobs file would do, as
data (dblockrun/ops/plantext.py writes it for people and tools).

The *before* side is what the live fleet runs: each live daemon publishes
its jobs' definition hashes, keyed with the fleet's secret, and the digest
of each key it sets (dblockrun/daemon/fleet.py); the current jobs file
(``--current``, by default the one the CLI reads) gives the values behind
those hashes where its own hash is the one the hosts publish. With no live
daemon publishing, the current file alone is the before side.

For each job added, removed or changed: the keys that change (old -> new),
its next slots by each definition (dblockrun/scheduling/cron.py, the
iteration `next` prints), the hosts running which definition now, and the
slots passed since its last recorded slot (the slot ledger: the job's lock
row) that a daemon started with NEW would run or record, decided by the
one misfire policy (dblockrun/scheduling/planner.py :func:`passed`). The
limits NEW makes full at one instant are :func:`starving`'s, the warnings
of `validate`.

:func:`read_fleet` reads the database (four statements); :func:`make_plan`
is pure: every time is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from dblockrun.config.load import differing_keys, job_key
from dblockrun.durations import format_duration
from dblockrun.jobs import EVERY_HOST_SEP, Job, JobsFile, loads_fields
from dblockrun.ops.definition import shown_value
from dblockrun.scheduling.calendars import next_real_slot
from dblockrun.scheduling.cron import upcoming
from dblockrun.scheduling.limits import starving
from dblockrun.scheduling.planner import Cause, Summary, passed
from dblockrun.scheduling.targeting import HOSTNAME, loads_labels, matches, row_name

if TYPE_CHECKING:
    from dblockrun.store.models import HostStatus, LockState
    from dblockrun.store.roles import StatusReading

#: What becomes of a job.
ADDED, REMOVED, CHANGED, UNCHANGED = "added", "removed", "changed", "unchanged"
#: Which definition a host runs: NEW's, the current file's, another (its
#: hash is neither file's), or none yet (NEW's run-on selects the host).
RUNS_NEW, RUNS_CURRENT, RUNS_OTHER, RUNS_NONE = "new", "current", "other", "none"
#: Slots per side when neither --count nor --days is given (`plan`), and at
#: most this many with --days alone.
DEFAULT_COUNT = 10
MOST_SLOTS = 1000


@dataclass(frozen=True)
class Slots:
    """A job's next slots by one definition (`next` prints the same)."""

    timezone: str
    #: Epoch seconds, oldest first (none: a job without a cron schedule).
    times: tuple[float, ...]
    #: ``every 6h (rate)``, ``after extract``: what else makes it run.
    also: str
    #: There are more in the window than were asked for (--days with --count).
    more: bool = False

    def shown(self) -> list[str]:
        """Each slot in the job's time zone, with its offset (DST shows)."""
        from dblockrun.timetext import zoned

        return [zoned(t, self.timezone) for t in self.times]


def job_slots(job: Job, now: float, count: int, until: float | None = None) -> Slots:
    """``job``'s next ``count`` slots after ``now`` (none after ``until``),
    and what else times it: the one home of `next`'s and `plan`'s lists."""
    rate = f"every {format_duration(job.rate)} (rate)" if job.rate is not None else ""
    after = "" if job.after is None else job.after.text()
    also = ", ".join(t for t in (rate if job.cron is None else "", after) if t)
    if job.cron is None:
        return Slots(job.timezone, (), also)
    if job.calendared:  # the slots that run: none a calendar or window excludes
        real: list[float] = []
        moment: float | None = now
        while moment is not None and len(real) < count + (until is not None):
            moment = next_real_slot(job, moment)
            if moment is None or (until is not None and moment > until):
                break
            real.append(moment)
        return Slots(job.timezone, tuple(real[:count]), also, more=len(real) > count)
    start = datetime.fromtimestamp(now, UTC)
    end = None if until is None else datetime.fromtimestamp(until, UTC)
    # With a window, one more tells whether the count cut it short.
    times = upcoming(job.schedule, start, count + (end is not None), end)
    return Slots(job.timezone, tuple(t.timestamp() for t in times[:count]), also,
                 more=len(times) > count)


@dataclass(frozen=True)
class KeyChange:
    """A key whose value changes (None: not set, its default)."""

    key: str
    before: str | None
    after: str | None
    #: False: the fleet runs a definition the current file does not hold;
    #: its keys' digests name the key, not its value.
    known: bool = True


@dataclass(frozen=True)
class HostDefinition:
    """Which definition of a job a live host runs now, and whether it runs
    the job under NEW (its labels against NEW's ``run-on``)."""

    host: str
    hostname: str
    #: The job's row on that host (``JOB@HOST`` for an every-host job).
    row: str
    runs: str
    digest: str | None
    keeps: bool

    @property
    def changes(self) -> bool:
        """Whether deploying NEW changes what this host runs of the job."""
        return not (self.runs == RUNS_NEW and self.keeps)


@dataclass(frozen=True)
class Passed:
    """Slots after the job's last recorded slot that a daemon started with
    NEW would run (catch-up) or record, as its resync decides them."""

    last_slot: float
    run: tuple[float, ...]
    recorded: tuple[float, ...]
    summary: Summary | None
    result: str
    reason: str


@dataclass(frozen=True)
class JobPlan:
    name: str
    change: str
    keys: tuple[KeyChange, ...]
    before: Slots | None
    after: Slots | None
    hosts: tuple[HostDefinition, ...]
    passed: Passed | None
    #: What else to know of it: disabled in the database, never ran, ...
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class LimitWarning:
    text: str
    #: Not a warning of the current file: the deploy brings it.
    new: bool


@dataclass(frozen=True)
class FleetFacts:
    """What the plan reads from the database, at one database time."""

    now: float
    #: The live daemons, each with its keys' digests (``fields``).
    hosts: tuple[HostStatus, ...]
    locks: dict[str, LockState]
    #: The fleet's secret, to key this process's hashes as the daemons do.
    key: bytes


@dataclass(frozen=True)
class DeployPlan:
    now: float
    jobs: tuple[JobPlan, ...]
    unchanged: tuple[str, ...]
    hosts: tuple[HostStatus, ...]
    warnings: tuple[LimitWarning, ...]
    #: How the before side was found, and where the fleet and the current
    #: file disagree.
    notes: tuple[str, ...]

    @property
    def changed(self) -> bool:
        return bool(self.jobs)


def read_fleet(store: StatusReading) -> FleetFacts:
    """The live daemons (with their keys' digests), every lock row and the
    database time."""
    locks, now = store.lock_states()
    hosts = store.live_hosts()
    if hosts:
        fields = store.host_fields([h.id for h in hosts])
        hosts = [replace(h, fields=fields.get(h.id)) for h in hosts]
    return FleetFacts(now, tuple(hosts), locks, store.fleet_key())


def make_plan(new: JobsFile, current: JobsFile | None, fleet: FleetFacts, *,
              count: int = DEFAULT_COUNT, days: float | None = None,
              max_running: int | None = None) -> DeployPlan:
    """What deploying ``new`` over ``current`` (and what the live fleet runs)
    would do; ``count`` slots a side, none further than ``days`` away."""
    now = fleet.now
    until = None if days is None else now + days * 86400
    publishing = [_Published.of(h) for h in fleet.hosts if h.job_hashes() is not None]
    notes: list[str] = []
    if not fleet.hosts:
        notes.append("no live daemon: the before side is "
                     + (f"the current file {current.path}" if current is not None else
                        "empty (no current jobs file): every job of NEW is added"))
    elif not publishing:
        notes.append("no live daemon publishes its definitions (older daemons): the before "
                     "side is " + (f"the current file {current.path}" if current is not None
                                   else "empty"))
    for host in fleet.hosts:
        if host.job_hashes() is None:
            notes.append(f"host {host.hostname} ({host.id}) does not publish its definitions "
                         "(an older daemon): not compared")
    cur_jobs = {j.name: j for j in current.jobs} if current is not None else {}
    new_jobs = {j.name: j for j in new.jobs}
    published = {name for p in publishing for name in p.rows}
    plans: list[JobPlan] = []
    unchanged: list[str] = []
    for name in sorted(cur_jobs.keys() | new_jobs.keys() | published):
        plan = _job_plan(name, cur_jobs.get(name), new_jobs.get(name), publishing, fleet,
                         now, count, until)
        if plan is None:
            continue
        if plan.change == UNCHANGED:
            unchanged.append(name)
        else:
            plans.append(plan)
        notes.extend(_cross_check(name, cur_jobs.get(name), plan))
    before = set(starving(current, now, max_running)) if current is not None else set()
    warnings = tuple(LimitWarning(text, text not in before)
                     for text in starving(new, now, max_running))
    return DeployPlan(now, tuple(plans), tuple(unchanged), fleet.hosts, warnings, tuple(notes))


def _job_plan(name: str, cur: Job | None, new: Job | None, publishing: list[_Published],
              fleet: FleetFacts, now: float, count: int,
              until: float | None) -> JobPlan | None:
    """The job's plan; None: a job only the current file has, which no
    live daemon runs (already removed from the fleet)."""
    hashes: dict[tuple[int, str], str] = {}  # (which side, row): each hashed once
    hosts = tuple(d for h in publishing
                  for d in _host_definitions(name, cur, new, h, fleet.key, hashes))
    running = [d for d in hosts if d.runs != RUNS_NONE]
    if publishing and running:
        # The fleet says what runs now.
        if new is None:
            change = REMOVED
        else:
            change = CHANGED if any(d.changes for d in hosts) else UNCHANGED
    elif publishing and hosts:  # no host runs it yet; NEW's run-on selects some
        change = ADDED
    elif publishing and new is None:
        return None  # no live host runs it, nor will: nothing to deploy
    elif new is None:
        change = REMOVED if cur is not None else UNCHANGED
    elif cur is None:
        change = ADDED
    else:
        change = UNCHANGED if _same(cur, new) else CHANGED
    # The current file's definition is the before side where the fleet runs
    # it (or says nothing of the job).
    trusted = cur is not None and (not running or any(d.runs == RUNS_CURRENT for d in running))
    if change == UNCHANGED:
        return JobPlan(name, change, (), None, None, hosts, None)
    keys: tuple[KeyChange, ...] = ()
    if cur is not None and new is not None and trusted:
        keys = key_changes(cur, new)
    elif new is not None and running:
        keys = _digest_keys(new, running, {p.host.id: p for p in publishing}, fleet.key)
    before = job_slots(cur, now, count, until) if cur is not None and trusted else None
    after = job_slots(new, now, count, until) if new is not None else None
    passed_slots, notes = _passed(new, fleet, now) if new is not None else (None, ())
    return JobPlan(name, change, keys, before, after, hosts, passed_slots, notes)


def _same(a: Job, b: Job) -> bool:
    return a.definition_hash() == b.definition_hash()


@dataclass(frozen=True)
class _Published:
    """A live host's published definitions, read once: per job of its file,
    its rows (``JOB``, or ``JOB@HOST``) and their hashes."""

    host: HostStatus
    labels: dict[str, str]
    rows: dict[str, list[tuple[str, str]]]
    #: Per row, its keys' digests (None: the host did not write them).
    fields: dict[str, dict[str, str]] | None

    @classmethod
    def of(cls, host: HostStatus) -> _Published:
        rows: dict[str, list[tuple[str, str]]] = {}
        for row, digest in (host.job_hashes() or {}).items():
            rows.setdefault(row.split(EVERY_HOST_SEP, 1)[0], []).append((row, digest))
        return cls(host, loads_labels(host.labels), rows, loads_fields(host.fields))


def _host_definitions(name: str, cur: Job | None, new: Job | None, published: _Published,
                      key: bytes, hashes: dict[tuple[int, str], str]) -> list[HostDefinition]:
    """What a host runs of the job ``name`` (its rows: ``JOB`` or
    ``JOB@HOST``), and whether it would under NEW."""
    host, labels = published.host, published.labels
    keeps = new is not None and (not labels or matches(labels, new.run_on))
    rows = published.rows.get(name, [])
    out: list[HostDefinition] = []
    for row, digest in rows:
        runs = (RUNS_NEW if new is not None and _keyed(new, row, key, hashes) == digest else
                RUNS_CURRENT if cur is not None and _keyed(cur, row, key, hashes) == digest else
                RUNS_OTHER)
        out.append(HostDefinition(host.id, host.hostname, row, runs, digest, keeps))
    if not rows and keeps and new is not None:
        row = (row_name(name, labels.get(HOSTNAME, host.hostname)) if new.every_host
               else name)
        out.append(HostDefinition(host.id, host.hostname, row, RUNS_NONE, None, True))
    return out


def _keyed(job: Job, row: str, key: bytes, hashes: dict[tuple[int, str], str]) -> str:
    """The job's definition hash as a daemon publishes it for ``row``
    (remembered in ``hashes``: every host has the same rows but for
    every-host jobs')."""
    known = hashes.get((id(job), row))
    if known is None:
        known = hashes[(id(job), row)] = _renamed(job, row).definition_hash(key)
    return known


def _renamed(job: Job, row: str) -> Job:
    """The job as a host runs it under ``row`` (an every-host job's row)."""
    return job if job.name == row else replace(job, name=row)


def key_changes(before: Job, after: Job) -> tuple[KeyChange, ...]:
    """The keys whose values differ, each value as the Job page shows it
    (no secret: env values, notification URLs)."""
    a, b = before.definition_data(), after.definition_data()
    set_a, set_b = before.set_fields(), after.set_fields()
    out: list[KeyChange] = []
    for field in sorted((a.keys() | b.keys()) - {"name"}):
        if a.get(field) == b.get(field):
            continue
        old = shown_value(before, field, a[field]) if field in set_a else None
        new = shown_value(after, field, b[field]) if field in set_b else None
        if old == new and new is not None:
            new += " (a value differs)"  # env: the names alone are shown
        out.append(KeyChange(job_key(field), old, new))
    return tuple(out)


def _digest_keys(new: Job, running: list[HostDefinition], published: dict[str, _Published],
                 key: bytes) -> tuple[KeyChange, ...]:
    """The keys in which NEW differs from what hosts run that the current
    file does not hold: from the hosts' keys' digests (values not known)."""
    names: set[str] = set()
    for d in running:
        if d.runs != RUNS_NEW:
            theirs = published[d.host].fields
            mine = _renamed(new, d.row).field_digests(key)
            names.update(differing_keys(mine, (theirs or {}).get(d.row)))
    set_new = {job_key(f): (f, v) for f, v in new.set_fields().items()}
    return tuple(KeyChange(k, None, shown_value(new, *set_new[k]) if k in set_new else None,
                           known=False) for k in sorted(names))


def _passed(job: Job, fleet: FleetFacts, now: float) -> tuple[Passed | None, tuple[str, ...]]:
    """The slots after the job's last recorded slot that a daemon started
    with ``job``'s definition would run or record (its resync at start,
    cause ``down``: dblockrun/scheduling/planner.py)."""
    if not job.enabled:
        return None, ("enabled: false: no daemon runs it",)
    if job.every_host:
        return None, ("an every-host job: each host's row JOB@HOST has its own last slot",)
    lock = fleet.locks.get(job.name)
    if lock is None or lock.last_slot is None:
        return None, (("no slot recorded yet: it starts with its first slot after the deploy",)
                      if job.cron is not None and not job.fan_out else ())
    if lock.disabled_until is not None and lock.disabled_until > now:
        return None, ("disabled in the database: its slots are not due until it is enabled",)
    plan = passed(job, lock.last_slot, now, Cause.DOWN)
    if plan is None:
        return None, ()
    return Passed(lock.last_slot, plan.run, plan.records, plan.summary, plan.result,
                  plan.reason), ()


def _cross_check(name: str, cur: Job | None, plan: JobPlan) -> list[str]:
    """Where the current file and the live hosts disagree on ``name``."""
    other = sorted({d.hostname for d in plan.hosts if d.runs == RUNS_OTHER})
    if not other:
        return []
    if cur is None:
        return [f"job {name}: {', '.join(other)} run a definition the current file does not "
                "have"]
    return [f"job {name}: {', '.join(other)} run a definition that is neither the current "
            "file's nor NEW's"]
