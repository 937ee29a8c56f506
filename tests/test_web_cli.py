"""``dblockrun web``'s command line: the users file's errors name file and
line (exit 2), ``web hash-password``, bad options; and the Fleet page's paging."""

from __future__ import annotations

import http.cookiejar
import json
import signal
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from argon2 import PasswordHasher
from click.testing import CliRunner
from helpers import REPO, TestDb, clean_env, dblockrun_cmd, free_port, http_get, wait_for
from starlette.testclient import TestClient
from webtools import PASSWORD, app_for, bearer, csrf_of, users_file

from dblockrun.cli import cli
from dblockrun.errors import UsageError
from dblockrun.scheduling.limits import seat_names
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
    seats = seat_names("backups", 2)
    store.ensure_jobs([f"job{i:04d}" for i in range(250)] + seats)
    assert store.claim_seat(seats, "h1", 300, "job0001") is not None
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
    nothing = client.get("/?q=nothing").text
    assert nothing.count("<tr data-job=") == 0
    for page in (first, last, found, nothing):  # the groups' seats on every page
        assert ('>backups</a></td><td data-label="seats">1 of 2'
                '</td><td data-label="held by">job0001 on <span class="host" title="h1">h1</span>'
                "</td>") in page
    status = client.get("/api/v1/status", headers=bearer("vera")).json()
    assert len(status["jobs"]) == 250  # the API: every job, as status --json


