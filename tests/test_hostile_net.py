"""Hostile input, round 2 (issue 25): a flood on the metrics port, a token
edited to the BIGINT maximum, a NOTIFY flood, and smaller crashes and leaks.

Each test starts real `dblockrun` processes against real SQLite, PostgreSQL
and MariaDB (where the item concerns them) and checks that nothing was lost,
no other job was disturbed and no secret was printed.
"""

from __future__ import annotations

import functools
import json
import math
import os
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import pg_admin
from harness import Fleet
from helpers import (
    REPO,
    Ran,
    TestDb,
    clean_env,
    cli,
    count_statements,
    dblockrun_cmd,
    free_port,
    history_of,
    invoke,
    lock_row,
    updates,
    wait_for,
)
from jobfiles import write_jobs

from dblockrun.store import Store
from dblockrun.store import models as m

EVERY_SECOND = '"* * * * * *"'
SECRET = "h0stile-Pw"
TOKEN_MAX = 2**63 - 1  # BIGINT


def on(db: TestDb, *args: str) -> Ran:
    """An operator's ``dblockrun ARGS`` on ``db``, in-process."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


def ok_runs(db: TestDb, name: str) -> list[m.RunRecord]:
    return [r for r in history_of(db, name) if r.result == m.OK]


def runs_at_least(db: TestDb, name: str, count: int) -> bool:
    return len(ok_runs(db, name)) >= count


def runs_since(db: TestDb, name: str, since: float, count: int) -> bool:
    return sum(r.started > since for r in ok_runs(db, name)) >= count


def went_busy(run: m.RunRecord) -> bool:
    """A slot that came while the job's previous run was still going
    (``overlap: forbid``): on a starved machine a one-second job's command
    can outlast its second. The slot is recorded, not lost."""
    return run.result == m.SKIPPED and "previous run still going" in (run.output or "")


def kept_every_slot(runs: list[m.RunRecord]) -> bool:
    """Each record is a run that went ok (or is running) or a slot skipped
    for a run still going: none failed, missed or lost to an outage."""
    return all(r.result in (m.OK, m.RUNNING) or went_busy(r) for r in runs)


# -- 6. a token at the BIGINT maximum -----------------------------------------------


@pytest.mark.parametrize("bad", [TOKEN_MAX, -5], ids=["max", "negative"])
def test_a_bad_token_fails_only_its_job_and_unlock_repairs_it_without_reuse(
        db: TestDb, tmp_path: Path, bad: int, fleet: Fleet) -> None:
    healthy = [f"fine{i}" for i in range(5)]
    # The edited job has run before: its runs were given tokens up to 41.
    lock_row(db, "edited", token=41)
    with Store(db.url, db.prefix) as store:
        store.start_run("edited", "earlier-host", token=41, result=m.OK, output="")
    lock_row(db, "edited", token=bad)
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n" + "".join(
        f"  {n}: {{cron: {EVERY_SECOND}, command: 'true'}}\n" for n in [*healthy, "edited"]))
    d = fleet.start(jobs)
    try:
        # Every job is due on every second (one batch claim): the edited row
        # must fail only its own job, not the batch as an outage.
        for name in healthy:
            wait_for(functools.partial(runs_at_least, db, name, 4), 40, what=f"runs of {name}")
        for name in healthy:
            runs = history_of(db, name)
            assert kept_every_slot(runs), (name, runs, d.text())
            done = sorted(r.slot or 0.0 for r in runs if r.result == m.OK or went_busy(r))
            # Every slot since the first has its record, no run late by more
            # than a second.
            assert [b - a for a, b in zip(done, done[1:], strict=False)] == \
                [1.0] * (len(done) - 1), (name, done)
            assert all(r.started - (r.slot or 0.0) < 1.0 for r in runs if r.token), (name, runs)
        log = d.text()
        why = "negative" if bad < 0 else "at the BIGINT maximum"
        assert log.count(f"job edited: its fencing token is {why}") == 1, log
        assert "repair it with `dblockrun unlock edited`" in log
        assert "database error" not in log and "database back" not in log, log
        assert "went backwards" not in log, log
        assert [r.token for r in history_of(db, "edited")] == [41]  # not run
        # The repair: the token after the newest handed out, never one reused.
        proc = on(db, "unlock", "edited")
        assert proc.returncode == 0, proc.stderr
        assert "token now 42" in proc.stdout, proc.stdout
        wait_for(lambda: len(ok_runs(db, "edited")) >= 2, 30, what="edited runs again")
        assert history_of(db, "edited")[-2].token == 43
        assert "went backwards" not in d.text()
        assert "Traceback" not in d.text()
    finally:
        assert d.stop() == 0


def test_unlock_refuses_when_the_maximum_was_handed_out(db: TestDb) -> None:
    with Store(db.url, db.prefix) as store:
        store.ensure_jobs(["spent"])
        store.start_run("spent", "earlier-host", token=TOKEN_MAX, result=m.OK, output="")
    lock_row(db, "spent", token=TOKEN_MAX)
    proc = on(db, "unlock", "spent")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "no newer token exists" in proc.stderr and "Traceback" not in proc.stderr
    with Store(db.url, db.prefix) as store:
        assert store.lock_state("spent").token == TOKEN_MAX  # type: ignore[union-attr]


# -- 7. a NOTIFY flood on the kill channel ---------------------------------------------


@pytest.fixture
def no_privilege_role(db: TestDb) -> Iterator[str]:
    """A PostgreSQL login role with no privilege on any dblockrun table."""
    if db.backend != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's")
    role = f"{db.prefix}flood"
    with pg_admin() as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield role
    finally:
        with pg_admin() as admin:
            admin.execute(f'DROP ROLE "{role}"')


def count_updates(db: TestDb, name: str) -> None:
    """From now, count the UPDATEs of the job's lock row (a trigger)."""
    locks = f"{db.prefix}locks"
    with psycopg.connect(db.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {db.prefix}updates (n bigint NOT NULL)")
        conn.execute(f"INSERT INTO {db.prefix}updates VALUES (0)")
        conn.execute(f"CREATE FUNCTION {db.prefix}count() RETURNS trigger LANGUAGE plpgsql AS "
                     f"$$ BEGIN UPDATE {db.prefix}updates SET n = n + 1; RETURN NEW; END $$")
        conn.execute(f"CREATE TRIGGER {db.prefix}count AFTER UPDATE ON {locks} FOR EACH ROW "
                     f"WHEN (NEW.name = '{name}') EXECUTE FUNCTION {db.prefix}count()")


def test_a_notify_flood_costs_one_extra_renewal_per_heartbeat(
        db: TestDb, tmp_path: Path, no_privilege_role: str, fleet: Fleet) -> None:
    heartbeat = 2.0
    jobs = write_jobs(tmp_path / "jobs.yaml",
                      "jobs:\n  slow: {rate: 1h, command: 'sleep 120'}\n"
                      f"  canary: {{cron: {EVERY_SECOND}, command: 'true'}}\n")
    d = fleet.start(jobs, heartbeat=f"{heartbeat}s", lease="8s", grace="2s")
    listening = ("SELECT count(*) FROM pg_stat_activity WHERE query = "
                 f"'LISTEN \"{db.prefix}kill\"'")
    try:
        wait_for(functools.partial(running, db, "slow"), 30, what="the slow run")
        with psycopg.connect(db.url, autocommit=True) as conn:
            wait_for(lambda: conn.execute(listening).fetchone() == (1,), 10,
                     what="the daemon listening")
        count_updates(db, "slow")
        # A role with no privilege on any table floods the kill channel for 3 s.
        flood_url = db.url.replace("postgres@", f"{no_privilege_role}@", 1)
        sent = 0
        with psycopg.connect(flood_url, autocommit=True) as flood:
            began = time.monotonic()
            while time.monotonic() - began < 3.0:
                flood.execute("SELECT pg_notify(%s, %s)", (f"{db.prefix}kill", str(sent)))
                sent += 1
            took = time.monotonic() - began
        settled = time.monotonic()
        wait_for(lambda: time.monotonic() - settled >= heartbeat, heartbeat + 1, interval=0.1,
                 what="a heartbeat after the flood")
        renewals = updates(db)
        regular = (took + heartbeat) / heartbeat
        print(f"\n{sent} notifications in {took:.1f}s: {renewals} renewals "
              f"(about {regular:.0f} regular ones)")
        assert sent > 1000
        # The regular renewals, and at most one extra one per heartbeat.
        assert renewals <= 2 * regular + 2, (renewals, sent)
        # The flood stopped nothing; a real kill still works within a heartbeat or two.
        assert running(db, "slow")
        asked = time.monotonic()
        kill = on(db, "kill", "slow")
        assert kill.returncode == 0, (kill.stdout, kill.stderr, d.text())
        assert time.monotonic() - asked < 2 * heartbeat + 3
        # The other job ran every second throughout.
        done = sorted(r.slot or 0.0 for r in ok_runs(db, "canary"))
        assert len(done) >= 4
        assert [b - a for a, b in zip(done, done[1:], strict=False)] == \
            [1.0] * (len(done) - 1), done
        assert "Traceback" not in d.text()
    finally:
        assert d.stop() == 0


def running(db: TestDb, name: str) -> list[m.RunRecord] | None:
    with Store(db.url, db.prefix) as store:
        return store.control.running(name) or None


# -- 3. a flood of idle sockets on the metrics port ------------------------------------


#: systemd's default open-files limit, 1,024 (soft and hard: the daemon
#: cannot lift it), for the command it runs.
LIMITED = ["sh", "-c", 'ulimit -Sn 1024 && ulimit -Hn 1024 && exec "$@"', "sh",
           *dblockrun_cmd()]


def listening_on(port: int) -> list[str]:
    """The local addresses (hex, /proc/net/tcp's) listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, hexport = local.rpartition(":")
                if state == "0A" and int(hexport, 16) == port:
                    found.append(addr)
    return found


def get(url: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """(status, body), or None if it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())
    except OSError:
        return None


