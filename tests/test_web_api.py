"""``dblockrun web``'s JSON API (issue 22 items 3 and 4), on every backend:
the CLI's shapes, actions audited with the signed-in user, roles, tokens,
CSRF, the sign-in limit, and output rendered inert."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, invoke, wait_for
from starlette.testclient import TestClient
from webtools import PASSWORD, app_for, bearer, csrf_of, users_file

from dblockrun.config.load import load_jobs
from dblockrun.jobs import JobsFile
from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.web.app import create_app
from dblockrun.web.context import WebConfig
from dblockrun.web.limits import Limits
from dblockrun.web.openapi import OPENAPI
from dblockrun.web.signin import SignInLimit


@pytest.fixture
def users(tmp_path: Path) -> Path:
    return users_file(tmp_path / "users.yaml")


def cli_json(db: TestDb, *args: str) -> dict[str, object]:
    """The CLI's JSON, through helpers.invoke: a command's entry point,
    environment and leak check, stdout alone (not stderr's lines too)."""
    result = invoke("--db", db.url, "--table-prefix", db.prefix, *args)
    assert result.returncode == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_status_history_and_audit_are_the_cli_shapes(db: TestDb, store: Store,
                                                     users: Path) -> None:
    store.ensure_jobs(["backup", "report"])
    client = TestClient(app_for(store, users))
    done = client.post("/api/v1/jobs/backup/disable", headers=bearer("olga"),
                       json={"for": "2h", "reason": "disk swap"})
    assert done.status_code == 200, done.text
    api = client.get("/api/v1/status", headers=bearer("vera")).json()
    ours = cli_json(db, "status", "--json")
    del api["db_time"], ours["db_time"]
    assert api == ours
    (backup,) = [j for j in api["jobs"] if j["name"] == "backup"]
    assert backup["state"] == "disabled" and backup["disabled_reason"] == "disk swap"
    assert backup["disabled_by"] == "web:olga"  # the signed-in user, not the OS user
    assert client.get("/api/v1/audit", headers=bearer("vera")).json() == cli_json(
        db, "audit", "--json")
    assert client.get("/api/v1/history?job=backup", headers=bearer("vera")).json() == cli_json(
        db, "history", "backup", "--json")
    one = client.get("/api/v1/status?job=report", headers=bearer("vera")).json()
    assert [j["name"] for j in one["jobs"]] == ["report"]
    assert client.get("/api/v1/status?job=nope", headers=bearer("vera")).status_code == 404


def test_without_users_anyone_reads_and_nobody_writes(store: Store) -> None:
    store.ensure_jobs(["backup"])
    client = TestClient(app_for(store, None))
    assert client.get("/api/v1/status").json()["jobs"][0]["name"] == "backup"
    refused = client.post("/api/v1/jobs/backup/disable", json={"reason": "x"})
    assert refused.status_code == 403 and "read-only" in refused.json()["error"]
    state = store.lock_state("backup")
    assert state is not None and state.disabled_until is None
    assert store.control.entries() == []


def test_roles_decide_the_actions(store: Store, users: Path) -> None:
    store.ensure_jobs(["backup"])
    client = TestClient(app_for(store, users))
    assert client.get("/api/v1/status").status_code == 401
    assert client.get("/api/v1/status", headers={"Authorization": "Bearer wrong"}
                      ).status_code == 401
    assert client.post("/api/v1/jobs/backup/disable", headers=bearer("vera")
                       ).status_code == 403
    assert client.post("/api/v1/jobs/backup/unlock", headers=bearer("olga")).status_code == 403
    assert client.post("/api/v1/pause", headers=bearer("olga")).status_code == 403
    assert store.control.entries() == []

    assert client.post("/api/v1/jobs/backup/unlock", headers=bearer("adam")).status_code == 200
    paused = client.post("/api/v1/pause", headers=bearer("adam"), json={"reason": "deploy"})
    assert paused.status_code == 200, paused.text
    status = client.get("/api/v1/status", headers=bearer("vera")).json()
    assert status["paused"]["by"] == "web:adam" and status["paused"]["reason"] == "deploy"
    assert client.post("/api/v1/resume", headers=bearer("adam")).json()["resumed"] is True
    assert store.control.paused() is None
    assert [(e.who, e.action) for e in store.control.entries()] == [
        ("web:adam", "resume"), ("web:adam", "pause"), ("web:adam", "unlock")]


def test_a_session_write_needs_its_csrf_token(store: Store, users: Path) -> None:
    store.ensure_jobs(["backup"])
    client = TestClient(app_for(store, users))
    page = client.get("/login")
    signed = client.post("/login", data={"name": "olga", "password": PASSWORD,
                                         "csrf": csrf_of(page.text), "next": "/"})
    assert signed.status_code == 200 and "olga (operator)" in signed.text
    token = csrf_of(signed.text)
    assert client.post("/api/v1/jobs/backup/disable").status_code == 403
    assert client.post("/api/v1/jobs/backup/disable",
                       headers={"X-CSRF-Token": "forged"}).status_code == 403
    assert store.control.entries() == []
    done = client.post("/api/v1/jobs/backup/disable", headers={"X-CSRF-Token": token})
    assert done.status_code == 200
    assert [(e.who, e.action) for e in store.control.entries()] == [("web:olga", "disable")]


def test_sign_in_is_rate_limited(store: Store, users: Path) -> None:
    app = app_for(store, users)
    # An hour's window: on a loaded machine five argon2 checks may take a minute.
    app.state.web.logins = SignInLimit(Limits(sign_in_window=3600))
    client = TestClient(app)
    token = csrf_of(client.get("/login").text)
    for _ in range(5):
        wrong = client.post("/login", data={"name": "olga", "password": "guess",
                                            "csrf": token, "next": "/"})
        assert wrong.status_code == 401
    right = client.post("/login", data={"name": "olga", "password": PASSWORD, "csrf": token,
                                        "next": "/"})
    assert right.status_code == 429 and "too many" in right.text
    assert client.get("/api/v1/status").status_code == 401  # not signed in


def test_bad_input_is_a_clear_error_and_nothing_executable_is_taken(
        store: Store, users: Path) -> None:
    store.ensure_jobs(["backup"])
    client = TestClient(app_for(store, users))
    olga = bearer("olga")
    bad = client.post("/api/v1/jobs/backup/disable", headers=olga, json={"for": "banana"})
    assert bad.status_code == 400 and bad.json()["error"].startswith("for:")
    gone = client.post("/api/v1/jobs/nosuch/disable", headers=olga)
    assert gone.status_code == 404 and "no such job" in gone.json()["error"]
    for body in ({"command": "touch /tmp/pwned"}, {"reason": "x", "jobs": {"a": {}}}, ["x"]):
        refused = client.post("/api/v1/jobs/backup/run", headers=olga, json=body)
        assert refused.status_code == 400, body
    assert store.lock_state("backup").run_requested is None  # type: ignore[union-attr]
    assert client.post("/api/v1/jobs/backup/run", headers=olga).status_code == 200
    assert store.lock_state("backup").run_requested is not None  # type: ignore[union-attr]
    body = OPENAPI["components"]["schemas"]["ActionBody"]
    assert set(body["properties"]) == {"reason", "for", "until"}
    assert body["additionalProperties"] is False
    assert client.get("/api/v1/openapi.json").json() == OPENAPI


def exec_cli(db: TestDb, name: str, *command: str, lease: str = "30s"
             ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "exec", "--name", name,
         "--lease", lease, "--", *command],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=clean_env(), cwd=REPO)


