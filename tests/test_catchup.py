"""Catch-up after downtime (``catch-up``, ``catch-up-limit``) and systemd's
notify protocol: the keys' validation, the pure plan, and real daemon
processes on every backend after a whole-fleet outage, read back from the
history; a real daemon talking to a notify socket the test binds."""

from __future__ import annotations

import math
import os
import signal
import socket
from collections import Counter
from pathlib import Path

import pytest
from harness import Fleet, NotifySocket
from helpers import (
    FIRST_RUN,
    TestDb,
    clean_env,
    coverage,
    output_of,
    pass_time,
    runs_of,
    set_last_slot,
    stop_across_slots,
    wait_for,
)
from jobfiles import error, load, one_job
from proxy import Proxy

from dblockrun.daemon.sdnotify import SystemdNotifier
from dblockrun.jobs import Job
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.status import report

EVERY_SECOND = '"* * * * * *"'

# --- the keys --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("catch-up", "sometimes", "must be one of latest, none, all, got a string ('sometimes')"),
        ("catch-up", "[all]", "must be one of latest, none, all, got a list"),
        ("catch-up", "true", "must be one of latest, none, all, got a boolean (true)"),
        ("catch-up", "~", "needs a value"),
        ("catch-up-limit", "0", "must be at least 1, got 0"),
        ("catch-up-limit", "x", "must be a whole number, got a string ('x')"),
        ("catch-up-limit", "2.5", "must be a whole number, got a number (2.5)"),
    ],
)
def test_bad_catch_up_value(key: str, value: str, message: str) -> None:
    extra = {"catch-up": "all"} if key == "catch-up-limit" else {}
    line = 6 if extra else 5
    assert error(one_job(**extra, **{key: value})) == f"jobs.yaml:{line}: job 'j': {key}: {message}"


def test_a_limit_needs_catch_up_all() -> None:
    assert error(one_job(**{"catch-up-limit": "3"})) == (
        "jobs.yaml:5: job 'j': catch-up-limit: only with catch-up: all "
        "(this job's catch-up is latest)")
    text = "defaults:\n  catch-up: none\n  catch-up-limit: 3\njobs:\n  j:\n    cron: '@daily'\n" \
           "    command: x\n"
    assert error(text) == ("jobs.yaml:3: job 'j': catch-up-limit: only with catch-up: all "
                           "(this job's catch-up is none)")


def test_both_keys_under_defaults_and_null_unsets_the_limit() -> None:
    jobs = load("""\
        defaults:
          catch-up: all
          catch-up-limit: 5
        jobs:
          a: {cron: '@daily', command: x}
          b: {cron: '@daily', command: x, catch-up: latest, catch-up-limit: null}
          c: {cron: '@daily', command: x}
        """).jobs
    assert [(j.catch_up, j.catch_up_limit) for j in jobs] == [
        ("all", 5), ("latest", None), ("all", 5)]
    # The default leaves a job's definition hash as it was before the keys existed.
    assert Job("x", "x", cron="@daily").definition_hash() == "c67d1869302f"
    assert (Job("x", "x", cron="@daily", catch_up="none").definition_hash()
            != Job("x", "x", cron="@daily").definition_hash())


# --- daemons after a whole-fleet outage ----------------------------------------------


def _down_since(store: Store, name: str, seconds: int) -> float:
    """The job's lock row as if the fleet had stopped ``seconds`` ago: its
    last slot that many whole seconds back (database clock). Returns it."""
    last = float(math.floor(store.db_now()) - seconds)
    set_last_slot(store, name, last)
    return last


def _slots(runs: list[m.RunRecord]) -> Counter[float]:
    return Counter(r.slot for r in runs if r.slot is not None)


# test_latest_runs_the_newest_missed_slot_and_records_the_older, test_none_runs_no_missed_slot
# and test_all_runs_the_newest_missed_slots_one_at_a_time_oldest_first moved to
# tests/test_firing_memory.py (one daemon's catch-up decisions, in-process on the memory
# store); the SQL they rely on stays covered by the contract tests and, with real
# daemons after a real outage, by the two-daemon test below.


JOB_ALL = ("jobs:\n  tick:\n    cron: " + EVERY_SECOND + "\n    catch-up: all\n"
           "    catch-up-limit: {limit}\n    command: 'sleep 0.3'\n")


