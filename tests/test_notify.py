"""Notifications (apprise) and heartbeat pings, from real `dblockrun daemon`
processes on every backend, to an HTTP server started by the test: what is
sent, once, by the host that ran the run; what a failed send does (nothing
to the run, a log line and a metric); that secrets are never printed.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
from harness import Fleet
from helpers import (
    FIRST_RUN,
    TestDb,
    clean_env,
    free_port,
    invoke,
    runs_of,
    stop_across_slots,
    wait_for,
)
from hooks import Hooks

from dblockrun.notify.pings import run_uuid
from dblockrun.store import Store
from dblockrun.store import models as m

pytestmark = pytest.mark.slow

EVERY_SECOND = '"* * * * * *"'


def iso(ts: float | None) -> str:
    assert ts is not None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


# -- notifications ----------------------------------------------------------------------


def test_a_failed_run_is_notified_once_by_the_host_that_ran_it(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    jobs = (f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n"
            "    command: 'echo line-1; echo out-$DBLOCKRUN_RUN_ID; exit 3'\n"
            f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n")
    a, b = fleet.start(jobs, name="a"), fleet.start(jobs, name="b")
    a.wait(lambda: len(runs_of(store, "fails", m.FAILED)) >= 3, 30, "three failed runs")
    assert a.stop() == 0 and b.stop() == 0  # a stop sends what is queued
    failed = runs_of(store, "fails", m.FAILED)
    sent = hooks.under("/hook")
    # One notification per failed run, from two daemons: none twice, none lost.
    assert sorted(int(h.field("run")) for h in sent) == [r.id for r in failed]
    for hit in sent:
        run = next(r for r in failed if r.id == int(hit.field("run")))
        doc = hit.json()
        assert doc["type"] == "failure"
        assert doc["title"] == f"dblockrun: job fails failed on {run.host.split(':')[0]}"
        assert hit.field("job") == "fails"
        assert hit.field("event") == "failure"
        assert hit.field("exit status") == "3"
        assert hit.field("host") == run.host  # the host that ran it
        assert hit.field("slot") == iso(run.slot)
        assert hit.field("duration").endswith("s")
        assert float(hit.field("duration")[:-1]) < 5
        assert doc["message"].endswith(f"line-1\nout-{run.id}")


def test_fan_out_items_are_notified_and_pinged_as_runs(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    d = fleet.start("jobs:\n  fan:\n    rate: 1h\n    items: [good, bad]\n    parallel: 2\n"
                    "    command: 'echo out-$DBLOCKRUN_ITEM; [ $DBLOCKRUN_ITEM = good ]'\n"
                    f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
                    f"    ping: '{hooks.url('http', '/ping')}'\n")
    d.wait(lambda: len(hooks.under("/ping")) == 4 and len(hooks.under("/hook")) == 1,
           FIRST_RUN, "the items' pings and the failure's notification")
    assert d.stop() == 0
    good, bad = (next(r for r in runs_of(store, "fan") if r.item == item)
                 for item in ("good", "bad"))
    (hit,) = hooks.under("/hook")
    assert (hit.field("job"), hit.field("item"), hit.field("run")) == ("fan", "bad", str(bad.id))
    assert hit.json()["message"].endswith("out-bad")
    pinged = sorted((h.path, h.query["rid"][0], h.body) for h in hooks.under("/ping"))
    assert pinged == sorted([
        ("/ping/start", run_uuid("fan", good.id), b""), ("/ping", run_uuid("fan", good.id),
                                                         b"out-good\n"),
        ("/ping/start", run_uuid("fan", bad.id), b""), ("/ping/fail", run_uuid("fan", bad.id),
                                                        b"out-bad\n")])


def test_recovery_is_notified_after_a_failure_and_not_after_a_success(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    # Fails the first time, then succeeds.
    d = fleet.start(f"jobs:\n  flaky:\n    cron: {EVERY_SECOND}\n"
                    "    command: 'if [ -e done ]; then echo fine; else touch done; exit 1; fi'\n"
                    f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
                    "      on: [failure, recovery]\n")
    d.wait(lambda: len(runs_of(store, "flaky", m.OK)) >= 3, 30, "three ok runs")
    assert d.stop() == 0
    history = runs_of(store, "flaky")
    assert [r.result for r in history[:2]] == [m.FAILED, m.OK]
    sent = hooks.under("/hook")
    assert [(h.field("event"), int(h.field("run"))) for h in sent] == [
        ("failure", history[0].id), ("recovery", history[1].id)]
    recovery = sent[1]
    assert recovery.json()["type"] == "success"
    assert recovery.field("previous run") == "failed"
    assert recovery.field("exit status") == "0"
    assert recovery.json()["message"].endswith("fine")


def test_a_run_stopped_at_lock_at_most_is_a_timeout(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    d = fleet.start("jobs:\n  slow:\n    rate: 1h\n    lock-at-most: 1s\n"
                    "    command: 'echo started; sleep 30'\n"
                    f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
                    "      on: [timeout]\n")
    d.wait(lambda: len(hooks.under("/hook")) == 1, 20, "the timeout notification")
    (run,) = runs_of(store, "slow")
    assert run.result == m.TIMEOUT
    (hit,) = hooks.under("/hook")
    assert hit.field("event") == "timeout"
    assert hit.field("result") == "timeout"
    assert hit.field("run") == str(run.id)
    assert hit.json()["message"].endswith("started")
    assert d.stop() == 0
    assert len(hooks.under("/hook")) == 1


def test_a_missed_slot_is_notified(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    d = fleet.start(f"jobs:\n  punctual:\n    cron: {EVERY_SECOND}\n"
                    "    starting-deadline: 300ms\n    command: 'true'\n"
                    f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n")
    d.wait(lambda: len(runs_of(store, "punctual", m.OK)) > 0, 20, "a first run")
    # Pause the daemon past a few slots.
    stop_across_slots(d.send)
    d.wait(lambda: len(runs_of(store, "punctual", m.MISSED)) > 0, 10, "a missed slot")
    assert d.stop() == 0
    missed = runs_of(store, "punctual", m.MISSED)
    sent = hooks.under("/hook")
    assert sorted(h.field("slot") for h in sent) == sorted(iso(r.slot) for r in missed)
    assert {h.field("event") for h in sent} == {"missed"}
    assert {h.json()["type"] for h in sent} == {"warning"}
    # Too late for the deadline, or (older slots the stop let pass) passed
    # while the daemon was stopped.
    assert all("(starting-deadline 0.3s)" in h.field("late")
               or "(this daemon woke late" in h.field("late") for h in sent)


def metric(port: int, name: str, **labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name}{{{want}}} in\n{text}")


def test_failed_sends_change_nothing_for_the_runs_and_are_counted(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    port, refused = free_port(), free_port()
    d = fleet.start(f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 4'\n"
                    f"    notify:\n      urls: ['{hooks.url('json', '/broken/hook')}']\n"
                    f"  works:\n    cron: {EVERY_SECOND}\n    command: 'echo fine'\n"
                    f"    ping: 'http://127.0.0.1:{refused}/ping'\n",
                    "--metrics", f"127.0.0.1:{port}")
    d.wait(lambda: len(hooks.under("/broken")) >= 3, 30, "three failed notifications")
    d.wait(lambda: metric(port, "dblockrun_pings_total", job="works", signal="success",
                          outcome="failed") >= 3, 20, "three failed pings")
    # Counted once the daemon has the hook's answer, a moment after the hook
    # has the request.
    d.wait(lambda: metric(port, "dblockrun_notifications_total", job="fails",
                          event="failure", outcome="failed") >= 3, 20,
           "three failed notifications counted")
    # The runs are what the commands did: exit 4 failed, echo ok.
    assert {(r.result, r.exit_code) for r in runs_of(store, "fails")} <= {
        (m.FAILED, 4), (m.RUNNING, None)}
    assert {(r.result, r.exit_code) for r in runs_of(store, "works")} <= {
        (m.OK, 0), (m.RUNNING, None)}
    assert len(runs_of(store, "works", m.OK)) >= 3
    assert d.stop() == 0
    log = d.text()
    # Logged once per job until a send gets through, with the reason.
    notify_lines = [ln for ln in log.splitlines() if "notification failure to" in ln]
    assert len(notify_lines) == 1, log
    assert "json://127.0.0.1/…" in notify_lines[0] and "error=500" in notify_lines[0]
    ping_lines = [ln for ln in log.splitlines() if "job works: ping" in ln]
    assert len(ping_lines) == 1, log
    assert "ping start to http://127.0.0.1/… failed: [Errno 111] Connection refused" in log


def test_a_slow_notification_service_delays_no_start(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    d = fleet.start(f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 1'\n"
                    f"    notify:\n      urls: ['{hooks.url('json', '/slow/hook')}']\n"
                    f"    ping: '{hooks.url('http', '/slow/ping')}'\n")
    d.wait(lambda: len(runs_of(store, "fails", m.FAILED)) >= 6, 30, "six failed runs")
    failed = runs_of(store, "fails", m.FAILED)
    # Each send takes 3 s and the runs come every second: the sender is far
    # behind, the runs are not.
    assert len(hooks.under("/slow")) < len(failed)
    slots = [r.slot or 0.0 for r in failed]
    assert slots == [slots[0] + i for i in range(len(failed))]  # every slot ran
    late = [r.started - slot for r, slot in zip(failed, slots, strict=True)]
    assert max(late) < 0.5, late
    d.kill()


def test_a_reload_reads_the_urls_again_and_a_bad_one_keeps_the_old_jobs(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    def jobs(url: str) -> str:
        return (f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 1'\n"
                f"    notify:\n      urls: [{url}]\n")

    d = fleet.start(jobs(f"'{hooks.url('json', '/one')}'"))
    d.wait(lambda: len(hooks.under("/one")) >= 1, 20, "a notification to /one")
    d.jobs.write_text(jobs("{env: NOT_SET_ANYWHERE}"))
    d.send(signal.SIGHUP)
    d.wait(lambda: "reload failed" in d.text(), 10, "the reload to fail")
    assert ("notify.urls[0]: environment variable NOT_SET_ANYWHERE is not set" in d.text())
    sent = len(hooks.under("/one"))
    d.wait(lambda: len(hooks.under("/one")) > sent, 10, "the old URL still notified")
    d.jobs.write_text(jobs(f"'{hooks.url('json', '/two')}'"))
    d.send(signal.SIGHUP)
    d.wait(lambda: len(hooks.under("/two")) >= 1, 10, "a notification to the new URL")
    assert d.stop() == 0


# -- pings --------------------------------------------------------------------------------


def test_pings_start_then_success_or_fail_with_the_run_id_and_the_output(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    d = fleet.start("jobs:\n"
                    f"  good:\n    rate: 1h\n    command: 'echo hello $DBLOCKRUN_JOB'\n"
                    f"    ping: '{hooks.url('http', '/ping/good')}'\n"
                    f"  bad:\n    rate: 1h\n    command: 'echo oops; exit 2'\n    retries: 1\n"
                    "    retry-delay: 100ms\n"
                    f"    ping: '{hooks.url('http', '/ping/bad?key=1')}'\n")
    d.wait(lambda: len(hooks.under("/ping/good")) == 2 and len(hooks.under("/ping/bad")) == 2,
           20, "two pings for each job")
    good_run, = runs_of(store, "good")
    good = hooks.under("/ping/good")
    rid = run_uuid("good", good_run.id)
    assert [(h.path, h.query, h.body) for h in good] == [
        ("/ping/good/start", {"rid": [rid]}, b""),
        ("/ping/good", {"rid": [rid]}, b"hello good\n"),
    ]
    # A run retried once: one start, one end, after the last attempt.
    first, second = runs_of(store, "bad")
    assert (first.result, second.result) == (m.FAILED, m.FAILED)
    bad = hooks.under("/ping/bad")
    rid = run_uuid("bad", first.id)
    assert [(h.path, h.query, h.body) for h in bad] == [
        ("/ping/bad/start", {"key": ["1"], "rid": [rid]}, b""),
        ("/ping/bad/fail", {"key": ["1"], "rid": [rid]}, b"oops\n"),
    ]
    assert d.stop() == 0


# -- secrets -------------------------------------------------------------------------------


def test_secrets_from_the_environment_and_files_are_never_printed(
    store: Store, fleet: Fleet, hooks: Hooks, db: TestDb, tmp_path: Path
) -> None:
    token = "s3cr3tT0ken"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ping-url").write_text(hooks.url("http", f"/broken/ping/{token}") + "\n")
    jobs = (f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 1'\n"
            "    notify:\n      urls: [{env: HOOK_URL}]\n"
            "    ping: {file: ping-url}\n")
    env = {"HOOK_URL": hooks.url("json", f"/broken/{token}/hook?pw={token}")}
    # (The file secret is named relative to the jobs file.)
    d = fleet.start(fleet.jobs_file(jobs, "a/jobs.yaml"), "-v",
                    env=clean_env(PYTHONUNBUFFERED="1", **env))
    d.wait(lambda: len(hooks.under(f"/broken/{token}/hook")) >= 2
           and len(hooks.under(f"/broken/ping/{token}/fail")) >= 2, 30,
           "notifications and pings sent with the secret URLs")
    # validate reads them as the daemon does, and prints none.
    checked = invoke("validate", str(d.jobs), env=clean_env(**env), cwd=tmp_path / "a")
    assert checked.returncode == 0, checked.stderr
    status = invoke("--db", db.url, "--table-prefix", db.prefix, "status", "--json",
                    env=clean_env(**env))
    assert status.returncode == 0, status.stderr
    assert d.stop() == 0
    log = d.text()
    assert "notification failure to json://127.0.0.1/…" in log
    assert "ping fail to http://127.0.0.1/…" in log
    for text in (log, checked.stdout, checked.stderr, status.stdout, status.stderr):
        assert token not in text


# -- a run lost with its host ----------------------------------------------------------


def test_a_run_lost_with_its_host_is_notified_and_failed_once_by_the_fleet(
    store: Store, fleet: Fleet, hooks: Hooks
) -> None:
    jobs = ("jobs:\n  long:\n    rate: 1h\n    command: 'echo started; sleep 60'\n"
            f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
            f"    ping: '{hooks.url('http', '/ping')}'\n")
    names = ("a", "b", "c")
    daemons = [fleet.start(jobs, "--label", f"hostname=web-{name}", name=name) for name in names]
    (run,) = wait_for(lambda: runs_of(store, "long", m.RUNNING) or None, 30, what="a running run")
    victim = next(d for d in daemons if d.pid == int(run.host.split(":")[1]))
    victim_name = names[daemons.index(victim)]
    daemons[0].wait(lambda: bool(hooks.under("/ping/start")), 10, "its start ping")
    victim.kill()  # kill -9, mid-run: it can tell nobody
    live = [d for d in daemons if d is not victim]
    live[0].wait(lambda: (r := store.run(run.id)) is not None and r.result == m.LOST, 20,
                 "the run recorded lost")
    live[0].wait(lambda: bool(hooks.under("/hook") and hooks.under("/ping/fail")), 10,
                 "the lost run's notification and fail ping")
    # A few more bookkeeping rounds on both live hosts (a window for a second,
    # wrong, send), then what they queued.
    told = time.time()
    wait_for(lambda: time.time() - told > 3, 5, what="three more bookkeeping rounds")
    assert [d.stop() for d in live] == [0, 0]
    rid = run_uuid("long", run.id)
    assert [(h.path, h.query, h.body) for h in hooks.under("/ping")] == [
        ("/ping/start", {"rid": [rid]}, b""),  # from the victim
        ("/ping/fail", {"rid": [rid]}, b""),  # from the host that recorded it lost
    ]
    (hit,) = hooks.under("/hook")
    doc = hit.json()
    assert doc["type"] == "failure"
    # The dead host by its hostname label, as the titles of its own runs name it.
    assert doc["title"] == f"dblockrun: job long lost on web-{victim_name}"
    assert (hit.field("event"), hit.field("result")) == ("failure", "lost")
    assert (hit.field("run"), hit.field("host")) == (str(run.id), run.host)
    recorder = hit.field("recorded by")
    assert recorder != run.host
    assert recorder in {h for d in live for h in re.findall(r"daemon (\S+) starting", d.text())}