def test_a_flood_of_idle_sockets_on_the_metrics_port_loses_no_run(
        db: TestDb, tmp_path: Path) -> None:
    url = db.url.replace("postgres@", f"postgres:{SECRET}@", 1)  # trust: not checked
    port = free_port()
    names = [f"tick{i}" for i in range(3)]
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n" + "".join(
        f"  {n}: {{cron: {EVERY_SECOND}, command: 'echo hi'}}\n" for n in names))
    # The URL (with a password) from the environment.
    limited = Fleet(None, tmp_path, prefix=db.prefix)
    d = limited.start(jobs, "--metrics", str(port), program=LIMITED,
                      env=clean_env(DBLOCKRUN_DB=url))
    flood: list[socket.socket] = []
    try:
        # A port alone binds the loopback only, and the log says where.
        wait_for(lambda: f"metrics on http://127.0.0.1:{port}/metrics" in d.text(), 30,
                 what="the metrics log line")
        assert listening_on(port) == ["0100007F"], listening_on(port)
        wait_for(functools.partial(runs_at_least, db, names[0], 1), 30, what="a first run")
        # An unprivileged local user opens 1,020 idle sockets and keeps them open.
        for _ in range(1020):
            s = socket.socket()
            flood.append(s)
            s.settimeout(3)
            s.connect_ex(("127.0.0.1", port))
        flooded = time.time()
        # Runs go on, every second, none lost; /healthz answers again while
        # the sockets are still open (the idle ones time out).
        health = wait_for(lambda: get(f"http://127.0.0.1:{port}/healthz"), 15,
                          what="/healthz answering during the flood")
        assert health == (200, b"ok\n"), health
        status, body = wait_for(lambda: get(f"http://127.0.0.1:{port}/metrics"), 15)
        assert status == 200 and b"dblockrun_runs_total" in body
        assert SECRET.encode() not in body
        for name in names:
            wait_for(functools.partial(runs_since, db, name, flooded + 4, 2), 30,
                     what=f"runs of {name} during the flood")
        for name in names:
            runs = history_of(db, name)
            assert kept_every_slot(runs), (name, runs, d.text())
        log = d.text()
        assert "Too many open files" not in log and "Traceback" not in log, log
        assert SECRET not in log
    finally:
        for s in flood:
            s.close()
        assert d.stop() == 0


