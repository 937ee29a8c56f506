"""A daemon's fleet bookkeeping, on its own timer: the database clock
samples, this host's row, recording lost runs (and the slots their dead
holder blocked), definition drift between hosts, and how many hosts are live
(for the batch share).

It runs in its own thread, one round every :data:`ROUND_EVERY` heartbeats,
apart from the lease renewals (:class:`~dblockrun.heartbeat.Renewer`): a
slow sweep or host read never delays a renewal. On PostgreSQL an idle round
is one statement (:meth:`Store.books_round`), so an idle daemon sends 5 a
minute at the default heartbeat; it also hands the round's run-now requests
to the daemon, which hears them at once through LISTEN
(:mod:`dblockrun.listen`) unless that connection is down.
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
#: A round every 1.2 heartbeats: 12 s by default, 5 rounds a minute, and a
#: host row at most 12 s old, inside the 15 s within which ``status`` calls
#: a host live (store/status.py ``LIVE_WITHIN``).
ROUND_EVERY = 1.2


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


class FleetBooks:
    """One daemon's bookkeeping rounds (see the module)."""

    def __init__(self, store: Store, holder: str, heartbeat: float, clock: DbClock,
                 outage: Outage, metrics: Metrics, jobs: Callable[[], JobsFile],
                 running: Callable[[], int],
                 requested: Callable[[list[str]], None] | None = None, *,
                 labels: str | None = None,
                 targets: Callable[[], str | None] | None = None) -> None:
        self.store = store
        self.holder = holder
        self.heartbeat = heartbeat
        self.clock = clock
        self.outage = outage
        self.metrics = metrics
        self._jobs = jobs
        self._running = running
        #: Given the jobs with a run-now request, when a round read them.
        self._requested = requested
        #: Published with the host row: this host's labels and its file's
        #: targeting (JSON; dblockrun/targeting.py).
        self._labels = labels
        self._targets = targets
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

    @property
    def interval(self) -> float:
        return ROUND_EVERY * self.heartbeat

    def _loop(self) -> None:
        delay = self.interval
        while not self._stop.wait(delay):
            try:
                self.round()
                self.outage.ok()
                delay = self.interval
            except DatabaseError as exc:
                delay = min(self.interval, self.outage.failed("bookkeeping", exc))

    def round(self) -> None:
        """One round: host row, clock sample, lost runs, live hosts, drift,
        run-now requests (one statement on PostgreSQL when idle)."""
        mine, mine_json = self._definitions()
        if not self.clock.known:
            # The first round writes the host row with the offset known before
            # it: sample once first, or `status` shows none until the next round.
            self.clock.add(self.store.clock_sample())
        done = self.store.books_round(
            self.holder,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            clock_offset=self.clock.offset,
            running=self._running(),
            jobs=mine_json,
            within=3 * self.heartbeat,
            labels=self._labels,
            targets=self._targets() if self._targets is not None else None,
        )
        self.clock.add(done.sample)
        self.live_hosts = 1 + done.live_others
        for lost in done.lost:
            self._blocked_slots(lost)
        self._check_drift(mine, done.differing)
        if done.requested and self._requested is not None:
            self._requested(done.requested)

    def report_bad_rows(self) -> None:
        """Lock rows edited into a state no claim takes: logged once each."""
        for name, token in self.store.bad_tokens(j.name for j in self._jobs().jobs):
            self.store.lock.bad_token(name, token)

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

    def _check_drift(self, mine: dict[str, str],
                     differing: list[tuple[str, str | None]]) -> None:
        """Warn once per (job, other definition) seen on another live host
        (``differing``: those whose definitions are not this host's)."""
        seen: dict[str, dict[str, list[str]]] = {}
        for host, text in differing:
            try:
                defs = json.loads(text or "{}")
            except ValueError:
                continue
            if isinstance(defs, dict):
                for name, digest in defs.items():
                    seen.setdefault(str(name), {}).setdefault(str(digest), []).append(host)
        for name, defs in seen.items():
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
