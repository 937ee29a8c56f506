"""Fan-out jobs: item rows claimed with SKIP LOCKED, on every backend."""

from __future__ import annotations

import collections
import threading
from pathlib import Path

import pytest
from conftest import ServerDatabases, selected_backends
from harness import Fleet, pid_alive
from helpers import TestDb, new_prefix, wait_for

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


def test_an_item_run_ends_when_its_command_did_not_when_written(store: Store) -> None:
    """As a job's run: an item's record ends its command's duration after its
    start, however late the write got through (an outage holds it back)."""
    store.items.sync("job", ["x", "y"])
    a, b = store.items.claim("job", "h1", 30, slot=None, rate=None, limit=2)
    assert store.items.finish("job", "h1", [a], "failed", 1, "", took=0.25)
    assert store.items.finish_and_release("job", "h1", [b], "ok", 0, "", 0, took=0.5) == (
        True, True)
    for claimed, took in ((a, 0.25), (b, 0.5)):
        run = store.run(claimed.run_id)
        assert run is not None and run.duration == pytest.approx(took, abs=0.001)


def test_an_item_claim_refused_after_its_pick_records_nothing_and_hands_out_nothing(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fault soak (`twice`): the job disabled (or the fleet paused)
    between the pick of due items and the claim's UPDATE. The UPDATE claims
    none, but a run record was inserted for every picked item all the same,
    with the token of the item's previous claim and the new slot: a claim
    nobody made, "lost" later with no command. Where the previous claim was
    this host's own, its old token was even handed out to run again. A
    refused claim now writes nothing and returns nothing."""
    store.ensure_jobs(["job"])
    store.items.sync("job", ["x"])
    slot = float(int(store.db_now())) - 3.0
    (before,) = store.items.claim("job", "h1", 30, slot=slot, rate=None, limit=1)
    assert store.items.finish_and_release("job", "h1", [before], "ok", 0, "", 0) == (True, True)
    engine = store.lock_engine()
    q, executor = engine.q, engine.x
    send = executor.send

    def disabled_before_the_claim(cur: object, sql: str,
                                  params: dict[str, object] | None = None) -> object:
        if sql.lstrip().startswith(f"UPDATE {q.items} SET"):
            # As another host's `disable` committed between the pick and the
            # claim (written here in the claim's own transaction).
            send(cur, f"UPDATE {q.locks} SET disabled_until = {q.now} + 60 "
                      f"WHERE name = {q.p('name')}", {"name": "job"})
        return send(cur, sql, params)

    monkeypatch.setattr(executor, "send", disabled_before_the_claim)
    for holder in ("h1", "h2"):  # the previous claim's own host; another
        assert store.items.claim("job", holder, 30, slot=slot + 1, rate=None, limit=1) == []
        store.enable("job")  # (the fix rolls the disable back with the claim)
    monkeypatch.undo()
    records = store.history("job", 10)
    assert [(r.item, r.token, r.slot, r.host) for r in records] == [("x", 1, slot, "h1")]


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
def test_three_daemons_share_sixty_items(db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    log = tmp_path / "items.log"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(FLEET_JOBS.format(log=log))
    fleet.start_n(3, jobs, grace=None)

    def slots() -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
        if log.exists():
            for line in log.read_text().splitlines():
                slot, item, host, _token = line.split()
                out[slot].append((item, host))
        return out

    try:
        # Two whole slots: every item of each ran by the time the third begins.
        wait_for(lambda: len(slots()) >= 3, 90, interval=0.5, what="three slots of items")
    finally:
        codes = fleet.stop()
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
def test_failing_items_command_is_a_failed_run(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    db = sqlite_db
    store = Store(db.url, db.prefix)
    store.ensure_schema()
    store.items.sync("listing", ["kept"])
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  listing:\n    rate: 1h\n    items-command: echo boom; exit 3\n"
                    "    command: echo never\n")
    d = sqlite_fleet.start(jobs, heartbeat=None, lease=None, grace=None)
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
        assert d.stop() == 0
        store.close()


@pytest.mark.slow
def test_items_command_timeout_stops_its_whole_group(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    db = sqlite_db
    pid_file = tmp_path / "child.pid"
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"""\
jobs:
  listing:
    rate: 1h
    lock-at-most: 2s
    items-command: |
      sleep 300 &
      echo $! > {pid_file}
      echo item-a
      sleep 300
    command: echo never
""")
    store = Store(db.url, db.prefix)
    store.ensure_schema()
    sqlite_fleet.start(jobs, grace=None)
    try:
        child = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 20,
                             what="the background child's pid"))
        assert pid_alive(child)
        run = wait_for(lambda: next((r for r in store.history("listing")
                                     if r.finished is not None), None), 20,
                       what="the listing run's end")
        # Stopped at its timeout (lock-at-most), its background child with it.
        wait_for(lambda: not pid_alive(child), 5, what="the background child to be stopped")
        assert run.result == "timeout"
        assert run.output is not None and run.output.endswith(
            "items-command stopped at its timeout (2s)\n")
        assert run.finished - run.started < 10  # type: ignore[operator]
        assert store.items.states("listing") == []  # nothing listed from a stopped command
    finally:
        assert sqlite_fleet.stop() == [0]
        store.close()


@pytest.mark.slow
def test_a_failing_item_is_retried(sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    db = sqlite_db
    marks = tmp_path / "marks"
    marks.mkdir()
    jobs = tmp_path / "jobs.yaml"
    # Each item fails its first attempt, and does its work on the retry.
    jobs.write_text(f"""\
jobs:
  flaky:
    rate: 1h
    items: [a, b]
    retries: 2
    retry-delay: 0.2s
    command: |
      mkdir "{marks}/$DBLOCKRUN_ITEM" 2>/dev/null && {{ echo "first try $DBLOCKRUN_ITEM"; exit 1; }}
      echo "done $DBLOCKRUN_ITEM"
""")
    store = Store(db.url, db.prefix)
    store.ensure_schema()
    sqlite_fleet.start(jobs, grace=None)
    try:
        def settled() -> bool:
            states = store.items.states("flaky")
            return len(states) == 2 and all(s.last_result == "ok" for s in states)

        wait_for(settled, 30, what="both items to end ok")
        for item in ("a", "b"):
            runs = sorted(store.history("flaky", item=item), key=lambda r: r.attempt)
            assert [(r.attempt, r.result, r.exit_code, r.output) for r in runs] == [
                (1, "failed", 1, f"first try {item}\n"), (2, "ok", 0, f"done {item}\n")]
            assert runs[0].token == runs[1].token  # one claim of the item, two attempts
    finally:
        assert sqlite_fleet.stop() == [0]
        store.close()


@pytest.mark.slow
def test_max_running_counts_running_items(
        sqlite_db: TestDb, tmp_path: Path, sqlite_fleet: Fleet) -> None:
    now_running, counts, done = tmp_path / "running", tmp_path / "counts", tmp_path / "done"
    now_running.mkdir()
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"""\
jobs:
  wide:
    rate: 1h
    parallel: 4
    items: [i1, i2, i3, i4, i5, i6]
    command: |
      touch "{now_running}/$DBLOCKRUN_ITEM"
      ls "{now_running}" | wc -l >> "{counts}"
      sleep 0.5
      rm "{now_running}/$DBLOCKRUN_ITEM"
      echo "$DBLOCKRUN_ITEM" >> "{done}"
""")
    sqlite_fleet.start(jobs, "--max-running", "2", grace=None)
    try:
        wait_for(lambda: done.exists() and len(done.read_text().split()) == 6, 40,
                 what="all six items")
    finally:
        assert sqlite_fleet.stop() == [0]
    assert sorted(done.read_text().split()) == [f"i{i}" for i in range(1, 7)]
    # parallel: 4, but this host runs at most 2 commands at once.
    assert max(int(n) for n in counts.read_text().split()) <= 2


RETRIED_JOBS = """\
jobs:
  sites:
    cron: "*/5 * * * * *"
    lock-at-most: 4s
    parallel: 2
    retries: 1
    retry-delay: 0s
    items: [{items}]
    env:
      LOG: {log}
      MARKS: {marks}
    command: |
      mkdir "$MARKS/$DBLOCKRUN_SLOT-$DBLOCKRUN_ITEM" 2>/dev/null && exit 1
      echo "$DBLOCKRUN_SLOT $DBLOCKRUN_ITEM $DBLOCKRUN_HOST_ID" >> "$LOG"
      sleep 0.1
"""


@pytest.mark.slow
@pytest.mark.parametrize("server", ["postgresql", "mariadb"])
def test_two_daemons_run_each_item_once_per_slot_with_retries(
        server: str, server_databases: ServerDatabases, request: pytest.FixtureRequest,
        tmp_path: Path) -> None:
    """Each item's first attempt in a slot fails and its retry logs it: an
    item run twice in a slot (by either daemon) would log it twice."""
    if server not in selected_backends(request.config):
        pytest.skip(f"{server} is not among the selected backends")
    db = TestDb(server, server_databases.url(server), new_prefix())
    names = [f"site-{i:02d}" for i in range(1, 17)]
    log, marks = tmp_path / "items.log", tmp_path / "marks"
    marks.mkdir()
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(RETRIED_JOBS.format(items=", ".join(names), log=log, marks=marks))
    fleet = Fleet(db, tmp_path, grace=None)
    fleet.start_n(2, jobs)

    def slots() -> dict[str, list[tuple[str, str]]]:
        out: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
        if log.exists():
            for line in log.read_text().splitlines():
                slot, item, host = line.split()
                out[slot].append((item, host))
        return out

    try:
        wait_for(lambda: len(slots()) >= 3, 45, interval=0.5, what="three slots of items")
    finally:
        codes = fleet.stop()
        fleet.close()
    assert codes == [0, 0]
    hosts: collections.Counter[str] = collections.Counter()
    for slot, runs in sorted(slots().items())[:2]:
        assert sorted(item for item, _host in runs) == names, f"slot {slot}"
        hosts.update(host for _item, host in runs)
    assert len(hosts) == 2, "both daemons took part"
    store = Store(db.url, db.prefix)
    try:
        records = store.history("sites", limit=1000)
    finally:
        store.close()
    first_slot = min(r.slot for r in records if r.slot is not None)
    attempts = collections.Counter((r.item, r.attempt, r.result) for r in records
                                   if r.slot == first_slot)
    assert attempts == {**{(n, 1, "failed"): 1 for n in names}, **{(n, 2, "ok"): 1 for n in names}}


# -- issue 36 item 15: an item longer than a run's record holds ---------------------------


@pytest.mark.slow
def test_an_items_command_line_too_long_fails_alone(db: TestDb, fleet: Fleet) -> None:
    """A 1,500-character line of ``items-command`` blocked its job for good
    on PostgreSQL and MariaDB (a run's ``item`` column holds 1,000: every
    record refused, retried every 30 s, no run ever recorded). It fails
    alone now, recorded with the reason; the other items run."""
    long = "x" * 1500
    proc = fleet.start("jobs:\n  listing:\n    rate: 1h\n"
                       f"    items-command: printf 'a\\n{long}\\nb\\n'\n"
                       "    command: echo \"done $DBLOCKRUN_ITEM\"\n", grace=None)
    try:
        with Store(db.url, db.prefix) as store:
            def ended() -> list[str] | None:
                runs = [r for r in store.history("listing", 10) if r.finished is not None]
                return [r.item or "" for r in runs] if len(runs) >= 3 else None

            wait_for(ended, 30, what="three ended runs")
            runs = {r.item: r for r in store.history("listing", 10)}
            assert {k: v.result for k, v in runs.items()} == {
                "a": "ok", "b": "ok", "x" * 997 + "...": "failed"}
            refused = store.run(runs["x" * 997 + "..."].id)
            assert refused is not None and refused.output == (
                f"not run: items-command printed an item {long[:40]!r}... is 1,500 characters "
                "long: at most 1,000 (a run's record holds its item)\n")
            assert sorted(s.item for s in store.items.states("listing")) == ["a", "b"]
    finally:
        assert proc.stop() == 0, proc.text()
    assert "retrying with backoff" not in proc.text()
