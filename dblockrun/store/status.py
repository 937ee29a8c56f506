"""What ``dblockrun status`` reads: a fixed number of statements, whatever the
number of jobs.

1. the lock rows, with the database clock (and the groups' seat rows,
   dblockrun/scheduling/limits.py, which are not jobs);
2. each job's last finished run and its current run (UNION ALL of a
   correlated ``ORDER BY id DESC LIMIT 1`` and a join on the token), the
   runs an ``overlap: allow N`` job's lanes hold, and the runs running per
   host (what the hosts' ``running`` shows: read with the jobs' runs, in
   the same statement, so the two agree);
3. each fan-out job's item counts (GROUP BY job);
4. the live hosts (:meth:`Store.hosts`), each with the runs running on it
   from statement 2 (not the count its daemon last published: up to a
   heartbeat old);
5. the fleet-wide pause (store/control.py): the one in effect, or the last
   one, whose end tells the slot it dropped from a job that looks due.

``status --check`` reads one more when a job's last record is a passed slot
(:func:`passed_since`), and looks whether another session holds the lock
rows (:func:`held_rows`: one statement).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.store import models as m
from dblockrun.store.cold import ColdPath
from dblockrun.store.control import Pause
from dblockrun.store.models import SEAT_PREFIX, GroupUsage, SeatRow

if TYPE_CHECKING:
    from dblockrun.store.control import ControlStore
    from dblockrun.store.drain import DrainStore

class StatusSource(ColdPath, Protocol):
    """What status reads of the store beside its own statements (the
    store's: :class:`~dblockrun.store.store.Store`)."""

    @property
    def control(self) -> ControlStore:
        """The pause (store/control.py)."""

    @property
    def drains(self) -> DrainStore:
        """The drained hosts (store/drain.py)."""

    def live_hosts(self, within: float | None = None) -> list[m.HostStatus]:
        """The live daemons' host rows."""

    def host_fields(self, ids: list[str]) -> dict[str, str | None]:
        """Their keys' digests (read where drift is found)."""

    def run(self, run_id: int) -> m.RunRecord | None:
        """One run's record, with its output."""


#: A daemon is *live* while its host row is at most :func:`live_window` of
#: its ``--heartbeat`` old. A row without one (a daemon older than schema 6)
#: is live this long: one and a half default heartbeats (10 s).
LIVE_WITHIN = 15.0
#: A daemon writes its host row every this many heartbeats (its bookkeeping
#: round, dblockrun/daemon/fleet.py).
ROUND_EVERY = 1.2
#: How much later than a round a row may be and still be live: this many
#: heartbeats, and at least :data:`LIVE_SLACK` seconds (a loaded host's round
#: is late by a database round trip or a scheduler's hiccup, whatever its
#: heartbeat).
LIVE_HEARTBEATS = 1.5
LIVE_SLACK = 3.0


def live_window(heartbeat: float | None) -> float:
    """How old a daemon's host row may be for it to be live: 1.5 of its
    heartbeats, at least a heartbeat and 3 s (15 s at the default 10 s, 4 s
    at 1 s, 90 s at 60 s); :data:`LIVE_WITHIN` for a row with none."""
    if heartbeat is None:
        return LIVE_WITHIN
    return max(LIVE_HEARTBEATS * heartbeat, heartbeat + LIVE_SLACK)


def live_window_sql(heartbeat: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
    """:func:`live_window` of a host row's ``heartbeat`` column, in SQL
    (the same CASE on the three databases)."""
    turn = LIVE_SLACK / (LIVE_HEARTBEATS - 1.0)  # where 1.5 heartbeats pass one + 3 s
    return sa.case((heartbeat.is_(None), sa.literal(LIVE_WITHIN)),
                   (heartbeat >= turn, heartbeat * LIVE_HEARTBEATS),
                   else_=heartbeat + LIVE_SLACK)


_ITEM_COUNTS = ("total", "done", "running", "waiting", "failed")

#: Lock columns status shows (a LockState; not the lease bookkeeping): on
#: MariaDB, PyMySQL decodes every value in Python.
_LOCK_COLUMNS = ("name", "holder", "lock_until", "locked_at", "token", "last_slot",
                 "last_start", "next_due", "disabled_until", "disabled_reason", "disabled_by",
                 "held_for", "run_requested")


@dataclass(frozen=True)
class StatusReport:
    """Everything ``status`` shows, read at one database time."""

    jobs: list[m.JobStatus]
    #: Hosts whose last heartbeat is at most ``live_within`` old.
    hosts: list[m.HostStatus]
    db_now: float
    #: ``--live-within``; None: each host by its own heartbeat (:func:`live_window`).
    live_within: float | None
    #: The fleet-wide pause in effect (``dblockrun pause``), if any.
    paused: Pause | None = None
    #: The groups' seats in use (all jobs shown only).
    groups: list[GroupUsage] = field(default_factory=list)


def report(store: StatusSource, names: Sequence[str] | None = None,
           live_within: float | None = None) -> StatusReport:
    """Jobs (all, or ``names``), live hosts (seen within ``live_within``;
    None: each by its own heartbeat), the groups' seats (read with the
    jobs), the pause and, with live hosts, their drains: five statements,
    six with live hosts (seven when live hosts define a job
    differently: their keys' digests, to name the keys that differ)."""
    jobs, seats, db_now, running = _read(store, names)
    # Each host's runs as the jobs' states read them (statement 2), not the
    # count its daemon published at its last round (a heartbeat old: a run
    # started since would show `running on` a host that `runs 0`).
    hosts = [replace(h, running=running.get(h.id, 0))
             for h in store.live_hosts(live_within)]
    drifting = {h for defs in m.definitions(hosts).values() if len(defs) > 1
                for ids in defs.values() for h in ids}
    if drifting:  # the keys that differ: those hosts' field digests (one more statement)
        fields = store.host_fields(sorted(drifting))
        hosts = [replace(h, fields=fields.get(h.id)) if h.id in drifting else h for h in hosts]
    if hosts:  # (a drain is shown on its live host's row: none, no statement)
        hosts = with_drains(hosts, store.drains.current())
    pause = store.control.last_pause()
    if pause is not None and pause.ends <= db_now:
        jobs = [_dropped(s, pause) for s in jobs]
        pause = None
    return StatusReport(jobs=jobs, hosts=hosts, db_now=db_now, live_within=live_within,
                        paused=pause, groups=_group_usage(seats, db_now))


def running_per_host(store: StatusSource) -> dict[str, int]:
    """The runs running on each host, by its holder id, as ``status``
    counts them (one statement, through the result index): for a page that
    lists the hosts without :func:`report`."""
    runs = store.t.runs
    stmt = _per_host(runs, runs.c.host, sa.func.count())
    return store._run(lambda c: {str(h): int(n) for h, n in c.execute(stmt)})


def _per_host(runs: sa.Table, *columns: sa.ColumnElement[Any]) -> sa.Select[Any]:
    """``columns`` per host of the runs running (``status``'s count)."""
    return sa.select(*columns).where(runs.c.result == m.RUNNING).group_by(runs.c.host)


def host_name(h: m.HostStatus) -> str:
    """A daemon's host name, as ``dblockrun drain`` names it: its
    ``hostname`` label (dblockrun/scheduling/targeting.py), else its row's."""
    import json

    try:
        labels = json.loads(h.labels or "{}")
    except ValueError:
        labels = {}
    name = labels.get("hostname") if isinstance(labels, dict) else None
    return name if isinstance(name, str) and name else h.hostname


def with_drains(hosts: list[m.HostStatus], drains: Sequence[m.Drain]) -> list[m.HostStatus]:
    """``hosts``, each with its host's drain in effect (``dblockrun drain``)."""
    by_host = {d.host: d for d in drains}
    if not by_host:
        return hosts
    return [replace(h, drain=by_host.get(host_name(h))) for h in hosts]


def _dropped(s: m.JobStatus, pause: Pause) -> m.JobStatus:
    """``s``, with the slot it looks due at marked dropped when the ended
    ``pause`` dropped it (its daemons tried it while paused and planned the
    next; the next claim publishes that one). A slot due up to one period
    before the pause began counts too when it never started: a daemon a
    moment late tried it after the pause had begun."""
    due, last = s.lock.next_due, s.lock.last_start
    if due is None or due >= pause.ends or due > s.db_now:
        return s
    period = due - last if last is not None and last < due else 0.0
    if due < pause.since - period:
        return s
    return replace(s, dropped=due, resumed=pause.ends)


def held_rows(store: StatusSource) -> str | None:
    """Whether another session holds the lock rows past the connection's
    lock wait (a reader's ``SELECT ... FOR UPDATE`` left open: every
    renewal, claim and bookkeeping round waits on it): why, naming that
    session where it can be seen, else None. One locking read of the lock
    rows (store/queries.py ``held_probe``), which waits at most the store's
    lock wait; not looked at on SQLite, through a connection pooler (whose
    connections carry no lock wait) or for a role that may not lock rows
    (PostgreSQL: UPDATE is needed)."""
    from dblockrun.errors import DatabaseError

    engine = store.lock_engine()
    probe = engine.q.held_probe
    if probe is None or store.pooler is not None:
        return None
    try:
        store.x.run(lambda cur: store.x.send(cur, probe).fetchall())
    except DatabaseError as exc:
        if exc.kind == "lock-held":
            return exc.message
        if exc.kind == "refused":
            return None
        raise
    return None


@dataclass(frozen=True)
class PassedSince:
    """A job whose newest records are passed slots (``missed``,
    ``skipped``): since when (the first slot they stand for), how many
    records, and the newest of them, with its output (why)."""

    since: float
    records: int
    newest: m.RunRecord


def passed_since(store: StatusSource, jobs: Sequence[m.JobStatus]) -> dict[str, PassedSince]:
    """Of ``jobs``, those whose last record is a passed slot: since when
    their slots are recorded passed (after their last other record). One
    statement, and one per such job for the newest record's output."""
    names = [s.lock.name for s in jobs
             if s.last_run is not None and s.last_run.result in m.PASSED]
    if not names:
        return {}
    runs = store.t.runs
    other = runs.alias("other")
    last_other = (sa.select(sa.func.max(other.c.id))
                  .where(other.c.job == runs.c.job, other.c.result.not_in(m.PASSED))
                  .scalar_subquery())
    stmt = (sa.select(runs.c.job, sa.func.min(sa.func.coalesce(runs.c.covers_from, runs.c.slot,
                                                                runs.c.started)),
                      sa.func.count(), sa.func.max(runs.c.id))
            .where(runs.c.job.in_(names), runs.c.result.in_(m.PASSED),
                   runs.c.id > sa.func.coalesce(last_other, 0))
            .group_by(runs.c.job))
    found: dict[str, PassedSince] = {}
    for job, since, count, newest in store._run(lambda c: c.execute(stmt).all()):
        record = store.run(int(newest))
        if record is not None:
            found[str(job)] = PassedSince(float(since), int(count), record)
    return found


def _group_usage(rows: Sequence[SeatRow], db_now: float) -> list[GroupUsage]:
    """Each group's seats in use at ``db_now``, by group name."""
    groups: dict[str, GroupUsage] = {}
    for row in sorted(rows, key=lambda r: r.name):
        group = row.name[len(SEAT_PREFIX):].rpartition(":")[0]
        got = groups.setdefault(group, GroupUsage(group, 0, []))
        groups[group] = got = GroupUsage(group, got.seats + 1, got.held)
        if row.holder is not None and row.lock_until is not None and row.lock_until > db_now:
            got.held.append((row.held_for or "?", row.holder))
    return [groups[g] for g in sorted(groups)]


def _read(store: StatusSource, names: Sequence[str] | None
          ) -> tuple[list[m.JobStatus], list[SeatRow], float, dict[str, int]]:
    """The jobs (all, or ``names``), ordered by name, the seat rows, the
    database time and the runs running per host (all jobs'): statements 1
    to 3."""
    wanted = list(dict.fromkeys(names)) if names else None
    jobs_stmt = _jobs_statement(store, wanted)
    runs_stmt = _runs_statement(store, wanted)
    items_stmt = _items_statement(store, wanted)

    def go(conn: Connection) -> tuple[list[m.JobStatus], list[SeatRow], float, dict[str, int]]:
        rows = conn.execute(jobs_stmt).mappings().all()
        db_now = float(rows[0]["db_now"])
        seats = [SeatRow(str(r["name"]), r["held_for"], r["holder"],
                         None if r["lock_until"] is None else float(r["lock_until"]))
                 for r in rows if r["name"] is not None and r["name"].startswith(SEAT_PREFIX)]
        locks = [r for r in rows if r["name"] is not None and m.is_job_row(r["name"])]
        last: dict[str, m.RunRecord] = {}
        running: dict[str, m.RunRecord] = {}
        lane_runs: dict[str, dict[int, m.RunRecord]] = {}
        counts: dict[str, dict[str, int]] = {}
        per_host: dict[str, int] = {}
        if locks:  # (no job row: no run goes on anywhere)
            for r in conn.execute(runs_stmt).all():
                if r._mapping["lane"] == _PER_HOST:
                    per_host[str(r._mapping["host"])] = int(r._mapping["id"])
                    continue
                run = m.from_row(m.RunRecord, r._mapping)
                if r._mapping["lane"]:
                    lane_runs.setdefault(run.job, {})[run.id] = run
                elif run.result not in m.UNFINISHED:
                    last[run.job] = run
                elif run.job not in running or running[run.job].id < run.id:
                    running[run.job] = run  # the newest attempt
            for r in conn.execute(items_stmt):
                counts[r[0]] = {k: int(v or 0) for k, v in zip(_ITEM_COUNTS, r[1:], strict=True)}
        out = []
        for row in locks:
            lock = m.from_row(m.LockState, row)
            out.append(m.JobStatus(lock=lock, last_run=last.get(lock.name),
                                   running=running.get(lock.name), db_now=db_now,
                                   items=counts.get(lock.name),
                                   lane_runs=tuple(sorted(lane_runs.get(lock.name, {}).values(),
                                                          key=lambda run: run.id))))
        return out, seats, db_now, per_host

    return store._run(go)


def lock_rows(store: StatusSource, conn: Connection) -> tuple[dict[str, m.LockState], float]:
    """Every lock row by name, and the database time (statement 1 alone)."""
    rows = conn.execute(_jobs_statement(store, None)).mappings().all()
    locks = {str(r["name"]): m.from_row(m.LockState, r) for r in rows if r["name"] is not None}
    return locks, float(rows[0]["db_now"])


def _jobs_statement(store: StatusSource, names: list[str] | None) -> sa.Select[Any]:
    """The lock rows with the database time; one row with only ``db_now``
    when there is no job, so the time is read in any case."""
    locks = store.t.locks
    on = locks.c.name.in_(names) if names else sa.literal(1) == 1
    one = sa.select(sa.literal(1).label("one")).subquery("one_row")
    return (sa.select(store.now.label("db_now"), *(locks.c[c] for c in _LOCK_COLUMNS))
            .select_from(one.outerjoin(locks, on)).order_by(locks.c.name))


def _items_statement(store: StatusSource, names: list[str] | None) -> sa.Select[Any]:
    """Per fan-out job: total, done, running, waiting, failed live items."""
    locks, items = store.t.locks, store.t.items
    # Each live item in one category, as operators read them: running (its
    # lease held by a running attempt), waiting (not yet run in the job's
    # current slot), failed (its last run failed), done.
    category = sa.case(
        (sa.and_(items.c.lock_until > store.now, items.c.last_result == m.RUNNING), "running"),
        (sa.and_(locks.c.last_slot.is_not(None),
                 sa.or_(items.c.last_slot.is_(None), items.c.last_slot < locks.c.last_slot)),
         "waiting"),
        (items.c.last_result == m.FAILED, "failed"),
        else_="done",
    ).label("category")
    per_item = (
        sa.select(items.c.job, category)
        .select_from(items.join(locks, locks.c.name == items.c.job))
        .where(items.c.retired == sa.false())
    )
    if names:
        per_item = per_item.where(items.c.job.in_(names))
    cat = per_item.subquery("item_category")

    def count(name: str) -> sa.ColumnElement[Any]:
        return sa.func.sum(sa.case((cat.c.category == name, 1), else_=0)).label(name)

    return (sa.select(cat.c.job, sa.func.count().label("total"),
                      *(count(k) for k in _ITEM_COUNTS[1:]))
            .group_by(cat.c.job))


#: The runs statement's rows that are no run: a host (``host``) and how many
#: runs are running on it (``id``).
_PER_HOST = 2

#: Run columns status shows (not the stored output).
_RUN_COLUMNS = ("id", "job", "item", "host", "slot", "token", "attempt", "started", "finished",
                "exit_code", "result")


def _runs_statement(store: StatusSource, names: list[str] | None) -> sa.CompoundSelect[Any]:
    """Per job, the newest finished run (a correlated ``ORDER BY id DESC
    LIMIT 1`` on the (job, id) index: the cost follows the number of jobs, not
    the history kept), and the runs still running under the job's current
    token (few: found through the result index). A window over all runs took
    0.37 s on MariaDB with 5 runs per job, and grows with every run kept.

    And, whatever ``names``, one row per host with runs running (``lane``
    :data:`_PER_HOST`; the count in ``id``), through the result index too:
    the hosts' ``running`` read in the same statement as the jobs' runs, so
    a job shown running on a host is counted on it (a fan-out's items and
    a lane's runs each count, as its daemon's ``--max-running`` does)."""
    runs, locks = store.t.runs, store.t.locks
    # A waiting slot's record says what it waits for (a seat, room on its host).
    columns = [*(runs.c[c] for c in _RUN_COLUMNS),
               sa.case((runs.c.result == m.WAITING, runs.c.output)).label("output")]
    r = runs.alias("newest")
    last_id = (sa.select(r.c.id).where(r.c.job == locks.c.name, r.c.result.not_in(m.UNFINISHED))
               .order_by(r.c.id.desc()).limit(1).scalar_subquery())
    last = sa.select(*columns, sa.literal(0).label("lane")).select_from(
        locks.join(runs, runs.c.id == last_id))
    running = sa.select(*columns, sa.literal(0).label("lane")).select_from(locks.join(
        runs, sa.and_(runs.c.job == locks.c.name, runs.c.token == locks.c.token))
    ).where(runs.c.result.in_(m.UNFINISHED))
    # overlap: allow N: the runs its lanes hold (dblockrun/scheduling/limits.py).
    lanes = sa.select(*columns, sa.literal(1).label("lane")).select_from(locks.join(
        runs, sa.and_(runs.c.job == locks.c.held_for, runs.c.token == locks.c.token))
    ).where(runs.c.result == m.RUNNING, runs.c.item.is_(None), locks.c.lock_until > store.now,
            sa.func.substr(locks.c.name, 1, len(m.LANE_PREFIX)) == m.LANE_PREFIX)
    per_host = _per_host(runs, *((sa.func.count() if c == "id" else runs.c.host if c == "host"
                                  else sa.null()).label(c) for c in _RUN_COLUMNS),
                         sa.null().label("output"), sa.literal(_PER_HOST).label("lane"))
    if names:
        last = last.where(locks.c.name.in_(names))
        running = running.where(locks.c.name.in_(names))
        lanes = lanes.where(runs.c.job.in_(names))
    return sa.union_all(last, running, lanes, per_host)
