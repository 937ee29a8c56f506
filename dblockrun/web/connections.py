"""The HTTP server's connections: how many are open at once, how long one
may sit idle, and how often the same complaint is logged.

uvicorn accepts every connection and keeps one that sends nothing forever:
1,100 such sockets under ``ulimit -n 1024`` took every descriptor, so
every request timed out, and asyncio's accept loop logged ``[Errno 24]``
1.6 million times in 30 s. Here (:func:`protocol`, uvicorn's own h11
protocol with its public connection hooks):

- at most :func:`~dblockrun.web.limits.connection_cap` connections are
  open; a new one beyond closes the one idle the longest (no request in
  progress), so a flood of idle sockets holds a bounded number of
  descriptors and a real request still gets in at once;
- a connection that has not sent a whole request head
  :attr:`~Limits.idle_timeout` seconds after it opened (or after its last
  answer) is closed, and one whose answer the client has not read for
  :attr:`~Limits.write_timeout` seconds too;
- :class:`Repeats` logs a repeated complaint (the accept loop's, uvicorn's
  "Invalid HTTP request") once per :attr:`~Limits.log_every` seconds, with
  how many it held back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

from dblockrun.web.limits import Limits

log = logging.getLogger("dblockrun.web")

#: How often the open connections are looked at (seconds).
SWEEP_EVERY = 1.0


class Guard:
    """The connections of one server, and its limits."""

    def __init__(self, limits: Limits, cap: int) -> None:
        self.limits = limits
        self.cap = cap
        self.open: set[GuardedH11] = set()
        self._sweeping: asyncio.TimerHandle | None = None

    def admit(self, new: GuardedH11) -> None:
        """Make room for ``new``: close the connection idle the longest, or
        ``new`` itself when every other one has a request in progress."""
        if len(self.open) <= self.cap:
            return
        live = [c for c in self.open if not c.transport.is_closing()]
        if len(live) <= self.cap:  # the rest close at the next turn of the loop
            return
        idle = [c for c in live if c is not new and not c.busy()]
        victim = min(idle, key=lambda c: c.idle_since) if idle else new
        log.warning("%d connections open (the limit): closed the %s", self.cap,
                    "one idle the longest" if victim is not new else
                    "new one, as every other one has a request in progress")
        victim.transport.close()

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections idle too long or whose answer is not read;
        again in :data:`SWEEP_EVERY` while any is open."""
        now = loop.time()
        for conn in list(self.open):
            if conn.transport.is_closing():
                continue
            if not conn.busy():
                if now - conn.idle_since > self.limits.idle_timeout:
                    conn.transport.close()
            elif conn.flow.write_paused:
                conn.stuck_since = conn.stuck_since or now
                if now - conn.stuck_since > self.limits.write_timeout:
                    conn.transport.abort()
            else:
                conn.stuck_since = None
        self._sweeping = None
        if self.open:
            self.start(loop)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweeping is None:
            self._sweeping = loop.call_later(SWEEP_EVERY, self.sweep, loop)


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol, each connection known to its server's :class:`Guard`."""

    guard: Guard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        #: When it last became idle: opened, or its last answer sent (loop time).
        self.idle_since = self.loop.time()
        #: Since when its answer has waited for the client to read (None: not waiting).
        self.stuck_since: float | None = None
        self.guard.open.add(self)
        self.guard.admit(self)
        self.guard.start(self.loop)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.open.discard(self)
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        self.idle_since = self.loop.time()
        self.stuck_since = None
        super().on_response_complete()

    def busy(self) -> bool:
        """Whether a request is in progress (its head read, its answer not done)."""
        return self.cycle is not None and not self.cycle.response_complete


def protocol(limits: Limits, cap: int) -> type[GuardedH11]:
    """The protocol class uvicorn serves with (``http=``): its connections
    share one :class:`Guard` of ``cap`` connections."""
    return type("GuardedH11", (GuardedH11,), {"guard": Guard(limits, cap)})


class Repeats(logging.Filter):
    """Lets a message (its first line) through once per ``every`` seconds;
    the next one that passes says how many were held back meanwhile."""

    def __init__(self, every: float) -> None:
        super().__init__()
        self.every = every
        self._last: dict[str, tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{str(record.msg).partition(chr(10))[0][:200]}"
        now = time.monotonic()
        last, held = self._last.get(key, (-self.every, 0))
        if now - last < self.every:
            self._last[key] = (last, held + 1)
            return False
        if len(self._last) > 1000:  # messages are few; never let the table grow
            self._last.clear()
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {now - last:.0f} s)"
        return True


#: The loggers whose repeated lines a client can cause.
NOISY = ("asyncio", "uvicorn.error", "dblockrun.web")


def quiet_repeats(limits: Limits) -> None:
    for name in NOISY:
        logging.getLogger(name).addFilter(Repeats(limits.log_every))


def uvicorn_options(limits: Limits, cap: int) -> dict[str, Any]:
    """What uvicorn is run with for these limits."""
    return {"http": protocol(limits, cap), "timeout_keep_alive": limits.keep_alive,
            "h11_max_incomplete_event_size": limits.max_head, "backlog": limits.backlog}
