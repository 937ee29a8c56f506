"""The contract of a daemon's job chains' role (dblockrun/store/runstore.py:
``ChainStore``): the triggers a finished upstream run makes, the one claim
or the one record each gets, and what a lost claim reads to say why (the
pause, a drain); held the same on the in-memory store and on every
selected database.

The logic tests that drive a daemon's chains on the memory store
(tests/test_firing_memory.py) rely on this suite for the SQL. The race of
several hosts for one trigger stays in tests/test_chains_store.py.
"""

from __future__ import annotations

from runstores import RoleUnderTest

from dblockrun.store import models as m


def upstream_run(run_store: RoleUnderTest, result: str, *, release: bool = True) -> int:
    """A run of ``extract`` that ended with ``result`` (``release``: and
    gave its lease back; else it still holds it, as a failed attempt whose
    retry is to come)."""
    store = run_store.chains
    won = store.claim_and_record("extract", "h1:1:a", 30)
    assert won is not None and won.run_id is not None
    if release:
        store.finish_and_release(won.run_id, "extract", "h1:1:a", won.token, result, 0, "")
    else:
        store.finish_run(won.run_id, "extract", won.token, result, 0, "")
    return won.run_id


def test_a_finished_run_makes_one_trigger_for_the_results_its_chain_takes(
        run_store: RoleUnderTest) -> None:
    store = run_store.chains
    run_store.ensure("extract", "load", "page")
    since = run_store.now() - 1
    assert not store.chained_before("load")
    ok = upstream_run(run_store, m.OK)
    failed = upstream_run(run_store, m.FAILED)
    assert store.make_triggers("load", ["extract"], [m.OK], since=run_store.now() + 60) == 0
    assert store.make_triggers("load", ["extract"], [m.OK], since=since) == 1
    # Made once, however many hosts look, by either way.
    assert store.make_triggers("load", ["extract"], [m.OK], since=since) == 0
    assert store.make_triggers("load", ["extract"], [m.OK], ids=[ok]) == 0
    trigger, = store.pending_triggers(["load"])
    assert (trigger.job, trigger.upstream_run, trigger.upstream_job, trigger.result) == (
        "load", ok, "extract", m.OK)
    assert since <= trigger.ended <= run_store.now() + 1
    assert store.chained_before("load") and not store.chained_before("page")
    assert store.make_triggers("page", ["extract"], [m.FAILED, m.LOST], ids=[failed, ok]) == 1
    assert [t.upstream_run for t in store.pending_triggers(["page", "load"])] == [ok, failed]
    assert [t.job for t in store.pending_triggers(["page"])] == ["page"]
    assert store.pending_triggers(["extract"]) == []


def test_a_run_that_is_not_over_makes_no_trigger_from_a_look(
        run_store: RoleUnderTest) -> None:
    """A failed attempt whose retry is still to come holds the lease, and
    once its retry is recorded it has a later attempt: a look (``since``)
    makes a trigger of the last attempt only, once it let the lease go."""
    store = run_store.chains
    run_store.ensure("extract", "page")
    since = run_store.now() - 1
    first = upstream_run(run_store, m.FAILED, release=False)
    assert store.make_triggers("page", ["extract"], [m.FAILED], since=since) == 0
    token = run_store.records("extract")[0].token
    assert token is not None
    retry = store.start_run("extract", "h1:1:a", token=token, attempt=2)
    assert store.finish_and_release(retry, "extract", "h1:1:a", token, m.FAILED, 1, "") == (
        True, True)
    assert store.make_triggers("page", ["extract"], [m.FAILED], since=since) == 1
    assert [t.upstream_run for t in store.pending_triggers(["page"])] == [retry]
    # Its host, which knows the run is over, names it: made whatever holds.
    assert store.make_triggers("page", ["extract"], [m.FAILED], ids=[first]) == 1


