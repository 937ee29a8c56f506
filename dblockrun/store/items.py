"""SQL of fan-out jobs: one row per work item, claimed with
``SELECT ... FOR UPDATE SKIP LOCKED`` in short transactions (claim, mark,
commit: no transaction stays open while a command runs). SQLite has no row
locks; ``BEGIN IMMEDIATE`` serialises the same steps on its one host."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.store import models as m
from dblockrun.store.engine import CLAIM_TOLERANCE, Claim
from dblockrun.store.engine import ClaimedItem as ClaimedItem

if TYPE_CHECKING:
    from dblockrun.store.store import Store


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
    def __init__(self, store: Store) -> None:
        self.s = store
        self.t = store.t.items

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        """One short transaction on a connection of the autocommit engine."""
        begin = "BEGIN IMMEDIATE" if self.s.dialect.name == "sqlite" else "BEGIN"
        with self.s._conn() as conn:
            if self.s.dialect.name == "mysql":
                # Rows read but not taken are not left locked against other hosts.
                conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
            conn.exec_driver_sql(begin)
            try:
                yield conn
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")

    def sync(self, job: str, items: Sequence[str]) -> tuple[int, int]:
        """Make the job's live items exactly ``items``: add new ones, retire
        missing ones, bring back returning ones. Returns (added, retired)."""
        t = self.t
        wanted = {item_key(i): i for i in items}
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(t.c.item_key, t.c.retired).where(t.c.job == job)
            ).all()
            have = {r[0]: bool(r[1]) for r in rows}
            new = [{"job": job, "item_key": k, "item": v, "retired": False, "token": 0}
                   for k, v in wanted.items() if k not in have]
            if new:
                conn.execute(self.s.dialect.insert_ignore(t), new)
            back = [k for k, retired in have.items() if retired and k in wanted]
            gone = [k for k, retired in have.items() if not retired and k not in wanted]
            for keys, flag in ((back, False), (gone, True)):
                for i in range(0, len(keys), 500):
                    conn.execute(
                        t.update()
                        .where(t.c.job == job, t.c.item_key.in_(keys[i : i + 500]))
                        .values(retired=flag)
                    )
        return len(new), len(gone)

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
        return self.s.lock_engine().claim_items(job, holder, lease, claim, limit)

    def renew(self, job: str, holder: str, items: Sequence[ClaimedItem], lease: float) -> bool:
        """Extend the leases of a batch; False if any token is no longer current."""
        return self.s.lock_engine().renew_items(job, holder, items, lease)

    def finish_and_release(self, job: str, holder: str, items: Sequence[ClaimedItem],
                           result: str, exit_code: int | None, output: str | None,
                           lock_at_least: float) -> tuple[bool, bool]:
        """The batch's result, while every token is ours, and the release of
        its items: one round trip."""
        return self.s.lock_engine().finish_and_release_items(
            job, holder, items, result, exit_code, output, lock_at_least)

    def states(self, job: str) -> list[ItemState]:
        t = self.t
        stmt = sa.select(t).where(t.c.job == job, t.c.retired == sa.false()).order_by(t.c.item)
        return self.s._run(lambda c: [
            ItemState(r.item, r.holder, r.lock_until, int(r.token), r.last_slot, r.last_start,
                      r.last_result) for r in c.execute(stmt)])

    def progress(self, job: str, slot: float | None) -> dict[str, int]:
        """Counts for status: total, done (this slot), running, waiting, failed."""
        now = self.s.db_now()
        counts = {"total": 0, "done": 0, "running": 0, "waiting": 0, "failed": 0}
        for it in self.states(job):
            counts["total"] += 1
            locked = it.lock_until is not None and it.lock_until > now
            if locked and it.last_result == m.RUNNING:
                counts["running"] += 1
            elif slot is not None and (it.last_slot is None or it.last_slot < slot):
                counts["waiting"] += 1
            elif it.last_result == m.FAILED:
                counts["failed"] += 1
            else:
                counts["done"] += 1
        return counts
