"""A TCP proxy in front of MySQL/MariaDB that counts the statements clients send.

A client packet is a 3-byte length, a sequence number and the payload. A
command starts a new sequence (number 0) and its first byte says which:
COM_QUERY (0x03) and COM_STMT_EXECUTE (0x17) are statements; a COM_QUERY
holding several statements (CLIENT.MULTI_STATEMENTS) counts once, as
bench/pgcount.py counts a PostgreSQL 'Q' message. COM_PING and the
handshake answers (sequence numbers above 0) are not statements. TLS is
never asked for (PyMySQL without ``ssl``).

``by_word()`` breaks the count down by each statement's first word
(``SELECT``, ``UPDATE``, ``COMMIT`` ...), to see where an idle cost goes.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import Counter

COM_QUERY = 0x03
COM_STMT_EXECUTE = 0x17


class MyCountingProxy:
    """``proxy = MyCountingProxy(3306)``, then connect to ``proxy.port``;
    ``proxy.statements()`` is the number of statements sent so far."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.words: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> MyCountingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def statements(self) -> int:
        with self._lock:
            return sum(self.words.values())

    def by_word(self) -> Counter[str]:
        with self._lock:
            return Counter(self.words)

    def close(self) -> None:
        for s in [self._listener, *self._socks]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                return
            upstream.settimeout(None)
            self._socks += [client, upstream]
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket) -> None:
        buf = b""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                buf += data
                while len(buf) >= 5:
                    length = struct.unpack("<I", buf[:3] + b"\0")[0]
                    if len(buf) < 4 + length:
                        break
                    if buf[3] == 0 and length and buf[4] in (COM_QUERY, COM_STMT_EXECUTE):
                        word = (bytes(buf[5:4 + min(length, 40)]).split(b" ", 1)[0]
                                .decode("latin-1").upper() if buf[4] == COM_QUERY else "EXECUTE")
                        with self._lock:
                            self.words[word] += 1
                    buf = buf[4 + length:]
        except OSError:
            pass

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
