"""Supervised background work (dblockrun/supervise.py): an exception injected
into each of the daemon's background loops, in a real `dblockrun daemon`
process, and what a user notices: the traceback logged once, the crashes
counted in ``dblockrun_thread_crashes_total{thread}``, ``/healthz`` red and
the systemd watchdog pings stopped while it lasts, then the loop working
again; or, for a heartbeat that keeps crashing, the daemon's exit status 1.

The fault is injected by a small wrapper that replaces one method with one
that raises while a flag file exists, then runs dblockrun's own ``main``:
the test breaks and heals the loop by creating and removing the file. Two
quick tests first pin the supervisor's own backoff, log and give-up.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import NotifySocket, Process, daemon_argv, database_options
from helpers import REPO, TestDb, clean_env, free_port, pass_time
from hooks import Hooks

from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.supervise import Policy, Threads

CHILD = """\
import importlib, os, sys

module, owner, attr, flag = sys.argv[1:5]
cls = getattr(importlib.import_module(module), owner)
real = getattr(cls, attr)

def broken(*args, **kwargs):
    if os.path.exists(flag):
        raise RuntimeError("injected fault")
    return real(*args, **kwargs)

setattr(cls, attr, broken)
sys.argv = ["dblockrun", *sys.argv[5:]]
from dblockrun.__main__ import main
main()
"""

FAULT = "RuntimeError: injected fault"


class Broken(Process):
    """A `dblockrun daemon` whose ``module.owner.attr`` raises while the flag
    file exists; with --metrics and systemd's notify socket (watchdog 1 s:
    pinged at least every 0.5 s)."""

    def __init__(self, db: TestDb, tmp: Path, target: str, jobs_text: str,
                 *extra: str) -> None:
        self.db = db
        self.flag = tmp / "broken"
        self.notify = NotifySocket(tmp / "notify")
        port = free_port()
        jobs = tmp / "jobs.yaml"
        jobs.write_text(jobs_text)
        module, owner, attr = target.rsplit(".", 2)
        super().__init__(
            daemon_argv(database_options(db.url, db.prefix), jobs,
                        "--metrics", f"127.0.0.1:{port}", "--grace", "5s", *extra,
                        program=[sys.executable, "-c", CHILD, module, owner, attr,
                                 str(self.flag)]),
            tmp / "daemon.log", cwd=REPO,
            env=clean_env(PYTHONUNBUFFERED="1", NOTIFY_SOCKET=str(tmp / "notify"),
                          WATCHDOG_USEC="1000000"))
        self.port = port

    @functools.cached_property
    def store(self) -> Store:
        """The daemon's database (closed with the daemon by the fixture)."""
        return Store(self.db.url, self.db.prefix)

    def results(self, job: str) -> list[str]:
        """The job's run results, oldest first."""
        return [r.result for r in sorted(self.store.history(job, 1000), key=lambda r: r.id)]

    def crashes(self, thread: str) -> float:
        code, body = self.get("/metrics")
        found = re.search(rf'^dblockrun_thread_crashes_total{{thread="{thread}"}} (\S+)$', body,
                          re.M)
        assert code == 200 and found, body
        return float(found.group(1))

    def pings(self) -> int:
        return self.notify.count("WATCHDOG=1")

    def no_pings_for(self, seconds: float) -> None:
        """No watchdog ping comes for ``seconds`` (but one that was sent
        just before the crash and is still on its way)."""
        before = self.pings()

        def none() -> None:
            assert self.pings() <= before + 1, "watchdog pings while a thread is crashed"

        pass_time(seconds, none)

    def ready(self) -> None:
        self.wait(lambda: self.notify.has("READY=1"), 30, "READY=1")
        self.wait(lambda: self.get("/healthz") == (200, "ok\n"), 20, "healthy")

    def break_until_crashed(self, thread: str, times: int = 2) -> None:
        """Break the loop; wait until it crashed ``times`` times, /healthz red
        naming it; then no watchdog ping comes for a second."""
        self.flag.touch()
        self.wait(lambda: self.crashes(thread) >= times, 20, f"{thread} crashing")
        assert self.get("/healthz") == (503, f"thread {thread} crashed ({FAULT})\n")
        self.no_pings_for(1.0)

    def heal(self, thread: str) -> None:
        """Heal the loop: /healthz green and the pings again, the traceback
        logged once for all its crashes."""
        self.flag.unlink()
        pings = self.pings()
        self.wait(lambda: self.get("/healthz") == (200, "ok\n"), 20, f"{thread} healthy again")
        self.wait(lambda: self.pings() > pings, 5, "watchdog pings again")
        text = self.text()
        assert text.count("Traceback") == 1, text
        assert text.count(f"thread {thread} crashed: {FAULT}; ") == 1, text
        assert re.search(rf"thread {thread} works again after \d+ crashes", text), text


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Broken]]:
    started: list[Broken] = []

    def make(db: TestDb, target: str, jobs_text: str, *extra: str) -> Broken:
        d = Broken(db, tmp_path, target, jobs_text, *extra)
        started.append(d)
        return d

    yield make
    for d in started:
        d.kill()
        d.notify.close()
        if "store" in d.__dict__:
            d.store.close()


