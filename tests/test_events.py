"""The run lifecycle (dblockrun/running/runjob.py) tells what became of a run as
events (dblockrun/events.py), in-process on every backend: each attempt's
start and end, the end marked final when no retry follows, told once each;
the log lines, metrics, notifications and pings are subscribers. And what it
records is the truth: a run stopped at lock-at-most stores why, and a result
written late (the database away) keeps the command's own duration."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dblockrun.errors import DatabaseError
from dblockrun.events import Event, Events, RunEnded, RunLost, RunStarted, SlotPassed
from dblockrun.jobs import Job
from dblockrun.notify.notifier import Notifier
from dblockrun.prometheus import Prometheus
from dblockrun.running.heartbeat import Renewer
from dblockrun.running.runjob import JobRun, RunContext
from dblockrun.running.runlog import log_run
from dblockrun.running.runloop import RunLoop
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.engine import Claim
from dblockrun.store.memory import MemoryRunStore
from dblockrun.store.outage import Outage

HOLDER = "web-1:4242:abcd"


class Heard:
    """The events told, in order."""

    def __init__(self, events: Events) -> None:
        self.events: list[Event] = []
        events.subscribe(self.events.append)


@pytest.fixture
def events() -> Events:
    bus = Events()
    bus.subscribe(log_run)
    return bus


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # the run loop's threads end with it


def run_job(store: Store | MemoryRunStore, job: Job, events: Events, stop: threading.Event,
            lease: float = 30.0, frozen: float = 0.0) -> JobRun:
    """Claim ``job`` and run it to its end, as a daemon would (one frozen
    for ``frozen`` seconds between its claim and the run's start). On the
    memory store, the outage's backoff and the renewer's rounds are on its
    manual clock."""
    store.ensure_jobs([job.name])
    sent = time.monotonic() - frozen
    won = (store.claim(job.name, HOLDER, lease, Claim(record=True))
           if isinstance(store, MemoryRunStore)
           else store.claim_and_record(job.name, HOLDER, lease))
    assert won is not None
    outage = (Outage(store.clock.now, store.clock.advance) if isinstance(store, MemoryRunStore)
              else Outage())
    renewer = Renewer(store, 1.0, outage)
    ctx = RunContext(store=store, holder=HOLDER, lease=lease, kill_grace=1.0, renewer=renewer,
                     outage=outage, stop=stop, stop_grace=lambda: None, loop=RunLoop(stop),
                     events=events)
    run = JobRun(ctx, job, won.token, None, sent, run_id=won.run_id)
    renewer.start()
    try:
        run.start()
        assert run.done.wait(60), "the run did not end"
    finally:
        renewer.stop()
    return run


def records(store: Store, job: str) -> list[m.RunRecord]:
    return sorted(store.history(job, 100), key=lambda r: r.id)


def test_each_attempt_is_told_started_and_ended_and_the_last_one_final(
    memory_store: MemoryRunStore, events: Events, stop: threading.Event,
    caplog: pytest.LogCaptureFixture
) -> None:
    """On the memory store: what it records of the attempts is the role's
    contract (tests/test_runstore_contract.py), which the databases keep."""
    store = memory_store
    heard = Heard(events)
    job = Job(name="flaky", command="echo out-$DBLOCKRUN_RUN_ID; exit 3", retries=1,
              retry_delay=0.1)
    with caplog.at_level(logging.INFO, logger="dblockrun"):
        run_job(store, job, events, stop)
    first, second = store.runs_of("flaky")
    assert [type(e).__name__ for e in heard.events] == [
        "RunStarted", "RunEnded", "RunStarted", "RunEnded"]
    s1, e1, s2, e2 = heard.events
    assert isinstance(s1, RunStarted) and isinstance(s2, RunStarted)
    assert isinstance(e1, RunEnded) and isinstance(e2, RunEnded)
    assert (s1.run_id, s1.attempt, s2.run_id, s2.attempt) == (first.id, 1, second.id, 2)
    assert s1.token == first.token and s1.host == HOLDER
    # The first end is followed by a retry; the second is the run's end.
    assert (e1.final, e2.final) == (False, True)
    assert (e1.run_id, e2.run_id, e2.first_run_id) == (first.id, second.id, first.id)
    assert (e2.result, e2.exit_code, e2.detail) == (m.FAILED, 3, "")
    assert e2.output == f"out-{second.id}\n" == second.output
    # The log lines are a subscriber's, with their text and JSON fields as before.
    lines = [r for r in caplog.records if r.name == "dblockrun" and "job flaky: run" in r.message]
    assert [r.getMessage().split(", exit")[0] for r in lines] == [
        f"job flaky: run {first.id} started (token {first.token}, attempt 1)",
        f"job flaky: run {first.id} failed",
        f"job flaky: run {second.id} started (token {first.token}, attempt 2)",
        f"job flaky: run {second.id} failed",
    ]
    assert lines[1].getMessage().startswith(f"job flaky: run {first.id} failed, exit 3, ")
    fields: dict[str, Any] = lines[3].__dict__
    assert {k: fields[k] for k in ("job", "run_id", "token", "host", "slot", "event")} == {
        "job": "flaky", "run_id": second.id, "token": first.token, "host": HOLDER,
        "slot": None, "event": "failed"}
    assert lines[0].__dict__["event"] == "start"


def test_a_run_stopped_at_lock_at_most_stores_why(
    store: Store, events: Events, stop: threading.Event
) -> None:
    heard = Heard(events)
    run_job(store, Job(name="slow", command="echo started; sleep 30", lock_at_most=1.0),
            events, stop)
    (run,) = records(store, "slow")
    assert run.result == m.TIMEOUT
    # What `history --output` shows: the output, then why it was stopped.
    assert run.output == "started\nreached lock-at-most\n"
    assert run.duration is not None and 0.9 < run.duration < 3
    (end,) = [e for e in heard.events if isinstance(e, RunEnded)]
    assert (end.result, end.exit_code, end.final) == (m.TIMEOUT, 143, True)
    assert end.detail == "reached lock-at-most" and end.output == run.output


def test_a_result_written_late_keeps_the_commands_duration(
    memory_store: MemoryRunStore, events: Events, stop: threading.Event,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the memory store: the outage's backoff moves its manual clock,
    no real seconds pass (the duration is the command's, as the run measured
    it); that a result's ``took`` decides its end on the databases is the
    role's contract."""
    store = memory_store
    # The database does not take the result for 3.5 s (three failed tries,
    # backing off 0.5, 1, 2 s): the run still took what its command took.
    real = store.finish_and_release
    fails = [3]

    def away(*args: Any, **kwargs: Any) -> tuple[bool, bool]:
        if fails[0]:
            fails[0] -= 1
            raise DatabaseError("connection refused (the test)", kind="unreachable")
        return real(*args, **kwargs)

    monkeypatch.setattr(store, "finish_and_release", away)
    before = store.clock.now()
    run_job(store, Job(name="quick", command="sleep 0.3"), events, stop)
    written = store.clock.now()
    (run,) = store.runs_of("quick")
    assert fails == [0] and written - before >= 3.5  # the record waited for the database
    assert run.result == m.OK
    assert run.duration is not None and 0.3 <= run.duration < 1.0, run.duration


def test_metrics_count_what_the_events_tell() -> None:
    metrics = Prometheus()
    job = Job(name="j", command="true", cron="* * * * *")
    end = RunEnded(job=job, host=HOLDER, run_id=7, first_run_id=7, slot=None, attempt=1,
                   result=m.OK, exit_code=0, duration=2.5, output="", detail="", final=True)
    metrics.hear(end)
    for result, cause, count in [(m.MISSED, "late", 1), (m.MISSED, "deadline", 2),
                                 (m.SKIPPED, "busy", 1), (m.SKIPPED, "host-full", 1),
                                 (m.SKIPPED, "group-full", 3), (m.SKIPPED, "dead-holder", 1)]:
        metrics.hear(SlotPassed(job=job, host=HOLDER, slot=60.0, result=result, reason="r",
                                cause=cause, late=1.0, count=count))
    text = metrics.render().decode()
    assert 'dblockrun_runs_total{job="j",result="ok"} 1.0' in text
    assert 'dblockrun_run_duration_seconds_sum{job="j"} 2.5' in text
    for kind, value in [("missed", 3), ("skipped", 2), ("max-running", 1), ("group", 3)]:
        assert f'dblockrun_missed_slots_total{{job="j",reason="{kind}"}} {value:.1f}' in text


class Sent:
    """What a notifier queued (its sending replaced: no network)."""

    def __init__(self, notifier: Notifier, monkeypatch: pytest.MonkeyPatch) -> None:
        self.items: list[tuple[str, str]] = []
        monkeypatch.setattr(notifier, "_put", self.put)

    def put(self, job: str, what: str, label: str, send: object) -> None:
        self.items.append((what, label))


def test_the_notifier_hears_starts_final_ends_missed_slots_and_lost_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dblockrun.jobs import LITERAL, Notify, SecretUrl

    notifier = Notifier(None, HOLDER)
    sent = Sent(notifier, monkeypatch)
    job = Job(name="j", command="false", cron="* * * * *",
              notify=Notify(urls=(SecretUrl(LITERAL, value="json://127.0.0.1/x"),)),
              ping=SecretUrl(LITERAL, value="http://127.0.0.1/ping"))
    notifier.hear(RunStarted(job=job, host=HOLDER, run_id=1, token=1, slot=None, attempt=1))
    notifier.hear(RunStarted(job=job, host=HOLDER, run_id=2, token=1, slot=None, attempt=2))
    for run_id, final in ((1, False), (2, True)):
        notifier.hear(RunEnded(job=job, host=HOLDER, run_id=run_id, first_run_id=1, slot=None,
                               attempt=run_id, result=m.FAILED, exit_code=1, duration=0.1,
                               output="", detail="", final=final))
    notifier.hear(SlotPassed(job=job, host=HOLDER, slot=60.0, result=m.SKIPPED, reason="r",
                             cause="busy", late=1.0))
    notifier.hear(SlotPassed(job=job, host=HOLDER, slot=60.0, result=m.MISSED, reason="r",
                             cause="late", late=1.0))
    notifier.hear(RunLost(job=job, name="j", host="web-2:1:x", run_id=3, first_run_id=3,
                          slot=None, ended=0.0, recorded_by=HOLDER))
    notifier.hear(RunLost(job=None, name="gone", host="web-2:1:x", run_id=4,
                          first_run_id=4, slot=None, ended=0.0, recorded_by=HOLDER))
    assert sent.items == [
        ("ping", "start"),  # the run's start, not the retry's
        ("ping", "fail"), ("notify", "failure"),  # its end, after the last attempt
        ("notify", "missed"),  # a missed slot, not a skipped one
        ("ping", "fail"), ("notify", "failure"),  # a lost run of a job in this file
    ]


def test_a_daemon_frozen_between_its_claim_and_the_start_does_not_start_the_command(
    store: Store, events: Events, stop: threading.Event, tmp_path: Path
) -> None:
    """Its lease ran out meanwhile (another host may hold the job): the
    command never starts, and the run is recorded lost. The fault soak saw
    a daemon SIGSTOPped right after a claim start its command 5 s later, 2 s
    after another host had claimed the job."""
    heard = Heard(events)
    marker = tmp_path / "ran"
    run_job(store, Job(name="late", command=f"touch {marker}"), events, stop, lease=3.0,
            frozen=5.0)
    assert not marker.exists()
    assert [type(e).__name__ for e in heard.events] == []
    (run,) = records(store, "late")
    assert run.result == m.LOST
