"""The hot path's role: what running a claimed job asks of a store.

:class:`RunStore` holds exactly what its three users call: the run's
lifecycle (:class:`~dblockrun.running.runjob.JobRun`: record, wait, start,
result, release, prune), the lease's renewals
(:class:`~dblockrun.running.heartbeat.Renewer`) and the slot book's writes
(:class:`~dblockrun.running.slotbook.SlotBook`). The claim is not in it:
its users are handed a claim already won (a token, maybe a run id), and
each claiming path speaks its own dialect (``Store.claim``,
``LockEngine.claim`` with a :class:`~dblockrun.store.engine.Claim`).

:class:`~dblockrun.store.engine.LockEngine` (``exec``, over a direct driver
connection) and :class:`~dblockrun.store.Store` (the daemon, which hands
each call to its engine) have it structurally, and so has
:class:`~dblockrun.store.memory.MemoryRunStore`, the in-memory one that
logic tests run on (tests/test_runstore_contract.py holds all three to the
same contract).

:class:`FiringStore` adds what a daemon's attempts
(:class:`~dblockrun.daemon.firing.Firing`) and the seats and queues they
take (dblockrun/running/seats.py) ask on top: the claims (a job's slot,
a batch of jobs of one slot, an operator's run-now request, a group's
seat or a job's lane), the lock rows read when a plan is in doubt, and
the runs that hold or wait for a lease (:class:`RunsControl`).
:class:`~dblockrun.store.Store` has it, and so has the memory store
(tests/test_firing_contract.py holds both to one contract).

Every time below is the store's clock (the database's; the memory store's
settable one), never the caller's. A write that is "fenced" matches only
while the job's lock row still has the caller's token (and, for a release,
its holder): a run whose lock another holder took writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from dblockrun.store.models import CLAIM_TOLERANCE, RUNNING

if TYPE_CHECKING:
    from dblockrun.store.control import Pause
    from dblockrun.store.models import Claimed, LockState, RunRecord, Trigger


class RunStore(Protocol):
    """The statements of one claimed run, its renewals and the slot book.
    Each raises :class:`~dblockrun.errors.DatabaseError` when the store is
    away (a memory store never is)."""

    # -- renewals -----------------------------------------------------------------

    def renew_many(self, holder: str, held: Sequence[tuple[str, int]], lease: float,
                   outputs: Sequence[tuple[int, str]] = ()) -> dict[str, str | None]:
        """Extend ``holder``'s leases ``held`` ((lock name, token) pairs) to
        now + ``lease``: a row is renewed while its holder and token are
        still these (whether or not its lease ran out meanwhile: nobody took
        it), never after another claim took it. Returns the names renewed,
        each with its kill request for that token (who and why; None: none);
        a name missing is a lost lease. ``outputs``: (run id, output tail) of
        runs still ``running``, written with it."""
        ...

    def write_outputs(self, outputs: Sequence[tuple[int, str]]) -> None:
        """Live output tails ((run id, text)) of runs still ``running``; a run
        with a result keeps its stored output."""
        ...

    # -- a run's records -------------------------------------------------------------

    def start_run(self, job: str, host: str, *, token: int | None, slot: float | None = None,
                  attempt: int = 1, item: str | None = None, result: str = RUNNING,
                  output: str | None = None, origin: tuple[str, int | None] | None = None
                  ) -> int:
        """A new run record (started now; a ``result`` other than
        ``running`` is finished now too); its id, greater than every id
        before. Unfenced: the caller holds the lock (or records a slot
        that ran nowhere)."""
        ...

    def run_waits(self, run_id: int, output: str) -> bool:
        """A run still ``running`` or ``waiting`` becomes ``waiting`` for
        ``output`` (a seat, room on the host). Whether it matched."""
        ...

    def run_admitted(self, run_id: int) -> bool:
        """A ``waiting`` run becomes ``running``, started now. Whether it matched."""
        ...

    def finish_run(self, run_id: int, job: str, token: int | None, result: str,
                   exit_code: int | None, output: str | None, took: float | None = None) -> bool:
        """A run's end (finished ``took`` after its start; None: now); with
        ``token``, fenced: only while ``job``'s lock still has that token.
        Whether it was written."""
        ...

    def release(self, name: str, holder: str, token: int, lock_at_least: float = 0.0) -> bool:
        """Free the lock (fenced by holder and token): its lease ends now,
        but not before its claim + ``lock_at_least`` (until then no claim
        wins). Whether it matched."""
        ...

    def finish_and_release(self, run_id: int, job: str, holder: str, token: int, result: str,
                           exit_code: int | None, output: str | None,
                           lock_at_least: float = 0.0,
                           seat: tuple[str, int] | None = None,
                           took: float | None = None) -> tuple[bool, bool]:
        """:meth:`finish_run` (fenced) and :meth:`release` at once, and the
        group ``seat`` freed with them: (result written, released). A
        fenced holder changes nothing: (False, False)."""
        ...

    def release_seat(self, seat: tuple[str, int], holder: str) -> bool:
        """Free a group seat (its row name, the token it was taken with):
        its lease ends now. Whether it matched."""
        ...

    def prune_runs(self, job: str, keep: int) -> int:
        """Delete all but the newest ``keep`` records of ``job``; how many went."""
        ...

    # -- the slot book ----------------------------------------------------------------

    def record_slots(self, name: str, host: str, result: str,
                     rows: Sequence[tuple[float, str, float | None]], *, first: float | None,
                     gap_of: int | None = None, next_due: float | None = None,
                     results: Sequence[str] | None = None) -> bool:
        """Record slots that ran nowhere (``rows``: slot, output, a summary's
        first slot), all or nothing. With ``first``: only while the job's
        last slot is before ``first``, which it advances to the newest of
        ``rows`` (and its next slot to ``next_due``): of the writers of the
        same slots one wins, the others get False. With ``gap_of``: only
        while the claim with that token is the row's last and its held gap
        unlooked-at, which it marks looked at. With neither: unconditional.
        ``results``: each row's result, else ``result``."""
        ...

    def record_trigger(self, trigger: Trigger, host: str, result: str,
                       output: str) -> int | None:
        """Take a pending ``trigger`` and record why it starts no run: the
        record's id, None when another host took it first."""
        ...


