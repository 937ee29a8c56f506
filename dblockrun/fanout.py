"""Fan-out jobs: one row per work item, worked through by every host.

Per slot (cron) or rate window: the host that wins the job's own lock
refreshes the item list (``items:`` or the output of ``items-command``) and
frees the lock again; then every host claims due items with SKIP LOCKED, up
to ``parallel`` invocations at once, ``batch`` items per invocation. Each
item has its own lock, lease, fencing token and run record.
"""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from dblockrun.errors import DatabaseError
from dblockrun.jobs import Job
from dblockrun.runjob import (
    RunContext,
    base_env,
    command_env,
    exit_status,
    line_logger,
    result_of,
    stored_output,
    stored_text,
)
from dblockrun.runner import LeaseWatch, RunAs, argv_for, run_process
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.items import ClaimedItem

log = logging.getLogger("dblockrun")

#: Longest wait for another host to finish refreshing the item list.
SYNC_WAIT = 60.0


class ItemsFailed(Exception):
    def __init__(self, code: int | None, output: str) -> None:
        super().__init__(f"items-command failed with exit {code}")
        self.code = code
        self.output = output


def list_items(job: Job, timeout: float) -> list[str]:
    """The job's items: its ``items:``, or the lines its ``items-command`` prints."""
    if job.items is not None:
        return list(job.items)
    assert job.items_command is not None
    argv = argv_for(job.items_command, job.shell)
    env, cwd = base_env(job), job.workdir
    try:
        run_as = RunAs.lookup(job.user) if job.user else None
        if run_as is not None:
            env, cwd = run_as.env(env), run_as.cwd(cwd)
        proc = subprocess.run(argv, capture_output=True, cwd=cwd, timeout=timeout,
                              env=env, stdin=subprocess.DEVNULL,
                              user=run_as.uid if run_as else None,
                              group=run_as.gid if run_as else None,
                              extra_groups=list(run_as.groups) if run_as else None)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ItemsFailed(None, str(exc)) from exc
    output = stored_text(proc.stdout)
    if proc.returncode != 0:
        raise ItemsFailed(exit_status(proc.returncode),
                          (output + stored_text(proc.stderr))[-65536:])
    seen: dict[str, None] = {}
    for line in output.splitlines():
        item = line.strip()
        if item:
            seen.setdefault(item, None)
    return list(seen)


