"""Lease renewal and the database clock, shared by the daemon and ``exec``."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from dblockrun.errors import DatabaseError
from dblockrun.running.runner import LeaseWatch, LiveOutput
from dblockrun.store.models import ClockSample
from dblockrun.store.outage import Outage
from dblockrun.store.runstore import RunStore
from dblockrun.supervise import Loop, Policy, Threads

log = logging.getLogger("dblockrun")

#: The most output characters one renewal statement writes (16 tails of
#: 64 KiB: a renewal stays a few tens of milliseconds, bench/livetail.py);
#: the runs left out are written first at the next heartbeat.
LIVE_BUDGET = 1024 * 1024


class DbClock:
    """This host's estimate of the database clock, from timed reads of it."""

    def __init__(self, keep: int = 8) -> None:
        self._samples: deque[ClockSample] = deque(maxlen=keep)
        self._lock = threading.Lock()
        #: The sample with the shortest round trip, chosen as each comes (the
        #: planner reads the clock for every due attempt: 10,000 at once).
        self._best_sample: ClockSample | None = None

    def add(self, sample: ClockSample) -> None:
        with self._lock:
            self._samples.append(sample)
            self._best_sample = min(self._samples, key=lambda s: s.rtt)

    def _best(self) -> ClockSample | None:
        return self._best_sample  # one attribute read: atomic

    @property
    def known(self) -> bool:
        return self._best() is not None

    def now(self) -> float:
        """The database time now (epoch seconds), by the best recent sample."""
        best = self._best()
        if best is None:
            return time.time()
        return time.monotonic() + best.mono_offset

    @property
    def offset(self) -> float | None:
        """The database clock minus this host's wall clock."""
        best = self._best()
        return None if best is None else best.offset

    @property
    def uncertainty(self) -> float:
        best = self._best()
        return 0.0 if best is None else best.rtt / 2