#: A line of almost 64 KiB (the stored tail's size), then markup, escapes and bad UTF-8.
HOSTILE = ("python3 -c \"print('x' * 65000)\"; printf '<script>document.title=\"pwned\""
           "</script>\\033]0;title\\007\\033[31mred\\377\\376 end\\n'")


def test_a_hostile_output_is_inert(db: TestDb, store: Store, users: Path) -> None:
    assert exec_cli(db, "evil", "sh", "-c", HOSTILE).wait(timeout=60) == 0
    (run,) = store.history("evil")
    client = TestClient(app_for(store, users))
    doc = client.get(f"/api/v1/runs/{run.id}/output", headers=bearer("vera")).json()
    assert doc["run"]["result"] == m.OK
    text = doc["output"]
    assert "\x1b" not in text and "\x07" not in text and "\\x1b]0;title\\x07" in text
    assert "\ufffd" in text  # invalid UTF-8, replaced
    client.post("/login", data={"name": "vera", "password": PASSWORD,
                                "csrf": csrf_of(client.get("/login").text), "next": "/"})
    page = client.get(f"/runs/{run.id}")
    assert page.status_code == 200
    assert "&lt;script&gt;document.title=" in page.text
    assert "<script>document" not in page.text and "\x1b" not in page.text
    assert "x" * 64000 in page.text  # the long line is there, wrapped by CSS
    assert "script-src 'self'" in page.headers["content-security-policy"]


