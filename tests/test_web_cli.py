"""``dblockrun web``'s command line: the users file's errors name file and
line (exit 2), ``web hash-password``, bad options; and the Fleet page's paging."""

from __future__ import annotations

from pathlib import Path

import pytest
from argon2 import PasswordHasher
from click.testing import CliRunner
from helpers import TestDb
from starlette.testclient import TestClient
from webtools import PASSWORD, app_for, bearer, csrf_of, users_file

from dblockrun.cli import cli
from dblockrun.store import Store
from dblockrun.web.users import token_hash


def web(db: TestDb, *args: str, stdin: str | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--db", db.url, "--table-prefix", db.prefix, "web",
                                      *args], input=stdin)
    return result.exit_code, result.output


@pytest.mark.parametrize(("text", "said"), [
    ("users:\n  - name: a\n    role: boss\n    password: '$argon2id$x'\n",
     "users.yaml:2: user a: role: 'boss' is not one of viewer, operator, admin"),
    ("users:\n  - name: a\n    role: viewer\n    password: hunter2\n",
     "users.yaml:2: user a: password: not an argon2 hash"),
    ("users:\n  - name: a\n    pasword: '$argon2id$x'\n",
     "users.yaml:3: pasword: unknown key"),
    ("users:\n  - name: a\n    token-sha256: abc\n",
     "users.yaml:2: user a: token-sha256: not 64 hex digits"),
    ("users: []\nx: [\n", "users.yaml: not YAML"),
])
def test_a_bad_users_file_names_its_line(tmp_path: Path, sqlite_db: TestDb, text: str,
                                         said: str) -> None:
    path = tmp_path / "users.yaml"
    path.write_text(text)
    code, out = web(sqlite_db, "--users", str(path))
    assert code == 2
    assert said in out and "Traceback" not in out


def test_bad_options_exit_2(sqlite_db: TestDb, tmp_path: Path) -> None:
    code, out = web(sqlite_db, "--listen", "localhost:http")
    assert code == 2 and "--listen 'localhost:http': expected [HOST:]PORT" in out
    code, out = web(sqlite_db, "--cert", str(tmp_path / "c.pem"))
    assert code == 2 and "--cert and --key together" in out


def test_hash_password_and_token(sqlite_db: TestDb) -> None:
    code, out = web(sqlite_db, "hash-password", stdin="s3cret\n")
    assert code == 0 and PasswordHasher().verify(out.strip(), "s3cret")
    code, out = web(sqlite_db, "hash-password", "--token")
    token, digest = (line.split(": ", 1)[1] for line in out.splitlines())
    assert code == 0 and token_hash(token) == digest and len(token) >= 40


def test_the_fleet_page_pages_and_filters(store: Store, tmp_path: Path) -> None:
    store.ensure_jobs([f"job{i:04d}" for i in range(250)])
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))
    client.post("/login", data={"name": "vera", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    first = client.get("/").text
    assert first.count("<tr data-job=") == 100 and "page 1 of 3" in first
    last = client.get("/fleet/live?page=3").text
    assert last.count("<tr data-job=") == 50 and 'data-job="job0249"' in last
    assert 'data-job="job0199"' not in last
    found = client.get("/?q=job012").text
    assert found.count("<tr data-job=") == 10 and "10 job(s)" in found
    assert client.get("/?q=nothing").text.count("<tr data-job=") == 0
    status = client.get("/api/v1/status", headers=bearer("vera")).json()
    assert len(status["jobs"]) == 250  # the API: every job, as status --json
