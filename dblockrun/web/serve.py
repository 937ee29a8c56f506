"""``dblockrun web``: the app served by uvicorn, with TLS if asked."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dblockrun.config.jobs import JobsFile
from dblockrun.errors import UsageError
from dblockrun.store import Store
from dblockrun.web.users import User

#: The session cookie's signing key, when no --secret-file is given.
SECRET_ENV = "DBLOCKRUN_WEB_SECRET"


@dataclass(frozen=True)
class WebOptions:
    listen: str = "127.0.0.1:8080"
    users_file: str | None = None
    cert: str | None = None
    key: str | None = None
    secret_file: str | None = None
    proxy_headers: bool = False


def listen_addr(text: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` (``[::1]:8080``; ``8080``: on 127.0.0.1)."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"--listen {text!r}: expected [HOST:]PORT, e.g. 127.0.0.1:8080") from None
    if not 0 < number <= 65535:
        raise UsageError(f"--listen {text!r}: port out of range")
    return host.strip("[]") or "127.0.0.1", number


def secret(options: WebOptions) -> str | None:
    """The session key: --secret-file's first line, else $DBLOCKRUN_WEB_SECRET,
    else None (a new one each start: sessions end with the server)."""
    if options.secret_file is not None:
        try:
            lines = Path(options.secret_file).read_text().splitlines()
            text = lines[0].strip() if lines else ""
        except OSError as exc:
            raise UsageError(f"--secret-file {options.secret_file}: {exc.strerror}") from None
        if len(text) < 16:
            raise UsageError(f"--secret-file {options.secret_file}: at least 16 characters")
        return text
    return os.environ.get(SECRET_ENV) or None


@dataclass(frozen=True)
class Checked:
    """The options checked and the users file read, before the database is opened."""

    options: WebOptions
    host: str
    port: int
    users: dict[str, User] | None
    secret: str | None


def check(options: WebOptions) -> Checked:
    """UsageError or ConfigError (exit 2) for a bad option or users file."""
    from dblockrun.web.users import load_users

    if (options.cert is None) != (options.key is None):
        raise UsageError("give --cert and --key together")
    host, port = listen_addr(options.listen)
    users = load_users(options.users_file) if options.users_file is not None else None
    return Checked(options, host, port, users, secret(options))


def serve(store: Store, checked: Checked, jobs: JobsFile | None = None) -> None:
    """``jobs``: the jobs file, whose definitions the Job page shows."""
    import uvicorn

    from dblockrun.web.app import create_app
    from dblockrun.web.context import WebConfig

    options = checked.options
    cfg = WebConfig(store=store, users=checked.users,
                    https_only=options.cert is not None or options.proxy_headers, jobs=jobs)
    if checked.secret is not None:
        cfg.secret = checked.secret
    uvicorn.run(create_app(cfg), host=checked.host, port=checked.port,
                ssl_certfile=options.cert, ssl_keyfile=options.key,
                proxy_headers=options.proxy_headers,
                forwarded_allow_ips="127.0.0.1" if options.proxy_headers else None,
                server_header=False, log_level="info")
