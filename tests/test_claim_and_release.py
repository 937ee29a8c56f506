"""A run's combined statements on every backend: a claim with its run
record, a result with the release, and many jobs of one slot in one batch."""

from __future__ import annotations

import threading

import pytest
from helpers import TestDb, fail_next_run_inserts, wait_for
from proxy import Proxy

from dblockrun.errors import DatabaseError
from dblockrun.store import Store
from dblockrun.store import models as m


@pytest.fixture
def store(store: Store) -> Store:
    store.ensure_schema()
    return store


def test_claim_and_record_wins_once_with_its_run(store: Store) -> None:
    store.ensure_jobs(["job"])
    slot = store.db_now() - 1
    won = store.claim_and_record("job", "h1", 30, slot=slot, next_due=slot + 60)
    assert won is not None
    assert won.token == 1
    assert won.run_id is not None
    run = store.run(won.run_id)
    assert run is not None
    assert (run.job, run.host, run.token, run.slot, run.result) == ("job", "h1", 1, slot,
                                                                    m.RUNNING)
    # The slot is taken and the lock held: a loser records nothing.
    assert store.claim_and_record("job", "h2", 30, slot=slot) is None
    assert [r.id for r in store.history("job")] == [won.run_id]
    lock = store.lock_state("job")
    assert lock is not None and lock.holder == "h1" and lock.next_due == slot + 60


def test_claim_and_record_of_a_rate_job(store: Store) -> None:
    store.ensure_jobs(["job"])
    won = store.claim_and_record("job", "h1", 30, rate=60)
    assert won is not None and won.run_id is not None
    run = store.run(won.run_id)
    assert run is not None and run.slot is None
    assert store.release("job", "h1", won.token)
    # Released, but started less than a rate ago.
    assert store.claim_and_record("job", "h2", 30, rate=60) is None


def test_one_round_trip_each_way_on_servers(store: Store, backend: str) -> None:
    store.ensure_jobs(["job"])
    warm = store.claim("job", "warm", 30)  # schema check and connection out of the way
    assert warm is not None and store.release("job", "warm", warm)
    slot = store.db_now()
    before = store.statements
    won = store.claim_and_record("job", "h1", 30, slot=slot)
    assert won is not None and won.run_id is not None
    store.finish_and_release(won.run_id, "job", "h1", won.token, m.OK, 0, "out")
    # SQLite runs in-process: its statements cost no round trip, each is
    # sent on its own (the claim, its record; the result, the release).
    trips = store.statements - before
    assert trips == (4 if backend == "sqlite" else 2)
    slot = store.db_now() - 5
    before = store.statements
    assert store.claim_and_record("job", "h2", 30, slot=slot) is None
    assert store.statements - before == 1


def test_finish_and_release_records_and_frees(store: Store) -> None:
    store.ensure_jobs(["job"])
    won = store.claim_and_record("job", "h1", 30, slot=store.db_now())
    assert won is not None and won.run_id is not None
    assert store.finish_and_release(won.run_id, "job", "h1", won.token, m.FAILED, 3,
                                    "it's \u00e9\n") == (True, True)
    run = store.run(won.run_id)
    assert run is not None
    assert (run.result, run.exit_code, run.output) == (m.FAILED, 3, "it's \u00e9\n")
    assert run.finished is not None
    lock = store.lock_state("job")
    assert lock is not None and lock.lock_until is not None
    assert lock.lock_until <= store.db_now()
    assert store.claim("job", "h2", 30) is not None


def test_finish_and_release_keeps_lock_at_least(store: Store) -> None:
    store.ensure_jobs(["job"])
    won = store.claim_and_record("job", "h1", 30)
    assert won is not None and won.run_id is not None
    store.finish_and_release(won.run_id, "job", "h1", won.token, m.OK, 0, "", 60)
    assert store.claim("job", "h2", 30) is None


def test_finish_and_release_by_a_fenced_holder_changes_nothing(store: Store) -> None:
    store.ensure_jobs(["job"])
    won = store.claim_and_record("job", "h1", 30)
    assert won is not None and won.run_id is not None
    new_token = store.force_unlock("job")
    taken = store.claim("job", "h2", 30)
    assert taken is not None and new_token is not None
    assert store.finish_and_release(won.run_id, "job", "h1", won.token, m.OK, 0,
                                    "late") == (False, False)
    run = store.run(won.run_id)
    # Shown lost (its token is not the lock's); the late result did not land.
    assert run is not None and run.result == m.LOST
    lock = store.lock_state("job")
    assert lock is not None and lock.holder == "h2" and lock.token == taken
    assert lock.lock_until is not None and lock.lock_until > store.db_now() + 20