class FanOut(threading.Thread):
    def __init__(self, ctx: RunContext, job: Job, slot: float | None,
                 on_done: Callable[[FanOut], None] | None = None,
                 next_due: float | None = None) -> None:
        super().__init__(name=f"fanout-{job.name}", daemon=True)
        self.next_due = next_due
        assert isinstance(ctx.store, Store), "fan-out needs the full store"
        self.store: Store = ctx.store
        self.ctx = ctx
        self.job = job
        self.slot = slot
        self.on_done = on_done

    def run(self) -> None:
        try:
            if self._refresh():
                self._work()
        except DatabaseError as exc:
            self.ctx.outage.failed(f"fan-out {self.job.name}", exc)
        finally:
            if self.on_done is not None:
                self.on_done(self)

    # -- the item list ----------------------------------------------------------

    def _refresh(self) -> bool:
        """Refresh the item list if this host wins the job's lock; else wait
        for the host that won. False when there is nothing to work on."""
        job, ctx, store = self.job, self.ctx, self.store
        token = store.claim(job.name, ctx.holder, ctx.lease, slot=self.slot, rate=job.rate,
                            next_due=self.next_due)
        if token is None:
            deadline = time.monotonic() + SYNC_WAIT
            while time.monotonic() < deadline and not ctx.stop.is_set():
                lock = store.lock_state(job.name)
                if lock is None or lock.lock_until is None or lock.lock_until <= store.db_now():
                    return True
                ctx.stop.wait(0.2)
            return True
        try:
            items = list_items(job, min(job.lock_at_most, 300.0))
        except ItemsFailed as exc:
            run_id = store.start_run(job.name, ctx.holder, token=token, slot=self.slot)
            store.finish_run(run_id, job.name, token, m.FAILED, exc.code, exc.output)
            store.release(job.name, ctx.holder, token)
            log.warning("job %s: items-command failed (exit %s); no items run this time",
                        job.name, exc.code)
            return False
        try:
            added, retired = store.items.sync(job.name, items)
        finally:
            store.release(job.name, ctx.holder, token)
        if added or retired:
            log.info("job %s: %d items (%d new, %d retired)", job.name, len(items), added,
                     retired)
        return True

    # -- the items ----------------------------------------------------------------

    def _work(self) -> None:
        job, ctx = self.job, self.ctx
        active: list[threading.Thread] = []
        finished = threading.Event()
        while not ctx.stop.is_set():
            active = [t for t in active if t.is_alive()]
            free = job.parallel - len(active)
            claimed: list[ClaimedItem] = []
            if free > 0:
                claimed = self.store.items.claim(job.name, ctx.holder, ctx.lease, slot=self.slot,
                                                 rate=job.rate, limit=free * job.batch)
                for i in range(0, len(claimed), job.batch):
                    batch = claimed[i : i + job.batch]
                    t = threading.Thread(target=self._run_batch, args=(batch, finished),
                                         name=f"item-{job.name}", daemon=True)
                    t.start()
                    active.append(t)
            if not claimed:
                if not active:
                    break
                finished.wait(1.0)
                finished.clear()
        for t in active:
            t.join()

    def _run_batch(self, batch: Sequence[ClaimedItem], finished: threading.Event) -> None:
        """One invocation for a batch of claimed items (their runs recorded by
        the claim); its result and the release go back in one round trip."""
        job, ctx = self.job, self.ctx
        items = self.store.items
        sent = time.monotonic()
        watch = LeaseWatch(job.name, ctx.holder, batch[0].token, ctx.lease, last_ok=sent,
                           renew=lambda: items.renew(job.name, ctx.holder, batch, ctx.lease))
        ctx.renewer.add(watch)
        result, code, output = m.FAILED, None, ""
        try:
            run_id = batch[0].run_id
            env = command_env(job, holder=ctx.holder, run_id=run_id, token=batch[0].token,
                              slot=self.slot, item=batch[0].item if len(batch) == 1 else None,
                              environ=ctx.environ)
            env["DBLOCKRUN_ITEMS"] = "\n".join(c.item for c in batch)
            label = batch[0].item if len(batch) == 1 else f"{batch[0].item} +{len(batch) - 1}"
            on_line = line_logger(f"[{job.name}:{label}] ", job=job.name, run_id=run_id,
                                  item=batch[0].item)
            started = time.monotonic()
            outcome = run_process(argv_for(job.command, job.shell), env=env, cwd=job.workdir,
                                  on_line=on_line, deadline=sent + job.lock_at_most, watch=watch,
                                  stop=ctx.stop, kill_grace=ctx.kill_grace,
                                  stop_grace=ctx.stop_grace, user=job.user)
            result = result_of(outcome)
            took = time.monotonic() - started
            code = exit_status(outcome.exit_code)
            if ctx.metrics is not None:
                ctx.metrics.run_finished(job.name, result, took)
            log.log(logging.INFO if result == m.OK else logging.WARNING,
                    "job %s: item %s %s, exit %s, %.2fs%s", job.name, label, result, code, took,
                    f" ({outcome.detail})" if outcome.detail else "",
                    extra={"job": job.name, "run_id": run_id, "item": batch[0].item,
                           "event": result})
            output = stored_output(outcome)
        finally:
            ctx.renewer.remove(watch)
            ctx.outage.retry(f"record result of {job.name}",
                             lambda: items.finish_and_release(job.name, ctx.holder, batch,
                                                              result, code, output,
                                                              job.lock_at_least),
                             time.monotonic() + 60)
            finished.set()
