"""Plain records the store returns."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from dblockrun.jobs import LANE_PREFIX as LANE_PREFIX
from dblockrun.jobs import SEAT_PREFIX as SEAT_PREFIX

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")

#: Run results.
RUNNING = "running"
#: A queued slot: claimed, waiting for a seat of its full group or for room on
#: its host (``when-full: queue``, dblockrun/scheduling/limits.py); ``running``
#: once its command starts.
WAITING = "waiting"
#: The results of a run not over yet.
UNFINISHED = (RUNNING, WAITING)
OK = "ok"
FAILED = "failed"
TIMEOUT = "timeout"
KILLED = "killed"
LOST = "lost"
MISSED = "missed"
SKIPPED = "skipped"
#: The results of a slot no command ran for (recorded by the slot book).
PASSED = (MISSED, SKIPPED)

#: The largest value of a BIGINT column (a run id, a token).
BIGINT_MAX = 2**63 - 1
#: The largest fencing token: a claim cannot go past it.
TOKEN_MAX = BIGINT_MAX


def run_id_possible(run_id: int) -> bool:
    """Whether a run can have this id: a bigger one is no run on any database
    (asking for it would overflow the driver's or the server's integer)."""
    return 1 <= run_id <= BIGINT_MAX


def token_usable(token: int) -> bool:
    """A token a claim can take and increment: a negative one, or one at
    :data:`TOKEN_MAX`, is a row edited by hand (``dblockrun unlock`` repairs it)."""
    return 0 <= token < TOKEN_MAX


def bad_token_why(token: int) -> str:
    """What is wrong with a token that is not :func:`token_usable`."""
    return "negative" if token < 0 else "at the BIGINT maximum"


@dataclass(frozen=True)
class Trigger:
    """A finished upstream run that starts one run of ``job`` (``after:``;
    dblockrun/daemon/chains.py): the upstream run's record is its identity."""

    job: str
    upstream_run: int
    upstream_job: str
    result: str  # the upstream run's: ok, failed, timeout or lost
    ended: float


@dataclass(frozen=True)
class ClockSample:
    """One reading of the database clock."""

    db_now: float
    offset: float  # database clock minus this host's wall clock, seconds
    mono_offset: float  # database clock minus time.monotonic()
    rtt: float


@dataclass(frozen=True)
class RunRecord:
    id: int
    job: str
    item: str | None
    host: str
    slot: float | None
    token: int | None
    attempt: int
    started: float
    finished: float | None
    exit_code: int | None
    result: str
    output: str | None = None
    #: A run an upstream run started (``after:``): that job and its run's record.
    upstream_job: str | None = None
    upstream_run: int | None = None
    #: A passed slot run again: ``backfill`` or ``rerun``, and the run it
    #: runs again (dblockrun/ops/backfill.py).
    origin: str | None = None
    origin_run: int | None = None

    @property
    def live(self) -> bool:
        """Still running: its output is the tail (at most 64 KiB) its holder
        last wrote with a lease renewal, not yet the stored output."""
        return self.result == RUNNING

    @property
    def duration(self) -> float | None:
        """None while running, or when a time was edited into NaN or infinity."""
        return run_seconds(self.started, self.finished)


class SlotRecord(NamedTuple):
    """A record of a job's slot (``Store.slot_records``): a run, or a
    passed slot (a summary record: the slots from ``covers_from`` to ``slot``)."""

    id: int
    slot: float
    covers_from: float | None
    result: str


def run_seconds(started: float, finished: float | None) -> float | None:
    """A run's duration: None while it runs, or when a time is not finite
    (a row edited to NaN or infinity)."""
    if finished is None:
        return None
    seconds = finished - started
    return seconds if math.isfinite(seconds) else None


class Span(NamedTuple):
    """A run as the dashboard's timeline draws it (``Store.runs_between``):
    a tuple, made straight from its row (10,000 of them in a window)."""

    id: int
    job: str
    item: str | None
    host: str
    slot: float | None
    started: float
    finished: float | None
    result: str

    @property
    def duration(self) -> float | None:
        """None while running, or when a time is not finite."""
        return run_seconds(self.started, self.finished)


