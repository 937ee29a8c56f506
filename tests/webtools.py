"""What the dashboard's tests share: a users file, an app over a test
database, and a real ``dblockrun web`` process with a browser's cookies."""

from __future__ import annotations

import http.cookiejar
import re
import resource
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO, TestDb, clean_env, dblockrun_cmd, free_port, http_get, wait_for

from dblockrun.store import Store
from dblockrun.web.app import WebApp, create_app
from dblockrun.web.context import WebConfig
from dblockrun.web.users import hash_password, load_users, token_hash

PASSWORD = "correct horse battery staple"
#: An API token per role.
TOKENS = {"vera": "viewer-token-" + "v" * 32, "olga": "operator-token-" + "o" * 32,
          "adam": "admin-token-" + "a" * 32}
ROLE = {"vera": "viewer", "olga": "operator", "adam": "admin"}


def users_file(path: Path) -> Path:
    """A users file: vera (viewer), olga (operator), adam (admin), each with
    :data:`PASSWORD` and a token of :data:`TOKENS`."""
    digest = hash_password(PASSWORD)
    path.write_text("users:\n" + "".join(
        f"  - name: {name}\n    role: {ROLE[name]}\n    password: '{digest}'\n"
        f"    token-sha256: {token_hash(token)}\n" for name, token in TOKENS.items()))
    return path


def web_config(store: Store, users: Path | None) -> WebConfig:
    return WebConfig(store=store, users=None if users is None else load_users(str(users)))


def app_for(store: Store, users: Path | None) -> WebApp:
    return create_app(web_config(store, users))


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html[:500]
    return found.group(1)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


# -- a real `dblockrun web` process ---------------------------------------------------


@dataclass
class WebServer:
    """A ``dblockrun web`` process of a test: its port, its log (stderr), its memory."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def status_kib(self, field: str) -> int:
        """A memory figure of /proc/PID/status in KiB (``VmRSS``; ``VmHWM``: its peak)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_web(db: TestDb, log: Path, *options: str, env: dict[str, str] | None = None,
              open_files: int | None = None) -> WebServer:
    """``dblockrun web`` on ``db`` on a free port of 127.0.0.1, its stderr to
    ``log``, with ``options`` (``--users FILE`` ...); ``open_files``: under
    ``ulimit -n`` that many. Returns once it answers."""
    port = free_port()

    def limit() -> None:
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with log.open("wb") as err:
        proc = subprocess.Popen(
            [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, "web", "--listen",
             f"127.0.0.1:{port}", *options],
            stdout=subprocess.DEVNULL, stderr=err, env=env or clean_env(), cwd=REPO,
            preexec_fn=limit)
    server = WebServer(proc, port, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"dblockrun web exited {proc.returncode}: {server.log_text()}")
        return http_get(port, "/api/v1/openapi.json")[0] == 200

    try:
        wait_for(up, 60, what="dblockrun web")
    except BaseException:
        server.stop()
        raise
    return server


class Browser:
    """One browser's cookies against a server, over urllib (a real HTTP client)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar),
                                                  _NoRedirect())

    def request(self, path: str, data: dict[str, str] | bytes | None = None,
                headers: dict[str, str] | None = None, method: str | None = None
                ) -> tuple[int, str, dict[str, str]]:
        """(status, body, headers: their names in lower case) of one request;
        a redirect is not followed."""
        body = urllib.parse.urlencode(data).encode() if isinstance(data, dict) else data
        req = urllib.request.Request(self.base + path, data=body, headers=headers or {},
                                     method=method)
        try:
            with self.opener.open(req, timeout=60) as r:
                return r.status, r.read().decode(), {k.lower(): v for k, v in r.headers.items()}
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(), {k.lower(): v for k, v in e.headers.items()}

    def csrf(self, path: str = "/login") -> str:
        return csrf_of(self.request(path)[1])

    def sign_in(self, name: str, password: str = PASSWORD,
                headers: dict[str, str] | None = None) -> int:
        """Sign in as a browser does (the form's token, then the post): the status."""
        token = self.csrf()
        return self.request("/login", {"name": name, "password": password, "csrf": token,
                                       "next": "/"}, headers)[0]

    def cookie(self) -> str:
        """The session cookie as sent now (``name=value``)."""
        return "; ".join(f"{c.name}={c.value}" for c in self.jar)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None
