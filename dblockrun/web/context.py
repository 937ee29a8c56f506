"""What every page and endpoint needs: the server's settings, who is asking,
and the session's CSRF token. The limits are in ``limits.py``, the layers
every request passes in ``middleware.py``, the sessions in ``sessions.py``,
the sign-in limit in ``signin.py``."""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from starlette.requests import Request

from dblockrun.jobs import JobsFile
from dblockrun.store import Store
from dblockrun.web.fleetview import FleetStatus
from dblockrun.web.fleetview import read as read_fleet
from dblockrun.web.limits import Limits
from dblockrun.web.signin import PasswordChecks, SignInLimit
from dblockrun.web.snapshot import Snapshot
from dblockrun.web.users import User, user_of_token

HERE = Path(__file__).parent

#: Who is asking when no users file is given: anyone, read-only.
ANYONE = User("anyone", "viewer")


@dataclass
class WebConfig:
    """What ``dblockrun web`` was started with."""

    store: Store
    #: None: read-only for anyone, no sign-in.
    users: dict[str, User] | None
    #: Signs the session cookie (``--secret-file``, DBLOCKRUN_WEB_SECRET, or new per start).
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    #: The session cookie only over HTTPS (TLS here, or a proxy's).
    https_only: bool = False
    #: This server's jobs file (``-f``): the Job page shows its definitions.
    jobs: JobsFile | None = None
    #: Commands (``command``, ``on-failure``'s, ``items-command``) shown to
    #: operators and admins only (``--hide-commands``; None: when no users
    #: are configured, i.e. to nobody).
    hide_commands: bool | None = None
    limits: Limits = field(default_factory=Limits)
    #: The sign-in limit and the password checks' gate (signin.py).
    logins: SignInLimit = field(init=False)
    checks: PasswordChecks = field(init=False)
    #: The whole fleet's status document and rows, shared by the requests for it.
    status: Snapshot[FleetStatus] = field(init=False)

    def __post_init__(self) -> None:
        self.status = Snapshot(lambda: read_fleet(self.store))
        self.logins = SignInLimit(self.limits, self.users or {})
        self.checks = PasswordChecks(self.limits)
        if self.hide_commands is None:
            self.hide_commands = self.users is None

    def shows_commands(self, user: User | None) -> bool:
        """Whether ``user`` (None: nobody signed in) sees the jobs' commands."""
        return not self.hide_commands or (
            self.users is not None and user is not None and user.can("operator"))


def config(request: Request) -> WebConfig:
    found: WebConfig = request.app.state.web
    return found


def current_user(request: Request) -> User | None:
    """The signed-in user: by an API token (``Authorization: Bearer``) or the
    session; :data:`ANYONE` when no users are configured; None: nobody."""
    cfg = config(request)
    if cfg.users is None:
        return ANYONE
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return user_of_token(cfg.users, auth[7:].strip())
    # The session's row in the database (sessions.py SignedIn read it).
    name = getattr(request.state, "user_name", None)
    return cfg.users.get(name) if isinstance(name, str) else None


def by_token(request: Request) -> bool:
    return request.headers.get("authorization", "").lower().startswith("bearer ")


def csrf_token(request: Request) -> str:
    """The session's CSRF token (made on first use)."""
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def csrf_ok(request: Request, given: str | None) -> bool:
    token = request.session.get("csrf")
    return isinstance(token, str) and given is not None and hmac.compare_digest(
        token.encode(), given.encode())


def refusal(request: Request, role: str, csrf_given: str | None) -> tuple[int, str] | None:
    """Why this request may not act with ``role`` (an HTTP status and a
    sentence), or None: the one check of the pages' forms and the API."""
    cfg = config(request)
    if cfg.users is None:
        return 403, "read-only: no users are configured (dblockrun web --users FILE)"
    user = current_user(request)
    if user is None:
        return 401, "sign in first: a session, or an API token (Authorization: Bearer)"
    if not by_token(request) and not csrf_ok(request, csrf_given):
        return 403, ("refused: the CSRF token is missing or wrong (a form: reload the page "
                     "and try again; the API: send it in X-CSRF-Token, or use a token)")
    if not user.can(role):
        return 403, f"this needs the {role} role; {user.name} is {user.role}"
    return None
