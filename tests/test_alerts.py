"""Deadlines and duration alerts (``expect:``), ``notify: {after: N}`` and
notification storms (issue 37 items 4 and 5), from real `dblockrun daemon`
processes on every backend to an HTTP receiver started by the test: each
alert is sent while its condition holds, once across the fleet, with its
recovery; a storm of passed slots is one notification.
"""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from harness import Fleet
from helpers import dblockrun_cmd, runs_of, wait_for
from hooks import Hit, Hooks

from dblockrun.config.load import load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.events import Events
from dblockrun.notify.alerts import Alerts, finish_deadline
from dblockrun.store import Store
from dblockrun.store import models as m

pytestmark = pytest.mark.slow

EVERY_SECOND = '"* * * * * *"'
#: Daemons that do not measure failover hold leases of 6 s; their
#: bookkeeping (where alerts are looked for) runs every 2.4 s. The waits
#: below are long (60 s) for a loaded CI machine; a pass takes seconds.
HEARTBEAT, LEASE = "2s", "6s"


def events(hooks: Hooks) -> list[str]:
    return [h.field("event") for h in hooks.under("/hook")]


def hook(hooks: Hooks, event: str) -> Hit | None:
    return next((h for h in hooks.under("/hook") if h.field("event") == event), None)


def test_a_slow_run_is_alerted_while_it_runs_once_across_three_daemons_then_recovers(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    jobs = ("jobs:\n  long:\n    rate: 1h\n"
            "    command: 'until [ -e done ]; do sleep 0.2; done'\n"
            "    expect: {max: 3s}\n"
            f"    notify: {{urls: ['{hooks.url('json', '/hook')}'], on: [slow, recovery]}}\n")
    daemons = [fleet.start(jobs, name=name, heartbeat=HEARTBEAT, lease=LEASE) for name in "abc"]
    slow = daemons[0].wait(lambda: hook(hooks, "slow"), 60, "the slow alert")
    (run,) = runs_of(store, "long")
    assert run.result == m.RUNNING  # sent while it runs, not after
    assert slow.field("run") == str(run.id)
    assert slow.field("alert") == "slow"
    assert "longer than max 3s" in slow.field("detail")
    assert slow.json()["title"].startswith("dblockrun: job long is slow")
    (fleet.workdir / "done").touch()
    recovery = daemons[0].wait(lambda: hook(hooks, "recovery"), 60, "the recovery")
    assert recovery.field("alert") == "slow"
    assert recovery.field("detail").startswith(f"run {run.id} ended ok after ")
    assert recovery.json()["type"] == "success"
    assert fleet.stop() == [0, 0, 0]
    assert events(hooks) == ["slow", "recovery"]  # once across the three


def test_late_fires_while_the_run_is_still_going_past_finish_by_once_across_three_daemons(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    # The run goes on until the test has seen the alert (a file ends it).
    deadline = (datetime.now(UTC) + timedelta(seconds=25)).replace(microsecond=0)
    if deadline.date() != (deadline + timedelta(seconds=60)).date():
        pytest.skip("too close to midnight UTC for a finish-by today")
    jobs = (f"jobs:\n  nightly:\n    cron: {EVERY_SECOND}\n"
            "    command: 'until [ -e done ]; do sleep 0.2; done'\n"
            f"    expect: {{finish-by: \"{deadline:%H:%M:%S}\"}}\n"
            f"    notify: {{urls: ['{hooks.url('json', '/hook')}'], on: [late, recovery]}}\n")
    daemons = [fleet.start(jobs, name=name, heartbeat=HEARTBEAT, lease=LEASE) for name in "abc"]
    first = daemons[0].wait(lambda: next(iter(runs_of(store, "nightly")), None), 25,
                            "the first run")
    assert first.slot is not None and first.slot < deadline.timestamp()
    late = daemons[0].wait(lambda: hook(hooks, "late"), 60, "the late alert")
    assert datetime.now(UTC) >= deadline
    assert runs_of(store, "nightly")[0].result == m.RUNNING  # still going
    assert late.field("run") == str(first.id)
    assert late.field("detail") == (
        f"run {first.id} of the slot {late.field('slot').replace('Z', '+00:00')} has not "
        f"finished by {deadline:%H:%M:%S} UTC")
    (fleet.workdir / "done").touch()
    recovery = daemons[0].wait(lambda: hook(hooks, "recovery"), 60, "the recovery")
    assert recovery.field("alert") == "late"
    assert fleet.stop() == [0, 0, 0]
    assert events(hooks) == ["late", "recovery"]


def test_late_fires_when_a_slot_has_not_started_within_start_within_and_recovers(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    jobs = (f"jobs:\n  tick:\n    cron: {EVERY_SECOND}\n    command: 'true'\n"
            "    expect: {start-within: 2s}\n"
            f"    notify: {{urls: ['{hooks.url('json', '/hook')}'], on: [late, recovery]}}\n")
    daemons = [fleet.start(jobs, name=name, heartbeat=HEARTBEAT, lease=LEASE) for name in "abc"]
    daemons[0].wait(lambda: len(runs_of(store, "tick", m.OK)) >= 1, 60, "a first run")
    assert fleet.cli("pause", "--reason", "test").returncode == 0
    late = daemons[0].wait(lambda: hook(hooks, "late"), 60, "the late alert")
    assert late.field("detail").endswith("has not started within 2s")
    assert hook(hooks, "recovery") is None  # still paused
    assert fleet.cli("resume").returncode == 0
    daemons[0].wait(lambda: hook(hooks, "recovery"), 60, "the recovery")
    assert fleet.stop() == [0, 0, 0]
    assert events(hooks) == ["late", "recovery"]


def test_a_run_that_ends_under_min_is_fast(store: Store, fleet: Fleet, hooks: Hooks) -> None:
    d = fleet.start("jobs:\n  quick:\n    rate: 1h\n    command: 'echo done'\n"
                    "    expect: {min: 30s}\n"
                    f"    notify: {{urls: ['{hooks.url('json', '/hook')}']}}\n",
                    heartbeat=HEARTBEAT, lease=LEASE)
    fast = d.wait(lambda: hook(hooks, "fast"), 60, "the fast alert")
    (run,) = runs_of(store, "quick")
    assert run.result == m.OK and fast.field("run") == str(run.id)
    assert "sooner than min 30s" in fast.field("detail")
    assert d.stop() == 0
    assert events(hooks) == ["fast"]  # no recovery for a run already over


def test_after_3_holds_the_first_two_failures_in_a_row(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    d = fleet.start(f"jobs:\n  broken:\n    cron: {EVERY_SECOND}\n    command: 'exit 4'\n"
                    f"    notify: {{urls: ['{hooks.url('json', '/hook')}'], on: [failure], "
                    "after: 3}\n", heartbeat=HEARTBEAT, lease=LEASE)
    d.wait(lambda: len(hooks.under("/hook")) >= 2, 60, "two failure notifications")
    assert d.stop() == 0
    failed = runs_of(store, "broken", m.FAILED)
    sent = hooks.under("/hook")
    # From the third failure in a row on, each one; the first two held.
    assert sorted(int(h.field("run")) for h in sent) == [r.id for r in failed[2:]]
    assert all(h.field("failures in a row") == "3 or more" for h in sent)
    assert d.text().count("notification held: failure") >= 2


def test_fifty_jobs_missed_in_one_outage_give_one_storm_notification(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    url = hooks.url("json", "/hook")
    jobs = "jobs:\n" + "".join(
        f"  job-{i:02d}:\n    cron: '*/4 * * * * *'\n    command: 'true'\n    catch-up: none\n"
        f"    notify: {{urls: ['{url}'], on: [missed]}}\n" for i in range(50))
    first = fleet.start(jobs, name="first", heartbeat=HEARTBEAT, lease=LEASE)
    names = [f"job-{i:02d}" for i in range(50)]
    first.wait(lambda: all(runs_of(store, n, m.OK) for n in names), 60, "a run of each job")
    assert first.stop() == 0
    stopped = store.db_now()
    wait_for(lambda: store.db_now() > stopped + 9, 20, what="two slots passed while down")
    daemons = [fleet.start(jobs, name=name, heartbeat=HEARTBEAT, lease=LEASE) for name in "abc"]
    storm = daemons[0].wait(lambda: hook(hooks, "storm"), 60, "the storm notification")
    # Every job's passed slots are recorded as before ...
    wait_for(lambda: all(runs_of(store, n, m.MISSED) for n in names), 20,
             what="each job's missed record")
    # ... and past the storm's wait (5 s) no host sends one per job.
    sent = store.db_now()
    wait_for(lambda: store.db_now() > sent + 8, 20, what="the per-job notifications' wait")
    assert fleet.stop() == [0, 0, 0, 0]  # the first one stopped before
    assert events(hooks) == ["storm"]
    assert storm.field("jobs") == "50"
    assert storm.field("cause").startswith("down (no daemon ran the jobs")
    assert storm.field("names") == ", ".join(names[:20]) + " and 30 more"
    assert storm.json()["title"].startswith("dblockrun: 50 jobs passed slots within 1m")


@pytest.mark.parametrize(("text", "message"), [
    ("    expect: {max: 2h, mx: 3}\n",
     "jobs.yaml:5: job 'j': expect.mx: unknown key (did you mean 'max'?)"),
    ("    expect: {max: 1h, min: 2h}\n",
     "jobs.yaml:5: job 'j': expect.min: min 2h is not shorter than max 1h"),
    ("    expect: {finish-by: 6:00}\n",
     "jobs.yaml:5: job 'j': expect.finish-by: must be a time of day in quotes, like \"06:00\" "
     "(unquoted, YAML reads 6:00 as a number)"),
    ("    expect: {finish-by: \"25:00\"}\n",
     "jobs.yaml:5: job 'j': expect.finish-by: must be a time of day like \"06:00\" or "
     "\"06:00:30\", got a string ('25:00')"),
    ("    expect: {start-within: 0s}\n",
     "jobs.yaml:5: job 'j': expect.start-within: must be more than zero, got 0s"),
    ("    expect: {}\n",
     "jobs.yaml:5: job 'j': expect: needs at least one of max, min, finish-by, start-within"),
    ("    notify: {urls: ['json://localhost/x'], after: 0}\n",
     "jobs.yaml:5: job 'j': notify.after: must be at least 1, got 0 (failure notifications "
     "start with the Nth failure in a row)"),
    ("    notify: {urls: ['json://localhost/x'], on: [late, slowly]}\n",
     "jobs.yaml:5: job 'j': notify.on: unknown event a string ('slowly') (known: failure, "
     "recovery, timeout, missed, late, slow, fast, change)"),
])
def test_expect_and_notify_errors_name_file_line_job_and_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_jobs_text(f"jobs:\n  j:\n    cron: '0 2 * * *'\n    command: 'true'\n{text}",
                       "jobs.yaml")
    assert str(caught.value) == message


def test_storm_and_expect_errors_exit_2_and_defaults_may_hold_expect(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("notify-storm: {threshold: 5, window: 2m, max-names: 10, wait: 10s}\n"
                    "defaults:\n  expect: {max: 2h}\njobs:\n"
                    "  a:\n    cron: '0 2 * * *'\n    command: 'true'\n"
                    "  b:\n    rate: 1h\n    command: 'true'\n    expect: {min: 1s}\n")
    parsed = load_jobs_text(good.read_text(), str(good))
    assert parsed.storm.threshold == 5 and parsed.storm.window == 120
    assert [j.expect.max if j.expect else None for j in parsed.jobs] == [7200.0, None]
    bad = tmp_path / "bad.yaml"
    bad.write_text("notify-storm: {threshold: 0, window: 10s, wait: 1m}\njobs:\n"
                   "  a:\n    rate: 1h\n    command: 'true'\n"
                   "    expect: {finish-by: \"06:00\"}\n")
    done = subprocess.run([*dblockrun_cmd(), "validate", str(bad)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"dblockrun: {bad}:1: notify-storm.threshold: must be at least 1, got 0",
        f"dblockrun: {bad}:1: notify-storm.wait: wait 1m is longer than window 10s",
        f"dblockrun: {bad}:6: job 'a': expect.finish-by: only for a cron job without items "
        "(a slot is what starts within it or finishes by it)",
    ]


def test_a_file_without_expect_costs_a_round_no_statement_and_one_with_it_one(
    store: Store
) -> None:
    store.ensure_jobs(["a", "b"])
    plain = load_jobs_text("jobs:\n  a: {cron: '* * * * *', command: 'true'}\n"
                           "  b: {rate: 1h, command: 'true', expect: {min: 1s}}\n", "jobs.yaml")
    before = store.statements
    Alerts(store, "host", lambda: plain, Events()).check()
    assert store.statements == before  # min alone is looked at when a run ends
    watched = load_jobs_text(
        "jobs:\n  a: {cron: '* * * * *', command: 'true', expect: {max: 1h}}\n"
        "  b: {rate: 1h, command: 'true', expect: {max: 1h}}\n", "jobs.yaml")
    before = store.statements
    Alerts(store, "host", lambda: watched, Events()).check()
    assert store.statements == before + 1  # one read for every watched job


def test_finish_by_is_the_first_such_time_after_the_slot_in_the_jobs_zone() -> None:
    (job,) = load_jobs_text("jobs:\n  nightly:\n    cron: '0 2 * * *'\n    command: 'true'\n"
                            "    timezone: Europe/Amsterdam\n"
                            "    expect: {finish-by: \"06:00\"}\n", "jobs.yaml").jobs
    zone = ZoneInfo("Europe/Amsterdam")

    def at(text: str) -> float:
        return datetime.fromisoformat(text).replace(tzinfo=zone).timestamp()

    assert finish_deadline(job, at("2026-11-28T02:00")) == at("2026-11-28T06:00")
    assert finish_deadline(job, at("2026-11-28T06:00")) == at("2026-11-29T06:00")
    assert finish_deadline(job, at("2026-11-28T23:30")) == at("2026-11-29T06:00")
    # The night summer time ends: 06:00 comes an hour later in UTC.
    assert finish_deadline(job, at("2026-10-25T02:30")) == at("2026-10-25T06:00")
