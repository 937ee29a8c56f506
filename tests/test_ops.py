"""Operations with a real daemon: run-now, metrics and /healthz, JSON logs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Fleet, Process
from helpers import TestDb, wait_for
from proxy import Proxy

from dblockrun.store import Store
from dblockrun.store.models import RunRecord

JOBS = """\
jobs:
  manual:
    rate: 1d
    command: echo "manual $DBLOCKRUN_FENCING_TOKEN"
  often:
    cron: "* * * * * *"
    command: echo often
"""



@pytest.fixture
def daemon(fleet: Fleet) -> Iterator[Process]:
    d = fleet.start(JOBS, "--log-format", "json", grace=None, metrics=True)
    yield d
    d.stop()


@pytest.mark.slow
@pytest.mark.pgbouncer
def test_run_now_runs_the_job_on_some_daemon(daemon: Process, fleet: Fleet) -> None:
    """Through a transaction pooler no daemon listens: the request is read
    by its next bookkeeping round (1.2 s at this heartbeat)."""
    store = fleet.store

    # The rate job ran once at start; it is not due again for a day.
    def ok_runs() -> list[RunRecord] | None:
        return [r for r in store.history("manual") if r.result == "ok"] or None

    wait_for(ok_runs, 20, what="the first run of the rate job")
    res = fleet.cli("run", "manual", "--timeout", "10s")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("manual: run ")
    assert " started on " in res.stdout
    runs = wait_for(lambda: (r := ok_runs()) and len(r) >= 2 and r, 10,
                    what="the requested run to finish")
    newest, before = runs[0].token, runs[1].token
    assert newest is not None and before is not None and newest == before + 1
    assert fleet.cli("run", "no-such-job").returncode == 2
    fleet.cli("disable", "manual")
    res = fleet.cli("run", "manual")
    assert res.returncode == 2 and "disabled" in res.stderr


@pytest.mark.slow
def test_run_now_leaves_a_job_disabled_in_the_jobs_file_alone(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """`enabled: false` keeps a job from running on that host, `run` included
    (issue 11, item 3): here the operator's command has no jobs file to check."""
    d = fleet.start(JOBS.replace("    rate: 1d\n", "    rate: 1d\n    enabled: false\n"),
                    grace=None, metrics=True)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: any(r.result == "ok" for r in store.history("often")), 20,
                 what="the daemon running its enabled job")
        res = fleet.cli("run", "manual", "--timeout", "3s")
        assert (res.returncode, res.stdout) == (1, "")
        assert res.stderr == (
            "dblockrun: manual: no daemon started it within 3s (is a daemon with this job "
            "enabled in its jobs file running?); the request stays filed (`dblockrun run "
            "manual --cancel` withdraws it)\n")
        assert store.history("manual") == []
    finally:
        store.close()
        assert d.stop() == 0


TRUTH_JOBS = """\
jobs:
  slow:
    rate: 1d
    command: exec sleep 60
  failing:
    rate: 1d
    command: sleep 0.2; exit 3
"""