# -- 8. smaller crashes and leaks ------------------------------------------------------


def no_nan(text: str) -> Any:
    """JSON as the standard allows it: NaN and Infinity are not JSON."""
    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} in JSON output")
    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinity_in_run_rows_are_shown_not_a_traceback(db: TestDb) -> None:
    if db.backend == "mariadb":
        pytest.skip("MariaDB's DOUBLE holds neither NaN nor infinity")
    with Store(db.url, db.prefix) as store:
        store.ensure_jobs(["odd"])
        first = store.start_run("odd", "h", token=1, result=m.OK, output="")
        second = store.start_run("odd", "h", token=2, result=m.OK, output="")
        runs = store.t.runs
        # (SQLite stores NaN as NULL, PostgreSQL as NaN.)
        nan = float("nan") if db.backend == "postgresql" else math.inf
        with store.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.id == first).values(
                started=nan, finished=math.inf, slot=-math.inf))
            conn.execute(runs.update().where(runs.c.id == second).values(
                started=0.0, finished=math.inf))
    for args in (["status"], ["status", "odd"], ["history"], ["history", "odd"]):
        proc = on(db, *args)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert "odd" in proc.stdout
    for args in (["status", "--json"], ["history", "--json"]):
        proc = on(db, *args)
        assert proc.returncode == 0, (args, proc.stderr)
        no_nan(proc.stdout)
    shown = no_nan(on(db, "history", "--json").stdout)["runs"]
    assert [r["duration"] for r in shown] == [None, None]