@dataclass(frozen=True)
class LockState:
    name: str
    holder: str | None
    lock_until: float | None
    locked_at: float | None
    token: int
    last_slot: float | None
    last_start: float | None
    next_due: float | None
    disabled_until: float | None
    disabled_reason: str | None
    #: Who disabled it (``user@host``; None: on-failure, or before schema 4).
    disabled_by: str | None = None
    #: When an operator's run-now request was filed (``dblockrun run``), until
    #: a daemon claims it or it is withdrawn.
    run_requested: float | None = None

    def disabled_at(self, now: float) -> bool:
        """Whether the row refuses claims as a disabled job's does at
        database time ``now``: a disable that has not ended, or a negative
        token (a row edited by hand: ``dblockrun unlock`` repairs it)."""
        return self.token < 0 or (self.disabled_until is not None and self.disabled_until > now)


@dataclass(frozen=True)
class Disable:
    """A job's disable: until when (database clock; ``FOREVER``: until
    enabled), by whom (None: on-failure) and why."""

    until: float
    by: str | None
    reason: str | None


@dataclass(frozen=True)
class Disabled:
    """What ``disable`` did: the new end, and the disable in effect that it
    replaced (None: the job was enabled)."""

    until: float
    replaced: Disable | None


@dataclass(frozen=True)
class JobStatus:
    lock: LockState
    last_run: RunRecord | None
    running: RunRecord | None
    db_now: float
    #: Fan-out jobs: total, done (this slot), running, waiting, failed.
    items: dict[str, int] | None = None
    #: ``overlap: allow N``: the runs its lanes hold (live leases), oldest first.
    lane_runs: tuple[RunRecord, ...] = ()
    #: The slot it is due at (``lock.next_due``, passed) when the fleet's last
    #: pause dropped it (a slot due while paused is neither run nor recorded),
    #: and when that pause ended: the job is not due since then, nor overdue.
    dropped: float | None = None
    resumed: float | None = None

    @property
    def state(self) -> str:
        lock = self.lock
        if lock.disabled_until is not None and lock.disabled_until > self.db_now:
            return "disabled"
        if self.lane_runs:
            return "running"
        if lock.lock_until is not None and lock.lock_until > self.db_now:
            if self.running is not None:
                return "waiting" if self.running.result == WAITING else "running"
            last = self.last_run
            if last is not None and last.result == FAILED and last.token == lock.token:
                return "retrying"  # the holder waits out the failed attempt's retry delay
            return "locked"
        return "idle"


@dataclass(frozen=True)
class Drain:
    """A host drained (``dblockrun drain HOST``): by its name (a daemon's
    ``hostname`` label), from ``since`` until ``ends`` (database clock;
    ``store.FOREVER``: until undrained), by whom and why."""

    host: str
    ends: float
    since: float
    who: str
    reason: str | None


@dataclass(frozen=True)
class HostStatus:
    id: str
    hostname: str
    pid: int
    version: str
    started: float
    last_seen: float
    clock_offset: float | None
    running: int
    jobs: str | None
    #: Its labels and its file's targeting, JSON (dblockrun/scheduling/targeting.py).
    labels: str | None = None
    targets: str | None = None
    #: Its ``--heartbeat`` (schema 6; None: an older daemon): how long it stays live.
    heartbeat: float | None = None
    #: Per job, a digest of each field its file sets (schema 8, JSON;
    #: dblockrun/jobs.py field_digests); None: not written (yet).
    fields: str | None = None
    #: Its host's drain in effect (``dblockrun drain``; store/drain.py), if any.
    drain: Drain | None = None

    def job_hashes(self) -> dict[str, str] | None:
        """Its file's jobs, each with its definition hash (``jobs``, JSON);
        None if it did not say, or said something else."""
        import json

        try:
            listed = json.loads(self.jobs or "")
        except ValueError:
            return None
        if not isinstance(listed, dict):
            return None
        return {str(name): str(digest) for name, digest in listed.items()}


#: Per record kind: its fields, each with the number type it holds (if any).
_FIELDS: dict[type, tuple[tuple[str, type[int] | type[float] | None], ...]] = {}
_NUMBER = {"int": int, "int | None": int, "float": float, "float | None": float}


NOT_JOB_PREFIXES = (SEAT_PREFIX, LANE_PREFIX)


