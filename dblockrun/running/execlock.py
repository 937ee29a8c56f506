"""``dblockrun exec``: one command under a job's lock, in the foreground.

exec runs from crontabs, so its start is paid on every run: this module and
what it imports stay light. The lock engine's statements go over a direct
driver connection (sqlite3, psycopg or PyMySQL, no SQLAlchemy) for a plain
URL; a URL with options, a missing schema or SQLite file, and the rare calls
(``-v`` on a busy lock) go through :class:`~dblockrun.store.Store`.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from dblockrun.errors import DatabaseError
from dblockrun.events import Events
from dblockrun.jobs import Job
from dblockrun.printable import printable
from dblockrun.running import spawn
from dblockrun.running.heartbeat import Renewer
from dblockrun.running.holder import new_holder_id
from dblockrun.running.runjob import JobRun, RunContext, shell_status
from dblockrun.running.runlog import log_run
from dblockrun.running.runloop import RunLoop
from dblockrun.signals import handling
from dblockrun.store.models import bad_token_why, token_usable
from dblockrun.store.outage import Outage

if TYPE_CHECKING:
    from dblockrun.store.engine import LockEngine
    from dblockrun.store.models import Claimed
    from dblockrun.store.store import Store

log = logging.getLogger("dblockrun")

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


class ExecOptions(NamedTuple):
    """exec's options, parsed (a NamedTuple: as frozen as a dataclass, and
    about 2 ms less to create on each start)."""

    name: str
    argv: tuple[str, ...]
    lock_at_most: float = 3600.0
    lock_at_least: float = 0.0
    lease: float = 30.0
    heartbeat: float = 10.0
    busy_exit_code: int = 0
    verbose: bool = False


def exec_command(opts: ExecOptions, url: str, prefix: str) -> int:
    """All of ``dblockrun exec`` past its options; returns the exit status.

    The command line's: the process ends after it (it freezes the garbage
    collector's view of everything allocated so far).
    """
    from dblockrun.store.drivers import lock_wait_for

    target = ExecTarget(url, prefix, lock_wait_for(opts.lease))
    # Modules, classes and the connection live until the process ends: out of
    # the collector's way, the full collection at exit skips them (a tenth of
    # exec's CPU on SQLite). What the run allocates is collected as usual
    # (dblockrun.__main__ holds collections back until here).
    gc.freeze()
    gc.enable()
    try:
        return exec_locked(target, opts)
    finally:
        target.close()


class ExecTarget:
    """The database of an exec: the lock engine over a direct connection
    where the URL allows (``DBLOCKRUN_EXEC_DIRECT=0``: always the pool), and
    the full :class:`~dblockrun.store.Store` made on first need."""

    def __init__(self, url: str, prefix: str, lock_wait: float | None = None) -> None:
        """``lock_wait``: how long a statement waits for a row another
        session holds (None: store/drivers.py's default)."""
        from dblockrun.store.drivers import DEFAULT_LOCK_WAIT

        self.url = url
        self.prefix = prefix
        self.lock_wait = DEFAULT_LOCK_WAIT if lock_wait is None else lock_wait
        self._store: Store | None = None
        self.engine: LockEngine = self._direct() or self.store().lock_engine()

    def _direct(self) -> LockEngine | None:
        if os.environ.get("DBLOCKRUN_EXEC_DIRECT", "1") == "0" or not plain_prefix(self.prefix):
            return None
        from dblockrun.store.drivers import direct_driver

        driver = direct_driver(self.url, self.lock_wait)
        if driver is None:
            return None
        from dblockrun.store.engine import LockEngine
        from dblockrun.store.executor import DirectExecutor

        return LockEngine(DirectExecutor(driver), self.prefix)

    def store(self) -> Store:
        if self._store is None:
            from dblockrun.store import Store

            self._store = Store(self.url, self.prefix, lock_wait=self.lock_wait)
        return self._store

    def claim(self, name: str, holder: str, lease: float) -> Claimed | None:
        """The claim with its run record; a missing or older schema is made
        current through Store (which refuses a newer one), then claimed again."""
        from dblockrun.store.engine import Claim

        try:
            return self.engine.claim(name, holder, lease, Claim(record=True), ensure=True)
        except DatabaseError as exc:
            if exc.kind != "schema":
                raise
        self.store().ensure_schema()
        return self.engine.claim(name, holder, lease, Claim(record=True), ensure=True)

    def close(self) -> None:
        self.engine.close()
        if self._store is not None:
            self._store.close()


def plain_prefix(prefix: str) -> bool:
    """A table prefix the statements use unquoted (lower case, ``_``, digits)."""
    return re.fullmatch(r"[a-z_][a-z0-9_]*", prefix) is not None


def exec_locked(target: ExecTarget, opts: ExecOptions) -> int:
    """Run the command if the lock is free; returns the exit status to use."""
    holder = new_holder_id()
    sent = time.monotonic()
    won = target.claim(opts.name, holder, opts.lease)
    if won is None:
        if opts.verbose:
            paused = target.store().control.paused()
            if paused is not None:
                log.warning("lock %s: the fleet is paused (by %s%s); not running", opts.name,
                            paused.who, f": {paused.reason}" if paused.reason else "")
                return opts.busy_exit_code
            drained = target.store().drains.drained(holder.partition(":")[0])
            if drained is not None:
                log.warning("lock %s: this host (%s) is drained (by %s%s); not running",
                            opts.name, drained.host, drained.who,
                            f": {drained.reason}" if drained.reason else "")
                return opts.busy_exit_code
            lock = target.store().lock_state(opts.name)
            if lock is not None and not token_usable(lock.token):
                log.warning("lock %s is unusable: its fencing token is %s (a row edited "
                            "by hand); not running (repair: dblockrun unlock %s)",
                            opts.name, bad_token_why(lock.token), opts.name)
                return opts.busy_exit_code
            from dblockrun.running.holder import held_why
            from dblockrun.timetext import iso

            full = target.store()
            if lock is not None and lock.disabled_until is not None and (
                    lock.disabled_until > full.db_now()):
                why = f"disabled until {iso(lock.disabled_until)}" + (
                    f" ({lock.disabled_reason})" if lock.disabled_reason else "")
            else:  # a run going, or its lock kept after it (lock-at-least) ...
                why = held_why(full, opts.name) or (
                    f"busy (holder {lock.holder if lock else '?'})")
            log.warning("lock %s is %s; not running", opts.name, why)
        return opts.busy_exit_code
    store = target.engine
    token = won.token
    outage = Outage()
    renewer = Renewer(store, opts.heartbeat, outage)
    stop = threading.Event()
    events = Events()  # the run's log lines; exec sends no notifications or pings
    events.subscribe(log_run)
    ctx = RunContext(store=store, holder=holder, lease=opts.lease, kill_grace=5.0,
                     renewer=renewer, outage=outage, stop=stop, stop_grace=lambda: None,
                     loop=RunLoop(stop), events=events)
    job = Job(name=opts.name, command=opts.argv, lock_at_most=opts.lock_at_most,
              lock_at_least=opts.lock_at_least)
    pgid: list[int] = []

    def forward(signum: int) -> None:
        if pgid:
            try:
                os.killpg(pgid[0], signum)
            except ProcessLookupError:
                pass

    def passthrough(line: bytes) -> None:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()

    def passthrough_err(line: bytes) -> None:  # the command's stderr stays stderr
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()

    # exec has no thread yet: its spawn service is a fork of itself.
    spawn.start(fork=True)
    run = JobRun(ctx, job, token, None, sent, line_sink=passthrough, on_start=pgid.append,
                 run_id=won.run_id, err_sink=passthrough_err)
    renewer.start()
    try:
        with handling({sig: forward for sig in FORWARDED}):
            run.run()
    finally:
        renewer.stop()
    outcome = run.last_outcome
    if outcome is None:
        # Said whatever the log level (exec logs errors only): it exits 1 with
        # nothing run, which silence would leave a mystery.
        sys.stderr.write(f"dblockrun: the command was not started: "
                         f"{run.not_started or 'the run ended first'}\n")
        sys.stderr.flush()
        return 1
    status = shell_status(outcome.exit_code)
    if outcome.reason == "error":
        log.error("%s", outcome.detail)
        return 127
    if outcome.reason != "exit":
        # Stopped by dblockrun, not ended by itself: its 143 (or 137) needs a word.
        from dblockrun.durations import format_duration

        why = (f"it reached --lock-at-most {format_duration(opts.lock_at_most)}"
               if outcome.reason == "timeout" else outcome.detail)
        sys.stderr.write(f"dblockrun: stopped the command: {printable(why)}\n")
        sys.stderr.flush()
    return 1 if status is None else status
