"""``dblockrun web``: the app served by uvicorn, with TLS if asked, within
the limits of ``limits.py`` (connections: ``connections.py``)."""

from __future__ import annotations

import logging
import os
import resource
from dataclasses import dataclass, replace

from dblockrun.errors import UsageError
from dblockrun.jobs import JobsFile
from dblockrun.secretfile import first_line
from dblockrun.store import Store
from dblockrun.web.limits import Limits, connection_cap
from dblockrun.web.users import User
from dblockrun.withheld import WEB_SECRET

log = logging.getLogger("dblockrun")

#: The session cookie's signing key, when no --secret-file is given (no
#: command inherits it: dblockrun/withheld.py).
SECRET_ENV = WEB_SECRET


@dataclass(frozen=True)
class WebOptions:
    listen: str = "127.0.0.1:8080"
    users_file: str | None = None
    cert: str | None = None
    key: str | None = None
    secret_file: str | None = None
    proxy_headers: bool = False
    #: Commands to operators and admins only; None: when no users are configured.
    hide_commands: bool | None = None
    #: How long a session lasts (seconds); None: :attr:`Limits.session_lifetime`.
    session_lifetime: float | None = None
    #: Log every request (``--access-log``; off: the pages poll every 2 s).
    access_log: bool = False


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


def secret(options: WebOptions, limits: Limits | None = None) -> str | None:
    """The session key: --secret-file's first line (read as ``{file:}``
    secrets are: a regular file, at most 64 KiB, UTF-8), else
    $DBLOCKRUN_WEB_SECRET, else None (a new one each start: sessions end
    with the server). At least :attr:`Limits.min_secret` bytes."""
    least = (limits or Limits()).min_secret
    if options.secret_file is not None:
        where = f"--secret-file {options.secret_file}"
        try:
            text = first_line(options.secret_file, "--secret-file")
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    else:
        where, text = SECRET_ENV, os.environ.get(SECRET_ENV, "")
        if not text:
            return None
    if len(text.encode()) < least:
        raise UsageError(f"{where}: the session key is {len(text.encode())} bytes long; at least "
                         f"{least} are needed (e.g. `openssl rand -base64 48`)")
    return text


@dataclass(frozen=True)
class Checked:
    """The options checked and the users file read, before the database is opened."""

    options: WebOptions
    host: str
    port: int
    users: dict[str, User] | None
    secret: str | None
    limits: Limits


def check(options: WebOptions) -> Checked:
    """UsageError or ConfigError (exit 2) for a bad option or users file."""
    from dblockrun.web.users import load_users

    if (options.cert is None) != (options.key is None):
        raise UsageError("give --cert and --key together")
    limits = Limits()
    if options.session_lifetime is not None:
        if options.session_lifetime <= 0:
            raise UsageError("--session-lifetime: must be longer than 0s")
        limits = replace(limits, session_lifetime=options.session_lifetime)
    host, port = listen_addr(options.listen)
    users = load_users(options.users_file) if options.users_file is not None else None
    return Checked(options, host, port, users, secret(options, limits), limits)


def open_files() -> int:
    """How many files this process may open (``ulimit -n``): its soft
    limit, raised to the hard one first where that is higher."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY:
        return 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def serve(store: Store, checked: Checked, jobs: JobsFile | None = None) -> None:
    """``jobs``: the jobs file, whose definitions the Job page shows (read
    again on SIGHUP and when it changes: jobsfile.py)."""
    import signal

    import uvicorn

    from dblockrun.signals import handling
    from dblockrun.store.dburl import describe
    from dblockrun.web.app import create_app
    from dblockrun.web.connections import quiet_repeats, uvicorn_options
    from dblockrun.web.context import WebConfig
    from dblockrun.web.jobsfile import JobsReload

    options, limits = checked.options, checked.limits
    cfg = WebConfig(store=store, users=checked.users,
                    https_only=options.cert is not None or options.proxy_headers, jobs=jobs,
                    hide_commands=options.hide_commands, limits=limits)
    if checked.secret is not None:
        cfg.secret = checked.secret
    quiet_repeats(limits)
    cap = connection_cap(limits, open_files())
    scheme = "https" if options.cert is not None else "http"
    host = f"[{checked.host}]" if ":" in checked.host else checked.host
    log.info("serving %s on %s://%s:%d (%s%s)", describe(store.url, store.prefix), scheme, host,
             checked.port, "read-only for anyone" if checked.users is None
             else f"{len(checked.users)} user(s)",
             f"; jobs file {jobs.path}" if jobs is not None else "")

    def put(new: JobsFile) -> None:
        cfg.jobs = new

    reload = JobsReload(lambda: cfg.jobs, put)
    reload.start()
    try:
        # log_config=None: uvicorn's lines go through dblockrun's log (its
        # format, its redaction), not handlers of its own. SIGHUP reloads
        # (uvicorn handles SIGINT and SIGTERM, and restores only those).
        with handling({signal.SIGHUP: reload.on_sighup}):
            uvicorn.run(create_app(cfg), host=checked.host, port=checked.port,
                        ssl_certfile=options.cert, ssl_keyfile=options.key,
                        proxy_headers=options.proxy_headers,
                        forwarded_allow_ips="127.0.0.1" if options.proxy_headers else None,
                        server_header=False, log_level="info", log_config=None,
                        access_log=options.access_log, **uvicorn_options(limits, cap))
    finally:
        reload.stop()