def is_job_row(name: str) -> bool:
    """Whether a lock row is a job's (not a group's seat, not a job's lane)."""
    return not name.startswith(NOT_JOB_PREFIXES)


class SeatRow(NamedTuple):
    """A seat's lock row as ``status`` reads it."""

    name: str
    held_for: str | None
    holder: str | None
    lock_until: float | None


@dataclass(frozen=True)
class GroupUsage:
    """A group's seats (its rows: the highest limit the daemons have had)
    and the (job, host) holding each seat in use."""

    group: str
    seats: int
    held: list[tuple[str, str]]


def from_row(kind: type[R], row: Mapping[Any, Any]) -> R:
    """A record of ``kind`` from a row: numbers as the record types them
    (drivers read a DOUBLE or BIGINT their own way); fields the row lacks keep
    their default."""
    if kind not in _FIELDS:
        _FIELDS[kind] = tuple((f.name, _NUMBER.get(str(f.type))) for f in fields(kind))
    values = {}
    for name, number in _FIELDS[kind]:
        if name in row:
            value = row[name]
            values[name] = value if value is None or number is None else number(value)
    return kind(**values)


def jobs_known(hosts: list[HostStatus]) -> set[str] | None:
    """The job names the hosts' files have; None if a host did not say."""
    names: set[str] = set()
    for host in hosts:
        jobs = host.job_hashes()
        if jobs is None:
            return None
        names.update(jobs)
    return names


def definitions(hosts: list[HostStatus]) -> dict[str, dict[str, list[str]]]:
    """Per job, which hosts run which version of it (definition hash -> host ids)."""
    out: dict[str, dict[str, list[str]]] = {}
    for host in hosts:
        for name, digest in (host.job_hashes() or {}).items():
            out.setdefault(name, {}).setdefault(digest, []).append(host.id)
    return out


# -- what the lock engine hands its callers (dblockrun/store/engine.py) -----------

#: How early a slot may be claimed, in seconds of the database clock (the
#: daemons' clock estimates), and how much short of its rate a cron + rate
#: job's start may be.
CLAIM_TOLERANCE = 0.1


@dataclass(frozen=True)
class Claimed:
    """A won claim: the new fencing token, and the run record of its first
    attempt when the claim made it (None: the caller records it, or releases)."""

    name: str
    token: int
    run_id: int | None


@dataclass(frozen=True)
class ClaimedItem:
    """A won fan-out item: its text, key, the item's own fencing token and
    the run record the claim made for it."""

    item: str
    key: str
    token: int
    run_id: int


@dataclass(frozen=True)
class LostRun:
    """A run recorded lost: its holder stopped renewing (or was fenced)."""

    id: int
    job: str
    item: str | None
    host: str
    token: int
    lock_until: float | None  # when its lease ran out (None: taken over since)
    ended: float  # its lease's last renewal
    slot: float | None  # the slot it ran for
    first_id: int  # the run's first attempt (its pings are keyed by it)


@dataclass(frozen=True)
class HeldGap:
    """A slot claim that moved a job's row on from ``after`` (the slot
    before) while the lock had been held until ``until``, a second or more
    past it (schema 5, ``Queries.claim_write``): the job's slots between
    were kept from every host, and whoever should have recorded them (the
    holder of a lock-at-least window or a retry's delay, the bookkeeping
    after a dead holder) may not have."""

    name: str
    token: int  # the claim's
    after: float
    until: float
    last_slot: float


class Told(NamedTuple):
    """An audited operator action a daemon logs (queries.TOLD_ACTIONS)."""

    id: int
    who: str
    action: str
    job: str | None
    detail: str | None
    reason: str | None


@dataclass(frozen=True)
class BooksRound:
    """What one bookkeeping round read (PostgreSQL: one statement)."""

    sample: ClockSample
    live_others: int  # other hosts seen within ``within``
    serving_others: int  # ... of them, those whose host is not drained
    #: (host id, definitions JSON) of the other live hosts whose definitions
    #: differ from this host's.
    differing: list[tuple[str, str | None]]
    requested: list[str]  # jobs with a run-now request
    lost: list[LostRun]  # the dead runs this round recorded lost
    #: Operator actions daemons log (queries.TOLD_ACTIONS), audited after the
    #: round's ``audit_after``: (id, who, action, job, detail, reason).
    told: list[Told] = field(default_factory=list)
