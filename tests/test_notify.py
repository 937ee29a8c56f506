"""Notifications (apprise) and heartbeat pings, from real `dblockrun daemon`
processes on every backend, to an HTTP server started by the test: what is
sent, once, by the host that ran the run; what a failed send does (nothing
to the run, a log line and a metric); that secrets are never printed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from helpers import TestDb, clean_env, dblockrun_cmd, free_port, stop_across_slots, wait_for

from dblockrun.notify.pings import run_uuid
from dblockrun.store import Store
from dblockrun.store import models as m

pytestmark = pytest.mark.slow

EVERY_SECOND = '"* * * * * *"'


@dataclass(frozen=True)
class Hit:
    path: str
    query: dict[str, list[str]]
    body: bytes

    def json(self) -> dict[str, str]:
        doc: dict[str, str] = json.loads(self.body)
        return doc

    def field(self, name: str) -> str:
        """``name: value`` from a notification's message."""
        for line in self.json()["message"].splitlines():
            if line.startswith(f"{name}: "):
                return line.split(": ", 1)[1]
        raise AssertionError(f"no {name!r} in {self.json()['message']!r}")


class Hooks:
    """An HTTP server recording every request; paths under /broken answer
    500, under /slow after 3 s."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = urlsplit(self.path)
                with hooks.lock:
                    hooks.hits.append(Hit(parts.path, parse_qs(parts.query), body))
                code = 500 if parts.path.startswith("/broken") else 200
                if parts.path.startswith("/slow"):
                    time.sleep(3)
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, scheme: str, path: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def under(self, prefix: str) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.path.startswith(prefix)]


@pytest.fixture
def hooks() -> Iterator[Hooks]:
    h = Hooks()
    yield h
    h.server.shutdown()


class Daemon:
    """One `dblockrun daemon` process in a folder of its own."""

    def __init__(self, db: TestDb, folder: Path, jobs_text: str, env: dict[str, str],
                 extra: list[str]) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.jobs = folder / "jobs.yaml"
        self.jobs.write_text(jobs_text)
        self.log = folder / "daemon.log"
        cmd = [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon",
               str(self.jobs), "--heartbeat", "1s", "--lease", "3s", "--grace", "5s", *extra]
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err,
                                         env=clean_env(PYTHONUNBUFFERED="1", **env), cwd=folder)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        def check() -> object:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode} while waiting for "
                                     f"{what}; log:\n{self.text()}")
            return predicate()

        wait_for(check, timeout, interval=0.05, what=what)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture
def start(db: TestDb, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def go(jobs_text: str, name: str = "a", env: dict[str, str] | None = None,
           extra: list[str] | None = None) -> Daemon:
        d = Daemon(db, tmp_path / name, jobs_text, env or {}, extra or [])
        started.append(d)
        return d

    yield go
    for d in started:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait(timeout=10)


def runs(store: Store, job: str, *results: str) -> list[m.RunRecord]:
    return sorted((r for r in store.history(job, 1000) if not results or r.result in results),
                  key=lambda r: r.id)


def iso(ts: float | None) -> str:
    assert ts is not None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


# -- notifications ----------------------------------------------------------------------


def test_a_failed_run_is_notified_once_by_the_host_that_ran_it(
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    jobs = (f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n"
            "    command: 'echo line-1; echo out-$DBLOCKRUN_RUN_ID; exit 3'\n"
            f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n")
    a, b = start(jobs, "a"), start(jobs, "b")
    a.wait(lambda: len(runs(store, "fails", m.FAILED)) >= 3, 30, "three failed runs")
    assert a.stop() == 0 and b.stop() == 0  # a stop sends what is queued
    failed = runs(store, "fails", m.FAILED)
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
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    d = start("jobs:\n  fan:\n    rate: 1h\n    items: [good, bad]\n    parallel: 2\n"
              "    command: 'echo out-$DBLOCKRUN_ITEM; [ $DBLOCKRUN_ITEM = good ]'\n"
              f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
              f"    ping: '{hooks.url('http', '/ping')}'\n")
    d.wait(lambda: len(hooks.under("/ping")) == 4 and len(hooks.under("/hook")) == 1, 20,
           "the items' pings and the failure's notification")
    assert d.stop() == 0
    good, bad = (next(r for r in runs(store, "fan") if r.item == item) for item in ("good", "bad"))
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
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    # Fails the first time, then succeeds.
    d = start(f"jobs:\n  flaky:\n    cron: {EVERY_SECOND}\n"
              "    command: 'if [ -e done ]; then echo fine; else touch done; exit 1; fi'\n"
              f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
              "      on: [failure, recovery]\n")
    d.wait(lambda: len(runs(store, "flaky", m.OK)) >= 3, 30, "three ok runs")
    assert d.stop() == 0
    history = runs(store, "flaky")
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
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    d = start("jobs:\n  slow:\n    rate: 1h\n    lock-at-most: 1s\n"
              "    command: 'echo started; sleep 30'\n"
              f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
              "      on: [timeout]\n")
    d.wait(lambda: len(hooks.under("/hook")) == 1, 20, "the timeout notification")
    (run,) = runs(store, "slow")
    assert run.result == m.TIMEOUT
    (hit,) = hooks.under("/hook")
    assert hit.field("event") == "timeout"
    assert hit.field("result") == "timeout"
    assert hit.field("run") == str(run.id)
    assert hit.json()["message"].endswith("started")
    assert d.stop() == 0
    assert len(hooks.under("/hook")) == 1


def test_a_missed_slot_is_notified(
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    d = start(f"jobs:\n  punctual:\n    cron: {EVERY_SECOND}\n"
              "    starting-deadline: 300ms\n    command: 'true'\n"
              f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n")
    d.wait(lambda: len(runs(store, "punctual", m.OK)) > 0, 20, "a first run")
    # Pause the daemon past a few slots.
    stop_across_slots(d.proc.send_signal)
    d.wait(lambda: len(runs(store, "punctual", m.MISSED)) > 0, 10, "a missed slot")
    assert d.stop() == 0
    missed = runs(store, "punctual", m.MISSED)
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
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    port, refused = free_port(), free_port()
    d = start(f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 4'\n"
              f"    notify:\n      urls: ['{hooks.url('json', '/broken/hook')}']\n"
              f"  works:\n    cron: {EVERY_SECOND}\n    command: 'echo fine'\n"
              f"    ping: 'http://127.0.0.1:{refused}/ping'\n",
              extra=["--metrics", f"127.0.0.1:{port}"])
    d.wait(lambda: len(hooks.under("/broken")) >= 3, 30, "three failed notifications")
    d.wait(lambda: metric(port, "dblockrun_pings_total", job="works", signal="success",
                          outcome="failed") >= 3, 20, "three failed pings")
    assert metric(port, "dblockrun_notifications_total", job="fails", event="failure",
                  outcome="failed") >= 3
    # The runs are what the commands did: exit 4 failed, echo ok.
    assert {(r.result, r.exit_code) for r in runs(store, "fails")} <= {
        (m.FAILED, 4), (m.RUNNING, None)}
    assert {(r.result, r.exit_code) for r in runs(store, "works")} <= {
        (m.OK, 0), (m.RUNNING, None)}
    assert len(runs(store, "works", m.OK)) >= 3
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
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    d = start(f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 1'\n"
              f"    notify:\n      urls: ['{hooks.url('json', '/slow/hook')}']\n"
              f"    ping: '{hooks.url('http', '/slow/ping')}'\n")
    d.wait(lambda: len(runs(store, "fails", m.FAILED)) >= 6, 30, "six failed runs")
    failed = runs(store, "fails", m.FAILED)
    # Each send takes 3 s and the runs come every second: the sender is far
    # behind, the runs are not.
    assert len(hooks.under("/slow")) < len(failed)
    slots = [r.slot or 0.0 for r in failed]
    assert slots == [slots[0] + i for i in range(len(failed))]  # every slot ran
    late = [r.started - slot for r, slot in zip(failed, slots, strict=True)]
    assert max(late) < 0.5, late
    d.proc.kill()


def test_a_reload_reads_the_urls_again_and_a_bad_one_keeps_the_old_jobs(
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    def jobs(url: str) -> str:
        return (f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 1'\n"
                f"    notify:\n      urls: [{url}]\n")

    d = start(jobs(f"'{hooks.url('json', '/one')}'"))
    d.wait(lambda: len(hooks.under("/one")) >= 1, 20, "a notification to /one")
    d.jobs.write_text(jobs("{env: NOT_SET_ANYWHERE}"))
    d.proc.send_signal(signal.SIGHUP)
    d.wait(lambda: "reload failed" in d.text(), 10, "the reload to fail")
    assert ("notify.urls[0]: environment variable NOT_SET_ANYWHERE is not set" in d.text())
    sent = len(hooks.under("/one"))
    d.wait(lambda: len(hooks.under("/one")) > sent, 10, "the old URL still notified")
    d.jobs.write_text(jobs(f"'{hooks.url('json', '/two')}'"))
    d.proc.send_signal(signal.SIGHUP)
    d.wait(lambda: len(hooks.under("/two")) >= 1, 10, "a notification to the new URL")
    assert d.stop() == 0


# -- pings --------------------------------------------------------------------------------


def test_pings_start_then_success_or_fail_with_the_run_id_and_the_output(
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    d = start("jobs:\n"
              f"  good:\n    rate: 1h\n    command: 'echo hello $DBLOCKRUN_JOB'\n"
              f"    ping: '{hooks.url('http', '/ping/good')}'\n"
              f"  bad:\n    rate: 1h\n    command: 'echo oops; exit 2'\n    retries: 1\n"
              "    retry-delay: 100ms\n"
              f"    ping: '{hooks.url('http', '/ping/bad?key=1')}'\n")
    d.wait(lambda: len(hooks.under("/ping/good")) == 2 and len(hooks.under("/ping/bad")) == 2,
           20, "two pings for each job")
    good_run, = runs(store, "good")
    good = hooks.under("/ping/good")
    rid = run_uuid("good", good_run.id)
    assert [(h.path, h.query, h.body) for h in good] == [
        ("/ping/good/start", {"rid": [rid]}, b""),
        ("/ping/good", {"rid": [rid]}, b"hello good\n"),
    ]
    # A run retried once: one start, one end, after the last attempt.
    first, second = runs(store, "bad")
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
    store: Store, start: Callable[..., Daemon], hooks: Hooks, db: TestDb, tmp_path: Path
) -> None:
    token = "s3cr3tT0ken"
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "ping-url").write_text(hooks.url("http", f"/broken/ping/{token}") + "\n")
    jobs = (f"jobs:\n  fails:\n    cron: {EVERY_SECOND}\n    command: 'exit 1'\n"
            "    notify:\n      urls: [{env: HOOK_URL}]\n"
            "    ping: {file: ping-url}\n")
    env = {"HOOK_URL": hooks.url("json", f"/broken/{token}/hook?pw={token}")}
    d = start(jobs, env=env, extra=["-v"])
    d.wait(lambda: len(hooks.under(f"/broken/{token}/hook")) >= 2
           and len(hooks.under(f"/broken/ping/{token}/fail")) >= 2, 30,
           "notifications and pings sent with the secret URLs")
    # validate reads them as the daemon does, and prints none.
    checked = subprocess.run([*dblockrun_cmd(), "validate", str(d.jobs)], capture_output=True,
                             text=True, env=clean_env(**env), cwd=tmp_path / "a", timeout=60)
    assert checked.returncode == 0, checked.stderr
    status = subprocess.run([*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix,
                             "status", "--json"], capture_output=True, text=True,
                            env=clean_env(**env), timeout=60)
    assert status.returncode == 0, status.stderr
    assert d.stop() == 0
    log = d.text()
    assert "notification failure to json://127.0.0.1/…" in log
    assert "ping fail to http://127.0.0.1/…" in log
    for text in (log, checked.stdout, checked.stderr, status.stdout, status.stderr):
        assert token not in text


# -- a run lost with its host ----------------------------------------------------------


def test_a_run_lost_with_its_host_is_notified_and_failed_once_by_the_fleet(
    store: Store, start: Callable[..., Daemon], hooks: Hooks
) -> None:
    jobs = ("jobs:\n  long:\n    rate: 1h\n    command: 'echo started; sleep 60'\n"
            f"    notify:\n      urls: ['{hooks.url('json', '/hook')}']\n"
            f"    ping: '{hooks.url('http', '/ping')}'\n")
    names = ("a", "b", "c")
    daemons = [start(jobs, name, extra=["--label", f"hostname=web-{name}"]) for name in names]
    (run,) = wait_for(lambda: runs(store, "long", m.RUNNING) or None, 30, what="a running run")
    victim = next(d for d in daemons if d.proc.pid == int(run.host.split(":")[1]))
    victim_name = names[daemons.index(victim)]
    daemons[0].wait(lambda: bool(hooks.under("/ping/start")), 10, "its start ping")
    victim.proc.kill()  # kill -9, mid-run: it can tell nobody
    victim.proc.wait()
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
