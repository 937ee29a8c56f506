"""The Starlette application: the pages, the API, the static files, and the
middleware every request passes (security headers, the signed session)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from dblockrun.web import api, pages
from dblockrun.web.context import HERE, SecurityHeaders, WebConfig


def create_app(cfg: WebConfig) -> Starlette:
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        cfg.store.close()

    app = Starlette(
        routes=[*pages.routes(), *api.routes(),
                Mount("/static", StaticFiles(directory=HERE / "static"), name="static")],
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(SessionMiddleware, secret_key=cfg.secret,
                       session_cookie="dblockrun_session", same_site="strict",
                       https_only=cfg.https_only, max_age=12 * 3600),
        ],
        lifespan=lifespan,
    )
    app.state.web = cfg
    return app
