"""A daemon's fleet bookkeeping, on its own timer: the database clock
samples, this host's row, recording lost runs (and the slots their dead
holder blocked), definition drift between hosts, and how many hosts are live
(for the batch share).

It runs in its own thread, one round every :data:`ROUND_EVERY` heartbeats,
apart from the lease renewals (:class:`~dblockrun.running.heartbeat.Renewer`): a
slow sweep or host read never delays a renewal. On PostgreSQL an idle round
is one statement (:meth:`Store.books_round`; on MySQL one round trip of
statements), so an idle daemon sends 5 a minute at the default heartbeat;
it also hands the round's run-now requests to the daemon, which hears them
at once through LISTEN (:mod:`dblockrun.store.listen`) or a woken wait on
MySQL (:mod:`dblockrun.store.doorbell`) unless that connection is down,
there is none (through a transaction pooler), or the requester could not
wake it. After each round the pool's idle
connections beyond one are closed (:meth:`Store.trim_pool`).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from dblockrun import __version__
from dblockrun.config.load import differing_keys
from dblockrun.daemon.state import DaemonState
from dblockrun.errors import DatabaseError
from dblockrun.events import RunLost
from dblockrun.jobs import Job, JobsFile, loads_fields
from dblockrun.scheduling.cron import next_slot_at
from dblockrun.scheduling.planner import Cause, passed
from dblockrun.store.models import LockState, LostRun, Told
from dblockrun.store.status import ROUND_EVERY
from dblockrun.supervise import Loop, Policy
from dblockrun.timetext import utc

if TYPE_CHECKING:
    from dblockrun.notify.alerts import Alerts
    from dblockrun.store.roles import FleetBookkeeping

log = logging.getLogger("dblockrun")

#: The round after which this daemon looks for jobs no live host's labels
#: match (the round at start-up, then this many): a fleet started together
#: has written its host rows by then, so no host warns of a job another
#: host that is starting too will run.
SETTLE_ROUNDS = 2
#: Seconds between rounds during the first :attr:`FleetBooks.interval`
#: after the start-up's round; then one every interval.
EARLY_ROUND = 2.0
#: Every this many rounds, the slots a lock held with no run kept from
#: everyone are recorded (:meth:`FleetBooks.held_slots`) ...
HELD_EVERY = 5
#: ... by each of up to this many live hosts; in a bigger fleet each host
#: looks less often, so that the fleet as a whole looks about this many
#: times every :data:`HELD_EVERY` rounds (the question is the fleet's, not
#: the host's): 1,000 idle hosts would otherwise send 1,000 statements a
#: minute for it (bench/idle_hosts.py).
HELD_HOSTS = 10


#: The most slots of one held gap looked at one by one (a summary covers more).
GAP_SLOTS = 10_000


def unrecorded_runs(job: Job, after: float, upto: float, recorded: set[float],
                    ranges: Sequence[tuple[float, float]] = ()) -> list[tuple[float, float]]:
    """The job's slots in (``after``, ``upto``] without a record (nor in a
    summary record's ``ranges``), as runs of consecutive slots: (the slot
    before the run, the run's last slot) each."""
    assert job.cron is not None
    out: list[tuple[float, float]] = []
    before, start, last = after, None, None
    slot = next_slot_at(job.schedule, after)
    for _ in range(GAP_SLOTS):
        if slot > upto:
            break
        if slot in recorded or any(lo <= slot <= hi for lo, hi in ranges):
            if start is not None and last is not None:
                out.append((start, last))
            start, last, before = None, None, slot
        else:
            if start is None:
                start = before
            last = slot
        slot = next_slot_at(job.schedule, slot)
    if start is not None and last is not None:
        out.append((start, last))
    return out


