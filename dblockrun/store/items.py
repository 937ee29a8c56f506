"""SQL of fan-out jobs: one row per work item, claimed with
``SELECT ... FOR UPDATE SKIP LOCKED`` in short transactions (claim, mark,
commit: no transaction stays open while a command runs). SQLite has no row
locks; ``BEGIN IMMEDIATE`` serialises the same steps on its one host."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.store import models as m
from dblockrun.store.engine import Claim, LockEngine, in_transaction, on_engine
from dblockrun.store.models import CLAIM_TOLERANCE
from dblockrun.store.models import ClaimedItem as ClaimedItem

if TYPE_CHECKING:
    from dblockrun.store.cold import ColdPath


def item_key(item: str) -> str:
    return hashlib.sha256(item.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ItemState:
    item: str
    holder: str | None
    lock_until: float | None
    token: int
    last_slot: float | None
    last_start: float | None
    last_result: str | None


class ItemStore:
    def __init__(self, store: ColdPath) -> None:
        self.s = store
        self.t = store.t.items

    def sync(self, job: str, items: Sequence[str]) -> tuple[int, int]:
        """Make the job's live items exactly ``items``: add new ones, retire
        missing ones, bring back returning ones. Returns (added, retired)."""
        t = self.t
        wanted = {item_key(i): i for i in items}

        def steps(conn: Connection) -> tuple[int, int]:
            rows = conn.execute(sa.select(t.c.item_key, t.c.retired).where(t.c.job == job))
            have = {r[0]: bool(r[1]) for r in rows}
            new = [{"job": job, "item_key": k, "item": v, "retired": False, "token": 0}
                   for k, v in wanted.items() if k not in have]
            if new:
                conn.execute(self.s.dialect.insert_ignore(t), new)
            back = [k for k, retired in have.items() if retired and k in wanted]
            gone = [k for k, retired in have.items() if not retired and k not in wanted]
            for keys, flag in ((back, False), (gone, True)):
                for i in range(0, len(keys), 500):
                    conn.execute(t.update().values(retired=flag).where(
                        t.c.job == job, t.c.item_key.in_(keys[i : i + 500])))
            return len(new), len(gone)

        with self.s._conn() as conn:
            return in_transaction(self.s.dialect.name, conn.exec_driver_sql,
                                  lambda: steps(conn))

    def claim(
        self,
        job: str,
        holder: str,
        lease: float,
        *,
        slot: float | None,
        rate: float | None,
        limit: int,
        slot_tolerance: float = CLAIM_TOLERANCE,
    ) -> list[ClaimedItem]:
        """Claim up to ``limit`` due items, oldest start first, skipping the
        rows other hosts are claiming right now: the lock engine's item claim,
        under the same conditions as every claim (store/queries.py)."""
        claim = Claim(slot=slot, rate=rate, tolerance=slot_tolerance)
        return self.lock_engine().claim_items(job, holder, lease, claim, limit)

    def lock_engine(self) -> LockEngine:
        return self.s.lock_engine()

    renew = on_engine(LockEngine.renew_items)
    finish = on_engine(LockEngine.finish_items)
    release = on_engine(LockEngine.release_items)
    finish_and_release = on_engine(LockEngine.finish_and_release_items)

    def states(self, job: str) -> list[ItemState]:
        t = self.t
        stmt = sa.select(t).where(t.c.job == job, t.c.retired == sa.false()).order_by(t.c.item)
        return self.s._run(lambda c: [m.from_row(ItemState, r._mapping) for r in c.execute(stmt)])
