"""The hot path's role (:class:`~dblockrun.store.runstore.RunStore`) in
memory, on a clock the caller moves: logic tests of the run lifecycle, the
renewals and the slot book take milliseconds instead of waiting for a
database's seconds to pass.

:class:`MemoryRunStore` keeps the lock rows and run records as the SQL of
:mod:`~dblockrun.store.queries` writes them, and decides every claim by
the same predicate (:meth:`Queries.claimable
<dblockrun.store.queries.Queries.claimable>`): a usable token, the lease
run out, the fleet not paused, the holder's host not drained, the job not
disabled, and as the claim asks a newer slot not in the future (within
its tolerance), a last start at least a rate old, an operator's request,
or a passed slot run again. Every time it reads or writes is its
:class:`ManualClock`'s, the database clock's stand-in.

It plays :class:`~dblockrun.store.runstore.FiringStore` too, what a
daemon's attempts ask: a job's claim with its record, a batch of jobs of
one slot (the same predicate, row by row: every claim here is serialized,
so no row is ever "being claimed at this moment" and ``wait`` changes
nothing), an operator's run-now request, a group's seat and a job's lane
(:mod:`~dblockrun.running.seats`), the lock rows, the audited disables'
starts, and the held runs (:class:`MemoryControl`: running, waiting,
kill requests; the audit trail keeps only the disables' starts).

Not modelled (they stay with the databases and their tests): a batch's
chunks and SKIP LOCKED, fan-out items, the claims of ``exec`` and the API
that record a dead holder's run lost first (``Claim.check``: the schema
version and the lost sweep), every-host rows (``JOB@HOST``) as one job,
the rest of the bookkeeping (lost runs, hosts: the held gaps are here,
:class:`~dblockrun.store.roles.HeldGaps`), transactions cut short, and a
store that is away: no call here raises
:class:`~dblockrun.errors.DatabaseError`.

It plays :class:`~dblockrun.store.runstore.ChainStore` too, the job
chains' triggers (``after:``): made once per (downstream job, upstream
run), taken once by a claim of the job (the same predicate) or a record
of why it did not run (tests/test_chain_contract.py holds it to the SQL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from dblockrun.jobs import EVERY_HOST_SEP, LANE_PREFIX
from dblockrun.store.control import Pause
from dblockrun.store.engine import Claim
from dblockrun.store.models import (
    CLAIM_TOLERANCE,
    OK,
    RUNNING,
    UNFINISHED,
    WAITING,
    Claimed,
    ClockSample,
    HeldGap,
    LockState,
    RunRecord,
    Trigger,
    token_usable,
)

#: A fixed start, so that logic tests read the same times on every run
#: (2027-01-15 08:00:00 UTC, a whole minute).
EPOCH = 1_800_000_000.0
#: A claim with no condition beyond the lock being free and the job enabled.
PLAIN = Claim()


class ManualClock:
    """The store's clock: it stands still until the test moves it."""

    def __init__(self, start: float = EPOCH) -> None:
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move on ``seconds`` (never back); the time now."""
        if seconds < 0:
            raise ValueError("a clock moves forward only")
        with self._lock:
            self._now += seconds
            return self._now


@dataclass
class LockRow:
    """A row of the locks table (a job's, a lane's or a seat's)."""

    name: str
    token: int = 0
    holder: str | None = None
    lock_until: float | None = None
    locked_at: float | None = None
    renewed_at: float | None = None
    prev_renewed_at: float | None = None
    last_slot: float | None = None
    last_start: float | None = None
    next_due: float | None = None
    disabled_until: float | None = None
    disabled_reason: str | None = None
    run_requested: float | None = None
    kill_token: int | None = None
    kill_by: str | None = None
    prev_slot: float | None = None
    prev_until: float | None = None
    #: A seat's or lane's: the job it was last taken for.
    held_for: str | None = None

    def state(self) -> LockState:
        return LockState(self.name, self.holder, self.lock_until, self.locked_at, self.token,
                         self.last_slot, self.last_start, self.next_due, self.disabled_until,
                         self.disabled_reason, run_requested=self.run_requested)


@dataclass
class RunRow:
    """A run record."""

    id: int
    job: str
    host: str
    token: int | None
    slot: float | None
    attempt: int
    started: float
    result: str
    item: str | None = None
    finished: float | None = None
    exit_code: int | None = None
    output: str | None = None
    covers_from: float | None = None
    upstream_job: str | None = None
    upstream_run: int | None = None
    origin: str | None = None
    origin_run: int | None = None

    @property
    def duration(self) -> float | None:
        return None if self.finished is None else self.finished - self.started

    def record(self) -> RunRecord:
        return RunRecord(self.id, self.job, self.item, self.host, self.slot, self.token,
                         self.attempt, self.started, self.finished, self.exit_code, self.result,
                         self.output, self.upstream_job, self.upstream_run, self.origin,
                         self.origin_run)


class MemoryRunStore:
    """:class:`~dblockrun.store.runstore.RunStore` in memory, plus the
    claim of :meth:`LockEngine.claim <dblockrun.store.engine.LockEngine.claim>`
    and the operator's switches a claim reads (disable, pause, drain, run
    now, kill), for tests. Thread-safe: a run's steps and its renewals call
    it from different threads."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock or ManualClock()
        self._lock = threading.RLock()
        self._locks: dict[str, LockRow] = {}
        self._runs: dict[int, RunRow] = {}
        self._next_id = 1
        self._pause_ends: float | None = None
        self._pause_since = 0.0
        self._drains: dict[str, float] = {}
        #: (downstream job, upstream run) -> the trigger, and when it was taken.
        self._triggers: dict[tuple[str, int], tuple[Trigger, float | None]] = {}
        #: The audited disables: (job, when).
        self._disables: list[tuple[str, float]] = []
        self._control = MemoryControl(self)
        self._drained = MemoryDrains(self)

    @property
    def control(self) -> MemoryControl:
        return self._control

    @property
    def drains(self) -> MemoryDrains:
        return self._drained

    def db_now(self) -> float:
        return self.clock.now()

    # -- what tests read ------------------------------------------------------------

    def lock_row(self, name: str) -> LockRow | None:
        """A copy of the lock row ``name``."""
        with self._lock:
            row = self._locks.get(name)
            return None if row is None else replace(row)

    def runs_of(self, job: str) -> list[RunRow]:
        """Copies of ``job``'s run records, oldest first."""
        with self._lock:
            return [replace(r) for r in self._runs.values() if r.job == job]

    def run(self, run_id: int) -> RunRow | None:
        with self._lock:
            found = self._runs.get(run_id)
            return None if found is None else replace(found)

    def set_last_slot(self, name: str, slot: float) -> None:
        """The job's lock row as a fleet would have left it (tests: a fleet
        stopped since ``slot``): its last slot ``slot`` (made if missing),
        with no run record."""
        with self._lock:
            self._locks.setdefault(name, LockRow(name)).last_slot = slot

    # -- the operator's switches ------------------------------------------------------

    def ensure_jobs(self, names: Iterable[str]) -> None:
        """Give each name its lock row (free, token 0) if it has none."""
        with self._lock:
            for name in names:
                self._locks.setdefault(name, LockRow(name))

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None, audited: bool = False) -> float:
        """Disable ``name`` (for ``for_seconds``, until ``until``, or for
        ever): no claim of it wins meanwhile. When it ends. ``audited``: an
        operator's (in the audit trail), else ``on-failure``'s (as
        ``Store.disable`` with no ``audit``, what the daemon calls)."""
        with self._lock:
            row = self._locks.setdefault(name, LockRow(name))
            now = self.clock.now()
            end = float("inf") if until is None else until
            if for_seconds is not None:
                end = now + for_seconds
            row.disabled_until, row.disabled_reason = end, reason
            if audited:  # (by job, as the audit trail: an every-host row's is its job's)
                self._disables.append((name.split(EVERY_HOST_SEP, 1)[0], now))
            return end

    def disabled_since(self, name: str, now: float) -> float | None:
        """As :meth:`Store.disabled_since <dblockrun.store.store.Store.disabled_since>`."""
        job = name.split(EVERY_HOST_SEP, 1)[0]
        with self._lock:
            return max((at for of, at in self._disables if of == job and at <= now),
                       default=None)

    def enable(self, name: str) -> None:
        """Clear a disable of ``name`` (``dblockrun enable``)."""
        with self._lock:
            row = self._locks.setdefault(name, LockRow(name))
            row.disabled_until = row.disabled_reason = None

    def resume(self) -> None:
        """End the fleet-wide pause (``dblockrun resume``)."""
        with self._lock:
            self._pause_ends = None

    def pause(self, for_seconds: float) -> None:
        """The fleet-wide pause: no claim wins for ``for_seconds``."""
        with self._lock:
            self._pause_since = self.clock.now()
            self._pause_ends = self._pause_since + for_seconds

    def drain(self, host: str, for_seconds: float) -> None:
        """Refuse the claims of holders on ``host`` (``HOST:...``) for ``for_seconds``."""
        with self._lock:
            self._drains[host] = self.clock.now() + for_seconds

    def request_run(self, name: str) -> None:
        """An operator's run-now request (``dblockrun run``)."""
        with self._lock:
            self._locks.setdefault(name, LockRow(name)).run_requested = self.clock.now()

    def kill(self, name: str, token: int, by: str) -> bool:
        """An operator's kill of the run of ``name`` with ``token``, while
        its lease is live: its holder reads it with its next renewal.
        Whether it was asked."""
        with self._lock:
            row = self._locks.get(name)
            if (row is None or row.token != token or row.lock_until is None
                    or row.lock_until <= self.clock.now()):
                return False
            row.kill_token, row.kill_by = row.token, by
            return True

    # -- the claim -------------------------------------------------------------------

    def claim(self, name: str, holder: str, lease: float, claim: Claim = PLAIN, *,
              ensure: bool = False) -> Claimed | None:
        """As :meth:`LockEngine.claim <dblockrun.store.engine.LockEngine.claim>`:
        the new token (and the first attempt's record with
        ``claim.record``), or None when lost. ``ensure``: make the row
        first if it has none."""
        with self._lock:
            if ensure:
                self._locks.setdefault(name, LockRow(name))
            return self._claim_row(name, holder, lease, claim, self.clock.now())

    def _claim_row(self, name: str, holder: str, lease: float, claim: Claim,
                   now: float) -> Claimed | None:
        """Every claim of a job's row: the predicate, the write, the record."""
        row = self._locks.get(name)
        if row is None or not self._claimable(row, holder, claim, now):
            return None
        self._take(row, holder, lease, claim, now)
        run_id = None
        if claim.record:
            run_id = self._insert(RunRow(0, name, holder, row.token, claim.slot, 1, now,
                                         RUNNING))
        return Claimed(name, row.token, run_id)

    def claim_and_record(self, name: str, holder: str, lease: float, *,
                         slot: float | None = None, rate: float | None = None,
                         next_due: float | None = None,
                         slot_tolerance: float = CLAIM_TOLERANCE) -> Claimed | None:
        return self.claim(name, holder, lease, Claim(
            slot=slot, rate=rate, next_due=next_due, tolerance=slot_tolerance, record=True))

    def claim_batch(self, names: Sequence[str], holder: str, lease: float, *, slot: float,
                    next_due: float, limit: int, rate: float | None = None,
                    slot_tolerance: float = CLAIM_TOLERANCE,
                    wait: bool = False) -> list[Claimed]:
        """As :meth:`Store.claim_batch <dblockrun.store.store.Store.claim_batch>`:
        the names in the order given, each by :meth:`_claim_row`."""
        claim = Claim(slot=slot, rate=rate, next_due=next_due, tolerance=slot_tolerance,
                      record=True, wait=wait)
        won: list[Claimed] = []
        with self._lock:
            now = self.clock.now()
            for name in dict.fromkeys(names):
                if len(won) >= limit:
                    break
                got = self._claim_row(name, holder, lease, claim, now)
                if got is not None:
                    won.append(got)
        return won

    def claim_requested(self, name: str, holder: str, lease: float) -> int | None:
        won = self.claim(name, holder, lease, Claim(requested=True))
        return None if won is None else won.token

    def claim_seat(self, seats: Sequence[str], holder: str, lease: float,
                   job: str, token: int | None = None) -> tuple[str, int] | None:
        """As :meth:`LockEngine.claim_seat <dblockrun.store.engine.LockEngine.claim_seat>`:
        the first free row by name (as MySQL takes it; PostgreSQL takes any)."""
        with self._lock:
            now = self.clock.now()
            for name in sorted(set(seats)):
                row = self._locks.get(name)
                if row is not None and self._claimable(row, holder, PLAIN, now, seat=True):
                    self._take(row, holder, lease, PLAIN, now, held_for=job, token=token)
                    return name, row.token
            return None

    def seat_holders(self, seats: Sequence[str]) -> list[tuple[str, str]]:
        with self._lock:
            now = self.clock.now()
            return [(str(row.held_for), row.holder) for name in sorted(set(seats))
                    if (row := self._locks.get(name)) is not None and row.holder is not None
                    and row.lock_until is not None and row.lock_until > now]

    def lock_state(self, name: str) -> LockState | None:
        with self._lock:
            row = self._locks.get(name)
            return None if row is None else row.state()

    def lock_states(self) -> tuple[dict[str, LockState], float]:
        with self._lock:
            return {name: row.state() for name, row in sorted(self._locks.items())}, \
                self.clock.now()

    def _claimable(self, row: LockRow, holder: str, claim: Claim, now: float, *,
                   seat: bool = False) -> bool:
        """:meth:`Queries.claimable <dblockrun.store.queries.Queries.claimable>`
        (``seat``: of a group's seat or a job's lane, ``ClaimShape.seat``)."""
        if not token_usable(row.token):
            return False
        if row.lock_until is not None and row.lock_until > now:
            return False
        if self._pause_ends is not None and self._pause_ends > now:
            return False
        if not seat and claim.again is None and any(
                ends > now and holder.startswith(f"{host}:")
                for host, ends in self._drains.items()):
            return False
        if row.disabled_until is not None and row.disabled_until > now:
            return False
        if claim.slot is not None:
            if row.last_slot is not None and row.last_slot >= claim.slot:
                return False
            if claim.slot > now + claim.tolerance:
                return False
        if claim.rate is not None:
            rate_tol = claim.tolerance if claim.slot is not None else 0.0
            if row.last_start is not None and row.last_start > now - claim.rate + rate_tol:
                return False
        if claim.requested and row.run_requested is None:
            return False
        if claim.again is not None:
            if row.last_slot is None or row.last_slot < claim.again:
                return False
            done = (RUNNING, WAITING, OK) if claim.undone else (RUNNING, WAITING)
            if any(r.job == row.name and r.item is None and r.slot == claim.again
                   and r.result in done for r in self._runs.values()):
                return False
        return True

    @staticmethod
    def _take(row: LockRow, holder: str, lease: float, claim: Claim, now: float, *,
              held_for: str | None = None, token: int | None = None) -> None:
        """:meth:`Queries.claim_write <dblockrun.store.queries.Queries.claim_write>`
        on a lock row: every value from the row as it was. ``held_for``: a
        seat's or lane's job; ``token``: a lane's (the job's claim's)."""
        row.prev_renewed_at = row.renewed_at
        if claim.slot is not None:
            held_past = (row.lock_until is not None and row.last_slot is not None
                         and row.lock_until >= row.last_slot + 1)
            row.prev_slot = row.last_slot if row.prev_until is None else row.prev_slot
            row.prev_until = row.lock_until if held_past else row.prev_until
        row.holder, row.lock_until, row.locked_at = holder, now + lease, now
        row.token = row.token + 1 if token is None else token
        row.last_start = row.renewed_at = now
        if held_for is not None:
            row.held_for = held_for
        row.run_requested = None
        if claim.next_due is not None:
            row.next_due = claim.next_due
        elif claim.rate is not None:
            row.next_due = now + claim.rate
        if claim.slot is not None:
            row.last_slot = claim.slot

    # -- renewals --------------------------------------------------------------------

    def renew(self, name: str, holder: str, token: int, lease: float) -> bool:
        """Extend one lease; False when the token is no longer ours."""
        return name in self.renew_many(holder, [(name, token)], lease)

    def renew_many(self, holder: str, held: Sequence[tuple[str, int]], lease: float,
                   outputs: Sequence[tuple[int, str]] = ()) -> dict[str, str | None]:
        with self._lock:
            self.write_outputs(outputs)
            now, renewed = self.clock.now(), {}
            for name, token in held:
                row = self._locks.get(name)
                if row is None or row.holder != holder or row.token != token:
                    continue
                row.lock_until, row.renewed_at = now + lease, now
                renewed[name] = row.kill_by if row.kill_token == row.token else None
            return renewed

    def write_outputs(self, outputs: Sequence[tuple[int, str]]) -> None:
        with self._lock:
            for run_id, text in outputs:
                run = self._runs.get(run_id)
                if run is not None and run.result == RUNNING:
                    run.output = text

    # -- a run's records -----------------------------------------------------------------

    def _insert(self, run: RunRow) -> int:
        run.id, self._next_id = self._next_id, self._next_id + 1
        self._runs[run.id] = run
        return run.id

    def start_run(self, job: str, host: str, *, token: int | None, slot: float | None = None,
                  attempt: int = 1, item: str | None = None, result: str = RUNNING,
                  output: str | None = None, origin: tuple[str, int | None] | None = None
                  ) -> int:
        with self._lock:
            now = self.clock.now()
            return self._insert(RunRow(
                0, job, host, token, slot, attempt, now, result, item=item,
                finished=None if result == RUNNING else now, output=output,
                origin=None if origin is None else origin[0],
                origin_run=None if origin is None else origin[1]))

    def run_waits(self, run_id: int, output: str) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.result not in (RUNNING, WAITING):
                return False
            run.result, run.output = WAITING, output
            return True

    def run_admitted(self, run_id: int) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None or run.result != WAITING:
                return False
            run.result, run.started, run.output = RUNNING, self.clock.now(), None
            return True

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None, took: float | None = None) -> bool:
        with self._lock:
            run = self._runs.get(run_id)
            if run is None:
                return False
            if token is not None:
                row = self._locks.get(job)
                if row is None or row.token != token:
                    return False
            run.finished = self.clock.now() if took is None else run.started + took
            run.exit_code, run.result, run.output = exit_code, result, output
            return True

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool:
        with self._lock:
            row = self._locks.get(name)
            if row is None or row.holder != holder or row.token != token:
                return False
            now = self.clock.now()
            row.lock_until = now if row.locked_at is None else max(
                now, row.locked_at + lock_at_least)
            return True

    def finish_and_release(self, run_id: int, job: str, holder: str, token: int, result: str,
                           exit_code: int | None, output: str | None,
                           lock_at_least: float = 0.0,
                           seat: tuple[str, int] | None = None,
                           took: float | None = None) -> tuple[bool, bool]:
        with self._lock:  # one statement: both see the row as it was
            done = (self.finish_run(run_id, job, token, result, exit_code, output, took),
                    self.release(job, holder, token, lock_at_least))
            if seat is not None:
                self.release_seat(seat, holder)
            return done

    def release_seat(self, seat: tuple[str, int], holder: str) -> bool:
        with self._lock:
            row = self._locks.get(seat[0])
            if row is None or row.holder != holder or row.token != seat[1]:
                return False
            row.lock_until = self.clock.now()
            return True

    def prune_runs(self, job: str, keep: int) -> int:
        with self._lock:
            ids = sorted((r.id for r in self._runs.values() if r.job == job), reverse=True)
            gone = ids[keep:]
            for run_id in gone:
                del self._runs[run_id]
            return len(gone)

    # -- the slot book --------------------------------------------------------------------

    def record_slots(self, name: str, host: str, result: str,
                     rows: Sequence[tuple[float, str, float | None]], *, first: float | None,
                     gap_of: int | None = None, next_due: float | None = None,
                     results: Sequence[str] | None = None) -> bool:
        with self._lock:
            row = self._locks.get(name)
            if first is not None:
                if row is None or (row.last_slot is not None and row.last_slot >= first):
                    return False
                row.last_slot = max(slot for slot, _, _ in rows)
                if next_due is not None:
                    row.next_due = next_due
            if gap_of is not None:
                if row is None or row.token != gap_of or row.prev_until is None:
                    return False
                row.prev_until = None
            now = self.clock.now()
            for i, (slot, text, covers_from) in enumerate(rows):
                self._insert(RunRow(0, name, host, None, slot, 1, now,
                                    result if results is None else results[i], finished=now,
                                    output=text, covers_from=covers_from))
            return True

    # -- the held gaps (dblockrun.store.roles.HeldGaps) ---------------------------------

    def held_gaps(self) -> list[HeldGap]:
        """:meth:`Queries.held_gaps <dblockrun.store.queries.Queries.held_gaps>`."""
        with self._lock:
            return [HeldGap(row.name, row.token, row.prev_slot, row.prev_until,
                            row.last_slot if row.last_slot is not None else row.prev_slot)
                    for row in self._locks.values()
                    if row.prev_until is not None and row.prev_slot is not None]

    def held_gaps_seen(self, gaps: Sequence[HeldGap]) -> None:
        """:meth:`Queries.held_gap_seen <dblockrun.store.queries.Queries.held_gap_seen>`."""
        with self._lock:
            for gap in gaps:
                row = self._locks.get(gap.name)
                if row is not None and row.token == gap.token:
                    row.prev_until = None

    def record_slots_in(self, job: str, after: float,
                        upto: float) -> tuple[set[float], list[tuple[float, float]]]:
        """As :meth:`Store.record_slots_in <dblockrun.store.store.Store.record_slots_in>`."""
        slots: set[float] = set()
        ranges: list[tuple[float, float]] = []
        with self._lock:
            for run in self._runs.values():
                if (run.job != job or run.item is not None or run.slot is None
                        or run.slot <= after
                        or (run.covers_from if run.covers_from is not None else run.slot) > upto):
                    continue
                if run.covers_from is not None:
                    ranges.append((run.covers_from, run.slot))
                if run.slot <= upto:
                    slots.add(run.slot)
        return slots, ranges

    def clock_sample(self) -> ClockSample:
        """The clock read once, as :class:`~dblockrun.running.heartbeat.DbClock`
        takes it (no round trip): a clock fed from it reads this one's time
        then, moving on in real seconds."""
        now = self.clock.now()
        return ClockSample(now, now - time.time(), now - time.monotonic(), 0.0)

    def record_trigger(self, trigger: Trigger, host: str, result: str,
                       output: str) -> int | None:
        with self._lock:
            if not self._untaken(trigger):
                return None
            now = self.clock.now()
            self._take_trigger(trigger, now)
            return self._insert(RunRow(0, trigger.job, host, None, None, 1, now, result,
                                       finished=now, output=output,
                                       upstream_job=trigger.upstream_job,
                                       upstream_run=trigger.upstream_run))

    # -- job chains (dblockrun.store.runstore.ChainStore) ---------------------------------

    def make_triggers(self, down: str, upstream: Sequence[str], results: Sequence[str], *,
                      since: float | None = None, ids: Sequence[int] = ()) -> int:
        """:meth:`Queries.make_triggers <dblockrun.store.queries.Queries.make_triggers>`."""
        made = 0
        with self._lock:
            now = self.clock.now()
            for run in sorted(self._runs.values(), key=lambda r: r.id):
                if (run.job not in upstream or run.item is not None or run.result not in results
                        or run.token is None or run.finished is None
                        or (down, run.id) in self._triggers):
                    continue
                if ids:
                    if run.id not in ids:
                        continue
                elif (since is None or run.finished < since
                      or any(n.job == run.job and n.token == run.token
                             and n.attempt > run.attempt for n in self._runs.values())
                      or self._control._holding(run, now)):
                    continue
                self._triggers[(down, run.id)] = (
                    Trigger(down, run.id, run.job, run.result, run.finished), None)
                made += 1
        return made

    def pending_triggers(self, jobs: Sequence[str]) -> list[Trigger]:
        with self._lock:
            return sorted((trigger for trigger, taken in self._triggers.values()
                           if taken is None and trigger.job in jobs),
                          key=lambda t: t.upstream_run)

    def _untaken(self, trigger: Trigger) -> bool:
        """Whether ``trigger`` is pending, not taken yet (under the lock)."""
        found = self._triggers.get((trigger.job, trigger.upstream_run))
        return found is not None and found[1] is None

    def _take_trigger(self, trigger: Trigger, now: float) -> None:
        """Mark the pending ``trigger`` taken at ``now`` (under the lock)."""
        key = (trigger.job, trigger.upstream_run)
        self._triggers[key] = (self._triggers[key][0], now)

    def chained_before(self, job: str) -> bool:
        with self._lock:
            return any(of == job for of, _ in self._triggers)

    def claim_trigger(self, trigger: Trigger, holder: str, lease: float) -> Claimed | None:
        """As :meth:`LockEngine.claim_trigger
        <dblockrun.store.engine.LockEngine.claim_trigger>`: the trigger
        taken and the claim (by :meth:`_claim_row`) with its record, or neither."""
        with self._lock:
            if not self._untaken(trigger):
                return None
            now = self.clock.now()
            won = self._claim_row(trigger.job, holder, lease, Claim(record=True), now)
            if won is None or won.run_id is None:
                return None
            self._take_trigger(trigger, now)
            run = self._runs[won.run_id]
            run.upstream_job, run.upstream_run = trigger.upstream_job, trigger.upstream_run
            return won

    def prune_triggers(self, before: float) -> int:
        with self._lock:
            gone = [key for key, (trigger, taken) in self._triggers.items()
                    if taken is not None and trigger.ended < before]
            for key in gone:
                del self._triggers[key]
            return len(gone)