def test_backoff_doubles_to_its_cap_logs_once_and_a_round_heals(
        caplog: pytest.LogCaptureFixture) -> None:
    threads = Threads()
    loop = threads.supervise("books", Policy(max_delay=2.0))
    assert threads.crash_counts() == {"books": 0} and threads.problem() is None
    with caplog.at_level("DEBUG", logger="dblockrun"):
        delays = [loop.crashed(RuntimeError("boom\nmore"), restart=True) for _ in range(4)]
        assert delays == [0.5, 1.0, 2.0, 2.0]
        assert threads.problem() == "thread books crashed (RuntimeError: boom)"
        assert [(r.levelname, r.exc_info is not None) for r in caplog.records] == [
            ("ERROR", True), ("DEBUG", True), ("DEBUG", True), ("DEBUG", True)]
        assert caplog.records[0].getMessage() == (
            "thread books crashed: RuntimeError: boom; restarting it in 0.5s")
        loop.ok()
        assert threads.problem() is None
        assert caplog.records[-1].getMessage() == "thread books works again after 4 crashes"
        assert loop.crashed(RuntimeError("boom"), restart=True) == 0.5  # a new episode
        assert caplog.records[-1].levelname == "ERROR"
    assert threads.crash_counts() == {"books": 5}
    assert threads.fatal is None


def test_a_loop_that_gives_up_makes_the_daemon_stop() -> None:
    threads = Threads()
    loop = threads.supervise("heartbeat", Policy(max_delay=0.1, give_up=0.0))
    ran: list[int] = []

    def target() -> None:
        ran.append(1)
        raise RuntimeError("boom")

    loop.run(target, threading.Event())  # returns: not restarted
    assert ran == [1]
    assert threads.fatal is not None and threads.fatal.startswith(
        "thread heartbeat kept crashing for 0.0s (RuntimeError: boom)")
    assert threads.problem() == threads.fatal