def _catch_up_runs(store: Store, last: float, limit: int) -> tuple[list[m.RunRecord],
                                                                    list[m.RunRecord]]:
    """(the missed records of the start, the catch-up runs): the slots after
    ``last`` recorded missed with the catch-up's reason, then the ``limit``
    slots after them."""
    runs = runs_of(store, "tick")
    missed = [r for r in runs if r.result == m.MISSED
              and "catch-up: all" in (store.run(r.id).output or "")]  # type: ignore[union-attr]
    newest_missed = max((r.slot or 0.0 for r in missed), default=last)
    ran = sorted((r for r in runs if r.slot is not None
                  and newest_missed < r.slot <= newest_missed + limit), key=lambda r: r.slot or 0)
    return missed, ran


def test_two_daemons_after_downtime_run_each_missed_slot_once(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    last = _down_since(store, "tick", 8)
    daemons = fleet.start_n(2, JOB_ALL.format(limit=4))

    def caught_up() -> bool:
        _missed, ran = _catch_up_runs(store, last, 4)
        return len(ran) == 4 and all(r.result != m.RUNNING for r in ran)

    daemons[0].wait(caught_up, FIRST_RUN, what="the catch-up")
    _missed, ran = _catch_up_runs(store, last, 4)
    newest = max(r.slot or 0 for r in ran)
    # A few regular slots after it, so both daemons had their chance at every slot.
    daemons[0].wait(lambda: any((r.slot or 0) > newest + 2 and r.result == m.OK
                                for r in runs_of(store, "tick")), 10, what="regular runs")
    runs = runs_of(store, "tick")
    assert max(_slots(runs).values()) == 1, _slots(runs)
    assert all(r.slot is not None for r in runs)
    # Every slot from the outage on has exactly one record: run, or missed
    # with why (a slow start may put the oldest in one summary record).
    count = coverage([r for r in runs if (r.slot or 0) <= newest], store, 1.0)
    assert sorted(count) == [last + k for k in range(1, int(newest - last) + 1)]
    assert set(count.values()) == {1}
    oks = sorted((r for r in runs if r.result == m.OK), key=lambda r: r.started)
    for a, b in zip(oks, oks[1:], strict=False):
        assert a.finished is not None and a.finished <= b.started + 0.001, (a, b)
    # Nothing refused the claims (no pause, no disable): a backlog slot given
    # up as unclaimable is a refusal misread (a lock released between the
    # claim and the read of its row: under load 3 of the 4 were so, CI).
    assert not [r.slot for r in runs if "could not be claimed" in output_of(store, r)]
    assert [r.result for r in ran].count(m.OK) >= 3, [
        (r.slot, r.result, r.host, output_of(store, r)) for r in ran]
    for d in daemons:
        assert d.stop() == 0


# --- systemd ---------------------------------------------------------------------------


def test_notifier_speaks_to_a_path_and_the_abstract_namespace(tmp_path: Path) -> None:
    listening = NotifySocket(tmp_path / "n")
    env = {"NOTIFY_SOCKET": str(tmp_path / "n"), "WATCHDOG_USEC": "4000000", "OTHER": "1"}
    n = SystemdNotifier(env)
    assert env == {"OTHER": "1"}  # commands the daemon starts don't inherit them
    assert n.watchdog_every == 2.0 and n.sleep_cap() == 1.0
    n.ready("ok")
    n.watchdog()
    n.watchdog()  # too soon: not sent again
    wait_for(lambda: len(listening.texts()) >= 2, 5, what="two messages")
    pass_time(0.2)  # and no third
    assert listening.texts() == ["READY=1\nSTATUS=ok", "WATCHDOG=1"]
    n.close()
    listening.close()
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"dblockrun-test-{os.getpid()}"
    abstract.bind(b"\0" + name.encode())
    abstract.settimeout(5)
    n = SystemdNotifier({"NOTIFY_SOCKET": f"@{name}"})
    n.stopping("bye")
    assert abstract.recv(100) == b"STOPPING=1\nSTATUS=bye"
    abstract.close()
    n.close()
    # Another process's watchdog, or none at all: no pings.
    assert SystemdNotifier({"NOTIFY_SOCKET": "/x", "WATCHDOG_USEC": "1000000",
                     "WATCHDOG_PID": "1"}).watchdog_every is None
    assert SystemdNotifier({"WATCHDOG_USEC": "1000000"}).watchdog_every is None


def test_daemon_notifies_systemd_ready_watchdog_and_stopping(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    notify = NotifySocket(tmp_path / "notify")
    proxy = Proxy(5432 if db.backend == "postgresql" else 3306) if db.backend != "sqlite" \
        else None
    url = proxy.url_for(db.url) if proxy is not None else db.url
    if proxy is not None:
        proxy.cut()  # the database is away when the daemon starts
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"jobs:\n  tick:\n    cron: {EVERY_SECOND}\n"
                    "    command: 'echo NOTIFY_SOCKET=${NOTIFY_SOCKET:-unset}'\n")
    d = fleet.start(jobs, url=url, heartbeat="5s", lease="15s", grace=None, env=clean_env(
        PYTHONUNBUFFERED="1", NOTIFY_SOCKET=str(tmp_path / "notify"), WATCHDOG_USEC="1000000"))
    try:
        if proxy is not None:
            wait_for(lambda: notify.has("STATUS=waiting for the database: database "
                                        "unreachable"), 20, what="waiting for the database")
            waiting = notify.count("WATCHDOG=1")
            assert not notify.has("READY=1")
            assert report(store, ["tick"]).jobs == []  # it has not reached the database
            proxy.restore()
            assert waiting >= 1  # the watchdog is fed while it waits for the database
        wait_for(lambda: notify.has("READY=1"), 20, what="READY=1")
        # READY only once the start-up against the database succeeded.
        assert [s.lock.name for s in report(store, ["tick"]).jobs] == ["tick"]
        ready_at = next(t for t, text in notify.messages if "READY=1" in text)
        # A heartbeat of 5s, but WATCHDOG_USEC=1s: pinged at least every 0.5s.
        wait_for(lambda: notify.count("WATCHDOG=1") and len(
            [t for t, x in notify.messages if x == "WATCHDOG=1" and t > ready_at]) >= 6, 10,
                 what="watchdog pings")
        pings = [t for t, x in notify.messages if x == "WATCHDOG=1" and t > ready_at]
        gaps = [b - a for a, b in zip(pings, pings[1:], strict=False)]
        assert max(gaps) < 0.6  # half of WATCHDOG_USEC, and the loop's own time
        wait_for(lambda: any(r.result == m.OK for r in store.history("tick")), 10,
                 what="a run")
        ok = next(r for r in store.history("tick") if r.result == m.OK)
        assert (store.run(ok.id).output or "").strip() == "NOTIFY_SOCKET=unset"  # type: ignore[union-attr]
        d.send(signal.SIGTERM)
        assert d.exited(20) == 0
        assert notify.has("STOPPING=1")
        stopping = next(t for t, text in notify.messages if "STOPPING=1" in text)
        assert stopping > ready_at
    finally:
        d.kill()
        notify.close()
        if proxy is not None:
            proxy.close()


@pytest.mark.parametrize("catch_up", ["latest", "all"])
def test_a_paused_daemon_applies_catch_up_to_the_slots_it_passed(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet,
        catch_up: str) -> None:
    # Not downtime, the same policy: a running daemon that falls behind runs
    # the newest slot (latest) or each one, oldest first (all), and records
    # the others missed, saying why.
    d = fleet.start(f"jobs:\n  tick:\n    cron: {EVERY_SECOND}\n"
                    f"    catch-up: {catch_up}\n    command: 'true'\n")
    d.wait(lambda: any(r.result == m.OK for r in runs_of(store, "tick")), FIRST_RUN,
           what="a run")
    stop_at, resume_at = stop_across_slots(d.send)
    # The first run after the pause of a slot at least as new as the wake-up.
    after = d.wait(lambda: next((r for r in runs_of(store, "tick") if r.result == m.OK
                                 and (r.slot or 0) >= math.floor(resume_at)), None), 10,
                   what="a run after")
    newest = after.slot or 0
    paused = [r for r in runs_of(store, "tick") if r.slot is not None and stop_at < r.slot < newest]
    expected = [float(s) for s in range(math.ceil(stop_at), int(newest))]
    assert [r.slot for r in paused] == expected
    if catch_up == "latest":
        assert {r.result for r in paused} == {m.MISSED}
        assert all((store.run(r.id).output or "").startswith(  # type: ignore[union-attr]
            "missed: this daemon woke late") for r in paused)
    else:
        assert {r.result for r in paused} == {m.OK}
    assert max(_slots(runs_of(store, "tick")).values()) == 1
    assert d.stop() == 0
