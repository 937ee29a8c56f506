"""What one client can make ``dblockrun web`` spend: every limit in one
place (docs/operations/web.md states each). A stranger who reaches the port
gets a bounded share of the server's memory, descriptors, threads and
password checks, and the server stays up for everyone else."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    #: The largest request body (a form, an API action's JSON): every form
    #: and body the dashboard takes is far smaller. Checked while the body
    #: is read, before anything parses it: a longer one is 413.
    max_body: int = 64 * 1024
    #: The whole body must arrive within this many seconds (408 otherwise).
    body_timeout: float = 10.0
    #: The largest request head (request line and headers; h11's limit): 431.
    max_head: int = 16 * 1024
    #: Connections open at once, at most; a new one beyond closes the one
    #: idle the longest (none idle: the new one is closed). Lowered to the
    #: open-file limit less :attr:`fd_reserve`.
    max_connections: int = 256
    #: Descriptors kept for the database pool, the log and the files served.
    fd_reserve: int = 128
    #: The listening socket's queue, and the most connections taken from it
    #: at once (asyncio accepts up to this many before the first is served,
    #: each a descriptor): :func:`connection_cap` leaves room for three rounds.
    backlog: int = 128
    #: A connection that has not sent a whole request head this many
    #: seconds after it opened, or after its last answer, is closed.
    idle_timeout: float = 10.0
    #: uvicorn's keep-alive: an idle connection after an answer is closed
    #: after this many seconds without a new request.
    keep_alive: float = 5.0
    #: An answer the client has not read for this many seconds (the
    #: server's send buffer full all along): the connection is closed.
    write_timeout: float = 30.0
    #: Sign-in attempts per address and per user name (across addresses)
    #: in :attr:`sign_in_window` seconds; each is counted before its
    #: password is checked, the rest get 429 until the window moves on.
    sign_in_attempts: int = 5
    sign_in_window: float = 60.0
    #: Client addresses and unknown user names the sign-in limit remembers
    #: (the least recently seen are forgotten first); the users file's
    #: names are always remembered.
    sign_in_remembered: int = 4096
    #: Password checks (argon2, 64 MiB each) running at once; up to
    #: :attr:`password_queue` more wait their turn, at most
    #: :attr:`password_wait` seconds; the rest get 429 at once.
    password_checks: int = 2
    password_queue: int = 8
    password_wait: float = 10.0
    #: A session ends this many seconds after its sign-in, whatever it does.
    session_lifetime: float = 12 * 3600.0
    #: A session key (``--secret-file``, ``DBLOCKRUN_WEB_SECRET``) is at least this long, in bytes.
    min_secret: int = 32
    #: The accept loop's error ("too many open files") is logged at most once per this many seconds.
    log_every: float = 10.0


def connection_cap(limits: Limits, open_files: int) -> int:
    """The connections served at once: :attr:`Limits.max_connections`, less
    if the process may open fewer files (``ulimit -n``) than that, the
    reserve and three rounds of accepts; at least 16."""
    return max(16, min(limits.max_connections,
                       open_files - limits.fd_reserve - 3 * limits.backlog))
