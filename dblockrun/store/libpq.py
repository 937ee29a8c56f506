"""A minimal binding to libpq through ctypes, for the lean store of ``exec``.

Importing psycopg takes 250-300 ms on a small machine, more than exec's whole
budget on PostgreSQL; loading libpq with ctypes takes about 4 ms. This is the
subset the lean store needs: connect with keyword/value parameters
(``PQconnectdbParams``, so no value is ever quoted into a connection string),
run one statement with its parameters sent apart from the SQL text
(``PQexecParams``, text format, ``$1``-style placeholders: values are never
formatted into SQL), and read text results.

The library is the libpq that psycopg-binary bundles (the one the SQLAlchemy
path uses), else the system's ``libpq.so.5``; :func:`load` returns None when
neither loads, and the lean store uses psycopg instead.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence

#: ConnStatusType CONNECTION_OK.
_CONNECTION_OK = 0
#: ExecStatusType of a statement that worked: PGRES_COMMAND_OK, PGRES_TUPLES_OK.
_SUCCESS = (1, 2)
#: PGresult error fields (postgres_ext.h).
_DIAG_SEVERITY = ord("S")
_DIAG_SQLSTATE = ord("C")

Row = tuple[str | None, ...]


class Error(Exception):
    """libpq or the server reported an error; ``sqlstate`` when the server sent one."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class OperationalError(Error):
    """The connection could not be made or was lost."""


class DataError(Error):
    """A parameter that cannot be sent as text (a NUL character, an unknown type)."""


_NOTICE_PROCESSOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


def _ignore_notice(_arg: int | None, _message: bytes | None) -> None:
    """Notices are dropped, as psycopg does with no handler (libpq would print them)."""


#: The C callback, at module level so that it lives as long as the connections.
_DROP_NOTICE = _NOTICE_PROCESSOR(_ignore_notice)


_lib: ctypes.CDLL | None = None
_tried = False


def _candidates() -> list[str]:
    """psycopg-binary's bundled libpq on sys.path (without importing psycopg),
    then the system's."""
    found: list[str] = []
    for entry in sys.path:
        folder = os.path.join(entry or os.curdir, "psycopg_binary.libs")
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        found += [os.path.join(folder, n) for n in names
                  if n.startswith("libpq-") and ".so" in n]
    return [*found, "libpq.so.5"]


