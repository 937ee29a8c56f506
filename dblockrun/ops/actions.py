"""Operator actions: which database they act on, and those that take more
than one store call.

Operator commands never create a database by accident: ``status``,
``history`` and ``audit`` (READ) never create a file or a table, and
``disable``, ``enable``, ``run``, ``unlock``, ``kill``, ``pause`` and
``resume`` (WRITE) act only on a database that has dblockrun's tables and
only on jobs it knows. Only ``init-db``, ``disable
--create``, ``exec`` and the daemon (CREATE) create what is missing.
"""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from dblockrun.errors import DblockrunError, UsageError
from dblockrun.store import Store
from dblockrun.store.control import Audit
from dblockrun.store.dburl import default_url, describe, missing_sqlite_file
from dblockrun.store.models import (
    OK,
    UNFINISHED,
    Disabled,
    HostStatus,
    RunRecord,
    jobs_known,
)

if TYPE_CHECKING:
    from dblockrun.store.roles import Control, StatusReading


class Access(enum.Enum):
    #: Never create a file or a table; the schema must be this version.
    READ = "read"
    #: The schema must exist (an older one is migrated); nothing else is created.
    WRITE = "write"
    #: Create the SQLite file and the schema if missing.
    CREATE = "create"


class NoDatabase(DblockrunError):
    """The database has no dblockrun tables."""


def open_store(url: str, prefix: str, access: Access, lock_wait: float | None = None) -> Store:
    """A Store on ``url`` for an operator command; :class:`NoDatabase` when
    ``access`` forbids creating what is missing. ``lock_wait``: how long a
    statement waits for a row another session holds (None: as a holder of
    the default lease)."""
    from dblockrun.store.drivers import DEFAULT_LOCK_WAIT
    from dblockrun.store.schema import SCHEMA_VERSION

    where = describe(url, prefix)
    advice = "start a daemon on it or run `dblockrun init-db`"
    if url == default_url():
        advice = ("nothing names a database: give --db, or a jobs file with `database:` "
                  "(-f, DBLOCKRUN_JOBS, /etc/dblockrun/jobs.yaml)")
    if access is not Access.CREATE:
        why = missing_sqlite_file(url)
        if why is not None:
            raise NoDatabase(f"no dblockrun database at {where}: {why}; {advice}")
    store = Store(url, prefix, create=access is not Access.READ,
                  lock_wait=DEFAULT_LOCK_WAIT if lock_wait is None else lock_wait)
    if access is Access.CREATE:
        return store
    try:
        version = store.schema_version()
        if version is None:
            raise NoDatabase(f"the database {where} has no dblockrun tables; {advice}")
        if access is Access.READ and version < SCHEMA_VERSION:
            raise NoDatabase(
                f"the dblockrun tables in {where} are schema version {version}, this "
                f"dblockrun reads version {SCHEMA_VERSION}: run `dblockrun init-db` "
                "(or start a daemon) to upgrade them"
            )
    except BaseException:
        store.close()
        raise
    return store


def no_such_job(store: StatusReading, names: list[str], hint: str = "") -> UsageError:
    """The error of every operator command given a job the database does not
    know, suggesting the names it knows that are close (a typo)."""
    import difflib

    known = store.job_names()
    close = list(dict.fromkeys(match for name in names
                               for match in difflib.get_close_matches(name, known, n=3)))
    guess = f" (did you mean {' or '.join(close)}?)" if close else ""
    files = [name for name in names if name.endswith((".yaml", ".yml"))]
    if files and not close:
        # `dblockrun status jobs.yaml`: the jobs file is an option here.
        guess = f" (a jobs file is named with -f: dblockrun -f {files[0]} ...)"
    return UsageError(f"no such job in {describe(store.url, store.prefix)}: "
                      f"{', '.join(names)}{guess}{hint}")


def require_job(store: StatusReading, job: str, hint: str = "") -> None:
    """UsageError unless the database knows ``job`` (has its lock row)."""
    if store.lock_state(job) is None:
        raise no_such_job(store, [job], hint)


def disable_job(store: Control, job: str, *, for_seconds: float | None,
                until: float | None, reason: str | None, audit: Audit,
                create: bool = False) -> Disabled:
    """``dblockrun disable``: a job the database knows (or any, ``create``),
    until a time that has not passed on the database clock."""
    if not create:
        require_job(store, job, " (--create to disable it before a daemon has loaded it)")
    if until is not None:
        now = store.db_now()
        if until <= now:
            from dblockrun.timetext import iso

            raise UsageError(f"--until {iso(until)} has passed (the database's clock reads "
                             f"{iso(now)}): nothing would be disabled")
    return store.disable(job, for_seconds=for_seconds, until=until, reason=reason, audit=audit)


