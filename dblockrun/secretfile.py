"""A secret read from a file: the first line of a regular file, bounded.

``--db-file``, ``DBLOCKRUN_DB_FILE`` and ``database-file:`` (the database
URL) and ``{file: PATH}`` (a notification or ping URL) name such a file, a
secret mounted by systemd or Kubernetes. Only a regular file is read: it is
opened non-blocking and refused unless it is one, since a FIFO would hold the
reader until a writer came (a daemon's reload, ``validate``), and a device
(``/dev/zero``) never ends. At most :data:`LIMIT` bytes are read: a large
file without a newline is refused, not read to the end. Messages name the
file, never its content.
"""

from __future__ import annotations

import os
import stat

#: The longest first line read, in bytes (a URL is far shorter).
LIMIT = 64 * 1024

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
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise ValueError(f"{what} {path}: not a regular file ({kind})")
        head = _read_head(fd)
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    line, newline, _rest = head.partition(b"\n")
    if not newline and len(line) > LIMIT:
        raise ValueError(f"{what} {path}: the first line is longer than {LIMIT // 1024} KiB")
    try:
        return line.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path}: not UTF-8 text") from None


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