def load() -> ctypes.CDLL | None:
    """libpq with the prototypes used here, or None if none can be loaded."""
    global _lib, _tried
    if not _tried:
        _tried = True
        for path in _candidates():
            try:
                _lib = _declare(ctypes.CDLL(path))
                break
            except (OSError, AttributeError):  # missing, or too old to have a function
                continue
    return _lib


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, s, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for name, restype, argtypes in (
        ("PQconnectdbParams", p, [ctypes.POINTER(s), ctypes.POINTER(s), i]),
        ("PQstatus", i, [p]),
        ("PQerrorMessage", s, [p]),
        ("PQfinish", None, [p]),
        ("PQbackendPID", i, [p]),
        ("PQsetNoticeProcessor", p, [p, _NOTICE_PROCESSOR, p]),
        ("PQexecParams", p, [p, s, i, p, ctypes.POINTER(s), p, p, i]),
        ("PQresultStatus", i, [p]),
        ("PQresultErrorMessage", s, [p]),
        ("PQresultErrorField", s, [p, i]),
        ("PQntuples", i, [p]),
        ("PQnfields", i, [p]),
        ("PQgetvalue", s, [p, i, i]),
        ("PQgetisnull", i, [p, i, i]),
        ("PQcmdTuples", s, [p]),
        ("PQclear", None, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def _text(value: object) -> bytes | None:
    """A parameter in PostgreSQL's text input format; None is SQL NULL."""
    if value is None:
        return None
    if isinstance(value, bool):
        return b"true" if value else b"false"
    if isinstance(value, int):
        return str(value).encode()
    if isinstance(value, float):
        return repr(value).encode()  # round-trips; 'inf' and 'nan' are valid input
    if isinstance(value, str):
        data = value.encode()
        if b"\0" in data:
            raise DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return data
    raise DataError(f"cannot send a {type(value).__name__} parameter")


def _decode(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", "replace")


class Result:
    """The rows (text, None for NULL) and the row count of one statement."""

    def __init__(self, rows: list[Row], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount


class Connection:
    """One connection in autocommit (libpq's default: no transaction is opened).

    Not thread-safe: callers serialise their use of it.
    """

    def __init__(self, lib: ctypes.CDLL, params: Mapping[str, str]) -> None:
        self._lib = lib
        keys = [k.encode() for k in params] + [None]
        values = [v.encode() for v in params.values()] + [None]
        key_array = (ctypes.c_char_p * len(keys))(*keys)
        value_array = (ctypes.c_char_p * len(values))(*values)
        # expand_dbname=0: a dbname is a name, never read as a connection string.
        conn = lib.PQconnectdbParams(key_array, value_array, 0)
        if not conn:
            raise OperationalError("connection failed: out of memory")
        self._conn: int | None = conn
        if lib.PQstatus(conn) != _CONNECTION_OK:
            message = _decode(lib.PQerrorMessage(conn)).strip()
            self.close()
            raise OperationalError(f"connection failed: {message}")
        lib.PQsetNoticeProcessor(conn, _DROP_NOTICE, None)

    def _handle(self) -> int:
        if self._conn is None:
            raise OperationalError("the connection is closed")
        return self._conn

    @property
    def closed(self) -> bool:
        return self._conn is None

    @property
    def broken(self) -> bool:
        """The connection was lost (the server went away, a network error)."""
        return self._conn is not None and self._lib.PQstatus(self._conn) != _CONNECTION_OK

    @property
    def backend_pid(self) -> int:
        return int(self._lib.PQbackendPID(self._handle()))

    def execute(self, sql: str, params: Sequence[object] = ()) -> Result:
        """Run one statement; ``$1``, ``$2``... in ``sql`` are ``params``, sent
        apart from it and typed by the server from where they stand."""
        lib, conn = self._lib, self._handle()
        encoded = [_text(v) for v in params]
        values = (ctypes.c_char_p * max(1, len(encoded)))(*encoded)
        res = lib.PQexecParams(conn, sql.encode(), len(encoded), None, values, None, None, 0)
        if not res:
            raise OperationalError(_decode(lib.PQerrorMessage(conn)).strip()
                                   or "the statement could not be sent")
        try:
            if lib.PQresultStatus(res) not in _SUCCESS:
                raise self._error(res)
            rows = [
                tuple(None if lib.PQgetisnull(res, r, c)
                      else _decode(lib.PQgetvalue(res, r, c))
                      for c in range(lib.PQnfields(res)))
                for r in range(lib.PQntuples(res))
            ]
            count = lib.PQcmdTuples(res)
            return Result(rows, int(count) if count else -1)
        finally:
            lib.PQclear(res)

    def _error(self, res: int) -> Error:
        lib = self._lib
        message = _decode(lib.PQresultErrorMessage(res)).strip()
        # As psycopg: without the severity prefix ("ERROR:  ", in the server's language).
        severity = _decode(lib.PQresultErrorField(res, _DIAG_SEVERITY))
        if severity and message.startswith(severity + ":"):
            message = message[len(severity) + 1:].strip()
        sqlstate = _decode(lib.PQresultErrorField(res, _DIAG_SQLSTATE)) or None
        cls = OperationalError if self.broken else Error
        return cls(message or "the statement failed", sqlstate)

    def cursor(self) -> Cursor:
        return Cursor(self)

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            self._lib.PQfinish(conn)


class Cursor:
    """The part of a DB-API cursor the lean store uses."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._rows: list[Row] = []
        self.rowcount = -1

    def execute(self, sql: str, params: Sequence[object] = ()) -> Cursor:
        result = self._conn.execute(sql, params)
        self._rows, self.rowcount = result.rows, result.rowcount
        return self

    def fetchone(self) -> Row | None:
        return self._rows.pop(0) if self._rows else None

    def close(self) -> None:
        self._rows = []


def connect(params: Mapping[str, str]) -> Connection:
    """A connection with these libpq keywords (host, port, dbname, user, ...).

    Raises OperationalError if it cannot be made, or if libpq cannot be loaded.
    """
    lib = load()
    if lib is None:
        raise OperationalError("libpq could not be loaded")
    return Connection(lib, params)
