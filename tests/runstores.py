"""The hot path's role (dblockrun/store/runstore.py), a daemon's attempts'
(same module: FiringStore) and the held gaps' (dblockrun/store/roles.py:
HeldGaps) under test: the
in-memory store on a clock the test moves, or a real database on its own
clock, behind one face, so that a contract test says once what both do.

``run_store`` (tests/conftest.py) hands one out per kind: ``memory`` and
each selected database backend.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers import wait_for

from dblockrun.store import Store
from dblockrun.store.control import Audit
from dblockrun.store.engine import Claim
from dblockrun.store.memory import ManualClock, MemoryRunStore
from dblockrun.store.models import Claimed
from dblockrun.store.roles import HeldGaps
from dblockrun.store.runstore import ChainStore, FiringStore, RunStore

#: The longest a real database's clock is waited for (a lease of a second
#: or two running out, on a loaded machine).
DEADLINE = 15.0


@dataclass(frozen=True)
class Row:
    """A lock row as the contract reads it."""

    holder: str | None
    token: int
    lock_until: float | None
    last_slot: float | None
    next_due: float | None


@dataclass(frozen=True)
class Record:
    """A run record as the contract reads it."""

    id: int
    slot: float | None
    token: int | None
    result: str
    output: str | None
    duration: float | None
    attempt: int = 1
    upstream_run: int | None = None


class RoleUnderTest:
    """A :class:`RunStore` and what its contract does around it: claim,
    switch a job off, read rows and records, let time pass. ``gaps``: the
    same store as the bookkeeping's :class:`HeldGaps`
    (tests/test_heldgaps_contract.py); ``firing``: as a daemon's attempts'
    :class:`FiringStore` (tests/test_firing_contract.py)."""

    kind: str
    store: RunStore
    gaps: HeldGaps
    firing: FiringStore
    #: The same store as a daemon's job chains' (tests/test_chain_contract.py).
    chains: ChainStore

    def ensure(self, *names: str) -> None:
        raise NotImplementedError

    def claim(self, name: str, holder: str, lease: float, claim: Claim = Claim()  # noqa: B008
              ) -> Claimed | None:
        raise NotImplementedError

    def now(self) -> float:
        raise NotImplementedError

    def pass_until(self, when: float) -> None:
        """Until the store's clock is past ``when``."""
        raise NotImplementedError

    def disable(self, name: str, for_seconds: float, *, audited: bool = False) -> None:
        """``audited``: an operator's (``dblockrun disable``, in the audit
        trail), else as ``on-failure`` disables."""
        raise NotImplementedError

    def pause(self, for_seconds: float) -> None:
        """The fleet-wide pause (``dblockrun pause``)."""
        raise NotImplementedError

    def resume(self) -> None:
        """``dblockrun resume``."""
        raise NotImplementedError

    def drain(self, host: str, for_seconds: float) -> None:
        """``dblockrun drain HOST``."""
        raise NotImplementedError

    def request(self, name: str) -> None:
        """``dblockrun run NAME``."""
        raise NotImplementedError

    def kill(self, name: str, run_id: int, token: int, who: str) -> bool:
        """``dblockrun kill``: whether the run was asked."""
        raise NotImplementedError

    def row(self, name: str) -> Row:
        raise NotImplementedError

    def records(self, job: str) -> list[Record]:
        """Oldest first."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class InMemory(RoleUnderTest):
    kind = "memory"

    def __init__(self) -> None:
        self.clock = ManualClock()
        self.memory = MemoryRunStore(self.clock)
        self.store = self.gaps = self.firing = self.chains = self.memory

    def ensure(self, *names: str) -> None:
        self.memory.ensure_jobs(names)

    def claim(self, name: str, holder: str, lease: float, claim: Claim = Claim()  # noqa: B008
              ) -> Claimed | None:
        return self.memory.claim(name, holder, lease, claim)

    def now(self) -> float:
        return self.clock.now()

    def pass_until(self, when: float) -> None:
        self.clock.advance(max(0.0, when - self.clock.now()) + 0.001)

    def disable(self, name: str, for_seconds: float, *, audited: bool = False) -> None:
        self.memory.disable(name, for_seconds=for_seconds, audited=audited)

    def pause(self, for_seconds: float) -> None:
        self.memory.pause(for_seconds)

    def resume(self) -> None:
        self.memory.resume()

    def drain(self, host: str, for_seconds: float) -> None:
        self.memory.drain(host, for_seconds)

    def request(self, name: str) -> None:
        self.memory.request_run(name)

    def kill(self, name: str, run_id: int, token: int, who: str) -> bool:
        return self.memory.kill(name, token, who)

    def row(self, name: str) -> Row:
        row = self.memory.lock_row(name)
        assert row is not None
        return Row(row.holder, row.token, row.lock_until, row.last_slot, row.next_due)

    def records(self, job: str) -> list[Record]:
        return [Record(r.id, r.slot, r.token, r.result, r.output, r.duration, r.attempt,
                       r.upstream_run)
                for r in self.memory.runs_of(job)]


class OnDatabase(RoleUnderTest):
    def __init__(self, kind: str, url: str, prefix: str) -> None:
        self.kind = kind
        self.full = Store(url, prefix)
        self.store = self.gaps = self.firing = self.chains = self.full

    def ensure(self, *names: str) -> None:
        self.full.ensure_jobs(names)

    def claim(self, name: str, holder: str, lease: float, claim: Claim = Claim()  # noqa: B008
              ) -> Claimed | None:
        return self.full.lock_engine().claim(name, holder, lease, claim)

    def now(self) -> float:
        return self.full.db_now()

    def pass_until(self, when: float) -> None:
        wait_for(lambda: self.full.db_now() > when, DEADLINE, interval=0.05,
                 what=f"the database clock to pass {when - self.full.db_now():.2f} s on")

    def disable(self, name: str, for_seconds: float, *, audited: bool = False) -> None:
        self.full.disable(name, for_seconds=for_seconds,
                          audit=Audit("op@test", "disable", name) if audited else None)

    def pause(self, for_seconds: float) -> None:
        self.full.control.pause(Audit("op@test", "pause"), for_seconds)

    def resume(self) -> None:
        self.full.control.resume(Audit("op@test", "resume"))

    def drain(self, host: str, for_seconds: float) -> None:
        self.full.drains.drain(host, Audit("op@test", "drain", detail=host), for_seconds)

    def request(self, name: str) -> None:
        self.full.request_run(name)

    def kill(self, name: str, run_id: int, token: int, who: str) -> bool:
        run = self.full.run(run_id)
        assert run is not None
        return bool(self.full.control.kill([run], who, None))

    def row(self, name: str) -> Row:
        lock = self.full.lock_state(name)
        assert lock is not None
        return Row(lock.holder, lock.token, lock.lock_until, lock.last_slot, lock.next_due)

    def records(self, job: str) -> list[Record]:
        found = sorted(self.full.history(job, 1000), key=lambda r: r.id)
        return [Record(r.id, r.slot, r.token, r.result, full.output if (
            full := self.full.run(r.id)) is not None else None, r.duration, r.attempt,
            r.upstream_run)
            for r in found]

    def close(self) -> None:
        self.full.close()