def test_a_trigger_is_claimed_once_with_a_record_naming_its_upstream_run(
        run_store: RoleUnderTest) -> None:
    store = run_store.chains
    run_store.ensure("extract", "load")
    since = run_store.now() - 1
    ok = upstream_run(run_store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    trigger, = store.pending_triggers(["load"])
    won = store.claim_trigger(trigger, "h2:1:a", 30)
    assert won is not None and won.run_id is not None and won.token == 1
    assert [(r.id, r.slot, r.token, r.result, r.upstream_run)
            for r in run_store.records("load")] == [(won.run_id, None, 1, m.RUNNING, ok)]
    assert run_store.row("load").holder == "h2:1:a"
    assert store.pending_triggers(["load"]) == []
    store.finish_and_release(won.run_id, "load", "h2:1:a", won.token, m.OK, 0, "")
    # Taken: no second run nor record, the lock free or not.
    assert store.claim_trigger(trigger, "h3:1:a", 30) is None
    assert store.record_trigger(trigger, "h3:1:a", m.SKIPPED, "x") is None
    assert [r.id for r in run_store.records("load")] == [won.run_id]


def test_a_claim_that_loses_leaves_the_trigger_pending_and_says_why(
        run_store: RoleUnderTest) -> None:
    """Held, disabled, paused or drained: nothing written, the trigger left
    for later; the pause and the drain read as in effect."""
    store = run_store.chains
    run_store.ensure("extract", "load", "page")
    since = run_store.now() - 1
    upstream_run(run_store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    store.make_triggers("page", ["extract"], [m.OK], since=since)
    trigger, = store.pending_triggers(["load"])
    off, = store.pending_triggers(["page"])
    busy = store.claim_and_record("load", "h1:1:a", 30)
    assert busy is not None
    assert store.claim_trigger(trigger, "h2:1:a", 30) is None
    assert store.pending_triggers(["load"]) == [trigger]
    assert [r.id for r in run_store.records("load")] == [busy.run_id]
    assert store.release("load", "h1:1:a", busy.token)
    run_store.disable("page", 3600)
    assert store.claim_trigger(off, "h2:1:a", 30) is None
    assert store.pending_triggers(["page"]) == [off] and run_store.records("page") == []
    assert store.drains.drained("h2") is None and store.control.paused() is None
    run_store.drain("h2", 3600)
    assert store.drains.drained("h2") is not None and store.drains.drained("h3") is None
    assert store.claim_trigger(trigger, "h2:1:a", 30) is None
    run_store.pause(3600)
    assert store.control.paused() is not None
    assert store.claim_trigger(trigger, "h3:1:a", 30) is None
    assert store.pending_triggers(["load"]) == [trigger]
    assert [r.id for r in run_store.records("load")] == [busy.run_id]
    run_store.resume()
    assert store.control.paused() is None
    won = store.claim_trigger(trigger, "h3:1:a", 30)
    assert won is not None and store.pending_triggers(["load"]) == []


def test_a_trigger_that_cannot_run_is_recorded_once_and_pruned_when_old(
        run_store: RoleUnderTest) -> None:
    store = run_store.chains
    run_store.ensure("extract", "load")
    since = run_store.now() - 1
    ok = upstream_run(run_store, m.OK)
    second = upstream_run(run_store, m.OK)
    store.make_triggers("load", ["extract"], [m.OK], since=since)
    trigger, pending = store.pending_triggers(["load"])
    assert store.prune_triggers(run_store.now() + 1) == 0  # not taken: kept
    run_id = store.record_trigger(trigger, "h2:1:a", m.SKIPPED, "skipped: load is disabled\n")
    assert run_id is not None
    assert store.record_trigger(trigger, "h3:1:a", m.SKIPPED, "again\n") is None
    assert store.claim_trigger(trigger, "h3:1:a", 30) is None
    assert [(r.id, r.result, r.token, r.upstream_run, r.output)
            for r in run_store.records("load")] == [
        (run_id, m.SKIPPED, None, ok, "skipped: load is disabled\n")]
    assert store.pending_triggers(["load"]) == [pending] and pending.upstream_run == second
    assert store.prune_triggers(trigger.ended) == 0
    assert store.prune_triggers(run_store.now() + 1) == 1
    assert store.pending_triggers(["load"]) == [pending] and store.chained_before("load")
