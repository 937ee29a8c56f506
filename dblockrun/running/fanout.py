"""Fan-out jobs: one row per work item, worked through by every host.

Per slot (cron) or rate window: the host that wins the job's own lock
refreshes the item list (``items:`` or the output of ``items-command``) and
frees the lock again; then every host claims due items with SKIP LOCKED, up
to ``parallel`` invocations at once (and within ``--max-running``), ``batch``
items per invocation. Each item has its own lock, lease, fencing token and
run record.

Nothing here has a thread of its own: the steps are taken on the daemon's
run loop (dblockrun/running/runloop.py). ``items-command`` is a command like any
other, started through the spawn service (its own process group, the
lifeline, its timeout stopping the whole group); each claimed batch runs as
a :class:`~dblockrun.running.runjob.JobRun`, the one run lifecycle, so retries,
on-failure, notifications, pings and metrics are a job's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from dblockrun.errors import DatabaseError
from dblockrun.jobs import MAX_ITEM, Job, item_too_long
from dblockrun.running.runjob import (
    JobRun,
    RunContext,
    base_env,
    line_logger,
    result_of,
    stored_output,
)
from dblockrun.running.runner import LeaseWatch, Process, ProcessEnd, argv_for, stored_text
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.items import ClaimedItem

log = logging.getLogger("dblockrun")

#: Longest wait for another host to finish refreshing the item list.
SYNC_WAIT = 60.0
#: How often a host that lost the refresh looks whether it is done.
SYNC_LOOK = 0.2
#: ``items-command`` is stopped (its whole process group) after the job's
#: lock-at-most, and at most this long.
LIST_TIMEOUT = 300.0


def item_lines(output: bytes) -> tuple[list[str], list[str]]:
    """The items ``items-command`` printed: one a line, stripped, blank
    lines dropped, the first of duplicates kept; and the lines too long to
    be an item (:data:`~dblockrun.jobs.MAX_ITEM`), which fail alone."""
    seen: dict[str, None] = {}
    for line in stored_text(output).splitlines():
        item = line.strip()
        if item:
            seen.setdefault(item, None)
    good = [item for item in seen if item_too_long(item) is None]
    return good, [item for item in seen if item_too_long(item) is not None]


class ItemBatch:
    """A claimed batch of items as a run holds it (:class:`~dblockrun.running.runjob.ItemHook`):
    the items' own tokens and run records, renewed, finished and released
    together (a result only while every token is still ours)."""

    def __init__(self, store: Store, job: Job, holder: str, lease: float, slot: float | None,
                 batch: Sequence[ClaimedItem]) -> None:
        self.items = store.items
        self.store = store
        self.job = job
        self.holder = holder
        self.lease = lease
        self.slot = slot
        self.batch = list(batch)
        self.item = batch[0].item
        self.label = self.item if len(batch) == 1 else f"{self.item} +{len(batch) - 1}"
        #: The last result recorded, kept by a release.
        self.result = m.FAILED
        #: Run records of the attempt being recorded (a retried record adds no second).
        self._recorded: tuple[int, dict[str, int]] = (0, {})

    def env(self) -> dict[str, str]:
        env = {"DBLOCKRUN_ITEMS": "\n".join(c.item for c in self.batch)}
        if len(self.batch) == 1:
            env["DBLOCKRUN_ITEM"] = self.item
        return env

    def renew(self) -> bool | str:
        return self.items.renew(self.job.name, self.holder, self.batch, self.lease)

    def record(self, attempt: int) -> int:
        if self._recorded[0] != attempt:
            self._recorded = (attempt, {})
        ids = self._recorded[1]
        for c in self.batch:
            if c.key not in ids:
                ids[c.key] = self.store.start_run(self.job.name, self.holder, token=c.token,
                                                  slot=self.slot, attempt=attempt, item=c.item)
        self.batch = [dataclasses.replace(c, run_id=ids[c.key]) for c in self.batch]
        return self.batch[0].run_id

    def run_ids(self) -> list[int]:
        return [c.run_id for c in self.batch]

    def finish(self, result: str, code: int | None, output: str, took: float) -> bool:
        self.result = result
        return self.items.finish(self.job.name, self.holder, self.batch, result, code, output,
                                 took)

    def finish_and_release(self, result: str, code: int | None, output: str,
                           lock_at_least: float, took: float) -> tuple[bool, bool]:
        self.result = result
        return self.items.finish_and_release(self.job.name, self.holder, self.batch, result,
                                             code, output, lock_at_least, took)

    def release(self, lock_at_least: float) -> bool:
        return self.items.release(self.job.name, self.holder, self.batch, self.result,
                                  lock_at_least)


class FanOut:
    """A fan-out job's slot (or rate window) on this host: refresh the item
    list, then claim and run batches until none is due (or the daemon
    stops). :attr:`done` is set once its last command ended."""

    #: Held while a fan-out looks at the host's room and takes some of it,
    #: so that two of them cannot both take the last.
    _reserving = threading.Lock()

    #: A fan-out never waits in a queue (dblockrun/daemon/registry.py Run).
    queued = False
    wants_room = False
    order = (0.0, 0)

    def __init__(self, ctx: RunContext, job: Job, slot: float | None,
                 on_done: Callable[[FanOut], None] | None = None,
                 next_due: float | None = None,
                 room: Callable[[], int | None] = lambda: None) -> None:
        """``room``: how many more commands this host may start (None: no
        ``--max-running``), this fan-out's own running ones counted."""
        self.next_due = next_due
        assert isinstance(ctx.store, Store), "fan-out needs the full store"
        self.store: Store = ctx.store
        self.ctx = ctx
        self.job = job
        self.slot = slot
        self.on_done = on_done
        self.room = room
        self.done = threading.Event()
        self._lock = threading.Lock()
        #: Commands running (or being claimed) for this fan-out: items-command, batches.
        self._running = 0
        self._claiming = False
        self._again = False

    @property
    def commands(self) -> int:
        """Commands it runs now (``--max-running`` counts each)."""
        with self._lock:
            return self._running

    def start(self) -> None:
        self._step(self._refresh)

    def is_alive(self) -> bool:
        return not self.done.is_set()

    def winding_up(self) -> bool:
        """Never: a fan-out's next slot is refused while any of its batches runs."""
        return False

    def _step(self, step: Callable[[], None]) -> None:
        """``step`` on a worker of the run loop; a failure ends the fan-out
        once its running commands have ended."""

        def guarded() -> None:
            try:
                step()
            except DatabaseError as exc:
                self.ctx.outage.failed(f"fan-out {self.job.name}", exc)
                self._settle()
            except Exception:
                log.exception("job %s: fan-out step failed", self.job.name)
                self._settle()

        self.ctx.loop.submit(guarded)

    def _settle(self) -> None:
        """Claim no more now; over if nothing runs."""
        with self._lock:
            self._claiming = self._again = False
            over = self._running == 0
        if over:
            self._end()

    def _end(self) -> None:
        if self.done.is_set():
            return
        self.done.set()
        if self.on_done is not None:
            self.on_done(self)

    # -- the item list ----------------------------------------------------------

    def _refresh(self) -> None:
        """Refresh the item list if this host wins the job's lock; else wait
        for the host that won."""
        job, ctx, store = self.job, self.ctx, self.store
        sent = time.monotonic()
        token = store.claim(job.name, ctx.holder, ctx.lease, slot=self.slot, rate=job.rate,
                            next_due=self.next_due)
        if token is None:
            self._await_list(time.monotonic() + SYNC_WAIT)
        elif job.items is not None:
            self._synced(token, list(job.items))
        else:
            self._list(token, sent)

    def _await_list(self, deadline: float) -> None:
        """Another host refreshes the list: work once it freed the job's lock
        (or after ``SYNC_WAIT``)."""
        lock = self.store.lock_state(self.job.name)
        if (lock is None or lock.lock_until is None or lock.lock_until <= self.store.db_now()
                or time.monotonic() >= deadline or self.ctx.stop.is_set()):
            self._more()
        else:
            self.ctx.loop.call_later(SYNC_LOOK, lambda: self._step(
                lambda: self._await_list(deadline)))

    def _list(self, token: int, sent: float) -> None:
        """Start ``items-command`` under the job's lock, renewed meanwhile."""
        job, ctx = self.job, self.ctx
        watch = LeaseWatch(job.name, ctx.holder, token, ctx.lease, last_ok=sent)
        out: list[bytes] = []
        timeout = min(job.lock_at_most, LIST_TIMEOUT)
        assert job.items_command is not None
        process = Process(
            argv_for(job.items_command, job.shell), env=base_env(job, ctx.environ),
            cwd=job.workdir, on_line=out.append,
            on_err_line=line_logger(f"[{job.name} items-command] ", job=job.name),
            deadline=time.monotonic() + timeout, watch=watch, stop=ctx.stop,
            kill_grace=ctx.kill_grace, stop_grace=ctx.stop_grace, stop_why=ctx.stop_why,
            user=job.user, limits=job.limits, name=job.name)
        ctx.renewer.add(watch)
        with self._lock:
            self._running += 1

        def ended(outcome: ProcessEnd | None = None) -> None:
            ctx.loop.unwatch(process)
            try:
                outcome = outcome or process.finish()
            finally:
                ctx.renewer.remove(watch)
                with self._lock:
                    self._running -= 1
            if outcome.reason == "exit" and outcome.exit_code == 0:
                items, too_long = item_lines(b"".join(out))
                self._synced(token, items, too_long)
            else:
                self._list_failed(token, outcome, timeout)

        failed = process.start(on_end=lambda: self._step(ended))
        if failed is not None:
            ended(failed)
        else:
            ctx.loop.watch(process)

    def _list_failed(self, token: int, outcome: ProcessEnd, timeout: float) -> None:
        """A failed ``items-command`` is a failed run of the job; the list
        stays as it was, and no item runs this time."""
        job, ctx, store = self.job, self.ctx, self.store
        result = result_of(outcome)
        output = stored_output(outcome)
        if outcome.reason in ("timeout", "fenced", "stopped"):
            why = (f"stopped at its timeout ({timeout:g}s)" if outcome.reason == "timeout"
                   else outcome.detail)
            output = (output + f"items-command {why}\n")[-65536:]
        try:
            run_id = store.start_run(job.name, ctx.holder, token=token, slot=self.slot)
            store.finish_run(run_id, job.name, token, result, outcome.exit_code, output)
        finally:
            store.release(job.name, ctx.holder, token)
        log.warning("job %s: items-command %s (exit %s%s); no items run this time", job.name,
                    result, outcome.exit_code, f", {outcome.detail}" if outcome.detail else "")
        self._settle()

    def _synced(self, token: int, items: list[str], too_long: Sequence[str] = ()) -> None:
        job, ctx, store = self.job, self.ctx, self.store
        try:
            added, retired = store.items.sync(job.name, items)
            for item in too_long:
                self._refused(token, item)
        finally:
            store.release(job.name, ctx.holder, token)
        if added or retired:
            log.info("job %s: %d items (%d new, %d retired)", job.name, len(items), added,
                     retired)
        self._more()

    def _refused(self, token: int, item: str) -> None:
        """An ``items-command`` line too long to be an item fails alone: a
        failed run of it (the item shortened to fit its record) says why,
        under the job's lock; the other items run."""
        job, ctx, store = self.job, self.ctx, self.store
        why = item_too_long(item)
        shown = item[:MAX_ITEM - 3] + "..."
        run_id = store.start_run(job.name, ctx.holder, token=token, slot=self.slot, item=shown,
                                 result=m.FAILED,
                                 output=f"not run: items-command printed an {why}\n")
        log.warning("job %s: items-command printed an %s; that item is not run (run %d)",
                    job.name, why, run_id)

    # -- the items ----------------------------------------------------------------

    def _more(self) -> None:
        """Claim what there is room for (one claim at a time: asked again
        meanwhile, it claims once more after)."""
        with self._lock:
            if self._claiming:
                self._again = True
                return
            self._claiming = True
        self._step(self._claim)

    def _claim(self) -> None:
        job, ctx = self.job, self.ctx
        claimed: list[ClaimedItem] = []
        sent = time.monotonic()
        if not ctx.stop.is_set():
            with FanOut._reserving:
                room = self.room()
                with self._lock:
                    take = job.parallel - self._running
                    take = max(0, take if room is None else min(take, room))
                    self._running += take  # counted from now: the host's room shrinks
            try:
                if take:
                    claimed = self.store.items.claim(job.name, ctx.holder, ctx.lease,
                                                     slot=self.slot, rate=job.rate,
                                                     limit=take * job.batch)
            finally:
                batches = -(-len(claimed) // job.batch)
                with self._lock:
                    self._running -= take - batches
            for i in range(0, len(claimed), job.batch):
                batch = claimed[i : i + job.batch]
                hook = ItemBatch(self.store, job, ctx.holder, ctx.lease, self.slot, batch)
                JobRun(ctx, job, batch[0].token, self.slot, sent, on_done=self._ran,
                       run_id=batch[0].run_id, item=hook).start()
        with self._lock:
            # Asked again meanwhile (a batch ended: room for one more): claim again.
            again, self._again = self._again, False
            self._claiming = again
            over = not again and not claimed and self._running == 0
        if again:
            self._step(self._claim)
        elif over:
            self._end()

    def _ran(self, run: JobRun) -> None:
        """A batch's run is over: its room goes to the next."""
        with self._lock:
            self._running -= 1
        self._more()
