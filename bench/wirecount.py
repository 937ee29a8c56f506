"""TCP proxies that count the statements clients send, at the wire.

    with PgCountingProxy(5432) as proxy:    # or MyCountingProxy(3306)
        ... connect to 127.0.0.1:proxy.port ...
        proxy.statements()

One proxy, :class:`CountingProxy`: a listener on a free local port, and for
each client connection one to the server and two threads with blocking
sockets. The server's side is forwarded untouched; the client's is forwarded
and read as it passes by a counter of its protocol, one per connection:

* :class:`PgStream`, PostgreSQL's frontend protocol (v3): after the untyped
  start-up packets, every message is a type byte and a 32-bit length. A
  statement is a simple-query message ('Q') or an extended-protocol Execute
  ('E'); Parse, Bind, Describe and Sync are not statements. Connections that
  switch to TLS or GSSAPI encryption cannot be read: they are counted in
  ``encrypted()`` (the benches fail loudly if that is not 0; the local server
  has ``ssl = off``).
* :class:`MyStream`, MySQL/MariaDB's: a packet is a 3-byte length, a
  sequence number and the payload. A command starts a new sequence (number
  0) and its first byte says which: COM_QUERY (0x03) and COM_STMT_EXECUTE
  (0x17) are statements, counted by their first word (``SELECT``,
  ``UPDATE``... ; ``EXECUTE``), to see where an idle cost goes. COM_PING and
  the handshake answers (sequence numbers above 0) are not statements. TLS
  is never asked for (PyMySQL without ``ssl``).

On both, a query of several statements (PostgreSQL's 'Q', MySQL's
CLIENT.MULTI_STATEMENTS) counts once: a round trip.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter
from typing import Self

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
COM_QUERY = 0x03
COM_STMT_EXECUTE = 0x17


class Stream:
    """What one client connection sent: its statements by kind, and its bytes
    each way. A protocol's subclass reads the client's side (:meth:`feed`)."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock  # the proxy's: counts are read while a connection adds to them
        self.counts: Counter[str] = Counter()
        self.encrypted = False  # switched to encryption: unreadable from then on
        self.sent = 0
        self.received = 0

    def count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] += 1

    def feed(self, data: bytes) -> None:
        """Bytes the client sent, in order."""
        raise NotImplementedError

    def answer(self, data: bytes) -> None:
        """Bytes the server sent, in order (only the bytes count here)."""


class PgStream(Stream):
    """The client's side of a PostgreSQL connection; counts 'Q' and 'E'."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.started = False  # past the untyped start-up packets
        self.header = bytearray()  # a partial message header
        self.skip = 0  # bytes of the current message body still to pass
        self.negotiating = False  # sent SSLRequest/GSSENCRequest, no answer seen yet

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
                if kind in "QE":
                    self.count(kind)
                self.skip = length - 4
            else:
                length, code = struct.unpack("!II", self.header)
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    self.negotiating = True
                elif code != CANCEL_REQUEST:
                    self.started = True  # StartupMessage: typed messages follow
                self.skip = length - 8
            self.header.clear()

    def answer(self, data: bytes) -> None:
        if self.negotiating:
            # One byte answers SSLRequest/GSSENCRequest: 'N' = go on in clear.
            self.negotiating = False
            if data[:1] != b"N":
                self.encrypted = True


class MyStream(Stream):
    """The client's side of a MySQL/MariaDB connection; counts each
    COM_QUERY by its first word, each COM_STMT_EXECUTE as ``EXECUTE``."""

    def __init__(self, lock: threading.Lock) -> None:
        super().__init__(lock)
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 5:
            length = struct.unpack("<I", self.buf[:3] + b"\0")[0]
            if len(self.buf) < 4 + length:
                return
            command = self.buf[4]
            if self.buf[3] == 0 and length and command in (COM_QUERY, COM_STMT_EXECUTE):
                self.count(bytes(self.buf[5:4 + min(length, 40)]).split(b" ", 1)[0]
                           .decode("latin-1").upper() if command == COM_QUERY else "EXECUTE")
            self.buf = self.buf[4 + length:]


class CountingProxy:
    """A proxy to ``target_host:target_port`` on ``127.0.0.1:port``, whose
    clients' statements its ``stream`` class counts."""

    stream: type[Stream] = Stream

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self._lock = threading.Lock()
        self._streams: list[Stream] = []
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def counts(self) -> Counter[str]:
        """Statements by kind, summed over every connection so far."""
        total: Counter[str] = Counter()
        with self._lock:
            for s in self._streams:
                total.update(s.counts)
        return total

    def statements(self) -> int:
        return sum(self.counts().values())

    def bytes(self) -> tuple[int, int]:
        """Bytes the clients sent and received so far, over every connection."""
        with self._lock:
            return (sum(s.sent for s in self._streams),
                    sum(s.received for s in self._streams))

    def encrypted(self) -> int:
        """Connections that switched to encryption (their statements uncounted)."""
        with self._lock:
            return sum(1 for s in self._streams if s.encrypted)

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
            stream = self.stream(self._lock)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._streams.append(stream)
                self._sockets += [client, upstream]
            for src, dst, to_server in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=_pump, args=(src, dst, stream),
                                 kwargs={"to_server": to_server}, daemon=True).start()


class PgCountingProxy(CountingProxy):
    """In front of PostgreSQL: ``statements()`` is the 'Q' + 'E' messages."""

    stream = PgStream


class MyCountingProxy(CountingProxy):
    """In front of MySQL/MariaDB: ``statements()`` is the COM_QUERY and
    COM_STMT_EXECUTE commands, ``by_word()`` the same by first word."""

    stream = MyStream

    def by_word(self) -> Counter[str]:
        return self.counts()


def _pump(src: socket.socket, dst: socket.socket, stream: Stream, *, to_server: bool) -> None:
    """Copy one direction of a connection, the stream reading along."""
    try:
        while data := src.recv(65536):
            if to_server:
                stream.sent += len(data)
                stream.feed(data)
            else:
                stream.received += len(data)
                stream.answer(data)
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