class RunsControl(Protocol):
    """The runs a daemon's attempts and queues read and stop, and the
    fleet-wide pause (a part of
    :class:`~dblockrun.store.control.ControlStore`). A run is *held* while
    a lock row (the job's own, or one of its lanes: ``overlap: allow N``)
    has the run's token and a live lease."""

    def running(self, job: str | None = None) -> list[RunRecord]:
        """The runs of ``job`` (None: of every job) that are ``running`` or
        ``waiting`` and held, by id."""
        ...

    def waiting(self, jobs: Sequence[str]) -> list[RunRecord]:
        """The ``waiting`` runs of ``jobs`` that are held, oldest slot (a
        slot-less run: its start) first, then by id."""
        ...

    def kill(self, runs: list[RunRecord], who: str, reason: str | None) -> list[RunRecord]:
        """Ask the holders of ``runs`` to stop them: a kill request (``who:
        reason``) on the row that holds each (the job's or a lane with the
        run's token, its lease live), which its holder reads with its next
        renewal; audited. The runs asked."""
        ...

    def paused(self) -> Pause | None:
        """The pause in effect now (``dblockrun pause``), None when none is:
        what a lost claim reads to say why (an every-host row's,
        dblockrun/daemon/firing.py; a job chain's, dblockrun/daemon/chains.py)."""
        ...