class Renewer:
    """Renews held leases every ``heartbeat`` seconds, retrying quickly on
    error, and nothing else: the daemon's bookkeeping has its own timer
    (:mod:`dblockrun.daemon.fleet`), so it never delays a renewal.

    Supervised (dblockrun/supervise.py): a crash is retried after a backoff
    of at most a heartbeat (the round then comes at once), so a one-off
    costs no lease; one that keeps coming for three heartbeats (by then a
    default lease, three heartbeats, has run out) stops the daemon, exit
    status 1, rather than have it win claims it cannot keep."""

    def __init__(
        self,
        store: RunStore,
        heartbeat: float,
        outage: Outage,
        threads: Threads | None = None,
    ) -> None:
        self.store = store
        self.heartbeat = heartbeat
        self.outage = outage
        self._leases: dict[int, LeaseWatch] = {}
        self._lock = threading.Lock()
        #: Held while one lease is being renewed (see remove).
        self._renewing = threading.Lock()
        self._kick = threading.Event()
        self._worker = Loop(threads, "heartbeat", Policy(max_delay=heartbeat,
                                                         give_up=3 * heartbeat),
                            self._loop, wake=self._kick)
        #: The rounds' schedule is on the outage's clock (the delays it backs
        #: off by are in its seconds; a test's manual clock); a renewal's
        #: send time, which the lease counts from, stays ``time.monotonic()``
        #: (the spawn service's lifeline shares it).
        self._clock = outage.clock
        #: When the next round starts (on the clock); a restart after a crash
        #: finds it passed and renews at once.
        self._next_at = 0.0
        #: No extra renewal (:meth:`renew_now`) before this (on the clock).
        self._extra_after = 0.0
        #: When the extra renewal asked for is due (None: none asked for).
        self._extra_at: float | None = None
        #: The outputs a failed renewal carried: the next renewal goes
        #: without any, and if it then gets through, they are to blame
        #: (written no more: a run's output never costs its lease).
        self._suspects: list[LiveOutput] | None = None

    def start(self) -> None:
        self._next_at = self._clock() + self.heartbeat
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    def renew_now(self, gap: float | None = None) -> None:
        """Renew at once (a kill was announced: the renewal reads it), then
        every heartbeat from then on; at most once per ``gap`` (None: per
        heartbeat). Any role that can connect to PostgreSQL can announce
        (NOTIFY needs no table privilege): a flood of announcements costs
        one extra renewal per heartbeat, not one per announcement, and a
        kill announced meanwhile is still read within a heartbeat, by the
        next regular renewal. MySQL's wake-ups (dblockrun/store/doorbell.py)
        come only from users who may end the daemon's statements, and say
        not whether a run or a kill was asked for: a shorter ``gap``, so
        that a kill soon after a run is still read at once. One asked for
        within ``gap`` of the last comes when the gap ends, not dropped: a
        kill filed 0.3 s after a run's wake-up waited a whole heartbeat."""
        now = self._clock()
        with self._lock:
            at = max(now, self._extra_after)
            if self._extra_at is not None and self._extra_at <= at:
                return  # one is on its way, no later
            self._extra_at = at
            self._extra_after = at + (self.heartbeat if gap is None else gap)
        self._kick.set()

    def wake(self) -> None:
        """Look at the clock again now: a manual clock was moved (a round
        due by then comes at once, not after the wait in real seconds)."""
        self._kick.set()

    def add(self, watch: LeaseWatch) -> None:
        with self._lock:
            self._leases[id(watch)] = watch

    def remove(self, watch: LeaseWatch) -> None:
        """Stop renewing ``watch``; returns once no renewal of it is on its
        way, so that a release that follows cannot be overtaken by one."""
        with self._lock:
            self._leases.pop(id(watch), None)
        with self._renewing:
            pass

    @property
    def count(self) -> int:
        with self._lock:
            return len(self._leases)

    def _loop(self) -> None:
        # Rounds start a heartbeat apart, however long each took: a lease is
        # renewed every heartbeat, not every heartbeat plus a round trip.
        while not self._worker.stopping:
            with self._lock:
                due = self._next_at if self._extra_at is None else min(self._next_at,
                                                                       self._extra_at)
            self._kick.wait(max(0.0, due - self._clock()))
            self._kick.clear()
            if self._worker.stopping:
                return
            began = self._clock()
            with self._lock:
                extra = self._extra_at is not None and began >= self._extra_at
                if extra:
                    self._extra_at = None
            if began < self._next_at and not extra:
                continue  # woken to wait for an extra renewal due later
            try:
                if self.renew_all():  # an idle round says nothing about the database
                    self.outage.ok()
                self._next_at = began + self.heartbeat
            except DatabaseError as exc:
                self._next_at = began + min(self.heartbeat,
                                            self.outage.failed("heartbeat", exc))
            self._worker.ok()

    def renew_all(self) -> bool:
        """Renew every held lease: a holder's job locks in one statement per
        500 (whatever their number), with the output of their runs that grew
        since the last renewal (at most 64 KiB each), other leases (fan-out
        items) one by one, their runs' output that grew in one statement
        more. Whether the database answered anything."""
        answered = False
        with self._lock:
            leases = list(self._leases.values())
        groups: dict[tuple[str, float], list[LeaseWatch]] = {}
        for watch in leases:
            if watch.renew is None:
                groups.setdefault((watch.holder, watch.lease), []).append(watch)
        for (holder, lease), watches in groups.items():
            for i in range(0, len(watches), 500):
                with self._renewing:
                    live = self._live(watches[i:i + 500])
                    if not live:
                        continue
                    fresh = self._fresh(live) if self._suspects is None else []
                    sent = time.monotonic()
                    for watch in live:  # said if their leases run out meanwhile
                        watch.failing = watch.failing or "its last renewal had no answer yet"
                    # A grouped run's seat is renewed with its lock, in the same
                    # statement, and the runs' output that grew is written with them.
                    # The rows are read once: a waiting slot's seat, taken by the run
                    # loop while this statement is on its way, is not in its answer
                    # and must not be judged lost by it (it is renewed next round).
                    rows = [(watch, watch.rows()) for watch in live]
                    try:
                        renewed = self.store.renew_many(
                            holder, [r for _w, held in rows for r in held], lease,
                            _outputs(fresh))
                    except DatabaseError as exc:
                        # Not the outputs' fault if a renewal without them fails too.
                        self._suspects = [out for out, _total, _text in fresh]
                        for watch in live:  # said if their leases run out
                            watch.failing = exc.message
                        raise
                    answered = True
                    _written(fresh)
                    self._blame()
                for watch, sent_rows in rows:
                    # Lost if the lock or its seat is; a kill request is on the lock.
                    held = all(n in renewed for n, _ in sent_rows)
                    self._settle(watch, renewed.get(watch.name, False) if held else False, sent)
        items = [w for w in leases if w.renew is not None]
        for watch in items:
            assert watch.renew is not None
            with self._renewing:
                if not self._live([watch]):
                    continue
                sent = time.monotonic()
                ok = watch.renew()
                answered = True
            self._settle(watch, ok, sent)
        with self._renewing:
            if fresh := self._fresh(self._live(items)):
                try:
                    self.store.write_outputs(_outputs(fresh))
                    _written(fresh)
                except DatabaseError as exc:  # the leases are renewed: again next heartbeat
                    log.debug("live output of fan-out runs not written: %s", exc)
        return answered

    def _blame(self) -> None:
        """A renewal without the outputs of a failed one got through: they
        are written no more (the runs' results still store their output)."""
        suspects, self._suspects = self._suspects, None
        for out in suspects or ():
            out.give_up()
            log.warning("run %s: its live output could not be written with its lease's "
                        "renewal; renewing without it (its result still stores its output)",
                        ", ".join(map(str, out.run_ids)))

    @staticmethod
    def _fresh(watches: list[LeaseWatch],
               budget: int = LIVE_BUDGET) -> list[tuple[LiveOutput, int, str]]:
        """(the output, the tail's total, its text) of the runs whose output
        grew since it was last written, those written longest ago first, up
        to ``budget`` characters in all (so that a renewal stays quick, and
        far below MariaDB's 16 MB ``max_allowed_packet``)."""
        fresh = []
        for watch in sorted(watches, key=lambda w: w.output.written_at if w.output else 0.0):
            out = watch.output
            if out is not None and (got := out.fresh()) is not None:
                fresh.append((out, *got))
                budget -= len(got[1]) * len(out.run_ids)
                if budget <= 0:  # the others next heartbeat, first
                    break
        return fresh

    def _live(self, watches: list[LeaseWatch]) -> list[LeaseWatch]:
        """Those still held and not removed meanwhile."""
        with self._lock:
            return [w for w in watches if not w.lost and self._leases.get(id(w)) is w]

    @staticmethod
    def _settle(watch: LeaseWatch, ok: bool | str | None, sent: float) -> None:
        """``ok``: renewed (True or None), lost (False), or renewed with a
        kill request (who and why), which the run's watcher then applies."""
        if ok is not False:
            watch.renewed(sent)
            if isinstance(ok, str) and watch.killed is None:
                watch.killed = ok
                log.warning("job %s: killed by %s; stopping its command", watch.name, ok)
        else:
            watch.lost = True
            log.error("job %s: lock lost (token %d no longer current); stopping its command",
                      watch.name, watch.token)


def _outputs(fresh: list[tuple[LiveOutput, int, str]]) -> list[tuple[int, str]]:
    """(run id, output tail) of each record of ``fresh`` outputs."""
    return [(run_id, text) for out, _total, text in fresh for run_id in out.run_ids]


def _written(fresh: list[tuple[LiveOutput, int, str]]) -> None:
    for out, total, _text in fresh:
        out.written(total)
