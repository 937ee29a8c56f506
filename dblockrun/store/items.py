"""SQL of fan-out jobs: one row per work item, claimed with
``SELECT ... FOR UPDATE SKIP LOCKED`` in short transactions (claim, mark,
commit: no transaction stays open while a command runs). SQLite has no row
locks; ``BEGIN IMMEDIATE`` serialises the same steps on its one host."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.store import models as m

if TYPE_CHECKING:
    from dblockrun.store.store import Store


def item_key(item: str) -> str:
    return hashlib.sha256(item.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ClaimedItem:
    item: str
    key: str
    token: int


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
    ) -> list[ClaimedItem]:
        """Claim up to ``limit`` due items, oldest start first, skipping the
        rows other hosts are claiming right now."""
        t, now = self.t, self.s.now
        conds: list[sa.ColumnElement[bool]] = [
            t.c.job == job,
            t.c.retired == sa.false(),
            sa.or_(t.c.lock_until.is_(None), t.c.lock_until <= now),
        ]
        if slot is not None:
            conds.append(sa.or_(t.c.last_slot.is_(None), t.c.last_slot < slot))
        if rate is not None:
            conds.append(sa.or_(t.c.last_start.is_(None), t.c.last_start <= now - rate))
        pick = (
            sa.select(t.c.item_key)
            .where(*conds)
            .order_by(t.c.last_start.is_not(None), t.c.last_start, t.c.item_key)
            # MySQL: candidates enough for the other hosts' picks too.
            .limit(limit * 4 + 16 if self.s.dialect.name == "mysql" else limit)
        )
        mysql = self.s.dialect.name == "mysql"
        if self.s.dialect.name == "postgresql":
            pick = pick.with_for_update(skip_locked=True)
        values: dict[str, Any] = {
            "holder": holder,
            "lock_until": now + lease,
            "locked_at": now,
            "token": t.c.token + 1,
            "last_start": now,
            "last_result": m.RUNNING,
        }
        if slot is not None:
            values["last_slot"] = slot
        with self._tx() as conn:
            keys = [r[0] for r in conn.execute(pick)]
            if mysql and keys:
                # InnoDB locks every row a sorted locking read looks at, so
                # one host's pick would hide all items from the others: read
                # the candidates unlocked, then lock only those by key.
                locked = {r[0] for r in conn.execute(
                    sa.select(t.c.item_key)
                    .where(*conds, t.c.item_key.in_(keys))
                    .limit(limit)
                    .with_for_update(skip_locked=True))}
                keys = [k for k in keys if k in locked]
            if not keys:
                return []
            conn.execute(t.update().where(t.c.job == job, t.c.item_key.in_(keys))
                         .values(**values))
            rows = conn.execute(
                sa.select(t.c.item, t.c.item_key, t.c.token)
                .where(t.c.job == job, t.c.item_key.in_(keys))
            ).all()
        order = {k: i for i, k in enumerate(keys)}
        claimed = [ClaimedItem(r[0], r[1], int(r[2])) for r in rows]
        return sorted(claimed, key=lambda c: order[c.key])

    def _mine(self, job: str, holder: str,
              items: Sequence[ClaimedItem]) -> sa.ColumnElement[bool]:
        t = self.t
        return sa.and_(
            t.c.job == job,
            t.c.holder == holder,
            sa.or_(*[sa.and_(t.c.item_key == c.key, t.c.token == c.token) for c in items]),
        )

    def renew(self, job: str, holder: str, items: Sequence[ClaimedItem], lease: float) -> bool:
        """Extend the leases of a batch; False if any token is no longer current."""
        stmt = self.t.update().where(self._mine(job, holder, items)).values(
            lock_until=self.s.now + lease)
        return self.s._run(lambda c: c.execute(stmt).rowcount == len(items))

    def release(self, job: str, holder: str, items: Sequence[ClaimedItem],
                lock_at_least: float, result: str) -> int:
        t = self.t
        until = self.s.dialect.greatest(self.s.now, t.c.locked_at + lock_at_least)
        stmt = t.update().where(self._mine(job, holder, items)).values(
            lock_until=until, last_result=result)
        return self.s._run(lambda c: int(c.execute(stmt).rowcount))

    def still_mine(self, job: str, holder: str, items: Sequence[ClaimedItem]) -> bool:
        stmt = sa.select(sa.func.count()).select_from(self.t).where(
            self._mine(job, holder, items))
        return self.s._run(lambda c: int(c.execute(stmt).scalar_one()) == len(items))

    def start_runs(self, job: str, host: str, items: Sequence[ClaimedItem],
                   slot: float | None, attempt: int) -> list[int]:
        return [self.s.start_run(job, host, token=c.token, slot=slot, attempt=attempt,
                                 item=c.item) for c in items]

    def finish_runs(self, job: str, holder: str, run_ids: Sequence[int],
                    items: Sequence[ClaimedItem], result: str, exit_code: int | None,
                    output: str | None) -> bool:
        """Record the batch's result, only while every token is still ours."""
        runs = self.s.t.runs
        if not self.still_mine(job, holder, items):
            return False
        stmt = runs.update().where(runs.c.id.in_(list(run_ids))).values(
            finished=self.s.now, result=result, exit_code=exit_code, output=output)
        self.s._run(lambda c: c.execute(stmt))
        return True

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
