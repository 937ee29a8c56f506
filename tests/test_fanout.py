"""Fan-out jobs: item rows claimed with SKIP LOCKED, on every backend."""

from __future__ import annotations

import collections
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from helpers import TestDb, dblockrun_cmd, wait_for

from dblockrun.store import Store
from dblockrun.store.items import ClaimedItem
from dblockrun.store.status import report


@pytest.fixture
def store(store: Store) -> Store:
    """conftest's store, with the schema created before the test."""
    store.ensure_schema()
    return store


def test_sync_adds_retires_and_brings_back(store: Store) -> None:
    items = store.items
    assert items.sync("job", ["a", "b", "c"]) == (3, 0)
    assert items.sync("job", ["a", "c", "d;'%\n"]) == (1, 1)
    assert [s.item for s in items.states("job")] == ["a", "c", "d;'%\n"]
    assert items.sync("job", ["a", "b"]) == (0, 2)
    assert [s.item for s in items.states("job")] == ["a", "b"]


def test_each_item_once_per_slot_under_concurrent_claims(store: Store) -> None:
    names = [f"item-{i:02d}" for i in range(40)]
    store.items.sync("job", names)
    slot = store.db_now() - 1
    got: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(4)

    def worker(me: str) -> None:
        barrier.wait()
        while True:
            claimed = store.items.claim("job", me, 30, slot=slot, rate=None, limit=3)
            if not claimed:
                return
            with lock:
                got.extend((me, c.item) for c in claimed)
            assert store.items.finish_and_release("job", me, claimed, "ok", 0, "", 0) == (
                True, True)

    threads = [threading.Thread(target=worker, args=(f"h{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(item for _h, item in got) == names
    # The next slot makes every item due again, oldest start first.
    again = store.items.claim("job", "h0", 30, slot=slot + 1, rate=None, limit=40)
    assert sorted(c.item for c in again) == names


def test_item_lease_token_and_rate(store: Store) -> None:
    store.items.sync("job", ["x", "y"])
    (first,) = store.items.claim("job", "h1", 30, slot=None, rate=3600, limit=1)
    assert first.token == 1
    assert store.items.renew("job", "h1", [first], 30)
    stale = ClaimedItem(first.item, first.key, first.token + 1, first.run_id)
    assert not store.items.renew("job", "h1", [first, stale], 30)
    # A result only while every token is ours: the stale one spoils the batch.
    assert store.items.finish_and_release("job", "h1", [first, stale], "ok", 0, "", 0) == (
        False, False)
    assert store.items.finish_and_release("job", "h1", [first], "ok", 0, "", 0) == (True, True)
    run = store.run(first.run_id)
    assert run is not None and (run.item, run.token, run.result) == ("x", 1, "ok")
    (second,) = store.items.claim("job", "h2", 30, slot=None, rate=3600, limit=5)
    assert second.item != first.item  # x ran within the rate window
    store.items.finish_and_release("job", "h2", [second], "failed", 1, "", 0)
    assert store.items.claim("job", "h2", 30, slot=None, rate=3600, limit=5) == []
    store.ensure_jobs(["job"])  # status lists a job by its lock row
    progress = report(store, ["job"]).jobs[0].items
    assert progress == {"total": 2, "done": 1, "running": 0, "waiting": 0, "failed": 1}


FLEET_JOBS = """\
jobs:
  sites:
    cron: "*/10 * * * * *"
    lock-at-most: 30s
    parallel: 2
    items-command: seq -f "site-%02g" 1 60
    env:
      LOG: {log}
    command: |
      echo "$DBLOCKRUN_SLOT $DBLOCKRUN_ITEM $DBLOCKRUN_HOST_ID $DBLOCKRUN_FENCING_TOKEN" >> "$LOG"
      sleep 0.2
"""


@pytest.mark.slow
def test_three_daemons_share_sixty_items(db: TestDb, tmp_path: Path) -> None:
    log = tmp_path / "items.log"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(FLEET_JOBS.format(log=log))
    procs = [
        subprocess.Popen(
            [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs),
             "--heartbeat", "1s", "--lease", "3s"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / f"d{i}.log").open("wb"))
        for i in range(3)
    ]

    def slots() -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
        if log.exists():
            for line in log.read_text().splitlines():
                slot, item, host, _token = line.split()
                out[slot].append((item, host))
        return out

    try:
        # Two whole slots: every item of each ran by the time the third begins.
        wait_for(lambda: len(slots()) >= 3, 45, interval=0.5, what="three slots of items")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=30) for p in procs]
    assert codes == [0, 0, 0]
    complete = sorted(slots().items())[:2]
    hosts: collections.Counter[str] = collections.Counter()
    for slot, runs in complete:
        items = [item for item, _host in runs]
        assert sorted(items) == [f"site-{i:02d}" for i in range(1, 61)], f"slot {slot}"
        hosts.update(host for _item, host in runs)
    print(f"\nitems per daemon over two slots: {sorted(hosts.values())}")
    assert len(hosts) == 3, "every daemon took part"
    assert min(hosts.values()) >= 12


@pytest.mark.slow
def test_failing_items_command_is_a_failed_run(sqlite_db: TestDb, tmp_path: Path) -> None:
    db = sqlite_db
    store = Store(db.url, db.prefix)
    store.ensure_schema()
    store.items.sync("listing", ["kept"])
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  listing:\n    rate: 1h\n    items-command: echo boom; exit 3\n"
                    "    command: echo never\n")
    proc = subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        run = wait_for(lambda: next(iter(store.history("listing")), None), 20,
                       what="the failed listing run")
        wait_for(lambda: store.run(run.id).finished is not None,  # type: ignore[union-attr]
                 10, what="the run to finish")
        rec = store.run(run.id)
        assert rec is not None
        assert (rec.result, rec.exit_code, rec.output) == ("failed", 3, "boom\n")
        assert [s.item for s in store.items.states("listing")] == ["kept"]  # nothing retired
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        store.close()
