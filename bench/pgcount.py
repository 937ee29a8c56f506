"""A TCP proxy in front of PostgreSQL that counts the statements clients send.

It parses the frontend side of the wire protocol (v3): after the untyped
start-up packets, every message is a type byte and a 32-bit length. A
statement is a simple-query message ('Q') or an extended-protocol Execute
('E'); Parse, Bind, Describe and Sync are not statements, and a 'Q' holding
several statements counts once. Connections that switch to TLS or GSSAPI
encryption cannot be read: they are counted in ``encrypted`` (the benches
fail loudly if that is not 0; the local server has ``ssl = off``).

The server's side is forwarded untouched. Each direction of each connection
has its own thread with blocking sockets.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102


class _Frontend:
    """The parser state of one client's stream."""

    def __init__(self) -> None:
        self.started = False  # past the untyped start-up packets
        self.header = bytearray()  # a partial message header
        self.skip = 0  # bytes of the current message body still to pass
        self.negotiating = False  # sent SSLRequest/GSSENCRequest, no answer seen yet
        self.encrypted = False
        self.counts: Counter[str] = Counter()
        #: Bytes each way (any protocol: the parse does not matter for these).
        self.sent = 0
        self.received = 0

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        i, n = 0, len(view)
        while i < n and not self.encrypted:
            if self.skip:
                step = min(self.skip, n - i)
                self.skip -= step
                i += step
                continue
            need = 5 if self.started else 8  # type + length, or length + code
            take = min(need - len(self.header), n - i)
            self.header += view[i:i + take]
            i += take
            if len(self.header) < need:
                return
            if self.started:
                kind = chr(self.header[0])
                length = struct.unpack("!I", self.header[1:5])[0]
                self.counts[kind] += 1
                self.skip = length - 4
            else:
                length, code = struct.unpack("!II", self.header)
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    self.negotiating = True
                elif code != CANCEL_REQUEST:
                    self.started = True  # StartupMessage: typed messages follow
                self.skip = length - 8
            self.header.clear()


class CountingProxy:
    """``with CountingProxy(5432) as proxy:`` then connect to ``proxy.port``;
    ``proxy.statements()`` is the number of 'Q' + 'E' messages so far."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._frontends: list[_Frontend] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> CountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def counts(self) -> Counter[str]:
        """Frontend messages by type, summed over every connection so far."""
        total: Counter[str] = Counter()
        with self._lock:
            for f in self._frontends:
                total.update(f.counts)
        return total

    def statements(self) -> int:
        c = self.counts()
        return c["Q"] + c["E"]

    def bytes(self) -> tuple[int, int]:
        """Bytes the clients sent and received so far, over every connection."""
        with self._lock:
            return (sum(f.sent for f in self._frontends),
                    sum(f.received for f in self._frontends))

    def encrypted(self) -> int:
        with self._lock:
            return sum(1 for f in self._frontends if f.encrypted)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            socks, self._sockets = self._sockets, []
        # shutdown() wakes the threads blocked in accept() and recv(); close() alone may not.
        for s in [self._listener, *socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            front = _Frontend()
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._frontends.append(front)
                self._sockets += [client, upstream]
            threading.Thread(target=self._client_to_server, args=(client, upstream, front),
                             daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(upstream, client, front),
                             daemon=True).start()

    @staticmethod
    def _client_to_server(src: socket.socket, dst: socket.socket, front: _Frontend) -> None:
        try:
            while data := src.recv(65536):
                front.sent += len(data)
                front.feed(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)

    @staticmethod
    def _server_to_client(src: socket.socket, dst: socket.socket, front: _Frontend) -> None:
        try:
            while data := src.recv(65536):
                front.received += len(data)
                if front.negotiating:
                    # One byte answers SSLRequest/GSSENCRequest: 'N' = go on in clear.
                    front.negotiating = False
                    if data[:1] != b"N":
                        front.encrypted = True
                dst.sendall(data)
        except OSError:
            pass
        finally:
            _shut(dst)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
