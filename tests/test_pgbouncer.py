"""PgBouncer in front of PostgreSQL (README "PgBouncer"): the URL option
``?pooler=transaction|session``, the configuration error of a refused
startup parameter, and the connections a daemon and an ``exec`` hold.

The claim paths, three daemons on one job, run-now, kill and a kill -9
failover also run through PgBouncer in both pool modes: the tests marked
``pgbouncer`` (tests/conftest.py). Here also: the pooler itself restarting
under running daemons.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import (
    PG_HOST,
    PG_PORT,
    PG_USER,
    ServerDatabases,
    pooled_url,
    selected_backends,
    strict,
)
from harness import Fleet, track
from helpers import (
    REPO,
    Ran,
    TestDb,
    clean_env,
    connections_to,
    dblockrun_cmd,
    invoke,
    new_prefix,
    wait_for,
)
from pgbouncer import Bouncer, Bouncers

from dblockrun import cli as cli_module
from dblockrun.errors import UsageError
from dblockrun.redact import url as redact
from dblockrun.store import Store
from dblockrun.store.dburl import driver_url
from dblockrun.store.drivers import connect_options, direct_driver, url_pooler, without_pooler

# -- the URL option ----------------------------------------------------------------


def test_the_pooler_option_is_dblockruns_not_the_drivers() -> None:
    url = "postgresql://u:p?w@bouncer:6432/ops?pooler=transaction&sslmode=disable"
    assert url_pooler(url) == "transaction"
    assert without_pooler(url) == "postgresql://u:p?w@bouncer:6432/ops?sslmode=disable"
    assert driver_url(url) == "postgresql+psycopg://u:p?w@bouncer:6432/ops?sslmode=disable"
    assert url_pooler("postgresql://u@h/ops?pooler=session") == "session"
    assert without_pooler("postgresql://u@h/ops?pooler=session") == "postgresql://u@h/ops"
    assert url_pooler("postgresql://u@h/ops") is None
    at_in_query = "postgresql://h/ops?pooler=transaction&application_name=a@b"
    assert url_pooler(at_in_query) == "transaction"
    assert without_pooler(at_in_query) == "postgresql://h/ops?application_name=a@b"
    assert redact(url) == "postgresql://u:***@bouncer:6432/ops?pooler=transaction&sslmode=disable"


@pytest.mark.parametrize(("url", "why"), [
    ("postgresql://u@h/ops?pooler=statement", "want pooler=transaction or pooler=session"),
    ("postgresql://u@h/ops?pooler=", "want pooler=transaction or pooler=session"),
    ("postgresql://u@h/ops?pooler=session&pooler=transaction", "want pooler=transaction"),
    ("mysql://u@h/ops?pooler=transaction", "is for postgresql:// URLs"),
])
def test_a_bad_pooler_option_is_a_usage_error(url: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        url_pooler(url)
    with pytest.raises(UsageError, match=why):
        driver_url(url)


def test_what_each_pool_mode_changes_in_a_connection() -> None:
    direct = connect_options("postgresql")
    assert direct["options"] == "-c statement_timeout=15000 -c lock_timeout=7500"
    assert "prepare_threshold" not in direct
    session = connect_options("postgresql", "session")
    assert "options" not in session and "prepare_threshold" not in session
    transaction = connect_options("postgresql", "transaction")
    assert "options" not in transaction and transaction["prepare_threshold"] is None
    # exec's own connection (no SQLAlchemy) reads the option too.
    assert direct_driver("postgresql://u@h/ops?pooler=transaction") is not None


# -- through a running PgBouncer ----------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The test database, directly or through a PgBouncer, and the port a
    client connects to."""

    mode: str  # direct, transaction or session
    db: TestDb
    port: int


@pytest.fixture(params=["direct", "transaction", "session"])
def target(request: pytest.FixtureRequest, server_databases: ServerDatabases,
           bouncers: Bouncers) -> Target:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("postgresql is not among the selected backends")
    mode = str(request.param)
    if mode == "direct":
        url = server_databases.url("postgresql")
        return Target(mode, TestDb("postgresql", url, new_prefix()),
                      PG_PORT)
    url = pooled_url(bouncers, server_databases, mode)
    return Target(mode, TestDb("postgresql", url, new_prefix()),
                  bouncers.get(mode).port)


