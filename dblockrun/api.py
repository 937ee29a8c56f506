"""The Python API: hold a dblockrun lock around a block of code or a function.

The lock is the same row as ``dblockrun exec --name NAME`` and a daemon job
called NAME, so a Python service, the CLI and the daemon exclude each other::

    import dblockrun

    with dblockrun.lock("nightly-report", db="postgresql://db/ops") as lease:
        build_report()
        lease.check()          # raises LockLost if the lease ran out
        publish(fence=lease.token)

    @dblockrun.locked("cleanup", lock_at_least="1m")
    def cleanup() -> int:      # runs only where the lock was won, else returns None
        ...

While the lock is held a background thread renews its lease every
``heartbeat``. :attr:`Lease.lost` turns True when a renewal found that the
fencing token is no longer current, when renewals failed for so long that the
lease may have expired, or when ``lock_at_most`` was reached (renewals stop
then, so the lock frees). The block is not interrupted: check ``lease.lost``
(or call :meth:`Lease.check`) before side effects, and pass ``lease.token`` to
systems that can reject stale writers.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import threading
import time
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Literal, ParamSpec, TypeVar, overload

from dblockrun.durations import parse_duration
from dblockrun.errors import DatabaseError, DblockrunError
from dblockrun.running.heartbeat import Renewer
from dblockrun.running.holder import new_holder_id
from dblockrun.running.runner import LeaseWatch
from dblockrun.store import DEFAULT_PREFIX, Store
from dblockrun.store import models as m
from dblockrun.store.dburl import resolve_url
from dblockrun.store.engine import Claim
from dblockrun.store.outage import Outage

__all__ = ["Lease", "LockBusy", "LockContext", "LockLost", "close_stores", "lock", "locked"]

log = logging.getLogger("dblockrun")

P = ParamSpec("P")
R = TypeVar("R")

Duration = str | int | float

#: How often ``wait=True`` tries the lock again.
POLL_INTERVAL = 0.5
#: Longest we keep retrying the release or the run's result on database errors.
_RELEASE_RETRY = 10.0
_OUTPUT_LIMIT = 64 * 1024


class LockBusy(DblockrunError):
    """The lock is held by someone else (or the job is disabled)."""

    def __init__(self, name: str, holder: str | None = None, why: str = "busy") -> None:
        self.name = name
        self.holder = holder
        held = f" (held by {holder})" if holder else ""
        super().__init__(f"lock {name!r} is {why}{held}")


class LockLost(DblockrunError):
    """The lease ended before the work did: another holder may have the lock."""

    def __init__(self, name: str, token: int) -> None:
        self.name = name
        self.token = token
        super().__init__(
            f"lock {name!r} lost: lease with token {token} expired or was taken over"
        )


# -- stores ---------------------------------------------------------------------

_stores: dict[tuple[str, str, float], Store] = {}
_stores_lock = threading.Lock()


def _store(db: str | Store | None, prefix: str, lock_wait: float | None = None) -> Store:
    """The shared store of ``db`` and ``prefix`` whose statements wait
    ``lock_wait`` for a row another session holds (a quarter of the lease:
    store/drivers.py ``lock_wait_for``; None: the default lease's)."""
    if isinstance(db, Store):
        return db
    from dblockrun.store.drivers import DEFAULT_LOCK_WAIT

    wait = DEFAULT_LOCK_WAIT if lock_wait is None else lock_wait
    url = resolve_url(db, None)
    key = (url, prefix, wait)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = Store(url, prefix, lock_wait=wait)
            # Create the schema before any thread uses the store: threads
            # sharing a fresh Store must not race its first schema check.
            store.ensure_schema()
            _stores[key] = store
        return store


def close_stores() -> None:
    """Close the database connections this module opened (done at exit too)."""
    with _stores_lock:
        stores = list(_stores.values())
        _stores.clear()
    for store in stores:
        store.close()


atexit.register(close_stores)


# -- the lease --------------------------------------------------------------------


class _Watch(LeaseWatch):
    """A :class:`LeaseWatch` whose renewals never reach past lock-at-most."""

    def __init__(
        self, name: str, holder: str, token: int, lease: float, last_ok: float, deadline: float
    ) -> None:
        self.deadline = deadline  # monotonic: claim sent + lock_at_most
        self.full_lease = lease
        self._lost = False
        super().__init__(name, holder, token, lease, last_ok)

    @property
    def lease(self) -> float:
        """The lease to renew with: the full lease, cut short at lock-at-most."""
        return max(0.0, min(self.full_lease, self.deadline - time.monotonic()))

    @lease.setter
    def lease(self, value: float) -> None:
        self.full_lease = value

    @property
    def lost(self) -> bool:
        """Token taken over, or lock-at-most reached (the Renewer then stops)."""
        return self._lost or time.monotonic() >= self.deadline

    @lost.setter
    def lost(self, value: bool) -> None:
        self._lost = value


class Lease:
    """A held lock. Read :attr:`lost` (or call :meth:`check`) before side effects."""

    def __init__(
        self, name: str, holder: str, token: int, run_id: int | None, watch: _Watch, margin: float
    ) -> None:
        #: The lock's name (the job name shared with the CLI and the daemon).
        self.name = name
        #: Who holds it: ``hostname:pid:random``, as shown by ``dblockrun status``.
        self.holder = holder
        #: The fencing token: strictly increasing with each acquisition.
        self.token = token
        #: The id of the run recorded in the history (None with ``record=False``).
        self.run_id = run_id
        self._watch = watch
        self._margin = margin
        self._lost = False

    @property
    def lost(self) -> bool:
        """True once the lease is no longer certainly ours; it stays True.

        Set when a renewal found the token no longer current or a kill
        request (``dblockrun kill``; the lease is still held), when no renewal
        succeeded for long enough that the lease may have expired (measured on
        the local monotonic clock from the last successful renewal), or when
        ``lock_at_most`` was reached.
        """
        if not self._lost:
            watch = self._watch
            may_have_expired = watch.last_ok + watch.full_lease - self._margin
            if watch.lost or watch.killed is not None or time.monotonic() >= may_have_expired:
                self._lost = True
        return self._lost

    def check(self) -> None:
        """Raise :class:`LockLost` if the lease is lost."""
        if self.lost:
            raise LockLost(self.name, self.token)

    def __repr__(self) -> str:
        return (
            f"Lease(name={self.name!r}, token={self.token}, holder={self.holder!r}, "
            f"run_id={self.run_id}, lost={self.lost})"
        )


# -- the context manager ------------------------------------------------------------


def _seconds(value: Duration, what: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


class LockContext:
    """What :func:`lock` returns: enter it to take the lock, exit to release it.

    Not reentrant, and each instance can be entered only once at a time.
    """

    def __init__(
        self,
        name: str,
        *,
        db: str | Store | None,
        lock_at_most: Duration,
        lock_at_least: Duration,
        lease: Duration,
        heartbeat: Duration | None,
        table_prefix: str,
        wait: bool,
        timeout: Duration | None,
        record: bool,
        raise_on_busy: bool,
    ) -> None:
        if not name:
            raise ValueError("lock name must not be empty")
        self.name = name
        self.lock_at_most = _seconds(lock_at_most, "lock_at_most")
        self.lock_at_least = _seconds(lock_at_least, "lock_at_least")
        self.lease_seconds = _seconds(lease, "lease")
        self.heartbeat = (
            self.lease_seconds / 3 if heartbeat is None else _seconds(heartbeat, "heartbeat")
        )
        self.timeout = None if timeout is None else _seconds(timeout, "timeout")
        if self.lock_at_most <= 0:
            raise ValueError("lock_at_most must be positive")
        if self.lock_at_least > self.lock_at_most:
            raise ValueError("lock_at_least is longer than lock_at_most")
        if self.lease_seconds <= 0:
            raise ValueError("lease must be positive")
        if not 0 < self.heartbeat < self.lease_seconds:
            raise ValueError("heartbeat must be positive and shorter than lease")
        self.db = db
        self.table_prefix = table_prefix
        self.wait = wait
        self.record = record
        self.raise_on_busy = raise_on_busy
        self._store: Store | None = None
        self._lease: Lease | None = None
        self._renewer: Renewer | None = None
        self._outage = Outage()

    # -- enter ----------------------------------------------------------------

    def __enter__(self) -> Lease | None:
        if self._lease is not None:
            raise RuntimeError(f"lock {self.name!r}: this context is already entered")
        from dblockrun.store.drivers import lock_wait_for

        store = self._store = _store(self.db, self.table_prefix,
                                     lock_wait_for(self.lease_seconds))
        holder = new_holder_id()
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        # The claim with its run record: one round trip (a lost claim too).
        claim = Claim(record=self.record)
        while True:
            sent = time.monotonic()
            first_lease = min(self.lease_seconds, self.lock_at_most)
            won = store.lock_engine().claim(self.name, holder, first_lease, claim, ensure=True)
            if won is not None:
                break
            if not self.wait or (deadline is not None and time.monotonic() >= deadline):
                self._busy(store)
                return None
            pause = POLL_INTERVAL
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)
        token, run_id = won.token, won.run_id
        if self.record and run_id is None:  # the claim's record failed: on its own
            try:
                run_id = store.start_run(self.name, holder, token=token)
            except BaseException:
                self._release_quietly(store, holder, token)
                raise
        watch = _Watch(self.name, holder, token, self.lease_seconds, sent,
                       sent + self.lock_at_most)
        margin = min(5.0, (self.lease_seconds - self.heartbeat) / 2)
        lease = self._lease = Lease(self.name, holder, token, run_id, watch, margin)
        renewer = self._renewer = Renewer(store, self.heartbeat, self._outage)
        renewer.add(watch)
        renewer.start()
        log.debug("lock %s acquired (token %d, holder %s)", self.name, token, holder)
        return lease

    def _busy(self, store: Store) -> None:
        why, holder = "busy", None
        try:
            state = store.lock_state(self.name)
        except DatabaseError:
            state = None
        if state is not None:
            holder = state.holder
            if state.disabled_until is not None:
                why = "busy or disabled"
        if self.raise_on_busy:
            raise LockBusy(self.name, holder, why)
        log.info("lock %s is %s; not running", self.name, why)

    def _release_quietly(self, store: Store, holder: str, token: int) -> None:
        self._outage.retry(f"release {self.name}",
                           lambda: store.release(self.name, holder, token, self.lock_at_least),
                           _RELEASE_RETRY)

    # -- exit -----------------------------------------------------------------

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease, store, renewer = self._lease, self._store, self._renewer
        self._lease = self._renewer = None
        if lease is None or store is None or renewer is None:
            return  # busy: nothing was taken
        # Stop renewing before releasing: a late renewal would re-extend the lease.
        renewer.stop()
        if lease.run_id is None:
            self._release_quietly(store, lease.holder, lease.token)
        else:
            self._finish(store, lease, lease.run_id, exc)
        log.debug("lock %s released (token %d)", self.name, lease.token)

    def _finish(self, store: Store, lease: Lease, run_id: int,
                exc: BaseException | None) -> None:
        """The run's result and the release, in one round trip."""
        if exc is None:
            result, output = m.OK, None
        else:
            result = m.FAILED
            output = "".join(traceback.format_exception(exc))[-_OUTPUT_LIMIT:]
        done = self._outage.retry(
            f"record result of {self.name}",
            lambda: store.finish_and_release(run_id, self.name, lease.holder, lease.token,
                                             result, None, output, self.lock_at_least),
            _RELEASE_RETRY,
        )
        if done is not None and not done[0]:
            log.warning("lock %s: run %d result not recorded: token %d is no longer current",
                        self.name, run_id, lease.token)


class _LeaseContext(LockContext):
    """A :class:`LockContext` that raises when busy, so it always enters with a Lease."""

    def __enter__(self) -> Lease:
        lease = super().__enter__()
        assert lease is not None
        return lease


@overload
def lock(
    name: str,
    *,
    db: str | Store | None = ...,
    lock_at_most: Duration = ...,
    lock_at_least: Duration = ...,
    lease: Duration = ...,
    heartbeat: Duration | None = ...,
    table_prefix: str = ...,
    wait: bool = ...,
    timeout: Duration | None = ...,
    record: bool = ...,
    raise_on_busy: Literal[True] = ...,
) -> _LeaseContext: ...


@overload
def lock(
    name: str,
    *,
    db: str | Store | None = ...,
    lock_at_most: Duration = ...,
    lock_at_least: Duration = ...,
    lease: Duration = ...,
    heartbeat: Duration | None = ...,
    table_prefix: str = ...,
    wait: bool = ...,
    timeout: Duration | None = ...,
    record: bool = ...,
    raise_on_busy: bool,
) -> LockContext: ...


def lock(
    name: str,
    *,
    db: str | Store | None = None,
    lock_at_most: Duration = "10m",
    lock_at_least: Duration = "0s",
    lease: Duration = "30s",
    heartbeat: Duration | None = None,
    table_prefix: str = DEFAULT_PREFIX,
    wait: bool = False,
    timeout: Duration | None = None,
    record: bool = True,
    raise_on_busy: bool = True,
) -> LockContext:
    """Hold the lock ``name`` for the duration of a ``with`` block.

    ``db``: a database URL (default: ``DBLOCKRUN_DB``, then the SQLite file
    under ``~/.local/state/dblockrun/``), or a :class:`~dblockrun.store.Store`.
    Durations are strings such as ``"90s"``, ``"10m"``, ``"1h30m"`` or numbers
    of seconds.

    * ``lock_at_most``: the longest the lock is held. Renewals stop then, the
      lock frees and the lease is :attr:`~Lease.lost`; the block is not stopped.
    * ``lock_at_least``: the lock stays taken at least this long after it was
      taken, even if the block ends sooner (one run per period across a fleet).
    * ``lease`` / ``heartbeat``: the lease is renewed every ``heartbeat``
      (default ``lease / 3``); if this process dies, the lock frees after ``lease``.
    * ``wait``: when busy, try again every 0.5 s until acquired or ``timeout``.
    * ``record``: record the run (``ok``, or ``failed`` if the block raised) in the
      history shown by ``dblockrun history``.
    * ``raise_on_busy``: when busy raise :class:`LockBusy` (default), or, when
      False, enter with ``None`` instead of a :class:`Lease`.

    On exit the result is recorded, the lease renewal stops and the lock is
    released (not before ``lock_at_least``). Exceptions from the block propagate.
    """
    cls = _LeaseContext if raise_on_busy else LockContext
    return cls(
        name,
        db=db,
        lock_at_most=lock_at_most,
        lock_at_least=lock_at_least,
        lease=lease,
        heartbeat=heartbeat,
        table_prefix=table_prefix,
        wait=wait,
        timeout=timeout,
        record=record,
        raise_on_busy=raise_on_busy,
    )


def locked(
    name: str,
    *,
    db: str | Store | None = None,
    lock_at_most: Duration = "10m",
    lock_at_least: Duration = "0s",
    lease: Duration = "30s",
    heartbeat: Duration | None = None,
    table_prefix: str = DEFAULT_PREFIX,
    wait: bool = False,
    timeout: Duration | None = None,
    record: bool = True,
    raise_on_busy: bool = False,
) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
    """Decorate a function to run it only under the lock ``name``.

    The decorated function returns the function's result, or None without
    calling it when the lock is busy (or :class:`LockBusy` is raised with
    ``raise_on_busy=True``). Options are those of :func:`lock`, checked at
    decoration time. Each call takes and releases the lock. Not for ``async``
    functions (the lock would be released before the coroutine runs).
    """
    def context() -> LockContext:
        return LockContext(
            name,
            db=db,
            lock_at_most=lock_at_most,
            lock_at_least=lock_at_least,
            lease=lease,
            heartbeat=heartbeat,
            table_prefix=table_prefix,
            wait=wait,
            timeout=timeout,
            record=record,
            raise_on_busy=raise_on_busy,
        )

    context()  # check the options at decoration time

    def decorate(fn: Callable[P, R]) -> Callable[P, R | None]:
        if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
            raise TypeError("dblockrun.locked does not support async functions")

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
            with context() as held:
                if held is None:
                    return None
                return fn(*args, **kwargs)

        return wrapper

    return decorate
