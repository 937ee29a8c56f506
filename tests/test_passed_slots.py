"""Every slot a daemon passes ends in exactly one record, whatever passed
it: two real daemons, a job every 2 s, the database out of reach for 20 s
(a cut TCP proxy; on SQLite, another process holding the file's write
lock), on every backend. Before the slot planner, 8 of 20 slots of this
case had no record at all."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import TestDb, coverage, output_of, wait_for
from proxy import Proxy
from test_daemon import DaemonProc, runs_of

from dblockrun.store import Store
from dblockrun.store import models as m

JOB = 'jobs:\n  tick:\n    cron: "*/2 * * * * *"\n    command: "true"\n'
STEP = 2.0
OUTAGE = 20.0


@contextmanager
def outage_switch(db: TestDb) -> Iterator[tuple[TestDb, Callable[[], None],
                                                Callable[[], None]]]:
    """The database the daemons use, and how to cut and restore it."""
    if db.backend == "sqlite":
        path = db.url.removeprefix("sqlite:///")
        holder: list[sqlite3.Connection] = []

        def cut() -> None:
            conn = sqlite3.connect(path, isolation_level=None, timeout=30)
            conn.execute("BEGIN EXCLUSIVE")  # every other statement: "database is locked"
            holder.append(conn)

        def restore() -> None:
            while holder:
                conn = holder.pop()
                conn.execute("ROLLBACK")
                conn.close()

        try:
            yield db, cut, restore
        finally:
            restore()
        return
    proxy = Proxy(5432 if db.backend == "postgresql" else 3306)
    try:
        yield TestDb(db.backend, proxy.url_for(db.url), db.prefix), proxy.cut, proxy.restore
    finally:
        proxy.restore()
        proxy.close()


@pytest.mark.slow
def test_every_slot_of_a_database_outage_has_exactly_one_record(
        db: TestDb, store: Store, tmp_path: Path) -> None:
    store.ensure_schema()
    with outage_switch(db) as (reach, cut, restore):
        daemons = []
        for n in range(2):
            (workdir := tmp_path / f"d{n}").mkdir()
            daemons.append(DaemonProc(reach, workdir, JOB, "5s"))
        try:
            daemons[0].wait(lambda: any(r.result == m.OK for r in runs_of(store, "tick")), 30,
                            what="a first run")
            cut()
            cut_at = time.time()
            wait_for(lambda: time.time() >= cut_at + OUTAGE, OUTAGE + 5, interval=0.2,
                     what="the outage's end")
            restore()
            back = time.time()
            daemons[0].wait(lambda: any(r.result == m.OK and (r.slot or 0) > back + 2 * STEP
                                        for r in runs_of(store, "tick")), 40,
                            what="runs again after the outage")
        finally:
            restore()
            for d in daemons:
                assert d.stop() == 0, d.text()
    records = runs_of(store, "tick")
    count = coverage(records, store, STEP)
    first, last = min(count), max(count)
    expected = [first + k * STEP for k in range(int((last - first) / STEP) + 1)]
    missing = [s for s in expected if count[s] == 0]
    twice = {s: n for s, n in count.items() if n > 1}
    assert not missing and not twice, (
        f"slots with no record: {missing}; with more than one: {twice}\n"
        + "\n".join(f"{r.slot} {r.result} {r.host}" for r in records))
    # The outage's slots were recorded, not run late.
    during = [s for s in expected if cut_at + 1 < s < cut_at + OUTAGE - 1]
    assert during and all(count[s] == 1 for s in during)
    passed_over = [r for r in records if r.result == m.MISSED]
    assert passed_over, "the outage's slots are recorded missed"
    reasons = {output_of(store, r).split(";")[0] for r in passed_over}
    assert any("the database could not be reached" in text for text in reasons), reasons