def enable_job(store: Control, job: str, audit: Audit) -> bool:
    """``dblockrun enable``: True if a disable was cleared (and audited),
    False if the job was not disabled (nothing recorded)."""
    cleared = store.enable(job, audit)
    if cleared is None:
        raise no_such_job(store, [job])
    return cleared


def forget_job(store: Control, job: str, audit: Audit) -> tuple[int, int]:
    """``dblockrun forget``: delete the rows of ``job`` (and of its every-host
    rows ``job@HOST``; or the one row ``JOB@HOST``), its items and its runs,
    when no live daemon defines it: an ``exec`` one-off, a job deleted from
    the file, a renamed host's every-host row. (lock rows, runs) deleted."""
    from dblockrun.jobs import EVERY_HOST_SEP
    from dblockrun.scheduling.targeting import HOSTNAME, loads_labels

    require_job(store, job)
    base, _sep, on_host = job.partition(EVERY_HOST_SEP)
    for host in store.live_hosts():
        known = jobs_known([host])
        if known is None:
            raise UsageError(f"live daemon {host.id} does not say which jobs it has (an older "
                             f"version?): cannot tell whether it defines {base}")
        name = loads_labels(host.labels).get(HOSTNAME, host.hostname)
        if base in {k.split(EVERY_HOST_SEP, 1)[0] for k in known} and (
                not on_host or name == on_host):
            raise UsageError(f"live daemon {host.id} has {base} in its jobs file: forget is "
                             "for jobs no live daemon defines (remove it from the file and "
                             "reload first)")
    rows = [job] if on_host else store.with_every_host([job])
    done = store.forget(rows, audit)
    if done is None:
        raise DblockrunError(f"{job} is held (a run may be going on): wait for it to end, "
                             f"or `dblockrun kill {job}`, then forget it")
    return done


def _with_reason(store: StatusReading, run: RunRecord) -> RunRecord:
    """A run not started (``skipped``) with its output, which says why (the
    history is read without outputs)."""
    if run.result != "skipped":
        return run
    return store.run(run.id) or run


#: How often ``run`` looks whether its run started, and ``run --wait`` whether it ended.
POLL = 0.1
WAIT_POLL = 0.5


class NotStarted(DblockrunError):
    """No daemon started the requested run: the request stays filed."""


def _filed(job: str, why: str) -> NotStarted:
    return NotStarted(f"{job}: {why}; the request stays filed (`dblockrun run {job} "
                      "--cancel` withdraws it)")


def not_now(store: StatusReading, job: str, hosts: list[HostStatus]) -> str | None:
    """Why no daemon starts ``job`` now, known without waiting: the fleet is
    paused, no daemon is live (``hosts``: the live ones), or no live daemon's
    file has the job."""
    from dblockrun.jobs import EVERY_HOST_SEP
    from dblockrun.ops.output import live_text

    paused = store.control.paused()
    if paused is not None:
        reason = f": {paused.reason}" if paused.reason else ""
        return (f"the fleet is paused (by {paused.who}{reason}); it starts after "
                "`dblockrun resume`")
    if not hosts:
        return (f"no daemon is live (none sent {live_text(None)}); it starts once one "
                f"that has {job} is")
    known = jobs_known(hosts)
    base = job.split(EVERY_HOST_SEP, 1)[0]  # every-host rows: JOB@HOST, on HOST only
    if known is not None and base not in {name.split(EVERY_HOST_SEP, 1)[0] for name in known}:
        return (f"no live daemon has {base} in its jobs file; it starts once one that "
                "has it is live")
    return None


def _busy(store: StatusReading, row: str) -> str | None:
    """Why ``row`` has not started yet when its lock is held: the run holding it."""
    from dblockrun.running.holder import held_why

    why = held_why(store, row)
    if why is None:
        return None
    return f"{row} is {why}" + ("; it starts when that run ends" if why.startswith("busy: ")
                                else "")


