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
  ('E'); Parse, Bind, Describe and Sync are not statements. An Execute is
  counted by the first word of the SQL its portal was bound to (Parse names
  the statement's text, Bind the portal's statement). A round trip is a 'Q'
  or a Sync ('S') after an Execute: each is answered by ReadyForQuery, which
  the client waits for (a pipeline's Executes share one). A Sync with no
  Execute before it is a preparation (psycopg prepares a statement on its
  sixth execution on a connection): not counted, as it comes once per
  connection and statement, when depends on a process's age, not on its
  code. Connections that switch to TLS or
  GSSAPI encryption cannot be read: they are counted in ``encrypted()`` (the
  benches fail loudly if that is not 0; the local server has ``ssl = off``).
* :class:`MyStream`, MySQL/MariaDB's: a packet is a 3-byte length, a
  sequence number and the payload. A command starts a new sequence (number
  0) and its first byte says which: COM_QUERY (0x03) and COM_STMT_EXECUTE
  (0x17) are statements, counted by their first word (``SELECT``,
  ``UPDATE``... ; ``EXECUTE``), to see where an idle cost goes. Every
  command but COM_QUIT is a round trip (COM_PING too); the handshake
  answers (sequence numbers above 0) are neither. TLS is never asked for
  (PyMySQL without ``ssl``).

On both, a query of several statements (PostgreSQL's 'Q', MySQL's
CLIENT.MULTI_STATEMENTS) counts once: a round trip. Each statement is also
kept with the moment it passed (``log()``), to count those of a window of
time afterwards, and to see which loop sent what.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple, Self
from urllib.parse import urlsplit

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
COM_QUIT = 0x01
COM_QUERY = 0x03
COM_STMT_EXECUTE = 0x17
#: The start of a statement's text kept as its shape (its literals made
#: ``?`` first, within four times as many bytes: a literal's length never
#: moves the cut).
SHAPE_BYTES = 512
#: Leading blanks, comments and parentheses before a statement's first word.
_LEAD = re.compile(r"(?:\s+|/\*.*?\*/|--[^\n]*\n|\()*", re.S)
#: What differs between two sendings of one statement: literals (MySQL's
#: client-side parameters; one cut short at SHAPE_BYTES too) and blanks.
_VARYING = re.compile(r"'(?:[^'\\]|\\.|'')*(?:'|$)|\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b|\s+",
                      re.I)


class Sent(NamedTuple):
    """One statement as it passed the proxy."""

    at: float  # time.monotonic()
    kind: str  # its first word: SELECT, UPDATE ...
    shape: str  # the start of its text, literals as ``?``: the same statement, sent again
    conn: int = 0  # its connection: the proxy's 0, 1, 2 ... in the order they came


def shape_of(sql: bytes) -> Sent:
    """A statement's kind and shape (``at`` and ``conn`` are filled in as it
    is counted)."""
    text = sql[:4 * SHAPE_BYTES].decode("latin-1")
    lead = _LEAD.match(text)
    rest = text[lead.end():] if lead else text
    kind = rest.split(None, 1)[0][:20].upper() if rest.strip() else "?"
    shape = _VARYING.sub(lambda m: " " if m[0].isspace() else "?", text).strip()
    return Sent(0.0, kind, shape[:SHAPE_BYTES])


#: A statement whose text the proxy did not see; a prepared one executed (MySQL).
UNKNOWN = Sent(0.0, "?", "?")
EXECUTE = Sent(0.0, "EXECUTE", "EXECUTE")


class Stream:
    """What one client connection sent: its statements by kind, and its bytes
    each way. A protocol's subclass reads the client's side (:meth:`feed`)."""

    def __init__(self, lock: threading.Lock, conn: int = 0) -> None:
        self._lock = lock  # the proxy's: counts are read while a connection adds to them
        self.conn = conn  # its number among the proxy's connections
        self.counts: Counter[str] = Counter()
        self.log: list[Sent] = []  # each statement, as it passed
        self.trips = 0  # round trips: requests the client waits for an answer to
        self.encrypted = False  # switched to encryption: unreadable from then on
        self.sent = 0
        self.received = 0

    def count(self, sent: Sent) -> None:
        sent = sent._replace(at=time.monotonic(), conn=self.conn)
        with self._lock:
            self.counts[sent.kind] += 1
            self.log.append(sent)

    def trip(self) -> None:
        with self._lock:
            self.trips += 1

    def feed(self, data: bytes) -> None:
        """Bytes the client sent, in order."""
        raise NotImplementedError

    def answer(self, data: bytes) -> None:
        """Bytes the server sent, in order (only the bytes count here)."""


class PgStream(Stream):
    """The client's side of a PostgreSQL connection; counts 'Q' and 'E' by
    their SQL's first word, round trips by 'Q' and 'S'."""

    #: The messages whose body is read: Parse, Bind, Execute, Query.
    READ = frozenset(b"PBEQ")

    def __init__(self, lock: threading.Lock, conn: int = 0) -> None:
        super().__init__(lock, conn)
        self.started = False  # past the untyped start-up packets
        self.header = bytearray()  # a partial message header
        self.skip = 0  # bytes of the current message body still to pass
        self.body = bytearray()  # the body read so far of a READ message
        self.reading = 0  # its type (0: none), ``skip`` its bytes still to come
        self.negotiating = False  # sent SSLRequest/GSSENCRequest, no answer seen yet
        self.prepared: dict[bytes, Sent] = {}  # statement name -> its shape
        self.portals: dict[bytes, Sent] = {}  # portal name -> its statement's shape
        self.executed = False  # an Execute since the last Sync

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        i, n = 0, len(view)
        while i < n and not self.encrypted:
            if self.skip:
                step = min(self.skip, n - i)
                if self.reading:
                    self.body += view[i:i + step]
                self.skip -= step
                i += step
                if not self.skip and self.reading:
                    self.message(self.reading, bytes(self.body))
                    self.reading = 0
                    self.body.clear()
                continue
            need = 5 if self.started else 8  # type + length, or length + code
            take = min(need - len(self.header), n - i)
            self.header += view[i:i + take]
            i += take
            if len(self.header) < need:
                return
            if self.started:
                kind = self.header[0]
                length = struct.unpack("!I", self.header[1:5])[0]
                if kind == ord("S") and self.executed:
                    self.trip()
                    self.executed = False
                self.skip = length - 4
                if kind in self.READ:
                    self.reading = kind
                    if not self.skip:
                        self.message(kind, b"")
                        self.reading = 0
            else:
                length, code = struct.unpack("!II", self.header)
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    self.negotiating = True
                elif code != CANCEL_REQUEST:
                    self.started = True  # StartupMessage: typed messages follow
                self.skip = length - 8
            self.header.clear()

    def message(self, kind: int, body: bytes) -> None:
        """A whole Parse, Bind, Execute or Query message's body."""
        name, _, rest = body.partition(b"\0")
        if kind == ord("P"):  # statement name, query, ...
            self.prepared[name] = shape_of(rest.partition(b"\0")[0])
        elif kind == ord("B"):  # portal name, statement name, ...
            self.portals[name] = self.prepared.get(rest.partition(b"\0")[0], UNKNOWN)
        elif kind == ord("E"):  # portal name, row limit
            self.count(self.portals.get(name, UNKNOWN))
            self.executed = True
        else:  # 'Q': a query string, answered by its own ReadyForQuery
            self.count(shape_of(name))
            self.trip()

    def answer(self, data: bytes) -> None:
        if self.negotiating:
            # One byte answers SSLRequest/GSSENCRequest: 'N' = go on in clear.
            self.negotiating = False
            if data[:1] != b"N":
                self.encrypted = True


class MyStream(Stream):
    """The client's side of a MySQL/MariaDB connection; counts each
    COM_QUERY by its first word, each COM_STMT_EXECUTE as ``EXECUTE``."""

    def __init__(self, lock: threading.Lock, conn: int = 0) -> None:
        super().__init__(lock, conn)
        self.buf = b""

    def feed(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= 5:
            length = struct.unpack("<I", self.buf[:3] + b"\0")[0]
            if len(self.buf) < 4 + length:
                return
            command = self.buf[4]
            if self.buf[3] == 0 and length:
                if command == COM_QUERY:
                    self.count(shape_of(self.buf[5:4 + min(length, 4 * SHAPE_BYTES + 1)]))
                elif command == COM_STMT_EXECUTE:
                    self.count(EXECUTE)
                if command != COM_QUIT:
                    self.trip()
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

    def round_trips(self) -> int:
        """Requests the clients waited for an answer to, so far."""
        with self._lock:
            return sum(s.trips for s in self._streams)

    def log(self) -> list[Sent]:
        """Every statement so far, in order of time."""
        with self._lock:
            return sorted((entry for s in self._streams for entry in s.log),
                          key=lambda sent: sent.at)

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
            with self._lock:
                stream = self.stream(self._lock, len(self._streams))
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._streams.append(stream)
                self._sockets += [client, upstream]
            for src, dst, to_server in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=_pump, args=(src, dst, stream),
                                 kwargs={"to_server": to_server}, daemon=True).start()


    def by_word(self) -> Counter[str]:
        """Statements by their first word (``counts()``)."""
        return self.counts()


class PgCountingProxy(CountingProxy):
    """In front of PostgreSQL: ``statements()`` is the 'Q' + 'E' messages."""

    stream = PgStream


class MyCountingProxy(CountingProxy):
    """In front of MySQL/MariaDB: ``statements()`` is the COM_QUERY and
    COM_STMT_EXECUTE commands."""

    stream = MyStream


#: The counting proxy of each backend.
PROXIES: dict[str, type[CountingProxy]] = {"postgresql": PgCountingProxy,
                                           "mariadb": MyCountingProxy}


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


def proxied(url: str, proxy: CountingProxy) -> str:
    """``url`` (``scheme://user@host:port/db``) through ``proxy``."""
    parts = urlsplit(url)
    return url.replace(f"@{parts.netloc.rpartition('@')[2]}/", f"@127.0.0.1:{proxy.port}/", 1)


@contextmanager
def counting(backend: str, url: str) -> Iterator[tuple[CountingProxy, str]]:
    """A counting proxy in front of ``url``'s server (``backend``:
    postgresql or mariadb), and the URL through it."""
    parts = urlsplit(url)
    if parts.port is None:
        raise ValueError(f"{url}: no port to put a proxy in front of")
    with PROXIES[backend](parts.port, parts.hostname or "127.0.0.1") as proxy:
        yield proxy, proxied(url, proxy)
