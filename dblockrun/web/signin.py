"""The sign-in limit and the password checks' gate.

:class:`SignInLimit` counts each attempt *before* its password is checked:
at most :attr:`Limits.sign_in_attempts` per window for one client address,
and as many for one user name across all addresses, so neither a burst of
simultaneous guesses nor a client changing its address (``X-Forwarded-For``
under ``--proxy-headers``) gets more checks. It remembers the users file's
names always, and at most :attr:`Limits.sign_in_remembered` addresses and
as many unknown names (the least recently seen forgotten first): its memory
is bounded whatever a client sends. Each server counts its own attempts.

The price, documented: anyone can hold a user's sign-in back for a window
with five wrong passwords. That user gets in anyway with an API token
(``Authorization: Bearer``, never limited: 32 random bytes need no limit),
or once the window has moved on, or when the server restarts.

:class:`PasswordChecks` runs at most :attr:`Limits.password_checks` argon2
checks at once (64 MiB each); up to :attr:`Limits.password_queue` more wait
their turn, the rest are refused at once (429).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from dblockrun.web.limits import Limits

#: The longest address or name kept as a key (``X-Forwarded-For`` may send 8 KB).
KEY_CHARS = 255


class _Recent:
    """Keys (addresses, names) and the times of their last attempts, the
    least recently seen forgotten beyond ``size`` (None: never)."""

    def __init__(self, size: int | None) -> None:
        self.size = size
        self.times: OrderedDict[str, deque[float]] = OrderedDict()

    def get(self, key: str, window: float, now: float) -> deque[float]:
        times = self.times.get(key)
        if times is None:
            times = self.times[key] = deque()
            if self.size is not None and len(self.times) > self.size:
                self.times.popitem(last=False)
        else:
            self.times.move_to_end(key)
        while times and times[0] <= now - window:
            times.popleft()
        return times


class SignInLimit:
    def __init__(self, limits: Limits | None = None, names: Iterable[str] = ()) -> None:
        self.limits = limits or Limits()
        self.attempts, self.window = self.limits.sign_in_attempts, self.limits.sign_in_window
        self._addresses = _Recent(self.limits.sign_in_remembered)
        self._known = _Recent(None)
        self._unknown = _Recent(self.limits.sign_in_remembered)
        self._names = set(names)
        self._lock = threading.Lock()

    def _counts(self, client: str, name: str, now: float) -> tuple[deque[float], deque[float]]:
        names = self._known if name in self._names else self._unknown
        return (self._addresses.get(client[:KEY_CHARS], self.window, now),
                names.get(name[:KEY_CHARS], self.window, now))

    def attempt(self, client: str, name: str) -> bool:
        """Count an attempt of ``client`` to sign in as ``name``, now, before
        its password is checked; False (not counted): too many already."""
        now = time.monotonic()
        with self._lock:
            counts = self._counts(client, name, now)
            if any(len(times) >= self.attempts for times in counts):
                return False
            for times in counts:
                times.append(now)
            return True

    def forget(self, client: str, name: str) -> None:
        """Uncount the last attempt of ``client`` as ``name``: it signed in,
        or its password was not checked."""
        now = time.monotonic()
        with self._lock:
            for times in self._counts(client, name, now):
                if times:
                    times.pop()

    def remembered(self) -> int:
        """Addresses and names remembered now (what its memory grows with)."""
        with self._lock:
            return sum(len(r.times) for r in (self._addresses, self._known, self._unknown))


class PasswordChecks:
    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._running = threading.BoundedSemaphore(self.limits.password_checks)
        self._lock = threading.Lock()
        self._queued = 0

    def run(self, check: Callable[[], bool]) -> bool | None:
        """``check()`` (in the caller's thread) once a turn is free; None:
        refused, too many are waiting."""
        limits = self.limits
        with self._lock:
            if self._queued >= limits.password_checks + limits.password_queue:
                return None
            self._queued += 1
        try:
            if not self._running.acquire(timeout=limits.password_wait):
                return None
            try:
                return check()
            finally:
                self._running.release()
        finally:
            with self._lock:
                self._queued -= 1