def request_run(store: Control, job: str, wait: float | None, audit: Audit | None = None,
                hosts: list[HostStatus] | None = None) -> RunRecord | None:
    """File a run-now request for ``job`` (recording the operator's
    ``audit``); with ``wait``, return the run a daemon started for it, or
    raise :class:`NotStarted` saying why none did: at once when no daemon
    can start it now (:func:`not_now`; ``hosts``: the live ones, if read),
    else after ``wait``."""
    before = store.lock_state(job)
    if before is None:
        raise no_such_job(store, [job], " (has a daemon loaded it?)")
    if before.disabled_until is not None and before.disabled_until > store.db_now():
        raise UsageError(f"{job} is disabled; `dblockrun enable {job}` first")
    store.request_run(job, audit)
    if wait is None:
        return None
    live = store.live_hosts() if hosts is None else hosts
    if (why := not_now(store, job, live)) is not None:
        raise _filed(job, why)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = store.lock_state(job)
        if state is not None and state.token > before.token:
            for run in store.history(job, 5, output=False):
                if run.token == state.token:
                    return _with_reason(store, run)
        time.sleep(POLL)
    busy = _busy(store, job)
    raise _filed(job, busy or f"no daemon started it within {wait:g}s (is a daemon with this "
                 "job enabled in its jobs file running?)")


def request_runs(store: Control, job: str, wait: float | None,
                 audit: Audit | None = None) -> list[tuple[str, RunRecord | None]] | None:
    """``dblockrun run JOB``: (row, the run started for it, or None if none
    did in time) per lock row asked to run; None with no ``wait``. An
    every-host job: its row on every live host (dblockrun/scheduling/targeting.py), each
    run there; else :func:`request_run`. With ``wait``, what keeps every
    daemon from starting it now (a pause, no live daemon) raises
    :class:`NotStarted` at once, the request filed."""
    from dblockrun.scheduling.targeting import (
        HOSTNAME,
        describe,
        loads_labels,
        loads_targets,
        matches,
        row_name,
    )
    hosts = store.live_hosts()
    for host in hosts:  # the job's run-on, as the live hosts' files have it
        run_on, _every = loads_targets(host.targets).get(job, ((), False))
        if run_on and not any(matches(loads_labels(h.labels), run_on) for h in hosts):
            raise UsageError(f"no live host matches run-on {describe(run_on)} of {job}: "
                             "no daemon would run it")
    rows = store.with_every_host([job])[1:]
    if not rows:
        run = request_run(store, job, wait, audit, hosts)
        return None if run is None else [(job, run)]

    base = store.lock_state(job)
    if base is not None and base.disabled_until is not None and (
            base.disabled_until > store.db_now()):
        raise UsageError(f"{job} is disabled; `dblockrun enable {job}` first")
    live = {loads_labels(h.labels).get(HOSTNAME) for h in hosts}
    rows = [row for row in rows if any(row == row_name(job, h) for h in live if h)]
    if not rows:
        raise DblockrunError(f"{job} runs on every host, and no live host has run it "
                             f"(no {job}@HOST row of a live host)")
    before = {row: store.lock_state(row) for row in rows}
    for i, row in enumerate(rows):  # the operator's action is recorded once
        store.request_run(row, audit if i == 0 else None)
    if wait is None:
        return None
    if (why := not_now(store, job, hosts)) is not None:
        raise _filed(job, why)
    started: dict[str, RunRecord] = {}
    deadline = time.monotonic() + wait
    while len(started) < len(rows) and time.monotonic() < deadline:
        for row in rows:
            state, old = store.lock_state(row), before[row]
            if row in started or state is None or old is None or state.token <= old.token:
                continue
            for run in store.history(row, 5, output=False):
                if run.job == row and run.token == state.token:
                    started[row] = _with_reason(store, run)
        time.sleep(POLL)
    return [(row, started.get(row)) for row in rows]


def wait_for_ends(store: StatusReading, runs: list[RunRecord], until: float | None = None,
                  poll: float = WAIT_POLL) -> dict[int, RunRecord]:
    """The runs as they ended, by id (``run --wait``, ``kill --timeout``):
    polled until all ended or ``until`` (monotonic; None: no end; Ctrl-C
    stops waiting). The ones still running then are missing."""
    ended: dict[int, RunRecord] = {}
    while True:
        for run in runs:
            if run.id not in ended:
                now = store.run(run.id)
                if now is None or now.result not in UNFINISHED:
                    ended[run.id] = now or run
        if len(ended) == len(runs) or (until is not None and time.monotonic() >= until):
            return ended
        time.sleep(poll)


def exit_status(run: RunRecord) -> int:
    """``run --wait``'s exit status for a run that ended: 0 if ok, its
    command's exit status if it failed with one, else 1."""
    if run.result == OK:
        return 0
    return run.exit_code if run.exit_code is not None and 0 < run.exit_code < 256 else 1