HUGE = "99999999999999999999"  # beyond BIGINT


def test_a_huge_run_id_is_the_same_answer_everywhere(db: TestDb) -> None:
    with Store(db.url, db.prefix) as store:
        store.ensure_schema()
        store.ensure_jobs(["j"])
    where = on(db, "status").stdout.splitlines()[0].removeprefix("database: ")
    for args, answer in ((["history", "--output", HUGE], f"dblockrun: no run {HUGE} in {where}"),
                         (["kill", "--run", HUGE], f"dblockrun: no run {HUGE} in {where}")):
        proc = on(db, *args)
        assert (proc.returncode, proc.stderr.strip()) == (2, answer), (args, proc.stderr)


def peak_rss_kib(args: Sequence[str]) -> int:
    """The peak resident memory of a dblockrun process (KiB)."""
    proc = subprocess.Popen([*dblockrun_cmd(), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=clean_env(), cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    if proc.stderr:
        proc.stderr.close()
    return int(usage.ru_maxrss)


def test_history_reads_no_output_it_does_not_show(db: TestDb) -> None:
    tail = "x" * 65535 + "\n"
    count = 1200  # 75 MiB of stored output
    with Store(db.url, db.prefix) as store:
        store.ensure_jobs(["chatty"])
        runs = store.t.runs
        with store.engine.begin() as conn:
            conn.execute(runs.insert(), [
                {"job": "chatty", "host": "h", "token": i, "attempt": 1, "started": 1e9 + i,
                 "finished": 1e9 + i + 1, "result": m.OK, "exit_code": 0, "output": tail}
                for i in range(1, count + 1)])
    base = ["--db", db.url, "--table-prefix", db.prefix, "history", "chatty"]
    one = peak_rss_kib([*base, "--limit", "1"])
    many = peak_rss_kib([*base, "--limit", str(count)])
    print(f"\nhistory --limit 1: {one / 1024:.1f} MiB, --limit {count}: {many / 1024:.1f} MiB")
    assert many - one < 10 * 1024, (one, many)
    # The output is still there for --output.
    proc = on(db, "history", "--output", "1")
    assert proc.returncode == 0 and proc.stdout == tail


def test_redaction_of_passwords_with_at_signs_and_libpq_strings(tmp_path: Path) -> None:
    at = "p@ss-" + SECRET
    for args, shown in (
            (["--db", f"postgresql://u:{at}@127.0.0.1:1/ops", "status"],
             "'postgresql://u:***@127.0.0.1:1/ops': write an '@' in the user name or password "
             "as %40"),
            (["--db", f"mysql://u:{at}@127.0.0.1:1/ops", "status"], "u:***@127.0.0.1"),
            (["--db", f"host=127.0.0.1 port=1 password={SECRET} dbname=ops", "status"],
             "password=***")):
        proc = cli(*args)
        assert proc.returncode in (1, 2) and "Traceback" not in proc.stderr, proc.stderr
        assert shown in proc.stderr, proc.stderr
        assert SECRET not in proc.stderr + proc.stdout and "ss-" not in proc.stderr, proc.stderr
        # A password given with --db is visible in ps: said so.
        assert "--db holds a password" in proc.stderr
    # The same URL from the environment: no warning.
    proc = cli("status", env=clean_env(DBLOCKRUN_DB=f"postgresql://u:{SECRET}@127.0.0.1:1/o"))
    assert proc.returncode == 1 and "--db holds a password" not in proc.stderr
    assert SECRET not in proc.stderr


def test_state_folders_are_private_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "home" / ".local" / "state"
    proc = subprocess.run([*dblockrun_cmd(), "exec", "-n", "private", "--", "true"],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env=clean_env(XDG_STATE_HOME=str(state), HOME=str(tmp_path / "home")),
                          preexec_fn=lambda: os.umask(0))  # noqa: PLW1509 (no threads here)
    assert proc.returncode == 0, proc.stderr
    for folder in (tmp_path / "home", tmp_path / "home" / ".local", state, state / "dblockrun"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    assert stat.S_IMODE((state / "dblockrun" / "dblockrun.db").stat().st_mode) == 0o600


def test_a_notify_flood_on_the_run_channel_is_coalesced(
        db: TestDb, tmp_path: Path, no_privilege_role: str, fleet: Fleet) -> None:
    jobs = write_jobs(tmp_path / "jobs.yaml", "jobs:\n  idle: {rate: 1h, command: 'true'}\n")
    d = fleet.start(jobs, heartbeat="2s", lease="8s", grace="2s")
    listening = ("SELECT count(*) FROM pg_stat_activity WHERE query = "
                 f"'LISTEN \"{db.prefix}kill\"'")
    try:
        wait_for(functools.partial(runs_at_least, db, "idle", 1), 30, what="the first run")
        with psycopg.connect(db.url, autocommit=True) as conn:
            wait_for(lambda: conn.execute(listening).fetchone() == (1,), 10,
                     what="the daemon listening")
        count_statements(db)
        # A role with no privilege on any table announces a run of `idle`
        # for 3 s, without filing a request (it cannot).
        flood_url = db.url.replace("postgres@", f"{no_privilege_role}@", 1)
        sent = 0
        with psycopg.connect(flood_url, autocommit=True) as flood:
            began = time.monotonic()
            while time.monotonic() - began < 3.0:
                flood.execute("SELECT pg_notify(%s, 'idle')", (f"{db.prefix}run",))
                sent += 1
            took = time.monotonic() - began
        settled = time.monotonic()
        wait_for(lambda: time.monotonic() - settled >= 1.5, 3, interval=0.1,
                 what="the flood handled")
        statements = updates(db)
        print(f"\n{sent} run announcements in {took:.1f}s: {statements} UPDATEs of the locks")
        assert sent > 1000
        assert statements <= (took + 1.5) / 0.25 + 4, (statements, sent)
        assert len(history_of(db, "idle")) == 1  # an announcement alone runs nothing
        # A real request still runs it at once.
        proc = on(db, "run", "idle", "--timeout", "10s")
        assert proc.returncode == 0, (proc.stdout, proc.stderr, d.text())
        assert len(history_of(db, "idle")) == 2
        assert "Traceback" not in d.text()
    finally:
        assert d.stop() == 0