class MemoryDrains:
    """The drained hosts of a :class:`MemoryRunStore` (``dblockrun drain``)."""

    def __init__(self, store: MemoryRunStore) -> None:
        self._s = store

    def drained(self, host: str) -> float | None:
        """When ``host``'s drain in effect now ends, None when none is."""
        with self._s._lock:
            ends = self._s._drains.get(host)
            return ends if ends is not None and ends > self._s.clock.now() else None



class MemoryControl:
    """:class:`~dblockrun.store.runstore.RunsControl` of a
    :class:`MemoryRunStore`: its held runs (:meth:`Queries.holding
    <dblockrun.store.queries.Queries.holding>`: the job's row or one of its
    lanes with the run's token, the lease live; items are not modelled)."""

    def __init__(self, store: MemoryRunStore) -> None:
        self._s = store

    def _holding(self, run: RunRow, now: float) -> list[LockRow]:
        if run.item is not None:
            return []
        return [row for row in self._s._locks.values()
                if (row.name == run.job or (row.held_for == run.job
                                            and row.name.startswith(LANE_PREFIX)))
                and row.token == run.token and row.lock_until is not None
                and row.lock_until > now]

    def paused(self) -> Pause | None:
        """The fleet-wide pause in effect now, None when none is."""
        with self._s._lock:
            ends = self._s._pause_ends
            if ends is None or ends <= self._s.clock.now():
                return None
            return Pause(ends, self._s._pause_since, "tests", None)

    def running(self, job: str | None = None) -> list[RunRecord]:
        with self._s._lock:
            now = self._s.clock.now()
            return [run.record() for run in sorted(self._s._runs.values(), key=lambda r: r.id)
                    if run.result in UNFINISHED and (job is None or run.job == job)
                    and self._holding(run, now)]

    def waiting(self, jobs: Sequence[str]) -> list[RunRecord]:
        with self._s._lock:
            now = self._s.clock.now()
            found = [run for run in self._s._runs.values()
                     if run.result == WAITING and run.job in jobs and self._holding(run, now)]
            found.sort(key=lambda r: (r.slot if r.slot is not None else r.started, r.id))
            return [run.record() for run in found]

    def kill(self, runs: list[RunRecord], who: str, reason: str | None) -> list[RunRecord]:
        by = (who if not reason else f"{who}: {reason}")[:1000]
        asked: list[RunRecord] = []
        with self._s._lock:
            now = self._s.clock.now()
            for run in runs:
                rows = self._holding(RunRow(run.id, run.job, run.host, run.token, run.slot,
                                            run.attempt, run.started, run.result,
                                            item=run.item), now)
                for row in rows:
                    row.kill_token, row.kill_by = run.token, by
                if rows:
                    asked.append(run)
        return asked