def dblockrun(db: TestDb, *args: str) -> Ran:
    """An operator's ``dblockrun ARGS`` on ``db``, in-process (the daemon
    and ``exec`` below are real processes)."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_a_refused_startup_parameter_is_a_configuration_error(
        mode: str, request: pytest.FixtureRequest, server_databases: ServerDatabases,
        bouncers: Bouncers, tmp_path: Path) -> None:
    """PgBouncer refuses the ``options`` startup parameter of a URL that
    does not say a pooler is in the way: exit status 2 naming it, at once,
    not a daemon retrying 'database unreachable' forever."""
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("postgresql is not among the selected backends")
    url = without_pooler(pooled_url(bouncers, server_databases, mode))
    db = TestDb("postgresql", url, "tnopooler_")
    done = dblockrun(db, "status")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(
        "dblockrun: database refused the connection's startup parameter 'options' (")
    assert done.stderr.endswith(
        "unsupported startup parameter: options): a connection pooler such as PgBouncer "
        "accepts only a few; add ?pooler=transaction (or ?pooler=session, as its pool_mode) "
        "to the database URL\n")
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("jobs:\n  tick:\n    cron: '* * * * * *'\n    command: 'true'\n")
    daemon = subprocess.run(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "daemon", str(jobs)],
        capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=30)
    assert daemon.returncode == 2, daemon.stderr
    assert "startup parameter 'options'" in daemon.stderr
    assert "unreachable" not in daemon.stderr


#: A burst at start (every job due at once, results written by several
#: workers together), then nothing due for a day.
BURST = "jobs:\n" + "".join(f"  j{i}:\n    rate: 1d\n    command: sleep 0.3\n" for i in range(24))
#: Steady-state connections of a daemon: one for its statements, and on
#: PostgreSQL the LISTEN connection for run-now and kill requests, which a
#: transaction pooler cannot serve (the bookkeeping round reads them).
DAEMON_CONNECTIONS = {"direct": 2, "session": 2, "transaction": 1}


@pytest.mark.slow
def test_a_quiet_daemon_holds_one_connection_for_its_statements(target: Target,
                                                               tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(BURST)
    db = target.db
    fleet = Fleet(db, tmp_path, grace=None)
    proc = fleet.start(jobs, name="daemon", cwd=REPO, env=clean_env())
    store = Store(db.url, db.prefix)
    try:
        peak = 0

        def burst_done() -> bool:
            nonlocal peak
            peak = max(peak, connections_to(proc.pid, target.port))
            ran = [r for r in store.history(None, 100) if r.result == "ok"]
            return len(ran) == 24

        proc.wait(burst_done, 60, interval=0.02, what="the 24 runs of the burst")
        expected = DAEMON_CONNECTIONS[target.mode]
        # The next bookkeeping round closes the burst's extra connections.
        wait_for(lambda: connections_to(proc.pid, target.port) == expected, 10,
                 what=f"{expected} connection(s) (peak {peak})")
        seen = set()
        until = time.monotonic() + 4  # over three more rounds
        while time.monotonic() < until:
            seen.add(connections_to(proc.pid, target.port))
            time.sleep(0.1)
        print(f"\n{target.mode}: a quiet daemon holds {seen} connection(s); "
              f"{peak} at the burst's peak")
        # Never more while quiet. One fewer for a moment is the same policy: two of
        # its threads' statements overlapped (a renewal, a bookkeeping round: more
        # likely when four test workers share two cores), the pool had opened a
        # second connection, and the next round closed the idle ones (trim_pool),
        # until the next statement opened one again.
        assert max(seen) <= expected and expected in seen, seen
    finally:
        store.close()
        assert proc.stop() == 0, proc.text()
        fleet.close()


@pytest.fixture
def release(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "release"
    yield path
    path.touch()


@pytest.mark.slow
def test_an_exec_holds_one_connection(target: Target, tmp_path: Path, release: Path) -> None:
    """The claim, its renewals and the result, on one connection. Through a
    transaction pooler it runs for six renewals (every 2 s: a third of the
    lease): psycopg would prepare the renewal at its fifth. The lease is 6 s,
    not 3: on a starved CI machine a 3 s lease ran out before its renewal
    (the exec fenced, 143)."""
    db, started = target.db, tmp_path / "started"
    ticks = 120 if target.mode == "transaction" else 5
    script = (f"touch {started}; n=0; while [ ! -e {release} ] || [ $n -lt {ticks} ]; "
              "do sleep 0.1; n=$((n+1)); done")
    # The schema first: the first exec on a database without it creates it
    # through a second (pooled) connection, once.
    init = dblockrun(db, "init-db")
    assert init.returncode == 0, init.stderr
    proc = track(subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", "--name",
         "conn", "--lease", "6s", "--", "sh", "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env(), cwd=REPO))
    try:
        wait_for(lambda: started.exists() or proc.poll() is not None, 30,
                 what="the command's start")
        assert proc.poll() is None, proc.communicate()
        count = connections_to(proc.pid, target.port)
        release.touch()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"\n{target.mode}: exec holds {count} connection(s)")
    assert (proc.returncode, err) == (0, "")
    assert count == 1


@pytest.mark.parametrize(("mode", "waits"), [("direct", 0.2), ("transaction", 0.4)])
def test_run_waits_longer_by_default_through_a_transaction_pooler(
        mode: str, waits: float, request: pytest.FixtureRequest,
        server_databases: ServerDatabases, bouncers: Bouncers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its daemons read the request in their next bookkeeping round, not at
    once: ``run`` waits RUN_WAIT_POOLED (30 s) there, RUN_WAIT (10 s)
    elsewhere (made short here)."""
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("postgresql is not among the selected backends")
    direct = server_databases.url("postgresql")
    url = direct if mode == "direct" else pooled_url(bouncers, server_databases, mode)
    prefix = new_prefix()
    with Store(url, prefix) as store:
        store.ensure_jobs(["idle"])
        # A live daemon that has the job (else `run` says at once that none is).
        store.heartbeat_host("h:1:x", hostname="h", pid=1, version="0", clock_offset=0.0,
                             running=0, jobs=json.dumps({"idle": "0"}))
    monkeypatch.setattr(cli_module, "RUN_WAIT", 0.2)
    monkeypatch.setattr(cli_module, "RUN_WAIT_POOLED", 0.4)
    done = CliRunner().invoke(cli_module.cli, ["--db", url, "--table-prefix", prefix, "run",
                                               "idle"], prog_name="dblockrun")
    assert done.exit_code == 1
    assert f"no daemon started it within {waits:g}s" in done.output