class FleetBooks:
    """One daemon's bookkeeping rounds (see the module)."""

    def __init__(self, state: DaemonState,
                 requested: Callable[[list[str]], None] | None = None, *,
                 settled: Callable[[], None] | None = None,
                 alerts: Alerts | None = None) -> None:
        #: What it shares with the daemon's other parts (dblockrun/daemon/state.py):
        #: the jobs, this host's labels and targeting, its runs and its drain
        #: are read from it each round.
        self.state = state
        #: (the role it uses: dblockrun/store/roles.py)
        self.store: FleetBookkeeping = state.store
        self.holder = state.settings.holder
        self.heartbeat = state.settings.heartbeat
        self.clock = state.clock
        self.outage = state.outage
        self.metrics = state.metrics
        self._jobs = state.jobs
        #: Given the jobs with a run-now request, when a round read them.
        self._requested = requested
        #: Records the slots a dead holder blocked (dblockrun/running/slotbook.py).
        self._book = state.book
        #: Told of each run this host records lost (notifications, pings).
        self.events = state.events
        #: Called once, after :data:`SETTLE_ROUNDS` rounds (the run-on check).
        self._settled = settled
        #: The jobs' ``expect:`` alerts, looked at after each round
        #: (dblockrun/notify/alerts.py: no statement without such jobs).
        self._alerts = alerts
        #: Daemons seen within three heartbeats (at least 1).
        self.live_hosts = 1
        #: ... of them, those not drained, this one counted (at least 1): the
        #: hosts a burst is shared among (dblockrun/daemon/firing.py).
        self.serving_hosts = 1
        #: Rounds since the held slots were last looked at.
        self._since_held = 0
        self._drift_seen: set[tuple[str, str]] = set()
        #: The newest audit entry read (None: not yet; from the start-up
        #: round on, the operator actions :meth:`_tell` logs).
        self._audit_after: int | None = None
        self._defs_for: JobsFile | None = None
        self._defs: tuple[dict[str, str], str] = ({}, "{}")
        #: Per job, its fields' digests (jobs.py field_digests) until they
        #: are written to the host row (then dropped: a drift seen makes the
        #: few it names again; 0.3 MB kept for 1,000 jobs), and the jobs file
        #: they were last written for.
        self._fields: dict[str, dict[str, str]] = {}
        self._fields_written: JobsFile | None = None
        # A crash is restarted after a backoff of at most a round's interval:
        # meanwhile the other hosts sweep lost runs and the renewals go on.
        self._worker = Loop(state.threads, "bookkeeping", Policy(max_delay=self.interval),
                            self._loop)

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()

    @property
    def interval(self) -> float:
        """A round every 1.2 heartbeats: 12 s by default, 5 rounds a minute,
        and a host row at most 12 s old, inside the window within which
        ``status`` calls a host live (store/status.py ``live_window``: 15 s
        at the default heartbeat, which the row carries)."""
        return ROUND_EVERY * self.heartbeat

    def _loop(self) -> None:
        # Rounds every EARLY_ROUND during the first interval too (each counts
        # as none of the rounds :meth:`step` counts): the hosts of a fleet
        # started together count each other before their first burst (the
        # batch share, dblockrun/daemon/firing.py), however slowly each
        # started, not a round later.
        early_until = time.monotonic() + self.interval
        delay = min(EARLY_ROUND, self.interval)
        rounds = 0
        while not self._worker.wait(delay):
            try:
                if time.monotonic() < early_until:
                    self.round()
                    delay = EARLY_ROUND
                else:
                    rounds = self.step(rounds)
                    delay = self.interval
                self.outage.ok()
            except DatabaseError as exc:
                delay = min(self.interval, self.outage.failed("bookkeeping", exc))
            self._worker.ok()

    def step(self, rounds: int) -> int:
        """What the loop does each :attr:`interval`, after ``rounds`` rounds
        done: a round, the pool's trim, the run-on check after
        :data:`SETTLE_ROUNDS`, the held slots every :data:`HELD_EVERY` (more
        in a fleet of more than :data:`HELD_HOSTS` live hosts); the
        rounds done then (bench/idle_hosts.py drives many hosts' steps).
        Raises :class:`~dblockrun.errors.DatabaseError`."""
        self.round()
        if self._alerts is not None:
            self._alerts.check()
        self.store.trim_pool()
        if rounds + 1 == SETTLE_ROUNDS and self._settled is not None:
            self._settled()  # (a database error: again after the next round)
        rounds += 1
        self._since_held += 1
        if self._since_held >= HELD_EVERY * -(-self.live_hosts // HELD_HOSTS):
            self._since_held = 0
            self.held_slots()
        return rounds

    def round(self) -> None:
        """One round: host row, clock sample, lost runs, live hosts, drift,
        run-now requests (one statement on PostgreSQL when idle)."""
        jobs = self._jobs()
        mine, mine_json = self._definitions(jobs)
        # Written when the file is (re)loaded; NULL keeps the row's.
        fields = (json.dumps(self._fields, sort_keys=True)
                  if self._fields_written is not jobs else None)
        if not self.clock.known:
            # The first round writes the host row with the offset known before
            # it: sample once first, or `status` shows none until the next round.
            self.clock.add(self.store.clock_sample())
        if self._audit_after is None:
            self._audit_after = self.store.control.last_id()
        done = self.store.books_round(
            self.holder,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=__version__,
            clock_offset=self.clock.offset,
            running=self.state.runs.count(),
            jobs=mine_json,
            within=3 * self.heartbeat,
            labels=self.state.local.labels_json,
            targets=self.state.local.targets,
            heartbeat=self.heartbeat,
            audit_after=self._audit_after,
            fields=fields,
        )
        self._fields_written = jobs
        self._fields = {}
        self.clock.add(done.sample)
        self.live_hosts = 1 + done.live_others
        self.serving_hosts = 1 + done.serving_others
        for lost in done.lost:
            self._tell_lost(lost)
            self._blocked_slots(lost)
        self._check_drift(jobs, mine, done.differing)
        for told in done.told:
            self._tell(told)
            self._audit_after = max(self._audit_after, told.id)
        if done.requested and self._requested is not None:
            self._requested(done.requested)

    def _tell(self, told: Told) -> None:
        """Log an operator's action this daemon should say it saw: the
        fleet's pause and resume, the disable and enable of its own jobs (an
        every-host job's included). Its runs' kill requests it logs as its
        renewals read them (dblockrun/running/heartbeat.py)."""
        detail = f" ({told.detail})" if told.detail else ""
        reason = f": {told.reason}" if told.reason else ""
        # A pause or disable stops starts: a warning; their end, news.
        level = logging.WARNING if told.action in ("pause", "disable") else logging.INFO
        if told.action in ("drain", "undrain"):
            if self.state.drain is not None:
                self.state.drain.told()
            log.info("%s%s by %s%s", told.action, detail, told.who, reason)
            return
        if told.job is None:
            if told.action in ("pause", "resume"):
                log.log(level, "fleet %sd by %s%s%s", told.action, told.who, detail, reason)
            return
        jobs = self._jobs().jobs
        if told.job in {j.file_name for j in jobs} | {j.name for j in jobs}:
            log.log(level, "job %s: %sd by %s%s%s", told.job, told.action, told.who, detail,
                    reason)

    def report_bad_rows(self) -> None:
        """Lock rows edited into a state no claim takes: logged once each."""
        self.store.log_bad_tokens(j.name for j in self._jobs().jobs)

    def _tell_lost(self, lost: LostRun) -> None:
        """A run this host's sweep recorded lost (once fleet-wide: the sweep
        that wrote it), told to the subscribers: its failure notification
        and ``/fail`` ping, which its dead host cannot send. Not one of this
        host's own runs (its lease ran out while the database was away): its
        lifecycle tells its end, once it has written it."""
        if lost.host != self.holder:
            self.events.emit(RunLost(job=self._jobs().job(lost.job), name=lost.job,
                                     host=lost.host, run_id=lost.id, first_run_id=lost.first_id,
                                     slot=lost.slot,
                                     ended=lost.ended, recorded_by=self.holder, item=lost.item))

    def held_slots(self) -> None:
        """The slots a job's lock kept from every host that nobody recorded.
        A live holder records its own as they come; a running run whose
        holder died is recorded lost, with its slots (:meth:`_blocked_slots`).
        Two more cases are found here: a lock that has run out while no run
        held it (a retry's delay, or a lock-at-least window, on a host that
        died or restarted since), and a claim that moved the job on over
        slots such a lock held before anyone recorded them (:meth:`_gaps`)."""
        self._gaps()
        jobs = [j for j in self._jobs().jobs
                if j.enabled and j.cron is not None and not j.fan_out
                and (j.lock_at_least > 0 or j.retries > 0)]
        if not jobs:
            return
        locks, now = self.store.lock_states()
        for job in jobs:
            lock = locks.get(job.name)
            if (lock is None or lock.token < 0 or lock.last_slot is None
                    or lock.lock_until is None or lock.lock_until > now - 1.0):
                continue
            why = (f"the lock was held until {utc(lock.lock_until)} (token {lock.token}, "
                   f"{lock.holder or 'no holder'}) with no run")
            plan = passed(job, lock.last_slot, now, Cause.LOCK_HELD, upto=lock.lock_until,
                          reason=why)
            if plan is not None:
                self._book.record(job, plan, now)

    def _gaps(self) -> None:
        """The slots between a claim's slot and the slot before it that a
        lock held a second or more past the slot before kept from every
        host, those without a record, recorded skipped through the slot
        book; each claim's gap by one host (the one that marks it seen).
        One statement when there are none."""
        gaps = self.store.held_gaps()
        if not gaps:
            return
        jobs, now, empty = self._jobs(), self.clock.now(), []
        for gap in gaps:
            job = jobs.job(gap.name)
            if job is None:
                continue  # not in this file: a host that has it looks
            if job.cron is None or job.fan_out:
                empty.append(gap)  # no slots of its own to record
                continue
            upto = min(gap.until, gap.last_slot) - 0.001
            why = (f"the lock was held until {utc(gap.until)} after the slot "
                   f"{utc(gap.after)}, and the job moved on with token {gap.token}")
            recorded, ranges = self.store.record_slots_in(job.name, gap.after, upto)
            plans = [plan for after, last in unrecorded_runs(job, gap.after, upto, recorded,
                                                             ranges)
                     if (plan := passed(job, after, now, Cause.LOCK_HELD, upto=last,
                                        reason=why)) is not None]
            if not plans:
                empty.append(gap)
            elif self._book.record(job, plans[0], now, gap_of=gap.token):
                for plan in plans[1:]:  # this host marked the gap seen: the rest is its own
                    self._book.record(job, plan, now, conditional=False)
        if empty:
            self.store.held_gaps_seen(empty)

    def _blocked_slots(self, lost: LostRun) -> None:
        """A run this host recorded lost (its holder stopped renewing). The
        slots after its own that its lock kept until the job could be
        claimed again started nowhere: those not recorded yet are recorded
        skipped through the slot book, saying why. Not only those after its
        last renewal: a holder starved before it was cut off renewed without
        recording its busy slots, and this write moves the job on past
        them. The one host whose sweep recorded the loss does this, so each
        slot is recorded once (a holder recording the same slots late is
        refused by the conditional write, or refuses this one)."""
        log.warning("job %s: run %d on %s lost: its lease was last renewed at %s",
                    lost.job, lost.id, lost.host, utc(lost.ended))
        job = self._jobs().job(lost.job)
        if lost.item is not None or job is None or job.cron is None:
            return
        after = lost.slot if lost.slot is not None else lost.ended
        if lost.lock_until is not None:
            # Nobody had claimed it since: the slots up to the lease's end,
            # after those already handled (a daemon's resync may have
            # recorded some), taken off the job by the conditional write so
            # no late claim runs one. Read again if another host moved first.
            why_end = f"its lease ran out at {utc(lost.lock_until)}"
            for _ in range(3):
                lock = self.store.lock_state(job.name)
                if lock is None or lock.token != lost.token:
                    break  # claimed since
                self._hold_at_least(job, lost, lock)
                floor = max(after, lock.last_slot if lock.last_slot is not None else after)
                if self._record_blocked(job, lost, floor, lost.lock_until, why_end):
                    return
        # Claimed since: that claim moved the job on over the slots its lease
        # kept, and _gaps records those nobody did.

    def _hold_at_least(self, job: Job, lost: LostRun, lock: LockState) -> None:
        """A lost run's lock is released as the run's end would have
        released it: held until its claim + ``lock-at-least``, when that
        outlasts its lease. No host claims the job before then (the claim
        checks the last start), and the slots it keeps must be recorded:
        by :meth:`held_slots` once it has run out, or, if a host claims a
        later slot first, through the gap its claim leaves (which keeps
        the lock's end). Kept for the lease alone, the slots between the
        lease's end and the lock-at-least's had no record (the fault soak,
        seed 24153: a holder cut off with a 3 s lease, lock-at-least 4 s)."""
        if (job.lock_at_least > 0 and lock.locked_at is not None
                and lock.locked_at + job.lock_at_least > max(self.clock.now(),
                                                             lock.lock_until or 0.0)):
            self.store.release(job.name, lost.host, lost.token, job.lock_at_least)

    def _record_blocked(self, job: Job, lost: LostRun, after: float, upto: float,
                        why_end: str) -> bool:
        reason = (f"{lost.host} held the lock and stopped renewing it at {utc(lost.ended)} "
                  f"(run {lost.id}, lost), {why_end}")
        now = self.clock.now()
        plan = passed(job, after, now, Cause.DEAD_HOLDER, upto=upto, reason=reason)
        return plan is None or self._book.record(job, plan, now)

    def _definitions(self, jobs: JobsFile) -> tuple[dict[str, str], str]:
        """Each job's definition hash (and as JSON), once per jobs file: an idle
        heartbeat then costs the same whatever the number of jobs. Keyed with
        the fleet's secret (read with the schema's version: no statement)."""
        if self._defs_for is not jobs:
            key = self.store.fleet_key()
            digests = {j.name: j.digests(key) for j in jobs.jobs}
            defs = {name: hashed for name, (hashed, _fields) in digests.items()}
            self._defs = (defs, json.dumps(defs))
            self._fields = {name: fields for name, (_hashed, fields) in digests.items()}
            self._defs_for = jobs
        return self._defs

    def _check_drift(self, jobs: JobsFile, mine: dict[str, str],
                     differing: list[tuple[str, str | None]]) -> None:
        """Warn once per (job, other definition) seen on another live host
        (``differing``: those whose definitions are not this host's; ``mine``:
        the definition hashes of ``jobs``)."""
        seen: dict[str, dict[str, list[str]]] = {}
        for host, text in differing:
            try:
                defs = json.loads(text or "{}")
            except ValueError:
                continue
            if isinstance(defs, dict):
                for name, digest in defs.items():
                    seen.setdefault(str(name), {}).setdefault(str(digest), []).append(host)
        new = [(name, digest, hosts) for name, defs in seen.items() if name in mine
               for digest, hosts in defs.items()
               if digest != mine[name] and (name, digest) not in self._drift_seen]
        if not new:
            return
        theirs = self._their_fields(sorted({h for _n, _d, hosts in new for h in hosts}))
        secret = self.store.fleet_key()
        for name, digest, hosts in new:
            self._drift_seen.add((name, digest))
            job = jobs.job(name)
            ours = job.field_digests(secret) if job is not None else {}
            differ = sorted({key for host in hosts if (fields := theirs.get(host)) is not None
                             for key in differing_keys(ours, fields.get(name))})
            log.warning(
                "job %s: defined differently on %s (%sdefinition %s, here %s): "
                "check that every host has the same jobs file, or that two files "
                "sharing this database do not use the same job name",
                name, ", ".join(hosts),
                f"{', '.join(differ)} differ{'s' if len(differ) == 1 else ''}; "
                if differ else "", digest, mine[name],
            )

    def _their_fields(self, hosts: list[str]) -> dict[str, dict[str, dict[str, str]]]:
        """The other hosts' field digests, per job (a host that did not
        write them, an older daemon, is left out)."""
        out: dict[str, dict[str, dict[str, str]]] = {}
        for host, text in self.store.host_fields(hosts).items():
            if (fields := loads_fields(text)) is not None:
                out[host] = fields
        return out
