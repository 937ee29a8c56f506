"""The Python API (`dblockrun.lock`, `dblockrun.locked`) on every backend: the same
lock row as `dblockrun exec`, busy handling, renewal, fencing, lock-at-least/most,
run records."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, fail_next_run_inserts, wait_for

import dblockrun
from dblockrun import api
from dblockrun.errors import DatabaseError, DblockrunError
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.drivers import lock_wait_for


@pytest.fixture(autouse=True)
def _close_cached_stores() -> Iterator[None]:
    yield
    api.close_stores()  # the server databases are dropped at the end of the session


def is_free(store: Store, name: str) -> bool:
    state = store.lock_state(name)
    assert state is not None
    return state.lock_until is None or state.lock_until <= store.db_now()


def run_exec(db: TestDb, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=clean_env(), cwd=REPO,
                          timeout=60)


def test_acquire_release_token_increments_and_run_recorded(db: TestDb, store: Store) -> None:
    with dblockrun.lock("a", db=db.url, table_prefix=db.prefix) as first:
        assert first.name == "a"
        assert not first.lost
        first.check()
        state = store.lock_state("a")
        assert state is not None
        assert state.holder == first.holder and state.token == first.token
        assert not is_free(store, "a")
        assert first.run_id is not None
        run = store.run(first.run_id)
        assert run is not None and run.result == m.RUNNING and run.token == first.token
    assert is_free(store, "a")
    run = store.run(first.run_id)
    assert run is not None and run.result == m.OK and run.finished is not None

    with dblockrun.lock("a", db=db.url, table_prefix=db.prefix) as second:
        assert second.token == first.token + 1
        assert second.holder != first.holder
    assert is_free(store, "a")


def test_busy_raises_lock_busy_or_yields_none(db: TestDb, store: Store) -> None:
    with dblockrun.lock("b", db=db.url, table_prefix=db.prefix) as held:
        with pytest.raises(dblockrun.LockBusy) as info:
            with dblockrun.lock("b", db=db.url, table_prefix=db.prefix):
                pytest.fail("entered a busy lock")
        assert isinstance(info.value, DblockrunError)
        assert info.value.name == "b" and info.value.holder == held.holder
        assert "busy" in str(info.value)

        with dblockrun.lock("b", db=db.url, table_prefix=db.prefix,
                            raise_on_busy=False) as none:
            assert none is None
        # The busy attempt did not disturb the holder.
        assert not held.lost
        state = store.lock_state("b")
        assert state is not None and state.token == held.token
    assert len(store.history("b")) == 1  # busy attempts record no run


def test_only_one_of_many_threads_gets_it(db: TestDb, store: Store) -> None:
    n = 6
    barrier = threading.Barrier(n)
    done_trying = threading.Barrier(n)
    winners: list[int] = []
    errors: list[BaseException] = []

    def contender() -> None:
        try:
            barrier.wait(timeout=30)
            with dblockrun.lock("t", db=db.url, table_prefix=db.prefix,
                                raise_on_busy=False) as lease:
                if lease is not None:
                    winners.append(lease.token)
                # The winner holds the lock until everyone has tried.
                done_trying.wait(timeout=30)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=contender) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(winners) == 1
    assert is_free(store, "t")


def test_second_holder_in_another_thread_cannot_take_it(db: TestDb, store: Store) -> None:
    outcome: list[object] = []

    def other() -> None:
        try:
            with dblockrun.lock("h", db=db.url, table_prefix=db.prefix):
                outcome.append("entered")
        except dblockrun.LockBusy as exc:
            outcome.append(exc)

    with dblockrun.lock("h", db=db.url, table_prefix=db.prefix):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], dblockrun.LockBusy)


def test_wait_acquires_after_release_or_times_out(db: TestDb, store: Store) -> None:
    got: list[int] = []
    waiting = threading.Event()

    def waiter() -> None:
        waiting.set()
        with dblockrun.lock("w", db=db.url, table_prefix=db.prefix, wait=True,
                            timeout="60s") as lease:
            got.append(lease.token)

    with dblockrun.lock("w", db=db.url, table_prefix=db.prefix) as held:
        with pytest.raises(dblockrun.LockBusy):
            with dblockrun.lock("w", db=db.url, table_prefix=db.prefix, wait=True,
                                timeout=0.6):
                pytest.fail("entered a busy lock")
        thread = threading.Thread(target=waiter)
        thread.start()
        waiting.wait(timeout=10)
    thread.join(timeout=60)
    assert got == [held.token + 1]


def test_lock_at_least_keeps_it_after_the_block(db: TestDb, store: Store) -> None:
    with dblockrun.lock("once", db=db.url, table_prefix=db.prefix,
                        lock_at_least="1h", lock_at_most="2h") as lease:
        pass
    state = store.lock_state("once")
    assert state is not None and state.lock_until is not None and state.locked_at is not None
    assert state.lock_until == pytest.approx(state.locked_at + 3600, abs=2)
    with dblockrun.lock("once", db=db.url, table_prefix=db.prefix,
                        raise_on_busy=False) as again:
        assert again is None
    assert store.claim("once", "other", 30) is None
    run = store.run(lease.run_id or 0)
    assert run is not None and run.result == m.OK


def test_lease_is_renewed_in_the_background(db: TestDb, store: Store) -> None:
    with dblockrun.lock("r", db=db.url, table_prefix=db.prefix, lease="1s") as lease:
        start = time.monotonic()
        first = store.lock_state("r")
        assert first is not None and first.lock_until is not None
        latest = first.lock_until
        # Hold well past the 1 s lease, watching the row's lock_until move on.
        while time.monotonic() - start < 2.5:
            state = store.lock_state("r")
            assert state is not None and state.lock_until is not None
            assert state.token == lease.token
            latest = max(latest, state.lock_until)
            time.sleep(0.1)
        assert latest > first.lock_until + 1.0
        assert not is_free(store, "r")
        assert store.claim("r", "other", 30) is None
        assert not lease.lost
        lease.check()
    assert is_free(store, "r")


def test_exception_records_failed_and_propagates(db: TestDb, store: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with dblockrun.lock("e", db=db.url, table_prefix=db.prefix) as lease:
            raise RuntimeError("boom")
    assert lease.run_id is not None
    run = store.run(lease.run_id)
    assert run is not None and run.result == m.FAILED
    assert run.output is not None and "RuntimeError: boom" in run.output
    assert is_free(store, "e")


def test_record_false_writes_no_run(db: TestDb, store: Store) -> None:
    with dblockrun.lock("n", db=db.url, table_prefix=db.prefix, record=False) as lease:
        assert lease.run_id is None
    assert store.history("n") == []
    assert is_free(store, "n")


def test_decorator_returns_the_value_or_none_when_busy(db: TestDb, store: Store) -> None:
    calls: list[int] = []

    @dblockrun.locked("d", db=db.url, table_prefix=db.prefix)
    def work(x: int, *, y: int = 1) -> int:
        """Docstring kept."""
        calls.append(x)
        return x + y

    assert work.__name__ == "work" and work.__doc__ == "Docstring kept."
    assert work(2, y=3) == 5
    assert is_free(store, "d")
    with dblockrun.lock("d", db=db.url, table_prefix=db.prefix):
        assert work(10) is None

        strict = dblockrun.locked("d", db=db.url, table_prefix=db.prefix,
                                  raise_on_busy=True)(work)
        with pytest.raises(dblockrun.LockBusy):
            strict(11)
    assert calls == [2]
    assert [r.result for r in store.history("d")] == [m.OK, m.OK]


def test_shared_with_exec(db: TestDb, store: Store, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with dblockrun.lock("x", db=db.url, table_prefix=db.prefix):
        proc = run_exec(db, "-v", "--name", "x", "--", "touch", str(marker))
        assert proc.returncode == 0, proc.stderr
        assert "busy" in proc.stderr
        assert not marker.exists()

    # And the other way round: exec's lock-at-least keeps the API out.
    proc = run_exec(db, "--lock-at-least", "1h", "--name", "x", "--", "touch", str(marker))
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    with pytest.raises(dblockrun.LockBusy):
        with dblockrun.lock("x", db=db.url, table_prefix=db.prefix):
            pytest.fail("entered a lock held by exec")


def test_lost_when_the_token_is_taken_over(db: TestDb, store: Store) -> None:
    with dblockrun.lock("f", db=db.url, table_prefix=db.prefix, lease="1s") as lease:
        # Free the row under the holder's feet and claim it as someone else;
        # retried in case a renewal lands between the two statements.
        def steal() -> int | None:
            store.release("f", lease.holder, lease.token)
            return store.claim("f", "thief", 60)

        thief = wait_for(steal, 10, what="taking over the lock")
        assert thief == lease.token + 1
        wait_for(lambda: lease.lost, 10, what="lease.lost")
        with pytest.raises(dblockrun.LockLost) as info:
            lease.check()
        assert info.value.token == lease.token
    state = store.lock_state("f")
    assert state is not None and state.holder == "thief" and state.token == thief
    assert not is_free(store, "f")  # our exit did not release the thief's lock
    run = store.run(lease.run_id or 0)
    # Fenced: its result was not written; the thief's claim recorded it lost.
    assert run is not None and run.result == m.LOST


def test_lost_when_renewals_fail_for_too_long(db: TestDb, store: Store,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(*_args: object) -> bool:
        raise DatabaseError("database error: simulated outage")

    with dblockrun.lock("o", db=db.url, table_prefix=db.prefix, lease="1s") as lease:
        assert not lease.lost
        # The lock's store: its statements wait a quarter of its lease for a held row.
        cached = api._store(db.url, db.prefix, lock_wait_for(1.0))
        # The heartbeat renews a holder's leases in one statement.
        monkeypatch.setattr(cached, "renew_many", unreachable)
        wait_for(lambda: lease.lost, 10, what="lease.lost during an outage")
        monkeypatch.undo()
        # Sticky: a later successful renewal does not make it certain again.
        state = wait_for(lambda: (s := store.lock_state("o")) and s.holder == lease.holder
                         and s.lock_until is not None and s.lock_until > store.db_now() and s,
                         10, what="renewals to resume")
        assert state.token == lease.token
        assert lease.lost
        with pytest.raises(dblockrun.LockLost):
            lease.check()


def test_lock_at_most_ends_the_lease(db: TestDb, store: Store) -> None:
    with dblockrun.lock("most", db=db.url, table_prefix=db.prefix,
                        lock_at_most="1s", lease="30s") as lease:
        wait_for(lambda: lease.lost, 10, what="lease.lost at lock-at-most")
        held = store.lock_state("most")
        assert held is not None and held.lock_until is not None and held.locked_at is not None
        assert held.lock_until <= held.locked_at + 1.5
        # Renewals never pushed the lease past lock-at-most: the lock frees.
        assert wait_for(lambda: store.claim("most", "next", 30), 10, what="claim after")
    state = store.lock_state("most")
    assert state is not None and state.holder == "next"


def test_db_defaults_to_the_environment(sqlite_db: TestDb,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DBLOCKRUN_DB", sqlite_db.url)
    with dblockrun.lock("env", table_prefix=sqlite_db.prefix) as lease:
        with Store(sqlite_db.url, sqlite_db.prefix) as s:
            state = s.lock_state("env")
            assert state is not None and state.token == lease.token


def test_one_store_per_url_and_prefix(sqlite_db: TestDb) -> None:
    a = api._store(sqlite_db.url, sqlite_db.prefix)
    assert api._store(sqlite_db.url, sqlite_db.prefix) is a
    assert api._store(sqlite_db.url, "other_") is not a
    api.close_stores()
    assert api._store(sqlite_db.url, sqlite_db.prefix) is not a


@pytest.mark.parametrize(
    "options",
    [
        {"lease": "soon"},
        {"lock_at_most": "-1s"},
        {"lock_at_most": 0},
        {"lock_at_least": "2h", "lock_at_most": "1h"},
        {"lease": "3s", "heartbeat": "3s"},
        {"lease": 0},
    ],
)
def test_bad_options_are_value_errors(options: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        dblockrun.lock("v", db="sqlite:////nonexistent/never-opened.db",
                       **options)  # type: ignore[call-overload]
    with pytest.raises(ValueError):
        dblockrun.locked("v", **options)  # type: ignore[arg-type]


def test_async_functions_are_refused() -> None:
    async def job() -> None:
        pass

    with pytest.raises(TypeError):
        dblockrun.locked("v", db="sqlite:////nonexistent/never-opened.db")(job)


def test_import_is_light() -> None:
    code = (
        "import sys, dblockrun\n"
        "assert 'sqlalchemy' not in sys.modules, 'sqlalchemy imported eagerly'\n"
        "assert callable(dblockrun.lock) and issubclass(dblockrun.LockBusy, Exception)\n"
        "assert 'sqlalchemy' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_a_claim_whose_run_record_deadlocks_is_still_held_and_recorded(db: TestDb,
                                                                       store: Store) -> None:
    """Issue 15 item 2, on the API's path: the claim's UPDATE is committed
    when its run record fails; the record is written on its own."""
    if db.backend != "mariadb":
        pytest.skip("the claim and its record are two statements of one round trip on MariaDB")
    store.ensure_schema()
    fail_next_run_inserts(store, 1)
    with dblockrun.lock("a", db=db.url, table_prefix=db.prefix) as held:
        assert held
        assert [r.result for r in store.history("a")] == [m.RUNNING]
    with store.engine.connect() as conn:
        left = conn.exec_driver_sql(f"SELECT n FROM `{store.t.runs.name}_fail`").scalar()
    assert left == 0  # the forced deadlock happened
    assert [(r.result, r.token) for r in store.history("a")] == [(m.OK, 1)]
    assert is_free(store, "a")
