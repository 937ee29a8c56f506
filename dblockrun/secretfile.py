"""Files dblockrun reads that someone else may have put there: regular
files only, bounded.

A secret (:func:`first_line`): ``--db-file``, ``DBLOCKRUN_DB_FILE`` and
``database-file:`` (the database URL) and ``{file: PATH}`` (a notification
or ping URL) name such a file, a secret mounted by systemd or Kubernetes.
The jobs file (:func:`whole_text`) is read the same way. Only a regular file
is read: it is opened non-blocking and refused unless it is one, since a
FIFO would hold the reader until a writer came (a daemon's reload,
``validate``), and a device (``/dev/zero``) never ends. Reads are bounded:
at most :data:`LIMIT` bytes of a secret's first line (a large file without
a newline is refused, not read to the end), at most :data:`TEXT_LIMIT` of a
jobs file. Messages name the file, never its content.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

#: The longest first line read, in bytes (a URL is far shorter).
LIMIT = 64 * 1024
#: The largest jobs file read, in bytes (10,000 jobs take about 1 MiB).
TEXT_LIMIT = 64 * 1024 * 1024

#: What a path that is not a regular file is, for messages.
_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISSOCK, "a socket"))


def first_line(path: str, what: str = "file") -> str:
    """The first line of the regular file ``path``, without the spaces
    around it. Raises ValueError naming ``what`` and ``path`` (never the
    content): unreadable, not a regular file, not UTF-8, or a first line
    longer than :data:`LIMIT` bytes."""
    try:
        head = _read_regular(path, _read_head)
    except _Refused as exc:
        raise ValueError(f"{what} {path}: {exc}" if exc.kind else f"cannot read {what} {path}: "
                         f"{exc}") from None
    line, newline, _rest = head.partition(b"\n")
    if not newline and len(line) > LIMIT:
        raise ValueError(f"{what} {path}: the first line is longer than {LIMIT // 1024} KiB")
    try:
        return line.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path}: not UTF-8 text") from None


def whole_text(path: str, limit: int = TEXT_LIMIT) -> str:
    """The UTF-8 text of the regular file ``path`` (the jobs file). Raises
    ValueError saying why, without the path (the caller names the file):
    ``cannot read: No such file or directory``, ``not a regular file (a
    named pipe)``, ``not UTF-8 text (...)``, or larger than ``limit`` bytes
    (not read past the limit)."""
    try:
        data = _read_regular(path, lambda fd: _read_upto(fd, limit + 1))
    except _Refused as exc:
        raise ValueError(str(exc) if exc.kind else f"cannot read: {exc}") from None
    if len(data) > limit:
        raise ValueError(f"larger than {_size(limit)}: not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"cannot read: not UTF-8 text ({exc.reason})") from None


class _Refused(Exception):
    """Why a file was not read: ``kind`` when it is not a regular file,
    else the system's reason."""

    def __init__(self, why: str, kind: bool = False) -> None:
        super().__init__(why)
        self.kind = kind


def _read_regular(path: str, read: Callable[[int], bytes]) -> bytes:
    """``read(fd)`` of ``path``, opened non-blocking, once it is known to be
    a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise _Refused(exc.strerror or str(exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise _Refused(f"not a regular file ({kind})", kind=True)
        return read(fd)
    except OSError as exc:
        raise _Refused(exc.strerror or str(exc)) from None
    finally:
        os.close(fd)


def _size(limit: int) -> str:
    return f"{limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"{limit} bytes"


def _read_upto(fd: int, most: int) -> bytes:
    """The file's bytes, at most ``most`` of them."""
    chunks: list[bytes] = []
    left = most
    while left > 0:
        got = os.read(fd, min(left, 1024 * 1024))
        if not got:
            break
        chunks.append(got)
        left -= len(got)
    return b"".join(chunks)


def _read_head(fd: int) -> bytes:
    """The file's bytes up to its first newline or ``LIMIT + 1`` bytes,
    whichever comes first (or all of a shorter file)."""
    head = b""
    while len(head) <= LIMIT:
        got = os.read(fd, LIMIT + 1 - len(head))
        if not got:
            break
        head += got
        if b"\n" in got:
            break
    return head
