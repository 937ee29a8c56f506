"""A daemon's fleet bookkeeping, on its own timer: the database clock
samples, this host's row, recording lost runs (and the slots their dead
holder blocked), definition drift between hosts, and how many hosts are live
(for the batch share).

It runs in its own thread, one round per heartbeat, apart from the lease
renewals (:class:`~dblockrun.heartbeat.Renewer`): a slow sweep or host read
never delays a renewal.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime

from dblockrun import __version__
from dblockrun.errors import DatabaseError
from dblockrun.heartbeat import DbClock
from dblockrun.jobs import JobsFile
from dblockrun.metrics import Metrics
from dblockrun.outage import Outage
from dblockrun.schedule import next_slot_at
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.engine import LostRun

log = logging.getLogger("dblockrun")

#: At most this many slots blocked by one dead holder are recorded skipped.
MAX_BLOCKED = 100


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


class FleetBooks:
    """One daemon's bookkeeping rounds (see the module)."""

    def __init__(self, store: Store, holder: str, heartbeat: float, clock: DbClock,
                 outage: Outage, metrics: Metrics, jobs: Callable[[], JobsFile],
                 running: Callable[[], int]) -> None:
        self.store = store
        self.holder = holder
        self.heartbeat = heartbeat
        self.clock = clock
        self.outage = outage
        self.metrics = metrics
        self._jobs = jobs
        self._running = running
        #: Daemons seen within three heartbeats (at least 1): the batch share.
        self.live_hosts = 1
        self._drift_seen: set[tuple[str, str]] = set()
        self._defs_for: JobsFile | None = None
        self._defs: tuple[dict[str, str], str] = ({}, "{}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bookkeeping", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        delay = self.heartbeat
        while not self._stop.wait(delay):
            try:
                self.round()
                self.outage.ok()
                delay = self.heartbeat
            except DatabaseError as exc:
                delay = min(self.heartbeat, self.outage.failed("bookkeeping", exc))

    def round(self) -> None:
        """One round: clock sample, host row, lost runs, drift."""
        self.clock.add(self.store.clock_sample())
        self.store.heartbeat_host(
            self.holder,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            clock_offset=self.clock.offset,
            running=self._running(),
            jobs=self._definitions()[1],
        )
        for lost in self.store.sweep_lost():
            self._blocked_slots(lost)
        self._check_drift()

    def report_bad_rows(self) -> None:
        """Lock rows edited into a state no claim takes: logged once each."""
        for name in self.store.negative_tokens(j.name for j in self._jobs().jobs):
            self.store.lock.negative_token(name)

    def _blocked_slots(self, lost: LostRun) -> None:
        """A run this host recorded lost (its holder stopped renewing). The
        slots that came after its last renewal and before the job could be
        claimed again started nowhere: record them skipped, saying why (the
        newest ``MAX_BLOCKED``). The one host whose sweep recorded the loss
        does this, so each slot is recorded once."""
        log.warning("job %s: run %d on %s lost: its lease was last renewed at %s",
                    lost.job, lost.id, lost.host, _utc(lost.ended))
        job = self._jobs().job(lost.job)
        if lost.item is not None or job is None or job.cron is None:
            return
        if lost.lock_until is not None:
            # Nobody has claimed it since: the slots up to the lease's end,
            # each taken off the job (skip_slot) so no late claim runs it.
            limit, inclusive = lost.lock_until, True
            why_end = f"its lease ran out at {_utc(lost.lock_until)}"
        else:
            # Claimed since: the slots before the first one that ran again.
            nxt = self.store.next_run_slot(job.name, lost.id)
            if nxt is None:
                return
            limit, inclusive, why_end = nxt, False, "until another host claimed it"
        blocked: deque[float] = deque(maxlen=MAX_BLOCKED)
        slot = next_slot_at(job.cron, job.timezone, max(lost.ended, lost.slot or 0.0))
        while slot < limit or (inclusive and slot == limit):
            blocked.append(slot)
            slot = next_slot_at(job.cron, job.timezone, slot)
        why = (f"skipped: {lost.host} held the lock and stopped renewing it at "
               f"{_utc(lost.ended)} (run {lost.id}, lost), {why_end}\n")
        for slot in blocked:
            if lost.lock_until is None or self.store.skip_slot(job.name, slot):
                self.store.start_run(job.name, self.holder, token=None, slot=slot,
                                     result=m.SKIPPED, output=why)
                self.metrics.missed.labels(job.name, "skipped").inc()

    def _definitions(self) -> tuple[dict[str, str], str]:
        """Each job's definition hash (and as JSON), once per jobs file: an idle
        heartbeat then costs the same whatever the number of jobs."""
        jobs = self._jobs()
        if self._defs_for is not jobs:
            defs = {j.name: j.definition_hash() for j in jobs.jobs}
            self._defs = (defs, json.dumps(defs))
            self._defs_for = jobs
        return self._defs

    def _check_drift(self) -> None:
        """Count the live hosts; warn once per (job, other definition) seen on
        another live host."""
        mine = self._definitions()[0]
        live = self.store.hosts(seen_within=3 * self.heartbeat)
        self.live_hosts = max(1, len(live))
        for name, defs in m.definitions(live).items():
            if name not in mine:
                continue
            for digest, hosts in defs.items():
                key = (name, digest)
                if digest != mine[name] and key not in self._drift_seen:
                    self._drift_seen.add(key)
                    log.warning(
                        "job %s: defined differently on %s (definition %s, here %s): "
                        "check that every host has the same jobs file",
                        name, ", ".join(hosts), digest, mine[name],
                    )
