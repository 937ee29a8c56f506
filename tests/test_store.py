"""The lock store on every backend: claims, tokens, leases, flags, runs."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from helpers import TestDb, count_statements, updates, wait_for

from dblockrun.errors import DatabaseError, SchemaTooNew
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.control import Audit
from dblockrun.store.models import BooksRound, LostRun
from dblockrun.store.status import report


@pytest.fixture
def store(store: Store) -> Store:
    """conftest's store, with the schema created before the test."""
    store.ensure_schema()
    return store


def test_clock_is_the_databases(store: Store) -> None:
    sample = store.clock_sample()
    # Local servers: the database clock and ours agree within a second.
    assert abs(sample.offset) < 1.0
    assert sample.rtt >= 0
    assert store.db_now() >= sample.db_now


def test_one_claim_per_slot_and_token_increments(store: Store) -> None:
    store.ensure_jobs(["job"])
    slot = store.db_now() - 1
    t1 = store.claim("job", "h1", 30, slot=slot)
    assert t1 == 1
    assert store.claim("job", "h2", 30, slot=slot) is None  # locked
    assert store.release("job", "h1", t1)
    # Free again, but the slot is taken: nobody runs it twice.
    assert store.claim("job", "h2", 30, slot=slot) is None
    t2 = store.claim("job", "h2", 30, slot=slot + 0.5)
    assert t2 == 2


def test_the_next_slots_of_many_jobs_are_written_in_few_statements(store: Store,
                                                                    db: TestDb) -> None:
    # A daemon publishes every cron job's next slot at start-up (`status`
    # shows them): 1,201 jobs, across the 500 a statement.
    names = [f"job-{i}" for i in range(1201)]
    store.ensure_jobs(names)
    due = {name: 1_800_000_000.25 + 7 * i for i, name in enumerate(names)}
    if db.backend == "postgresql":
        count_statements(db)
    store.set_next_due(due)
    assert {j.lock.name: j.lock.next_due for j in report(store).jobs} == due
    if db.backend == "postgresql":
        assert updates(db) == 3  # was one per job
        # The next host to start computes the same slots: it writes no row
        # (and so waits for no other host's row locks).
        versions = _row_versions(db)
        store.set_next_due(due)
        assert _row_versions(db) == versions


def _row_versions(db: TestDb) -> list[tuple[str, str]]:
    """Each lock row's name and version (PostgreSQL's xmin: an UPDATE that
    wrote the row, even with the same values, changes it)."""
    import psycopg

    with psycopg.connect(db.url, autocommit=True) as conn:
        return [(str(n), str(x)) for n, x in conn.execute(
            f"SELECT name, xmin::text FROM {db.prefix}locks ORDER BY name").fetchall()]


def test_future_slot_is_not_claimed_early(store: Store) -> None:
    store.ensure_jobs(["job"])
    assert store.claim("job", "h1", 30, slot=store.db_now() + 5) is None


def test_renew_and_release_need_the_current_token(store: Store) -> None:
    store.ensure_jobs(["job"])
    token = store.claim("job", "h1", 0.2)
    assert token is not None
    assert store.renew("job", "h1", token, 30)
    assert not store.renew("job", "h1", token + 1, 30)
    assert not store.renew("job", "h2", token, 30)
    assert not store.release("job", "h1", token - 1)
    assert store.release("job", "h1", token)


def test_expired_lease_is_taken_over_and_old_holder_is_fenced(store: Store) -> None:
    store.ensure_jobs(["job"])
    old = store.claim("job", "h1", 0.1)
    assert old is not None
    import time

    deadline = time.monotonic() + 5
    new = None
    while new is None and time.monotonic() < deadline:
        new = store.claim("job", "h2", 30)
    assert new == old + 1
    assert not store.renew("job", "h1", old, 30)
    assert not store.release("job", "h1", old)
    run = store.start_run("job", "h1", token=old)
    assert not store.finish_run(run, "job", old, m.OK, 0, "late")
    # Not overwritten with the late result, and shown lost: its token is not the lock's.
    assert store.history("job")[0].result == m.LOST