def test_batch_claims_each_job_once_with_runs(store: Store) -> None:
    names = [f"job-{i:03d}" for i in range(120)]
    store.ensure_jobs(names)
    slot = store.db_now() - 2
    first = store.claim_batch(names, "h1", 30, slot=slot, next_due=slot + 60, limit=50)
    assert len(first) == 50
    rest = store.claim_batch(names, "h2", 30, slot=slot, next_due=slot + 60, limit=1000)
    assert len(rest) == 70
    assert sorted(c.name for c in first + rest) == names
    for c in first[:3] + rest[:3]:
        assert c.run_id is not None
        run = store.run(c.run_id)
        assert run is not None
        assert (run.job, run.token, run.slot, run.result) == (c.name, c.token, slot, m.RUNNING)
    assert store.claim_batch(names, "h3", 30, slot=slot, next_due=slot + 60, limit=1000) == []
    # Released, the same slot is still not run again; the next one is.
    for c in first:
        store.release(c.name, "h1", c.token)
    assert store.claim_batch(names, "h3", 30, slot=slot, next_due=slot + 60, limit=1000) == []
    again = store.claim_batch(names, "h3", 30, slot=slot + 1, next_due=slot + 60, limit=1000)
    assert sorted(c.name for c in again) == names[:50]


def test_batch_skips_disabled_and_future_slots(store: Store) -> None:
    store.ensure_jobs(["a", "b"])
    store.disable("b", for_seconds=60)
    now = store.db_now()
    assert store.claim_batch(["a", "b"], "h1", 30, slot=now + 5, next_due=now + 60,
                             limit=10) == []
    won = store.claim_batch(["a", "b"], "h1", 30, slot=now - 1, next_due=now + 60, limit=10)
    assert [c.name for c in won] == ["a"]


