"""Job chains (``after:``) in the store, on every backend: the triggers a
finished upstream run makes, the one claim (or the one record) each gets."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dblockrun.store import Store
from dblockrun.store import models as m


@pytest.fixture
def store(store: Store) -> Store:
    store.ensure_schema()
    store.ensure_jobs(["extract", "load"])
    return store


def upstream_run(store: Store, result: str, *, release: bool = True) -> int:
    """A run of ``extract`` that ended with ``result``."""
    won = store.claim_and_record("extract", "h1", 30)
    assert won is not None and won.run_id is not None
    if release:
        store.finish_and_release(won.run_id, "extract", "h1", won.token, result, 0, "")
    else:
        store.finish_run(won.run_id, "extract", won.token, result, 0, "")
    return won.run_id


def test_a_finished_run_makes_one_trigger_for_its_results(store: Store) -> None:
    since = store.db_now() - 1
    ok = upstream_run(store, m.OK)
    failed = upstream_run(store, m.FAILED)
    assert store.make_triggers("load", ["extract"], [m.OK], since=since) == 1
    # Made once, however many hosts look.
    assert store.make_triggers("load", ["extract"], [m.OK], since=since) == 0
    assert store.make_triggers("load", ["extract"], [m.OK], ids=[ok]) == 0
    pending = store.pending_triggers(["load"])
    assert [(t.job, t.upstream_run, t.upstream_job, t.result) for t in pending] == [
        ("load", ok, "extract", m.OK)]
    assert store.make_triggers("page", ["extract"], [m.FAILED, m.TIMEOUT, m.LOST],
                               ids=[failed]) == 1
    assert [t.upstream_run for t in store.pending_triggers(["page"])] == [failed]


def test_a_run_still_holding_its_lease_is_not_over(store: Store) -> None:
    """A failed attempt whose retry (or on-failure command) is still to come
    holds the lease: its host's bookkeeping makes no trigger of it yet."""
    since = store.db_now() - 1
    upstream_run(store, m.FAILED, release=False)
    assert store.make_triggers("page", ["extract"], [m.FAILED], since=since) == 0


def test_one_claim_per_trigger(store: Store) -> None:
    since = store.db_now() - 1
    ok = upstream_run(store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    trigger, = store.pending_triggers(["load"])
    won = store.claim_trigger(trigger, "h2", 30)
    assert won is not None and won.run_id is not None
    run = store.run(won.run_id)
    assert run is not None
    assert (run.job, run.host, run.result, run.upstream_job, run.upstream_run) == (
        "load", "h2", m.RUNNING, "extract", ok)
    assert store.pending_triggers(["load"]) == []
    store.finish_and_release(won.run_id, "load", "h2", won.token, m.OK, 0, "")
    # Taken: no second run, free lock or not.
    assert store.claim_trigger(trigger, "h3", 30) is None
    assert store.record_trigger(trigger, "h3", m.SKIPPED, "x") is None
    assert [r.id for r in store.history("load")] == [won.run_id]


def test_a_claim_that_loses_leaves_the_trigger(store: Store) -> None:
    since = store.db_now() - 1
    upstream_run(store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    trigger, = store.pending_triggers(["load"])
    busy = store.claim_and_record("load", "h1", 30)
    assert busy is not None
    assert store.claim_trigger(trigger, "h2", 30) is None
    assert store.pending_triggers(["load"]) == [trigger]
    assert [r.id for r in store.history("load")] == [busy.run_id]


def test_a_trigger_that_cannot_run_is_recorded_once(store: Store) -> None:
    since = store.db_now() - 1
    ok = upstream_run(store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    trigger, = store.pending_triggers(["load"])
    run_id = store.record_trigger(trigger, "h2", m.SKIPPED, "skipped: load is disabled\n")
    assert run_id is not None
    assert store.record_trigger(trigger, "h3", m.SKIPPED, "skipped: load is disabled\n") is None
    assert store.claim_trigger(trigger, "h3", 30) is None
    run, = store.history("load")
    assert (run.id, run.result, run.upstream_run, run.output) == (
        run_id, m.SKIPPED, ok, "skipped: load is disabled\n")


def test_hosts_racing_for_triggers_start_one_run_each(store: Store) -> None:
    """Four stores (four hosts) claim the same triggers at once: each
    trigger gets exactly one run."""
    since = store.db_now() - 1
    ids = [upstream_run(store, m.OK) for _ in range(6)]
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    triggers = store.pending_triggers(["load"])
    assert [t.upstream_run for t in triggers] == ids
    hosts = [Store(store.url, store.prefix) for _ in range(4)]
    won: list[tuple[int, int]] = []
    lock = threading.Lock()

    def work(host: Store, name: str) -> None:
        for trigger in triggers:
            for _ in range(200):
                claimed = host.claim_trigger(trigger, name, 30)
                if claimed is not None:
                    assert claimed.run_id is not None
                    with lock:
                        won.append((trigger.upstream_run, claimed.run_id))
                    host.finish_and_release(claimed.run_id, "load", name, claimed.token,
                                            m.OK, 0, "")
                    break
                if trigger not in host.pending_triggers(["load"]):
                    break

    threads = [threading.Thread(target=work, args=(h, f"h{i}")) for i, h in enumerate(hosts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in hosts:
        h.close()
    assert sorted(up for up, _ in won) == ids
    runs = store.history("load", limit=100)
    assert sorted(r.upstream_run for r in runs if r.upstream_run is not None) == ids


def test_taken_triggers_are_forgotten_after_the_window(store: Store) -> None:
    since = store.db_now() - 1
    upstream_run(store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    trigger, = store.pending_triggers(["load"])
    assert store.prune_triggers(store.db_now() + 1) == 0  # not taken: kept
    store.record_trigger(trigger, "h1", m.SKIPPED, "x")
    assert store.prune_triggers(trigger.ended) == 0
    assert store.prune_triggers(store.db_now() + 1) == 1


def test_the_job_page_links_upstream_and_downstream_jobs(store: Store, tmp_path: Path) -> None:
    """A daemon publishes what its jobs run after with its host row (``status
    --json`` says it: tests/test_chains.py); the web Job page links the jobs
    both ways."""
    from starlette.testclient import TestClient
    from webtools import PASSWORD, app_for, csrf_of, users_file

    from dblockrun.config.load import load_jobs_text
    from dblockrun.scheduling.targeting import targets_json

    jobs = load_jobs_text("jobs:\n  extract: {rate: 1m, command: x}\n"
                          "  load: {after: extract, command: x}\n"
                          "  page: {after: {jobs: [extract, load], on: failure}, command: x}\n",
                          "jobs.yaml")
    store.ensure_jobs(["page"])
    store.books_round("h1:1:a", hostname="h1", pid=1, version="t", clock_offset=0.0,
                      running=0, jobs="{}", within=30, targets=targets_json(jobs))
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))
    client.post("/login", data={"name": "vera", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    load = client.get("/jobs/load").text
    assert 'runs after <a href="/jobs/extract">extract</a>' in load
    assert 'starts <a href="/jobs/page">page</a>' in load
    extract = client.get("/jobs/extract").text
    assert 'starts <a href="/jobs/load">load</a>, <a href="/jobs/page">page</a>' in extract
