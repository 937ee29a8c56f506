"""What the dashboard says when something goes wrong, to whoever asked:
never a traceback, never which database (its URL, host, name or table
prefix), whoever is asking. The traceback of an unexpected error goes to
the server's log (redacted, as every log line)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from dblockrun import redact
from dblockrun.errors import DatabaseError
from dblockrun.store.dburl import describe

if TYPE_CHECKING:
    from dblockrun.store.roles import StatusReading

log = logging.getLogger("dblockrun.web")

#: How an error names the database to a dashboard reader.
THE_DATABASE = "the database"


def public(store: StatusReading, message: str) -> str:
    """``message`` (an operator command's error) without the database's
    name: ``no such job in postgresql://app:***@db/ops: x`` is ``no such job
    in the database: x``."""
    for shown in (describe(store.url, store.prefix), redact.url(store.url)):
        message = message.replace(shown, THE_DATABASE)
    return message


def _answer(request: Request, status: int, message: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    return PlainTextResponse(message + "\n", status_code=status)


async def database_error(request: Request, exc: Exception) -> Response:
    """A database error during a request: 503, logged once as a line."""
    assert isinstance(exc, DatabaseError)
    log.warning("%s %s: database error: %s", request.method, request.url.path, exc.message)
    return _answer(request, 503, "the database is not answering; try again in a moment")


async def server_error(request: Request, _exc: Exception) -> Response:
    """Anything else: 500 (Starlette logs the traceback)."""
    return _answer(request, 500, "internal error: the server's log says more")