def test_concurrent_batches_split_without_duplicates(store: Store) -> None:
    names = [f"j{i}" for i in range(200)]
    store.ensure_jobs(names)
    slot = store.db_now() - 0.2
    results: dict[str, list[str]] = {}
    errors: list[BaseException] = []
    go = threading.Barrier(4)

    def host(h: str) -> None:
        try:
            go.wait()
            won = store.claim_batch(names, h, 30, slot=slot, next_due=slot + 60, limit=60)
            won += store.claim_batch(names, h, 30, slot=slot, next_due=slot + 60, limit=200)
            results[h] = [c.name for c in won]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(f"h{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    claimed = [n for got in results.values() for n in got]
    assert sorted(claimed) == sorted(names)
    runs = store.history(limit=1000)
    assert len(runs) == 200


def test_lost_connection_is_a_database_error_then_recovers(db: TestDb) -> None:
    """Through a proxy that drops every connection: the hot statements raise
    the project's DatabaseError (never the driver's), and work again after."""
    if db.backend == "sqlite":
        pytest.skip("SQLite has no connection to lose (it is a local file)")
    proxy = Proxy(5432 if db.backend == "postgresql" else 3306)
    store = Store(proxy.url_for(db.url), db.prefix)
    try:
        store.ensure_jobs(["job"])
        won = store.claim_and_record("job", "h1", 30)
        assert won is not None
        proxy.cut()
        with pytest.raises(DatabaseError):
            store.renew("job", "h1", won.token, 30)
        with pytest.raises(DatabaseError):
            store.renew("job", "h1", won.token, 30)  # no connection can be made
        proxy.restore()
        assert store.renew("job", "h1", won.token, 30)
    finally:
        proxy.restore()
        store.close()
        proxy.close()


def test_a_run_whose_lease_ran_out_reads_lost_before_anyone_sweeps(store: Store) -> None:
    store.ensure_jobs(["job"])
    won = store.claim_and_record("job", "h1", 2, slot=store.db_now())
    assert won is not None and won.run_id is not None
    run_id = won.run_id
    run = store.run(run_id)
    assert run is not None and run.result == m.RUNNING  # held: running
    wait_for(lambda: (r := store.run(run_id)) is not None and r.result == m.LOST, 10,
             what="the 2 s lease to run out")
    assert [r.result for r in store.history("job")] == [m.LOST]


def test_a_claim_whose_run_record_deadlocks_is_still_won(store: Store, backend: str) -> None:
    if backend != "mariadb":
        pytest.skip("the claim and its record are two statements of one round trip on MariaDB")
    store.ensure_jobs(["job"])
    fail_next_run_inserts(store, 1)
    slot = store.db_now()
    won = store.claim_and_record("job", "h1", 30, slot=slot)
    # The UPDATE is committed: the claim is ours, its record is for the caller.
    assert won is not None and won.token == 1 and won.run_id is None
    run_id = store.start_run("job", "h1", token=won.token, slot=slot)
    assert store.finish_and_release(run_id, "job", "h1", won.token, m.OK, 0, "") == (True,
                                                                                      True)
    assert [(r.slot, r.result) for r in store.history("job")] == [(slot, m.OK)]


def test_a_holders_leases_renew_in_one_statement(store: Store) -> None:
    names = [f"job-{i}" for i in range(30)]
    store.ensure_jobs([*names, "other"])
    held = []
    for name in names:
        token = store.claim(name, "h1", 5)
        assert token is not None
        held.append((name, token))
    fenced = names[3]
    store.force_unlock(fenced)  # its token moves on: no longer ours
    assert store.claim("other", "h2", 5) is not None
    before_renew = {n: store.lock_state(n) for n in (*names, "other")}
    before = store.statements
    renewed = store.renew_many("h1", [*held, ("other", 1)], 60)
    assert store.statements - before == 1
    assert set(renewed) == set(names) - {fenced}  # not the fenced one, nor h2's lock
    for name in (*names, "other"):
        lock, old = store.lock_state(name), before_renew[name]
        assert lock is not None and old is not None
        if name in renewed:
            assert lock.lock_until is not None and lock.lock_until > store.db_now() + 50
        else:
            assert lock.lock_until == old.lock_until


def test_runs_ending_at_once_end_in_one_statement_each_as_alone(store: Store,
                                                                 backend: str) -> None:
    """The ends of runs on several threads at once go in one statement
    (dblockrun/store/executor.py: Together), each written and released as alone: a
    fenced run's end changes nothing, and lock-at-least is each run's own."""
    if backend == "sqlite":
        pytest.skip("SQLite is embedded: each end alone, no round trip to share")
    names = [f"job-{i}" for i in range(6)]
    store.ensure_jobs(names)
    won = {name: store.claim_and_record(name, "h1", 30) for name in names}
    assert all(w is not None and w.run_id is not None for w in won.values())
    store.force_unlock("job-0")  # fenced: another host holds it now
    taken = store.claim("job-0", "h2", 30)
    assert taken is not None
    engine = store.lock_engine()
    real_send, gate = engine._ends._send_many, threading.Event()
    sends: list[int] = []

    def held_first(ends: object) -> object:
        sends.append(len(ends))  # type: ignore[arg-type]
        if len(sends) == 1:  # the first send waits for every other end to queue
            gate.wait(10)
        return real_send(ends)  # type: ignore[arg-type]

    engine._ends._send_many = held_first  # type: ignore[assignment]
    got: dict[str, tuple[bool, bool]] = {}

    def end(name: str, least: float) -> None:
        w = won[name]
        assert w is not None and w.run_id is not None
        got[name] = store.finish_and_release(w.run_id, name, "h1", w.token, m.OK, 0,
                                             f"out {name}", least, took=0.5)

    threads = [threading.Thread(target=end, args=(name, 60.0 if name == "job-5" else 0.0))
               for name in names]
    threads[0].start()
    wait_for(lambda: len(sends) == 1, 10)
    for t in threads[1:]:
        t.start()
    wait_for(lambda: len(engine._ends._waiting) == len(names) - 1, 10)
    gate.set()
    for t in threads:
        t.join(10)
    assert got["job-0"] == (False, False)
    assert all(got[name] == (True, True) for name in names[1:])
    assert sends == [1, len(names) - 1]
    for name in names[1:]:
        w = won[name]
        assert w is not None and w.run_id is not None
        run = store.run(w.run_id)
        assert run is not None and (run.result, run.output) == (m.OK, f"out {name}")
        assert run.finished is not None and abs(run.finished - run.started - 0.5) < 0.01
    lock = store.lock_state("job-0")
    assert lock is not None and lock.holder == "h2" and lock.token == taken
    # Released (the next claim wins), but job-5 keeps its lock-at-least.
    assert store.claim("job-1", "h3", 30) is not None
    assert store.claim("job-5", "h3", 30) is None
