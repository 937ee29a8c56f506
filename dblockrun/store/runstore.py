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

Every time below is the store's clock (the database's; the memory store's
settable one), never the caller's. A write that is "fenced" matches only
while the job's lock row still has the caller's token (and, for a release,
its holder): a run whose lock another holder took writes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from dblockrun.store.models import RUNNING

if TYPE_CHECKING:
    from dblockrun.store.models import Trigger


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