def test_lock_at_least_keeps_the_lock_after_release(store: Store) -> None:
    store.ensure_jobs(["job"])
    token = store.claim("job", "h1", 30)
    assert token is not None
    assert store.release("job", "h1", token, lock_at_least=60)
    assert store.claim("job", "h2", 30) is None
    state = store.lock_state("job")
    assert state is not None and state.lock_until is not None and state.locked_at is not None
    assert state.lock_until == pytest.approx(state.locked_at + 60, abs=0.01)


def test_rate_condition(store: Store) -> None:
    store.ensure_jobs(["job"])
    token = store.claim("job", "h1", 30, rate=3600)
    assert token is not None
    store.release("job", "h1", token)
    assert store.claim("job", "h2", 30, rate=3600) is None
    assert store.claim("job", "h2", 30, rate=0.0) is not None


def test_disable_for_until_and_enable(store: Store) -> None:
    store.ensure_jobs(["job"])
    end = store.disable("job", for_seconds=3 * 3600, reason="maintenance; 'quoted' %s").until
    assert end == pytest.approx(store.db_now() + 3 * 3600, abs=5)
    assert store.claim("job", "h1", 30) is None
    status = report(store, ["job"]).jobs[0]
    assert status.state == "disabled"
    assert status.lock.disabled_reason == "maintenance; 'quoted' %s"
    assert store.enable("job")
    assert store.claim("job", "h1", 30) is not None
    past = store.disable("other", until=store.db_now() - 10).until
    assert past < store.db_now()
    assert store.claim("other", "h1", 30) is not None


