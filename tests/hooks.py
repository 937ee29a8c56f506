"""An HTTP server a test starts to receive what daemons send: notifications
(apprise's ``json://``) and heartbeat pings, each request recorded."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socket import socket
from urllib.parse import parse_qs, urlsplit

from helpers import harness_thread


@dataclass(frozen=True)
class Hit:
    path: str
    query: dict[str, list[str]]
    body: bytes

    def json(self) -> dict[str, str]:
        doc: dict[str, str] = json.loads(self.body)
        return doc

    def field(self, name: str) -> str:
        """``name: value`` from a notification's message."""
        for line in self.json()["message"].splitlines():
            if line.startswith(f"{name}: "):
                return line.split(": ", 1)[1]
        raise AssertionError(f"no {name!r} in {self.json()['message']!r}")


class HarnessHTTPServer(ThreadingHTTPServer):
    """An HTTP server of the test harness: each request served in a thread
    of its own, named as the harness's (:func:`helpers.harness_thread`), so
    that a daemon process's request served while a command runs in this
    process is not taken for a thread the command left behind."""

    def process_request(self, request: socket | tuple[bytes, socket],
                        client_address: tuple[str, int]) -> None:
        harness_thread(self.process_request_thread, request, client_address,
                       what=f"HTTP request from {client_address[0]}:{client_address[1]}")


class Hooks:
    """An HTTP server recording every request; paths under /broken answer
    500, under /slow after 3 s."""

    def __init__(self) -> None:
        self.hits: list[Hit] = []
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = urlsplit(self.path)
                with hooks.lock:
                    hooks.hits.append(Hit(parts.path, parse_qs(parts.query), body))
                code = 500 if parts.path.startswith("/broken") else 200
                if parts.path.startswith("/slow"):
                    time.sleep(3)
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = HarnessHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        harness_thread(self.server.serve_forever, what=f"hooks on port {self.port}")

    def url(self, scheme: str, path: str) -> str:
        return f"{scheme}://127.0.0.1:{self.port}{path}"

    def under(self, prefix: str) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.path.startswith(prefix)]