def test_kill_through_the_api_ends_a_running_run(db: TestDb, store: Store,
                                                 users: Path) -> None:
    # A 6 s lease: the exec makes the schema (one table more with the drain)
    # while this test's store does too; 3 s ran out under load before its
    # first renewal (the kill's words never came). It measures no failover.
    proc = exec_cli(db, "long", "sh", "-c", "echo started; exec sleep 300", lease="6s")
    try:
        (run,) = wait_for(lambda: store.control.running("long") or None, 30, what="the run")
        client = TestClient(app_for(store, users))
        asked = client.post(f"/api/v1/runs/{run.id}/kill", headers=bearer("olga"),
                            json={"reason": "stuck"})
        assert asked.status_code == 200, asked.text
        assert proc.wait(timeout=30) != 0
        ended = wait_for(lambda: (r := store.run(run.id)) and r.result != m.RUNNING and r,
                         30, what="the run's end")
        assert ended.result == m.KILLED and "web:olga" in (ended.output or "")
        again = client.post(f"/api/v1/runs/{run.id}/kill", headers=bearer("olga"))
        assert again.status_code == 409 and "not running" in again.json()["error"]
    finally:
        proc.kill()
        proc.wait()


def test_a_running_runs_output_is_its_live_tail_marked_live(db: TestDb, store: Store,
                                                            users: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = exec_cli(db, "chatty", "sh", "-c",
                    f"echo first; while [ ! -e {go} ]; do sleep 0.1; done; echo second",
                    lease="9s")  # a renewal (the live tail) every 3 s; 3 s ran out on a busy CI
    try:
        client = TestClient(app_for(store, users))
        (run,) = wait_for(lambda: store.control.running("chatty") or None, 30, what="the run")

        def output() -> dict[str, object]:
            got = client.get(f"/api/v1/runs/{run.id}/output", headers=bearer("vera"))
            assert got.status_code == 200, got.text
            doc: dict[str, object] = got.json()
            return doc

        # The holder's heartbeat brings the first line while the command waits.
        doc = wait_for(lambda: "first" in str((d := output())["output"]) and d, 30,
                       what="the first line, live")
        assert doc["live"] is True and doc["run"]["result"] == m.RUNNING, doc  # type: ignore[index]
        assert "second" not in str(doc["output"])
        go.touch()
        assert proc.wait(timeout=30) == 0
        doc = output()
        assert doc["live"] is False and doc["run"]["result"] == m.OK  # type: ignore[index]
        assert str(doc["output"]).split() == ["first", "second"]
    finally:
        proc.kill()
        proc.wait()


# -- the Job page's definition (issue 22 item 1) ------------------------------------

SECRET_JOBS = """\
jobs:
  backup:
    cron: "0 3 * * *"
    command: pg_dump postgresql://backup:hunter2@db.internal/app
    env:
      API_TOKEN: s3cr3t-token-value
    lock-at-most: 2h
    ping: https://hc-ping.example/ping-uuid-secret
"""


def jobs_yaml(path: Path, text: str) -> JobsFile:
    path.write_text(text)
    return load_jobs(str(path))


def live_host(store: Store, host: str, jobs: JobsFile) -> None:
    """A live daemon's host row, as its bookkeeping writes it: each job's
    definition hash and its keys' digests."""
    key = store.fleet_key()
    store.heartbeat_host(
        host, hostname=host, pid=1, version="test", clock_offset=0.0, running=0,
        jobs=json.dumps({j.name: j.definition_hash(key) for j in jobs.jobs}),
        fields=json.dumps({j.name: j.field_digests(key) for j in jobs.jobs}), heartbeat=60.0)


def host_row(html: str, host: str) -> str:
    found = re.search(rf'<tr><td><span class="host">{host}</span></td>.*?</tr>', html)
    assert found is not None, f"no row for {host} in the Job page's hosts"
    return found.group(0)


def test_the_job_page_shows_the_jobs_files_definition_and_which_keys_differ(
        store: Store, tmp_path: Path) -> None:
    mine = jobs_yaml(tmp_path / "jobs.yaml", SECRET_JOBS)
    other = jobs_yaml(tmp_path / "other.yaml",
                      SECRET_JOBS.replace("pg_dump postgresql", "pg_dumpall postgresql"))
    store.ensure_jobs(["backup"])
    live_host(store, "web-1", mine)
    live_host(store, "web-2", other)
    # --show-commands: read-only without users hides them by default.
    client = TestClient(create_app(WebConfig(store=store, users=None, jobs=mine,
                                             hide_commands=False)))
    page = client.get("/jobs/backup")
    assert page.status_code == 200, page.text
    html = page.text
    assert "<h3>in this server's jobs file</h3>" in html
    # The keys and values as the loader parsed them, the URL's password hidden.
    assert "<code>command</code></td><td><code>pg_dump postgresql://backup:***@db.internal/app" \
        in html
    assert "<code>lock-at-most</code></td><td><code>2h</code>" in html  # with its unit
    # env: its names, never its values.
    assert "<code>env</code></td><td><code>API_TOKEN</code>" in html
    assert "s3cr3t" not in html and "hunter2" not in html
    # ping: where its URL comes from, never the URL (it may be a secret).
    assert "<code>ping</code></td><td><code>literal</code>" in html
    assert "ping-uuid-secret" not in html
    # Per live host its hash; the host that differs names the key.
    assert mine.jobs[0].definition_hash(store.fleet_key()) in host_row(html, "web-1")
    assert "as in this server" in host_row(html, "web-1")
    assert '<td class="differs" data-label="differs in">command</td>' in host_row(html, "web-2")
    assert other.jobs[0].definition_hash(store.fleet_key()) in host_row(html, "web-2")


def test_without_a_jobs_file_the_job_page_says_how_to_show_the_definition(
        store: Store, tmp_path: Path) -> None:
    mine = jobs_yaml(tmp_path / "jobs.yaml", SECRET_JOBS)
    other = jobs_yaml(tmp_path / "other.yaml",
                      SECRET_JOBS.replace("lock-at-most: 2h", "lock-at-most: 3h"))
    store.ensure_jobs(["backup"])
    live_host(store, "web-1", mine)
    live_host(store, "web-2", other)
    html = TestClient(app_for(store, None)).get("/jobs/backup").text
    assert "not in the database" in html and "<code>-f JOBS_FILE</code>" in html
    assert "pg_dump" not in html
    for host in ("web-1", "web-2"):  # each defines it differently from the other
        row = host_row(html, host)
        assert '<td class="differs" data-label="differs in">lock-at-most</td>' in row
