"""``dblockrun exec``: one command under a job's lock, in the foreground.

exec runs from crontabs, so its start is paid on every run: this module and
what it imports stay light (no click, no SQLAlchemy unless the lean store
cannot serve).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, NamedTuple

from dblockrun.heartbeat import Renewer
from dblockrun.holder import new_holder_id
from dblockrun.jobs import Job
from dblockrun.outage import Outage
from dblockrun.runjob import JobRun, RunContext, exit_status
from dblockrun.signals import handling

if TYPE_CHECKING:
    from dblockrun.store.base import RunStore

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
    """All of ``dblockrun exec`` past its options: the lean store when it can
    serve (the driver alone), else Store; returns the exit status to use.

    The command line's: the process ends after it (it freezes the garbage
    collector's view of everything allocated so far).
    """
    store: RunStore | None = None
    if os.environ.get("DBLOCKRUN_EXEC_LEAN", "1") != "0":  # 0: always through SQLAlchemy
        from dblockrun.store.lean import open_lean

        store = open_lean(url, prefix)
    if store is None:
        from dblockrun.store import Store

        store = Store(url, prefix)
    # Modules, classes and the connection live until the process ends: out of
    # the collector's way, the full collection at exit skips them (a tenth of
    # exec's CPU on SQLite). What the run allocates is collected as usual
    # (dblockrun.__main__ holds collections back until here).
    gc.freeze()
    gc.enable()
    try:
        return exec_locked(store, opts)
    finally:
        store.close()


def exec_locked(store: RunStore, opts: ExecOptions) -> int:
    """Run the command if the lock is free; returns the exit status to use."""
    holder = new_holder_id()
    store.ensure_jobs([opts.name])
    sent = time.monotonic()
    token = store.claim(opts.name, holder, opts.lease)
    if token is None:
        if opts.verbose:
            lock = store.lock_state(opts.name)
            why = "busy"
            if lock is not None and lock.disabled_until is not None:
                why = "busy or disabled"
            log.warning("lock %s is %s (holder %s); not running", opts.name, why,
                        lock.holder if lock else "?")
        return opts.busy_exit_code
    outage = Outage()
    renewer = Renewer(store, opts.heartbeat, outage)
    ctx = RunContext(store=store, holder=holder, lease=opts.lease, kill_grace=5.0,
                     renewer=renewer, outage=outage, stop=threading.Event(),
                     stop_grace=lambda: None)
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

    run = JobRun(ctx, job, token, None, sent, line_sink=passthrough, on_start=pgid.append)
    renewer.start()
    try:
        with handling({sig: forward for sig in FORWARDED}):
            run.run()
    finally:
        renewer.stop()
    outcome = run.last_outcome
    if outcome is None:
        return 1
    status = exit_status(outcome.exit_code)
    if outcome.reason == "error":
        log.error("%s", outcome.detail)
        return 127
    return 1 if status is None else status
