"""Signed-in sessions that signing out ends, everywhere.

The session cookie (Starlette's, signed with the session key) holds what a
browser needs between requests: its CSRF token, a flash message, and once
signed in a random session id (``sid``). Who is signed in comes from the
database only (dblockrun/store/sessions.py): the row of that id's SHA-256,
with its user and an end :attr:`Limits.session_lifetime` after the sign-in.
Signing out deletes the row, so the cookie (a copy saved before, another
``dblockrun web`` on the same database) opens nothing any more, and no
request moves the end: a cookie re-issued with a flash message is still the
same session.

:class:`SignedIn` reads the row once per request (in a worker thread: the
database is not asked from the event loop; not for the static files) and
leaves the user's name in ``request.state.user_name``.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from dblockrun.errors import DatabaseError
from dblockrun.web.middleware import ASGIApp, Receive, Scope, Send, refuse

if TYPE_CHECKING:
    from dblockrun.store import Store

log = logging.getLogger("dblockrun.web")

#: The key of the session id in the cookie's session.
SID = "sid"


def row_key(sid: str) -> str:
    """The database's key of a session id: its SHA-256 (a reader of the
    table cannot use a row to sign in)."""
    return hashlib.sha256(sid.encode("utf-8", "surrogatepass")).hexdigest()


def start(store: Store, request: Request, user_name: str, lifetime: float) -> None:
    """Sign ``user_name`` in: a new session (a new id, a new cookie: no fixation)."""
    sid = secrets.token_urlsafe(32)
    store.sessions.start(row_key(sid), user_name, lifetime)
    request.session.clear()
    request.session[SID] = sid


def end(store: Store, request: Request) -> None:
    """Sign out: the session's row is deleted, the cookie emptied."""
    sid = request.session.get(SID)
    if isinstance(sid, str):
        store.sessions.end(row_key(sid))
    request.session.clear()


class SignedIn:
    """Puts the name of the session's user (None: not signed in) in
    ``scope["state"]["user_name"]``; inside Starlette's session middleware."""

    def __init__(self, app: ASGIApp, store: Store) -> None:
        self.app = app
        self.store = store

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session: dict[str, Any] = scope.get("session") or {}
        sid = session.get(SID)
        name: str | None = None
        if isinstance(sid, str) and not scope["path"].startswith("/static/"):
            try:
                name = await run_in_threadpool(self.store.sessions.user, row_key(sid))
            except DatabaseError as exc:
                log.warning("cannot read the session: %s", exc.message)
                await refuse(scope, send, 503, "the database is not answering; try again")
                return
        scope.setdefault("state", {})["user_name"] = name
        await self.app(scope, receive, send)