class FiringStore(RunStore, Protocol):
    """What a daemon's attempts ask of a store: :class:`RunStore` (the
    runs they start, the claims they give back) and the claims, reads and
    runs below. A claim wins by one predicate on every path (a usable
    token, the lease run out, no fleet pause, the holder's host not
    drained except for a seat or lane, the job not disabled, and what the
    claim asks: a newer slot not later than now + its tolerance, a last
    start at least ``rate`` old (within the tolerance when with a slot),
    an operator's request). A claim won takes the row: ``holder``, a lease
    of ``lease`` from now, the token one up (a lane: the job's), its last
    start now, the run-now request cleared, and as asked its last slot and
    next due time (``next_due``, else now + ``rate`` when rate-only)."""

    @property
    def control(self) -> RunsControl:
        """The held runs: who runs, who waits, and the kill requests."""
        ...

    def ensure_jobs(self, names: Iterable[str]) -> None:
        """Make the lock rows of ``names`` that do not exist yet (free,
        token 0); the others are left as they are."""
        ...

    def lock_state(self, name: str) -> LockState | None:
        """The lock row ``name``, None when there is none."""
        ...

    def lock_states(self) -> tuple[dict[str, LockState], float]:
        """Every lock row by name, and the store's time, read at once."""
        ...

    def disabled_since(self, name: str, now: float) -> float | None:
        """When the disable of ``name`` (``JOB@HOST``: its job's) began by
        the audit trail: its newest audited ``disable`` at or before
        ``now``; None when none is (an unaudited disable: ``on-failure``)."""
        ...

    def claim_and_record(self, name: str, holder: str, lease: float, *,
                         slot: float | None = None, rate: float | None = None,
                         next_due: float | None = None,
                         slot_tolerance: float = CLAIM_TOLERANCE) -> Claimed | None:
        """Claim ``name`` (for ``slot``; None: a rate-only turn) and, when
        won, the ``running`` record of its first attempt (slot, the new
        token, started at the claim). None when lost (a missing row too)."""
        ...

    def claim_batch(self, names: Sequence[str], holder: str, lease: float, *, slot: float,
                    next_due: float, limit: int, rate: float | None = None,
                    slot_tolerance: float = CLAIM_TOLERANCE,
                    wait: bool = False) -> list[Claimed]:
        """:meth:`claim_and_record` of up to ``limit`` of ``names`` (one
        slot), by the same predicate: those won, each with its run id; which
        of more candidates than ``limit`` are taken is the store's choice.
        Rows another claim is taking at this moment are skipped, or with
        ``wait`` waited for."""
        ...

    def claim_requested(self, name: str, holder: str, lease: float) -> int | None:
        """Claim ``name`` only while an operator's run-now request is on it
        (``dblockrun run``), which the claim clears; no record is made. The
        new token, or None."""
        ...

    def claim_seat(self, seats: Sequence[str], holder: str, lease: float,
                   job: str, token: int | None = None) -> tuple[str, int] | None:
        """Take one free row of ``seats`` (a group's seats, or a job's lanes)
        for ``job`` (held for it from now), by the claim predicate without
        the drain (the slot is claimed already); ``token``: a lane's, the
        job's claim's, else the row's next one. (row, token), or None when
        none is free (a missing row is never free)."""
        ...

    def seat_holders(self, seats: Sequence[str]) -> list[tuple[str, str]]:
        """(job held for, holder) of each row of ``seats`` whose lease is
        live and that has a holder, by row name."""
        ...


class Drained(Protocol):
    """The drained hosts, as a job chain's lost claim reads them."""

    def drained(self, host: str) -> object | None:
        """``host``'s drain in effect now (``dblockrun drain``), None when none is."""
        ...


class ChainStore(FiringStore, Protocol):
    """What a daemon's job chains (``after:``; :class:`~dblockrun.daemon.chains.Chains`)
    ask on top of :class:`FiringStore`: the triggers. A trigger is a row
    keyed by (downstream job, upstream run record): made once, pending
    until taken, taken once, by the claim of its job's one run
    (:meth:`claim_trigger`) or by the record of why it started none
    (:meth:`~RunStore.record_trigger`). :class:`~dblockrun.store.Store`
    has it, and so has the memory store (tests/test_chain_contract.py
    holds both to one contract)."""

    @property
    def control(self) -> RunsControl:
        """The held runs and the fleet-wide pause."""
        ...

    @property
    def drains(self) -> Drained:
        """The drained hosts."""
        ...

    def make_triggers(self, down: str, upstream: Sequence[str], results: Sequence[str], *,
                      since: float | None = None, ids: Sequence[int] = ()) -> int:
        """Make the triggers of ``down`` for the finished runs (no item, a
        token, a finish) of ``upstream`` whose result is in ``results`` and
        that have none yet: with ``ids``, those runs only (their host just
        recorded their end); else those that ended at or after ``since``
        and are over (no later attempt with their token, and no lock row,
        the job's or a lane, holding their token with a live lease). A
        trigger taken and pruned is not made again only while it is kept.
        The number made."""
        ...

    def pending_triggers(self, jobs: Sequence[str]) -> list[Trigger]:
        """The triggers of ``jobs`` not taken yet, by upstream run id."""
        ...

    def chained_before(self, job: str) -> bool:
        """Whether ``job`` has a trigger, pending or taken (its ``after:`` is not new)."""
        ...

    def claim_trigger(self, trigger: Trigger, holder: str, lease: float) -> Claimed | None:
        """Take the pending ``trigger`` and claim its job (the claim
        predicate, no slot) with its first attempt's ``running`` record,
        which names the upstream run: both or neither. None, nothing
        written, when the trigger is taken already or the claim loses."""
        ...

    def prune_triggers(self, before: float) -> int:
        """Forget the taken triggers whose upstream run ended before
        ``before`` (pending ones are kept); the number forgotten."""
        ...


if TYPE_CHECKING:  # who plays the roles: mypy checks it here
    from dblockrun.store.engine import LockEngine
    from dblockrun.store.memory import MemoryRunStore
    from dblockrun.store.store import Store

    def _plays(store: Store, engine: LockEngine,
               memory: MemoryRunStore) -> tuple[ChainStore, RunStore, ChainStore]:
        return store, engine, memory
