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

Not modelled (they stay with the databases and their tests): batch claims
(``claim_batch``: SKIP LOCKED, its chunks), fan-out items, group seats'
claims (their release is), the claims of ``exec`` and the API that record
a dead holder's run lost first (``Claim.check``: the schema version and
the lost sweep), the rest of the bookkeeping (lost runs, hosts: the held
gaps are here, :class:`~dblockrun.store.roles.HeldGaps`), transactions
cut short, and a store that is away: no call here raises
:class:`~dblockrun.errors.DatabaseError`. Triggers exist only once
:meth:`MemoryRunStore.add_trigger` made them (``make_triggers`` is not in
the role).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from dblockrun.store.engine import Claim
from dblockrun.store.models import (
    OK,
    RUNNING,
    WAITING,
    Claimed,
    ClockSample,
    HeldGap,
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
        self._drains: dict[str, float] = {}
        self._triggers: dict[tuple[str, int], float | None] = {}

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

    # -- the operator's switches ------------------------------------------------------

    def ensure_jobs(self, names: Iterable[str]) -> None:
        """Give each name its lock row (free, token 0) if it has none."""
        with self._lock:
            for name in names:
                self._locks.setdefault(name, LockRow(name))

    def disable(self, name: str, *, for_seconds: float | None = None, until: float | None = None,
                reason: str | None = None) -> float:
        """Disable ``name`` (for ``for_seconds``, until ``until``, or for
        ever): no claim of it wins meanwhile. When it ends."""
        with self._lock:
            row = self._locks.setdefault(name, LockRow(name))
            end = float("inf") if until is None else until
            if for_seconds is not None:
                end = self.clock.now() + for_seconds
            row.disabled_until, row.disabled_reason = end, reason
            return end

    def pause(self, for_seconds: float) -> None:
        """The fleet-wide pause: no claim wins for ``for_seconds``."""
        with self._lock:
            self._pause_ends = self.clock.now() + for_seconds

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

    def add_trigger(self, trigger: Trigger) -> None:
        """A pending trigger (as ``make_triggers`` makes them)."""
        with self._lock:
            self._triggers.setdefault((trigger.job, trigger.upstream_run), None)

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
            row = self._locks.get(name)
            now = self.clock.now()
            if row is None or not self._claimable(row, holder, claim, now):
                return None
            self._take(row, holder, lease, claim, now)
            run_id = None
            if claim.record:
                run_id = self._insert(RunRow(0, name, holder, row.token, claim.slot, 1, now,
                                             RUNNING))
            return Claimed(name, row.token, run_id)

    def _claimable(self, row: LockRow, holder: str, claim: Claim, now: float) -> bool:
        """:meth:`Queries.claimable <dblockrun.store.queries.Queries.claimable>`."""
        if not token_usable(row.token):
            return False
        if row.lock_until is not None and row.lock_until > now:
            return False
        if self._pause_ends is not None and self._pause_ends > now:
            return False
        if claim.again is None and any(
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
    def _take(row: LockRow, holder: str, lease: float, claim: Claim, now: float) -> None:
        """:meth:`Queries.claim_write <dblockrun.store.queries.Queries.claim_write>`
        on a lock row: every value from the row as it was."""
        row.prev_renewed_at = row.renewed_at
        if claim.slot is not None:
            held_past = (row.lock_until is not None and row.last_slot is not None
                         and row.lock_until >= row.last_slot + 1)
            row.prev_slot = row.last_slot if row.prev_until is None else row.prev_slot
            row.prev_until = row.lock_until if held_past else row.prev_until
        row.holder, row.lock_until, row.locked_at = holder, now + lease, now
        row.token += 1
        row.last_start = row.renewed_at = now
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
            key = (trigger.job, trigger.upstream_run)
            if key not in self._triggers or self._triggers[key] is not None:
                return None
            now = self.clock.now()
            self._triggers[key] = now
            return self._insert(RunRow(0, trigger.job, host, None, None, 1, now, result,
                                       finished=now, output=output,
                                       upstream_job=trigger.upstream_job,
                                       upstream_run=trigger.upstream_run))
