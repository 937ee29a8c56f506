"""The application: Starlette's (the pages, the API, the static files, the
signed session cookie and who is signed in), inside the layers every
request passes first (middleware.py: the security headers on every answer,
its errors included, and the request's limits).

A request flows: :class:`~dblockrun.web.middleware.SecurityHeaders` ->
:class:`~dblockrun.web.middleware.RequestGuard` (NUL, body size and time)
-> Starlette (its error page, errors.py) -> the session cookie ->
:class:`~dblockrun.web.sessions.SignedIn` (the session's user, from the
database) -> the route (pages.py, api.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import State
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from dblockrun.errors import DatabaseError
from dblockrun.web import api, errors, pages
from dblockrun.web.context import HERE, WebConfig
from dblockrun.web.middleware import ASGIApp, Receive, RequestGuard, Scope, SecurityHeaders, Send
from dblockrun.web.sessions import SignedIn

COOKIE = "dblockrun_session"


class WebApp:
    """What uvicorn serves: Starlette's application inside the guards.
    ``state.web`` is the :class:`WebConfig`, as Starlette's."""

    def __init__(self, inner: Starlette, outer: ASGIApp) -> None:
        self.inner = inner
        self.state: State = inner.state
        self._asgi = outer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._asgi(scope, receive, send)


def create_app(cfg: WebConfig) -> WebApp:
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        cfg.store.close()

    handlers: dict[Any, Any] = {Exception: errors.server_error,
                                DatabaseError: errors.database_error}
    inner = Starlette(
        routes=[*pages.routes(), *api.routes(),
                Mount("/static", StaticFiles(directory=HERE / "static"), name="static")],
        middleware=[
            # The cookie's own age: the session's end is its row's (sessions.py).
            Middleware(SessionMiddleware, secret_key=cfg.secret, session_cookie=COOKIE,
                       same_site="strict", https_only=cfg.https_only,
                       max_age=int(cfg.limits.session_lifetime)),
            Middleware(SignedIn, store=cfg.store),
        ],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    inner.state.web = cfg
    return WebApp(inner, SecurityHeaders(RequestGuard(inner, cfg.limits)))