def _serve(db: TestDb, tmp_path: Path, *options: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "web", "--listen",
         f"127.0.0.1:{port}", "--users", str(users_file(tmp_path / "users.yaml")), *options],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "web.log").open("wb"), env=clean_env(),
        cwd=REPO)
    return proc, port


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _sign_in(base: str, name: str, password: str, forwarded: str,
             context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """A sign-in as a browser does it: the form (its cookie, its CSRF token), then the post."""
    jar = http.cookiejar.CookieJar()
    handlers: list[urllib.request.BaseHandler] = [urllib.request.HTTPCookieProcessor(jar)]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    with opener.open(f"{base}/login", timeout=30) as r:
        token = csrf_of(r.read().decode())
        cookie = r.headers.get("set-cookie", "")
    body = urllib.parse.urlencode({"name": name, "password": password, "csrf": token,
                                   "next": "/"}).encode()
    request = urllib.request.Request(f"{base}/login", data=body,
                                     headers={"X-Forwarded-For": forwarded})
    try:
        with opener.open(request, timeout=30) as r:
            return r.status, cookie
    except urllib.error.HTTPError as e:
        return e.code, cookie


def test_forwarded_headers_are_ignored_unless_asked(sqlite_db: TestDb, store_sqlite: Store,
                                                    tmp_path: Path) -> None:
    proc, port = _serve(sqlite_db, tmp_path)
    try:
        wait_for(lambda: http_get(port, "/login")[0] == 200, 60, what="dblockrun web")
        base = f"http://127.0.0.1:{port}"
        # Another address in each X-Forwarded-For: the limit counts the real one.
        codes = [_sign_in(base, f"nobody{i}", "guess", f"10.0.0.{i}")[0] for i in range(6)]
        assert codes == [401] * 5 + [429]
    finally:
        _stop(proc)


def test_tls_with_cert_and_key(sqlite_db: TestDb, store_sqlite: Store, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    proc, port = _serve(sqlite_db, tmp_path, "--cert", str(cert), "--key", str(key))
    context = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{port}"

    def up() -> bool:
        try:
            urllib.request.urlopen(f"{base}/login", context=context, timeout=5).close()
        except OSError:
            return False
        return True

    try:
        wait_for(up, 60, what="dblockrun web over TLS")
        code, cookie = _sign_in(base, "olga", PASSWORD, "-", context)
        assert code == 200
        assert "secure" in cookie.lower() and "httponly" in cookie.lower()
        assert "samesite=strict" in cookie.lower()
    finally:
        _stop(proc)


@pytest.fixture
def store_sqlite(sqlite_db: TestDb) -> Iterator[Store]:
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_schema()
        yield store


def test_a_reason_is_shown_escaped(store: Store, tmp_path: Path) -> None:
    store.ensure_jobs(["backup"])
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))
    reason = '<img src=x onerror="alert(1)">'
    assert client.post("/api/v1/jobs/backup/disable", headers=bearer("olga"),
                       json={"reason": reason}).status_code == 200
    client.post("/login", data={"name": "vera", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    for path in ("/", "/jobs/backup", "/audit"):
        page = client.get(path).text
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page, path
        assert reason not in page, path


def test_the_session_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dblockrun.web.serve import SECRET_ENV, WebOptions, secret

    monkeypatch.delenv(SECRET_ENV, raising=False)
    assert secret(WebOptions()) is None  # a new one each start
    monkeypatch.setenv(SECRET_ENV, "from-the-environment-" + "e" * 11)
    assert secret(WebOptions()) == "from-the-environment-" + "e" * 11
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef" * 2 + "\nignored\n")
    assert secret(WebOptions(secret_file=str(path))) == "0123456789abcdef" * 2
    path.write_text("0123456789abcdef\n")
    with pytest.raises(UsageError, match="16 bytes long; at least 32 are needed"):
        secret(WebOptions(secret_file=str(path)))


def test_the_fleet_page_shows_drift_and_live_hosts(store: Store, tmp_path: Path) -> None:
    names = [f"job{i:04d}" for i in range(150)]
    store.ensure_jobs(names)
    for host, digest in (("h1:1:a", "aaaa"), ("h2:2:b", "bbbb")):
        defs = dict.fromkeys(names, "same")
        defs["job0120"] = digest  # the two hosts' files differ on one job
        store.heartbeat_host(host, hostname=host[:2], pid=int(host[3]), version="t",
                             clock_offset=0.002, running=0, jobs=json.dumps(defs))
    client = TestClient(app_for(store, users_file(tmp_path / "users.yaml")))
    client.post("/login", data={"name": "vera", "password": PASSWORD, "next": "/",
                                "csrf": csrf_of(client.get("/login").text)})
    page = client.get("/?page=2").text
    row = page.split('<tr data-job="job0120"', 1)[1].split("</tr>", 1)[0]
    assert '<span class="bad">differs</span>' in row
    other = page.split('<tr data-job="job0121"', 1)[1].split("</tr>", 1)[0]
    assert "differs" not in other
    assert "job job0120 is defined differently: aaaa on h1:1:a; bbbb on h2:2:b" in page
    assert 'class="host">h1:1:a</a></td>' in page and "+2.0 ms" in page
    hosts = client.get("/hosts").text
    assert ('<td><span class="host">h1:1:a</span></td><td data-label="live">yes</td>'
            '<td data-label="hostname">h1</td><td data-label="pid">1</td>'
            '<td data-label="version">t</td>') in hosts


def test_web_with_f_shows_the_files_definition(sqlite_db: TestDb, store_sqlite: Store,
                                               tmp_path: Path) -> None:
    """``dblockrun web -f FILE`` (the global option, after the command) hands
    the jobs file to the Job page."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text('jobs:\n  nightly:\n    cron: "0 3 * * *"\n    command: echo from-the-file\n'
                    "    env:\n      TOKEN: do-not-show-me\n")
    store_sqlite.ensure_jobs(["nightly"])
    proc, port = _serve(sqlite_db, tmp_path, "-f", str(jobs))
    try:
        wait_for(lambda: http_get(port, "/login")[0] == 200, 60, what="dblockrun web")
        request = urllib.request.Request(f"http://127.0.0.1:{port}/jobs/nightly",
                                         headers=bearer("vera"))
        with urllib.request.urlopen(request, timeout=30) as r:
            html = r.read().decode()
        assert "in this server's jobs file" in html and "echo from-the-file" in html
        assert "TOKEN" in html and "do-not-show-me" not in html
    finally:
        _stop(proc)