TICK = """\
jobs:
  tick:
    cron: "* * * * * *"
    lock-at-most: 10s
    command: echo "$DBLOCKRUN_SLOT $DBLOCKRUN_HOST_ID" >> {log}
"""


@pytest.mark.slow
def test_daemons_ride_out_a_restart_of_the_pooler(
        request: pytest.FixtureRequest, server_databases: ServerDatabases,
        tmp_path: Path) -> None:
    """The transaction pooler itself goes away (every client connection
    cut) and comes back on its port: the daemons report one outage, carry
    on with the slots after it, and no slot starts twice."""
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("postgresql is not among the selected backends")
    direct = server_databases.url("postgresql")
    try:
        bouncer = Bouncer("transaction", PG_HOST, PG_PORT, PG_USER)
    except RuntimeError as exc:
        if strict():
            pytest.fail(f"{exc} (CI/DBLOCKRUN_TEST_STRICT: not skipping)", pytrace=False)
        pytest.skip(str(exc))
    db = TestDb("postgresql", bouncer.url(direct), new_prefix())
    log, jobs = tmp_path / "starts.log", tmp_path / "jobs.yaml"
    jobs.write_text(TICK.format(log=log))
    fleet = Fleet(db, tmp_path, grace=None)
    procs = [fleet.start(jobs, name=f"daemon{i}", cwd=REPO, env=clean_env()) for i in range(2)]

    def starts() -> list[str]:
        return log.read_text().split("\n")[:-1] if log.exists() else []

    def daemon_logs() -> list[str]:
        return [p.text() for p in procs]

    try:
        wait_for(lambda: len(starts()) >= 3, 30, what="three starts before the restart")
        bouncer.stop()
        wait_for(lambda: all("database unreachable" in text for text in daemon_logs()), 15,
                 what="both daemons to see the outage")
        cut = len(starts())
        bouncer = Bouncer("transaction", PG_HOST, PG_PORT, PG_USER, listen_port=bouncer.port)
        wait_for(lambda: len(starts()) >= cut + 3, 30, what="three starts after the restart")
        wait_for(lambda: all("database back after" in text for text in daemon_logs()), 15,
                 what="both daemons to say the database is back")
        assert all(p.alive() for p in procs), daemon_logs()
    finally:
        codes = fleet.stop()
        fleet.close()
        bouncer.stop()
    assert codes == [0, 0], daemon_logs()
    slots = [line.split()[0] for line in starts()]
    assert len(slots) == len(set(slots)), "a slot started twice"
    for text in daemon_logs():
        assert "prepared statement" not in text
