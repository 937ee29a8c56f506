"""Truthful run records, with real daemons: a run stopped for its lease (the
database cut by a TCP proxy) or at lock-at-most is recorded with its
command's own duration, not until its result could be written, and its
stored output ends with why it was stopped; the job's next slot waits for
a stopped run's record instead of being skipped as "previous run still
going". PostgreSQL and MariaDB: SQLite has no connection to lose."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import pytest
from commandlog import LONG_JOB, Line, log_of, read_lines, running, start_logging, starts
from harness import Fleet
from helpers import TestDb, wait_for
from proxy import Proxy

from dblockrun.store import Store
from dblockrun.store import models as m

pytestmark = pytest.mark.slow


@pytest.fixture
def server(db: TestDb) -> int:
    if db.backend == "sqlite":
        pytest.skip("SQLite has no connection to lose (it is a local file)")
    return 5432 if db.backend == "postgresql" else 3306


@pytest.fixture
def proxy(server: int) -> Iterator[Proxy]:
    proxy = Proxy(server)
    yield proxy
    proxy.restore()
    proxy.close()


def record_of(store: Store, token: int) -> m.RunRecord:
    return next(r for r in store.history("long", 100) if r.token == token)


def line(fleet: Fleet, kind: str, token: int) -> Line | None:
    return next((ln for ln in read_lines(log_of(fleet)) if ln.kind == kind and ln.token == token),
                None)


def test_a_run_stopped_for_its_lease_keeps_its_duration_and_why(
        db: TestDb, fleet: Fleet, proxy: Proxy) -> None:
    # A slot every 5 s: none comes while the command runs, before the cut
    # (that one would be "still going", rightly).
    (d,) = start_logging(fleet, 1, LONG_JOB.replace('"* * * * * *"', '"*/5 * * * * *"'),
                         url=proxy.url_for(db.url))
    _holder, token = wait_for(lambda: running(fleet), 30, what="a running job")
    start = wait_for(lambda: line(fleet, "start", token), 10, what="the command to start")
    proxy.cut()
    cut_at = time.time()
    end = wait_for(lambda: line(fleet, "end", token), 10, what="the command to be stopped")
    # The database stays away well past the stop; the result waits for it.
    wait_for(lambda: time.time() - cut_at > 7, 9, what="a long outage")
    proxy.restore()
    back_at = time.time()
    wait_for(lambda: "database back" in d.text(), 20, what="the daemon to reconnect")
    wait_for(lambda: record_of(fleet.store, token).result != m.RUNNING, 30,
             what="the stopped run's record")
    wait_for(lambda: next((s for s in starts(fleet) if s.token > token), None), 20,
             what="the job to run again")
    run = record_of(fleet.store, token)
    assert run.result == m.KILLED
    # `history --output`: the output, then why it was stopped, as a kill's is.
    assert run.output is not None
    # ... and why the renewals failed (issue 36 item 14).
    assert re.search(r"lease could not be renewed before it expired \((database error: .+|its "
                     r"last renewal had no answer yet)\)\n$", run.output), run.output
    # Its duration is the command's, not until the database came back.
    real = end.at - start.at
    assert run.duration is not None and real - 0.2 < run.duration < real + 1.5, (
        run.duration, real)
    assert run.finished is not None and run.finished < back_at - 2
    log = d.text()
    assert "previous run still going" not in log, log
    print(f"\nlost lease: command ran {real:.2f}s, recorded {run.duration:.2f}s; "
          f"database back {back_at - end.at:.2f}s after the stop")


SLOW_RESULT = """\
jobs:
  long:
    cron: "*/3 * * * * *"
    lock-at-most: 1s
    env:
      LOG: {log}
    command: |
      echo "start $DBLOCKRUN_FENCING_TOKEN $$ $(date +%s.%N)" >> "$LOG"
      echo started
      sleep 30
"""

def refuse_results(db: TestDb, store: Store) -> Callable[[float], None]:
    """Every write of a run's result fails (an error the daemon retries,
    as through an outage) until the time the returned function sets (epoch
    seconds, database clock); every other statement works."""
    store.ensure_schema()
    runs = store.t.runs.name
    with store.engine.begin() as conn:
        if db.backend == "postgresql":
            conn.exec_driver_sql(f'CREATE TABLE "{runs}_refuse" (until DOUBLE PRECISION)')
            conn.exec_driver_sql(f'INSERT INTO "{runs}_refuse" VALUES (1e12)')
            conn.exec_driver_sql(
                f'CREATE FUNCTION "{runs}_refuse_f"() RETURNS trigger AS $$ BEGIN '
                "IF OLD.result = 'running' AND NEW.result <> 'running' "
                "AND EXTRACT(EPOCH FROM clock_timestamp()) "
                f'< (SELECT until FROM "{runs}_refuse") THEN '
                "RAISE EXCEPTION 'result refused (by the test)'; END IF; "
                "RETURN NEW; END $$ LANGUAGE plpgsql")
            conn.exec_driver_sql(
                f'CREATE TRIGGER "{runs}_refuse_t" BEFORE UPDATE ON "{runs}" '
                f'FOR EACH ROW EXECUTE FUNCTION "{runs}_refuse_f"()')
            table = f'"{runs}_refuse"'
        else:
            conn.exec_driver_sql(f"CREATE TABLE `{runs}_refuse` (until DOUBLE)")
            conn.exec_driver_sql(f"INSERT INTO `{runs}_refuse` VALUES (1e12)")
            conn.exec_driver_sql(
                f"CREATE TRIGGER `{runs}_refuse_t` BEFORE UPDATE ON `{runs}` FOR EACH ROW "
                "BEGIN IF OLD.result = 'running' AND NEW.result <> 'running' "
                f"AND UNIX_TIMESTAMP(NOW(6)) < (SELECT until FROM `{runs}_refuse`) THEN "
                "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'result refused (by the test)'; "
                "END IF; END")
            table = f"`{runs}_refuse`"

    def until(at: float) -> None:
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"UPDATE {table} SET until = {float(at)!r}")

    return until


def test_a_run_stopped_at_lock_at_most_stores_why_and_the_next_slot_waits_for_its_record(
    db: TestDb, fleet: Fleet, server: int,
) -> None:
    try:
        refuse_until = refuse_results(db, fleet.store)
        # A lease longer than the refused writes: the run is never lost meanwhile.
        (d,) = start_logging(fleet, 1, SLOW_RESULT, lease="10s")
        _holder, token = wait_for(lambda: running(fleet), 30, what="a running job")
        first = record_of(fleet.store, token)
        assert first.slot is not None
        # Stopped at lock-at-most, 1 s in; its result refused past the next
        # slot (3 s in), written before the one after.
        refuse_until(first.slot + 4)
        wait_for(lambda: record_of(fleet.store, token).result != m.RUNNING, 20,
                 what="the stopped run's record, once the database takes it")
        nxt = wait_for(lambda: next((r for r in fleet.store.history("long", 100)
                                     if r.token is not None and r.token > token), None), 10,
                       what="the next slot's run")
        run = record_of(fleet.store, token)
        log = d.text()
        assert run.result == m.TIMEOUT
        assert run.output == "started\nreached lock-at-most\n"
        # Stopped at 1 s; its result written some 3 s later.
        assert run.duration is not None and 0.9 < run.duration < 2.5, run.duration
        # The slot that came while the record was refused waited for it, and ran.
        assert nxt.slot == first.slot + 3, (
            fleet.store.history("long", 100), log)
        assert "previous run still going" not in log, log
        assert not [r for r in fleet.store.history("long", 100) if r.result == m.SKIPPED]
    finally:
        fleet.stop()
