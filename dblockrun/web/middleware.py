"""The ASGI layers every request passes before Starlette's application
(dblockrun/web/app.py puts them outside it, so that its error pages pass
them too):

- :class:`SecurityHeaders`: the headers every answer carries (CSP and
  friends), errors included;
- :class:`RequestGuard`: a request whose path or query holds a NUL is 400;
  a body is read here, at most :attr:`Limits.max_body` bytes within
  :attr:`Limits.body_timeout`, before anything parses it (413, 408
  otherwise), and handed on from memory.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from dblockrun.web.limits import Limits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

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


class RequestGuard:
    """Refuses what no page or endpoint takes, before the application sees it."""

    def __init__(self, app: ASGIApp, limits: Limits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if "\x00" in scope["path"] or b"%00" in scope["query_string"] \
                or b"\x00" in scope["query_string"]:
            await refuse(scope, send, 400, "a NUL byte in the path or the query")
            return
        body = await self._body(scope, receive, send)
        if body is None:
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request's whole body, or None once it was refused."""
        limit = self.limits.max_body
        length = _content_length(scope)
        if length is not None and length > limit:
            await refuse(scope, send, 413, f"the body is larger than {limit // 1024} KiB")
            return None
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        await refuse(scope, send, 413,
                                     f"the body is larger than {limit // 1024} KiB")
                        return None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            await refuse(scope, send, 408,
                         f"the body did not arrive within {self.limits.body_timeout:g} s")
            return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def refuse(scope: Scope, send: Send, status: int, why: str) -> None:
    """Answer ``status`` with ``why`` (JSON under ``/api/``, text elsewhere)
    and close the connection: the rest of the request is not read."""
    if scope["path"].startswith("/api/"):
        body, kind = json.dumps({"error": why}).encode(), b"application/json"
    else:
        body, kind = f"{why}\n".encode(), b"text/plain; charset=utf-8"
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
