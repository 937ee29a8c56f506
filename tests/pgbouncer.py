"""PgBouncer instances of the tests' own, in front of the test PostgreSQL.

:class:`Bouncers` starts one ``pgbouncer`` per pool mode (``transaction``,
``session``) on a free port, with a generated configuration (trust
authentication for the test user, no Unix socket, no log or pid file: its
log is its stderr, kept in its folder), on first use; stops them at the
end. As root it drops to ``nobody`` (PgBouncer refuses to run as root),
after reading its configuration. ``scripts/test`` installs it from apt.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psycopg
from helpers import wait_for

POOL_MODES = ("transaction", "session")
#: Server connections per (database, user) pair: several daemons share them
#: in transaction mode; in session mode each client connection holds one.
POOL_SIZE = 30

CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
admin_users = {user}
pool_mode = {mode}
default_pool_size = {pool_size}
max_client_conn = 500
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bouncer:
    """One running pgbouncer."""

    def __init__(self, mode: str, host: str, port: int, user: str,
                 listen_port: int | None = None) -> None:
        binary = shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None)
        if binary is None:
            raise RuntimeError("pgbouncer is not installed (apt-get install pgbouncer; "
                               "scripts/test does it)")
        self.mode = mode
        self.user = user
        self.folder = Path(tempfile.mkdtemp(prefix=f"dblockrun-pgbouncer-{mode}-"))
        self.port = listen_port or free_port()
        (self.folder / "users.txt").write_text(f'"{user}" ""\n')
        config = self.folder / "pgbouncer.ini"
        config.write_text(CONFIG.format(host=host, port=port, listen=self.port,
                                        folder=self.folder, user=user, mode=mode,
                                        pool_size=POOL_SIZE))
        self.log = self.folder / "pgbouncer.log"
        as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
        with self.log.open("wb") as err:
            self.proc = subprocess.Popen([binary, *as_user, str(config)],
                                         stdout=subprocess.DEVNULL, stderr=err)
        try:
            wait_for(self._answers, 15, interval=0.1, what=f"pgbouncer ({mode}) to answer")
        except AssertionError as exc:
            self.stop()
            raise RuntimeError(f"{exc}: {self.log.read_text()[-1000:]}") from None

    def _answers(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}: "
                               f"{self.log.read_text()[-1000:]}")
        try:
            with self.admin() as conn:
                conn.execute("SHOW VERSION")
            return True
        except psycopg.OperationalError:
            return False

    def url(self, direct_url: str) -> str:
        """``direct_url``'s database through this pgbouncer, with the option
        that says so."""
        database = direct_url.rsplit("/", 1)[1]
        return (f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"
                f"?pooler={self.mode}")

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        """A connection to the admin console (``SHOW CLIENTS``, ``SHOW SERVERS``)."""
        return psycopg.connect(host="127.0.0.1", port=self.port, user=self.user,
                               dbname="pgbouncer", autocommit=True, connect_timeout=5,
                               prepare_threshold=None)

    def show(self, what: str, database: str) -> list[dict[str, object]]:
        """The rows of ``SHOW CLIENTS`` or ``SHOW SERVERS`` for ``database``."""
        assert what in ("CLIENTS", "SERVERS")
        with self.admin() as conn:
            cur = conn.execute(f"SHOW {what}")
            names = [c.name for c in cur.description or []]
            rows = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        return [r for r in rows if r.get("database") == database]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)


class Bouncers:
    """One pgbouncer per pool mode, started on first use."""

    def __init__(self, host: str, port: int, user: str) -> None:
        self.host, self.port, self.user = host, port, user
        self._running: dict[str, Bouncer] = {}
        self._errors: dict[str, str] = {}

    def get(self, mode: str) -> Bouncer:
        """The pgbouncer in ``mode``; RuntimeError if it cannot start."""
        if mode in self._errors:
            raise RuntimeError(self._errors[mode])
        if mode not in self._running:
            try:
                self._running[mode] = Bouncer(mode, self.host, self.port, self.user)
            except (OSError, RuntimeError) as exc:
                self._errors[mode] = f"cannot start pgbouncer ({mode}): {exc}"
                raise RuntimeError(self._errors[mode]) from None
        return self._running[mode]

    def stop(self) -> None:
        for bouncer in self._running.values():
            bouncer.stop()