@pytest.mark.slow
def test_run_says_busy_and_run_wait_exits_with_the_runs_status(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """Issue 23, item 6: `run` of a running job said "no daemon started it
    ... is a daemon running?" and the job ran later without a word; `run
    failing` exited 0."""
    d = fleet.start(TRUTH_JOBS, grace="0s", metrics=True)
    store = Store(db.url, db.prefix)
    try:
        (slow,) = wait_for(lambda: store.control.running("slow") or None, 20,
                           what="the first run of slow")
        wait_for(lambda: any(r.result == "failed" for r in store.history("failing")) or None,
                 20, what="the first run of failing")
        res = fleet.cli("run", "slow", "--timeout", "1s")
        assert (res.returncode, res.stdout) == (1, "")
        assert re.fullmatch(
            rf"dblockrun: slow: slow is busy: run {slow.id} on {re.escape(slow.host)} has run "
            r"since \S+Z; it starts when that run ends; the request stays filed \(`dblockrun "
            r"run slow --cancel` withdraws it\)\n", res.stderr), res.stderr
        status = json.loads(fleet.cli("status", "--json", "slow").stdout)
        assert status["jobs"][0]["run_requested"] is not None
        where = f"{db.url} (table prefix {db.prefix})"
        assert fleet.cli("run", "slow", "--cancel").stdout == (
            f"slow: run request withdrawn in {where}\n")
        assert json.loads(fleet.cli("status", "--json", "slow").stdout)["jobs"][0][
            "run_requested"] is None

        res = fleet.cli("run", "failing", "--wait", process=True)  # a real exit status
        assert res.returncode == 3, res.stderr
        started, ended = res.stdout.splitlines()
        run_id = int(re.fullmatch(r"failing: run (\d+) started on .*", started)[1])  # type: ignore[index]
        assert re.fullmatch(rf"failing: run {run_id} on \S+ ended failed \(exit 3\) in "
                            r"0\.\d\ds", ended), ended
    finally:
        store.close()
        assert d.stop() == 0


@pytest.mark.slow
def test_run_now_is_heard_at_once_on_postgresql(db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    """PostgreSQL: `run` announces its request (NOTIFY) and the daemons
    LISTEN, so it starts within a second or two even though the daemon's
    bookkeeping round (which also reads requests) comes only every 36 s here;
    an idle daemon sends no statement to look for requests."""
    if db.backend != "postgresql":
        pytest.skip("MySQL daemons are woken (tests/test_doorbell.py); SQLite polls every second")
    d = fleet.start(JOBS, heartbeat="30s", lease="90s", grace=None, metrics=True)
    store = Store(db.url, db.prefix)
    try:
        wait_for(lambda: any(r.result == "ok" for r in store.history("manual")) or None, 20,
                 what="the first run of the rate job")
        res = fleet.cli("run", "manual", "--timeout", "3s")
        assert res.returncode == 0, res.stderr
        assert " started on " in res.stdout
    finally:
        store.close()
        assert d.stop() == 0


@pytest.mark.slow
def test_metrics_healthz_and_json_logs(daemon: Process) -> None:
    def scraped() -> str | None:
        code, body = daemon.get("/metrics")
        return body if code == 200 and 'dblockrun_runs_total{job="often",result="ok"}' in body \
            else None

    body = wait_for(scraped, 20, what="metrics with a finished run")
    for name in ("dblockrun_run_duration_seconds_bucket", "dblockrun_claims_total",
                 "dblockrun_last_success_timestamp_seconds", "dblockrun_running_commands",
                 "dblockrun_database_errors_total", "dblockrun_clock_offset_seconds",
                 "dblockrun_database_up 1.0"):
        assert name in body, name
    assert daemon.get("/healthz") == (200, "ok\n")
    assert daemon.get("/nope")[0] == 404
    # Every log line is one JSON object; run events carry job, run id and token.
    lines = [json.loads(x) for x in daemon.log.read_text().splitlines() if x.strip()]
    starts = [x for x in lines if x.get("event") == "start"]
    assert starts and {"job", "run_id", "token", "host"} <= set(starts[0])
    outputs = [x for x in lines if x["msg"].startswith("[often] ")]
    assert outputs and outputs[0]["job"] == "often" and "run_id" in outputs[0]


@pytest.mark.slow
def test_healthz_fails_while_the_database_is_unreachable(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    if db.backend == "sqlite":
        pytest.skip("SQLite has no connection to lose (it is a local file)")
    proxy = Proxy(5432 if db.backend == "postgresql" else 3306)
    d = fleet.start(JOBS, url=proxy.url_for(db.url), grace=None, metrics=True)
    try:
        wait_for(lambda: d.get("/healthz")[0] == 200, 20, what="healthy")
        proxy.cut()
        wait_for(lambda: d.get("/healthz")[0] == 503, 20, what="unhealthy")
        assert "dblockrun_database_up 0.0" in d.get("/metrics")[1]
        proxy.restore()
        wait_for(lambda: d.get("/healthz")[0] == 200, 30, what="healthy again")
    finally:
        proxy.restore()
        assert d.stop() == 0
        proxy.close()


# -- issue 36 item 6: run --wait prints the run's output ------------------------------------

CHATTY = """\
jobs:
  chatty:
    rate: 1d
    command: echo first; sleep 1.5; printf 'second\\033[2J\\n'; exit 4
"""


@pytest.mark.slow
def test_run_wait_prints_the_runs_output_as_it_grows(fleet: Fleet) -> None:
    """``run --wait`` passed the exit status through but not the output:
    it prints it as ``tail`` does (from whichever host runs it, escaped),
    between the lines that say the run started and ended."""
    d = fleet.start(CHATTY, grace=None)
    store = fleet.store
    try:
        wait_for(lambda: any(r.finished for r in store.history("chatty")) or None, 20,
                 what="the first run of chatty")
        res = fleet.cli("run", "chatty", "--wait", process=True)  # a real exit status
        assert res.returncode == 4, res.stderr
        lines = res.stdout.splitlines()
        assert re.fullmatch(r"chatty: run (\d+) started on .*", lines[0]), lines
        assert lines[1:3] == ["first", "second\\x1b[2J"], lines
        assert re.fullmatch(r"chatty: run \d+ on \S+ ended failed \(exit 4\) in 1\.\d\ds",
                            lines[3]), lines
        assert len(lines) == 4
    finally:
        assert d.stop() == 0
