"""What every page and endpoint needs: the server's settings, who is asking,
the session's CSRF token, and the headers every answer carries (CSP and
friends)."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.requests import Request

from dblockrun.config.jobs import JobsFile
from dblockrun.store import Store
from dblockrun.web.snapshot import Snapshot
from dblockrun.web.users import LoginLimit, User, user_of_token

HERE = Path(__file__).parent

#: No inline script or style, nothing from elsewhere, no framing.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]

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
    logins: LoginLimit = field(default_factory=LoginLimit)
    #: This server's jobs file (``-f``): the Job page shows its definitions.
    jobs: JobsFile | None = None
    #: The whole fleet's status document, shared by the requests for it.
    status: Snapshot = field(init=False)

    def __post_init__(self) -> None:
        self.status = Snapshot(lambda: whole_status(self.store))


def whole_status(store: Store) -> str:
    """``status --json`` of every job (ops/output.py's serializer)."""
    from dblockrun.ops.output import status_json
    from dblockrun.store.status import report

    got = report(store)
    return status_json(got.jobs, got.hosts, got.db_now, None, got.paused, got.groups)


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
    name = request.session.get("user")
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


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class SecurityHeaders:
    """Adds :data:`HEADERS` to every HTTP answer."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
