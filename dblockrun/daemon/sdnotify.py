"""systemd's notify protocol (``Type=notify``, ``WatchdogSec=``), written out:
one datagram per message to the unix socket ``$NOTIFY_SOCKET`` names (a
path, or ``@name`` in the abstract namespace), newline-separated
``KEY=VALUE`` lines. systemd documents it as a stable interface for
programs to reimplement (sd_notify(3)); it is a few lines, no dependency.

The daemon sends ``READY=1`` once it has loaded its jobs and its start-up
against the database succeeded, ``STATUS=`` lines while it waits for the
database and runs, ``STOPPING=1`` when its shutdown starts, and, when
``$WATCHDOG_USEC`` is set (and ``$WATCHDOG_PID``, if set, is this process),
``WATCHDOG=1`` from its main loop at least every half of that time, while
no background thread is crashed (dblockrun/supervise.py). The
variables are taken out of the environment, so commands the daemon starts
do not inherit them. Without ``$NOTIFY_SOCKET`` nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, MutableMapping

log = logging.getLogger("dblockrun")

_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def _address(value: str | None) -> str | bytes | None:
    """The socket address ``$NOTIFY_SOCKET`` names (``@``: abstract)."""
    if not value or value[0] not in "/@":
        return None  # unset, or a vsock address (systemd in a VM): not used here
    return b"\0" + value[1:].encode() if value[0] == "@" else value


def _watchdog(usec: str | None, pid: str | None) -> float | None:
    """Seconds between two ``WATCHDOG=1`` at most: half of ``WATCHDOG_USEC``,
    when the watchdog is meant for this process."""
    try:
        micros = int(usec or "")
        if pid and int(pid) != os.getpid():
            return None
    except ValueError:
        return None
    return micros / 2e6 if micros > 0 else None


class SystemdNotifier:
    """Messages to systemd, or nothing when not started by it."""

    def __init__(self, environ: MutableMapping[str, str] | None = None, *,
                 alive: Callable[[], bool] = lambda: True) -> None:
        """``alive``: whether to go on with the watchdog pings (False: let
        systemd's watchdog restart this process)."""
        env = os.environ if environ is None else environ
        self._alive = alive
        self.address = _address(env.get("NOTIFY_SOCKET"))
        every = _watchdog(env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID"))
        #: The longest gap between two watchdog pings (None: no watchdog).
        self.watchdog_every = every if self.address is not None else None
        for name in _VARIABLES:
            env.pop(name, None)
        self._sock: socket.socket | None = None
        self._last_ping = 0.0
        self._failed = False

    def send(self, *lines: str) -> None:
        """One message; a failure is logged once, never raised."""
        if self.address is None:
            return
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd (NOTIFY_SOCKET): %s", exc)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def sleep_cap(self) -> float | None:
        """The longest the main loop may sleep between two pings."""
        return None if self.watchdog_every is None else self.watchdog_every / 2

    def watchdog(self) -> None:
        """``WATCHDOG=1`` if half the gap has passed since the last one: the
        loop, which sleeps at most :meth:`sleep_cap`, then pings at least
        every :attr:`watchdog_every`. None while ``alive()`` says no."""
        if self.watchdog_every is None or not self._alive():
            return
        now = time.monotonic()
        if now - self._last_ping >= self.watchdog_every / 2:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