def test_concurrent_threads_one_winner_per_slot(store: Store) -> None:
    store.ensure_jobs(["job"])
    base = store.db_now() - 1
    wins: list[tuple[str, float, int]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker(me: str) -> None:
        barrier.wait()
        for i in range(15):
            slot = base - 15 + i
            token = store.claim("job", me, 30, slot=slot)
            if token is not None:
                with lock:
                    wins.append((me, slot, token))
                store.release("job", me, token)

    threads = [threading.Thread(target=worker, args=(f"h{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    slots = [w[1] for w in wins]
    assert len(slots) == len(set(slots)), "a slot was claimed twice"
    tokens = [w[2] for w in wins]
    assert sorted(tokens) == list(range(1, len(tokens) + 1))


def test_runs_and_history(store: Store) -> None:
    store.ensure_jobs(["job"])
    token = store.claim("job", "h1", 30, slot=store.db_now() - 1)
    assert token is not None
    run = store.start_run("job", "h1", token=token, slot=100.0)
    status = report(store, ["job"]).jobs[0]
    assert status.state == "running" and status.running is not None
    assert store.finish_run(run, "job", token, m.FAILED, 3, "out\n")
    rec = store.run(run)
    assert rec is not None
    assert (rec.result, rec.exit_code, rec.output, rec.slot) == (m.FAILED, 3, "out\n", 100.0)
    assert rec.duration is not None and rec.duration >= 0
    for _ in range(5):
        store.start_run("job", "h1", token=None, result=m.MISSED)
    assert store.prune_runs("job", 2) == 4
    assert len(store.history("job", 100)) == 2


def test_sweep_marks_runs_of_dead_holders_lost_at_their_last_renewal(store: Store) -> None:
    store.ensure_jobs(["job"])
    token = store.claim("job", "h1", 0.5)
    assert token is not None
    run = store.start_run("job", "h1", token=token)
    assert store.renew("job", "h1", token, 0.5)  # the holder's last sign of life
    renewed = store.lock_state("job")
    assert renewed is not None and renewed.lock_until is not None
    lost = wait_for(lambda: store.sweep_lost() or None, 10, what="the lease to run out")
    assert [(r.id, r.job, r.host, r.token) for r in lost] == [(run, "job", "h1", token)]
    rec = store.run(run)
    assert rec is not None and rec.result == m.LOST and rec.finished is not None
    # It ended at the last renewal (lease end - lease), not when it was swept.
    assert rec.finished == pytest.approx(renewed.lock_until - 0.5, abs=0.01)
    assert store.sweep_lost() == []  # recorded once


def test_a_lost_retry_names_its_runs_first_attempt(store: Store) -> None:
    """Pings of a run are keyed by its first attempt: a retry recorded lost
    by the sweep (or the one-round-trip bookkeeping round) says which."""
    store.ensure_jobs(["job", "other"])
    token = store.claim("job", "h1", 0.5)
    other = store.claim("other", "h1", 0.5)
    assert token is not None and other is not None
    first = store.start_run("job", "h1", token=token)
    assert store.finish_run(first, "job", token, m.FAILED, 1, "")
    store.start_run("other", "h1", token=other)  # another job's run, token alike
    retry = store.start_run("job", "h1", token=token, attempt=2)
    assert store.renew("job", "h1", token, 0.5) and store.renew("other", "h1", other, 0.5)
    if store.lock.q.books_in_one_trip:
        def swept() -> list[LostRun] | None:
            return store.books_round("h2:1:x", hostname="h2", pid=1, version="0",
                                     clock_offset=None, running=0, jobs=None,
                                     within=60).lost or None
    else:
        def swept() -> list[LostRun] | None:
            return store.sweep_lost() or None
    lost = wait_for(swept, 10, what="the leases to run out")
    assert {(r.job, r.id, r.first_id) for r in lost} >= {("job", retry, first)}
    assert all(r.first_id == r.id for r in lost if r.job == "other")


def test_a_bookkeeping_round_reads_what_the_fleet_filed(store: Store) -> None:
    """One round writes this host's row and reads the other live hosts,
    their differing definitions and the run-now requests (MySQL: statements
    of one round trip; SQLite: one by one, its daemons polling for requests)."""
    store.ensure_jobs(["a", "b"])
    store.heartbeat_host("other:1:x", hostname="other", pid=1, version="0", clock_offset=0.0,
                         running=0, jobs='{"a": "2"}')
    store.request_run("b")

    def round_of(host: str, jobs: str) -> BooksRound:
        return store.books_round(host, hostname="me", pid=2, version="0", clock_offset=0.25,
                                 running=1, jobs=jobs, within=60)

    done = round_of("me:2:x", '{"a": "1"}')
    assert done.live_others == 1
    assert done.differing == [("other:1:x", '{"a": "2"}')]
    assert done.requested == (["b"] if store.lock.q.books_in_one_trip else [])
    hosts = {h.id: h for h in store.hosts(seen_within=60)}
    assert hosts["me:2:x"].running == 1 and hosts["me:2:x"].clock_offset == 0.25
    # The next round updates the row; this host is not counted among the others.
    again = round_of("me:2:x", '{"a": "2"}')
    assert (again.live_others, again.differing) == (1, [])
    assert {h.id for h in store.hosts(seen_within=60)} == {"me:2:x", "other:1:x"}
    # A drained host is live but takes no share of a burst (dblockrun drain other);
    # a drain of a host whose name only begins the same is not its.
    assert again.serving_others == 1
    store.drains.drain("othe", Audit("alice@ops-1", "drain"), 3600)
    assert round_of("me:2:x", '{"a": "2"}').serving_others == 1
    store.drains.drain("other", Audit("alice@ops-1", "drain"), 3600)
    drained = round_of("me:2:x", '{"a": "2"}')
    assert (drained.live_others, drained.serving_others) == (1, 0)


def test_hosts_register_with_offset(store: Store) -> None:
    store.heartbeat_host("a:1:x", hostname="a", pid=1, version="0", clock_offset=0.25,
                         running=1, jobs=None)
    store.heartbeat_host("a:1:x", hostname="a", pid=1, version="0", clock_offset=0.5,
                         running=0, jobs=None)
    (host,) = store.hosts(seen_within=60)
    assert (host.id, host.clock_offset, host.running) == ("a:1:x", 0.5, 0)
    store.remove_host("a:1:x")
    assert store.hosts() == []


def test_newer_schema_is_refused(db: TestDb, store: Store) -> None:
    with store.engine.connect() as conn:
        conn.execute(
            store.t.meta.update().where(store.t.meta.c.key == "schema_version").values(value="99")
        )
    fresh = Store(db.url, db.prefix)
    with pytest.raises(SchemaTooNew, match="version 99"):
        fresh.db_now()
    fresh.close()


def test_no_schema_without_create(db: TestDb) -> None:
    s = Store(db.url, db.prefix + "x_", create=False)
    with pytest.raises(DatabaseError, match="init-db"):
        s.db_now()
    s.close()


def test_unreachable_database_is_a_database_error() -> None:
    s = Store("postgresql://nobody:secret@127.0.0.1:1/none")
    with pytest.raises(DatabaseError) as info:
        s.db_now()
    assert "secret" not in str(info.value)
    s.close()


def test_names_and_reasons_are_bound_parameters(store: Store) -> None:
    name = "x'; DROP TABLE t; --%s"
    store.ensure_jobs([name])
    store.disable(name, reason="it's 100% \"bad\"; --")
    (status,) = report(store, [name]).jobs
    assert status.lock.name == name
    assert status.lock.disabled_reason == "it's 100% \"bad\"; --"
    with store.engine.connect() as conn:
        assert sa.inspect(conn).has_table(store.t.locks.name)


def test_when_a_disable_began_is_read_from_the_audit_trail(store: Store) -> None:
    """A resync that finds a job disabled records the slots that passed
    before the disable began: an operator's disable says when (its audit
    row, for every host's row of an every-host job); an on-failure disable
    is not audited, so nobody knows."""
    store.ensure_jobs(["job", "eh@web-1"])
    before = store.db_now()
    store.disable("job", for_seconds=60, audit=Audit("ops@host", "disable", "job"))
    began = store.disabled_since("job", store.db_now())
    assert began is not None and before - 0.01 <= began <= store.db_now()
    store.disable("eh", for_seconds=60, audit=Audit("ops@host", "disable", "eh"))
    assert store.disabled_since("eh@web-1", store.db_now()) is not None
    store.ensure_jobs(["quiet"])
    store.disable("quiet", for_seconds=60)  # on-failure: no audit row
    assert store.disabled_since("quiet", store.db_now()) is None


# -- issue 36 item 3: a lost run says why --------------------------------------------------


def test_a_lost_run_s_output_names_its_recorder_holder_and_last_renewal(store: Store) -> None:
    """Killed runs end with ``killed by ...``; a lost one said nothing of
    why. Its output now ends with a line naming its holder, that holder's
    last renewal and the host that recorded it (after the output so far,
    on a line of its own); a run with no output gets the line alone."""
    import re
    from datetime import datetime

    store.ensure_jobs(["job", "quiet"])
    runs = {}
    for name in ("job", "quiet"):
        token = store.claim(name, "web-1:42:aa", 0.5)
        assert token is not None
        runs[name] = store.start_run(name, "web-1:42:aa", token=token)
    store.write_outputs([(runs["job"], "working\nstill working")])  # a live tail, no newline
    lost: list[int] = []

    def swept() -> bool:
        lost.extend(r.id for r in store.sweep_lost("web-2:7:bb"))
        return len(lost) == 2

    wait_for(swept, 10, what="the leases to run out")
    assert sorted(lost) == sorted(runs.values())
    for name, before in (("job", "working\nstill working\n"), ("quiet", "")):
        rec = store.run(runs[name])
        assert rec is not None and rec.finished is not None and rec.output is not None
        line = re.fullmatch(
            re.escape(f"{before}lost: its holder web-1:42:aa last renewed its lease at ")
            + r"(\S+Z), then stopped \(its host or daemon died, froze or lost the database\); "
            r"recorded lost by web-2:7:bb\n", rec.output)
        assert line is not None, rec.output
        # The database writes the time (SQLite rounds its milliseconds, the others cut them).
        at = datetime.fromisoformat(line[1].replace("Z", "+00:00")).timestamp()
        assert at == pytest.approx(rec.finished, abs=0.0011)