@pytest.mark.slow
def test_a_crashing_heartbeat_restarts_and_renews_again(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    # A run of 14 s under a 12 s lease is stopped 9 s after its last
    # renewal: it ends ok only if the renewals resumed after the crashes.
    d = start(sqlite_db, "dblockrun.running.heartbeat.Renewer.renew_all",
              "jobs:\n  long:\n    rate: 1h\n    command: sleep 14\n",
              "--heartbeat", "2s", "--lease", "12s")
    d.ready()
    d.wait(lambda: d.results("long") == [m.RUNNING], 20, "the run")
    d.break_until_crashed("heartbeat")
    d.heal("heartbeat")
    d.wait(lambda: d.results("long") == [m.OK], 30, "the run to end ok")
    assert d.stop() == 0


@pytest.mark.slow
def test_a_heartbeat_that_keeps_crashing_stops_the_daemon_with_status_1(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    # Three heartbeats of crashes: a daemon that cannot renew must not go on
    # winning claims it cannot keep.
    d = start(sqlite_db, "dblockrun.running.heartbeat.Renewer.renew_all",
              "jobs:\n  tick:\n    rate: 1s\n    command: 'true'\n",
              "--heartbeat", "1s", "--lease", "4s")
    d.ready()
    d.flag.touch()
    assert d.exited(30) == 1
    text = d.text()
    assert text.count("Traceback") == 1, text
    assert (f"thread heartbeat crashed again: {FAULT}; it kept crashing, so the daemon stops "
            "(exit status 1)") in text
    assert re.search(r"dblockrun: thread heartbeat kept crashing for \d+\.\ds "
                     rf"\({FAULT}\): stopped\n$", text), text
    assert d.notify.has("STOPPING=1")


@pytest.mark.slow
def test_a_crashing_bookkeeping_round_restarts_and_the_host_is_live_again(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    d = start(sqlite_db, "dblockrun.daemon.fleet.FleetBooks.round",
              "jobs:\n  tick:\n    rate: 1h\n    command: 'true'\n",
              "--heartbeat", "1s", "--lease", "3s")
    d.ready()
    d.break_until_crashed("bookkeeping")
    # Its host row is written by the round: `status` no longer sees it live.
    d.wait(lambda: d.store.hosts(2.0) == [], 10, "the host row to go stale")
    d.heal("bookkeeping")
    d.wait(lambda: len(d.store.hosts(2.0)) == 1, 10, "the host live again")
    assert d.stop() == 0


@pytest.mark.slow
def test_a_crashing_run_request_listener_restarts_and_hears_requests_again(
        db: TestDb, start: Callable[..., Broken]) -> None:
    if db.backend != "postgresql":
        pytest.skip("only PostgreSQL daemons LISTEN for run requests")
    # A 30 s heartbeat: the bookkeeping round reads requests only every 36 s,
    # so a run within a few seconds was heard by the listener.
    d = start(db, "psycopg.Connection.notifies",
              "jobs:\n  manual:\n    rate: 1d\n    command: 'true'\n",
              "--heartbeat", "30s", "--lease", "90s")
    d.ready()
    d.wait(lambda: d.results("manual") == [m.OK], 20, "the first run")
    d.break_until_crashed("run-requests")
    d.heal("run-requests")
    asked = subprocess.run(
        [sys.executable, "-m", "dblockrun", "--db", db.url, "--table-prefix", db.prefix,
         "run", "manual", "--timeout", "5s"], capture_output=True, text=True, timeout=60,
        env=clean_env())
    assert asked.returncode == 0, asked.stderr
    assert d.stop() == 0


@pytest.mark.slow
def test_a_crashing_notifier_goes_on_and_pings_again(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    hooks = Hooks()
    try:
        d = start(sqlite_db, "dblockrun.notify.notifier.Notifier._ping",
                  f"jobs:\n  tick:\n    rate: 1s\n    command: 'true'\n"
                  f"    ping: '{hooks.url('http', '/ping')}'\n",
                  "--heartbeat", "1s", "--lease", "3s")
        d.ready()
        d.break_until_crashed("notifier")
        sent = len(hooks.under("/ping"))
        d.heal("notifier")
        d.wait(lambda: len(hooks.under("/ping")) > sent, 10, "pings sent again")
        assert d.stop() == 0
    finally:
        hooks.server.shutdown()


@pytest.mark.slow
def test_a_crashing_metrics_server_restarts(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    """It serves /healthz itself: while it is down nothing answers, and the
    watchdog pings stop; afterwards /metrics counts the crashes."""
    d = start(sqlite_db, "dblockrun.prometheus._Server.service_actions",
              "jobs:\n  tick:\n    rate: 1h\n    command: 'true'\n",
              "--heartbeat", "1s", "--lease", "3s")
    d.ready()
    d.flag.touch()
    d.wait(lambda: f"thread metrics crashed: {FAULT}; restarting it in 0.5s" in d.text(), 10,
           "the metrics thread to crash")
    d.no_pings_for(1.5)  # (restarted after 0.5 s, 1 s: crashed again each time)
    d.heal("metrics")
    assert d.crashes("metrics") >= 2
    assert d.stop() == 0


@pytest.mark.slow
def test_a_crashing_run_watcher_goes_on_and_applies_the_stops_again(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    # The watcher applies lock-at-most: while its checks crash, the command
    # outlives it; once healed, it is stopped.
    d = start(sqlite_db, "dblockrun.running.runner.Process.check",
              "jobs:\n  long:\n    rate: 1h\n    lock-at-most: 2s\n    command: sleep 60\n",
              "--heartbeat", "1s", "--lease", "3s")
    d.ready()
    d.wait(lambda: d.results("long") == [m.RUNNING], 20, "the run")
    d.break_until_crashed("run-watcher")
    started = d.store.history("long")[0].started
    d.wait(lambda: time.time() > started + 3, 10, "lock-at-most to pass")
    assert d.results("long") == [m.RUNNING]
    d.heal("run-watcher")
    d.wait(lambda: d.results("long") == [m.TIMEOUT], 20, "the command stopped")
    assert d.stop() == 0


@pytest.mark.slow
def test_a_crashing_run_step_ends_its_run_and_the_workers_go_on(
        sqlite_db: TestDb, start: Callable[..., Broken]) -> None:
    d = start(sqlite_db, "dblockrun.running.runjob.JobRun._attempt",
              "jobs:\n  tick:\n    rate: 1s\n    command: 'true'\n",
              "--heartbeat", "1s", "--lease", "3s")
    d.ready()
    d.break_until_crashed("run-worker")
    assert "job tick: run failed (RuntimeError: injected fault); ending it" in d.text()
    ok = d.results("tick").count(m.OK)
    d.heal("run-worker")
    d.wait(lambda: d.results("tick").count(m.OK) > ok, 10, "runs again")
    assert d.stop() == 0
