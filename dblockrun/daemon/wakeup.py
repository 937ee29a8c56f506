"""A wake-up call for the daemon's main loop that a signal handler may ring.

`threading.Event` is not safe there: its ``set()`` takes a lock that the main
thread may hold at the instant the signal arrives (inside its own ``wait()`` or
``clear()``), and the handler, which runs on the main thread, then waits for
itself forever. A byte written to a non-blocking pipe takes no lock.
"""

from __future__ import annotations

import os
import select

from dblockrun.running.runner import GRACE_RAN_OUT, SECOND_INTERRUPT


class Wakeup:
    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def set(self) -> None:
        """Wake the waiter (now, or at its next wait). Safe in a signal handler."""
        if self._write < 0:
            return  # closed
        try:
            os.write(self._write, b"\0")
        except BlockingIOError:
            pass  # the pipe is full: a wake-up is already pending

    def wait(self, timeout: float) -> bool:
        """Sleep until `set()` or ``timeout`` seconds; True if woken. Consumes the wake-ups."""
        ready, _, _ = select.select([self._read], [], [], max(0.0, timeout))
        if not ready:
            return False
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        """Close the pipe; later `set()` calls do nothing."""
        write, self._write = self._write, -1
        if write >= 0:
            os.close(write)
            os.close(self._read)


class Signals:
    """What the signal handlers asked for. A handler runs on the main thread
    between any two of its bytecodes: it must take no lock the main thread
    might hold (so no Event.set()), hence plain flags and a pipe to wake it."""

    def __init__(self) -> None:
        self.wake = Wakeup()
        self.stop_requested = False
        self.stop_now = False
        self.reload = False
        #: Monotonic time the shutdown grace ends (None: not stopping).
        self.deadline: float | None = None

    def grace_ends(self) -> float | None:
        """The run context's ``stop_grace``: when the shutdown grace ends."""
        return self.deadline

    def stop_why(self) -> str:
        """The run context's ``stop_why``: why the shutdown stops a command."""
        return SECOND_INTERRUPT if self.stop_now else GRACE_RAN_OUT
