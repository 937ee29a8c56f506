"""Where statements are sent: one retry policy, one error mapping.

An executor hands ``fn`` a driver cursor and runs it under the policy:

* a connection found dead is dropped and ``fn`` tried once more on a new one
  (not when the connection was new: the database is down, say so);
* a statement the database rolled back to break a deadlock is sent again, up
  to three times (every ``fn`` is safe to send again: a rolled-back
  statement changed nothing);
* a statement that waited for a row lock past the connection's lock wait
  (:func:`~dblockrun.store.drivers.lock_wait_for`) is not sent again here:
  the session holding the rows is looked up (:attr:`Executor.held_by`, one
  statement) and named in the error (kind ``lock-held``), and the caller's
  backoff tries later;
* every other driver error becomes a :class:`~dblockrun.errors.DatabaseError`
  (:func:`~dblockrun.store.drivers.db_error`).

:class:`PooledExecutor` takes connections from a SQLAlchemy engine's pool
(the daemon, the API, the operator commands); :class:`DirectExecutor` keeps
one driver connection of its own (``exec``, which never imports SQLAlchemy).
Every call of :meth:`Executor.send` is one round trip, and counted.

:class:`Together`: calls made from many threads at once, sent as one (a
group commit). A burst of runs ends on the run loop's workers at the same
moment, each with its result and release to write: rather than one
statement each, the first caller sends its own and every call that arrived
meanwhile in one statement, and the others wait for its answer. A lone call
goes at once; nothing waits for company.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from dblockrun.errors import DatabaseError
from dblockrun.latch import Latch
from dblockrun.store.drivers import Driver, db_error, holder_text, is_deadlock, is_lock_wait

T = TypeVar("T")

#: How many times a deadlocked (idempotent) statement is sent at most.
DEADLOCK_TRIES = 3


def try_again(*, dead: bool, new: bool, deadlock: bool, attempt: int) -> bool:
    """The retry policy: after a failed attempt, whether to send it again."""
    if dead:
        return not new and attempt == 1
    return deadlock and attempt < DEADLOCK_TRIES


class Executor:
    """Runs ``fn(cursor)`` with the retry policy; counts round trips."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.dialect = driver.dialect
        self.statements = 0
        self._count_lock = threading.Lock()
        self._errors: tuple[type[BaseException], ...] | None = None
        #: The dialect's statement naming the session that holds rows
        #: (store/queries.py ``held_by``; set by the lock engine), or None.
        self.held_by: str | None = None

    # -- what a kind of connection supplies --------------------------------------

    def _acquire(self) -> tuple[Any, bool]:
        """A connection and whether it is new."""
        raise NotImplementedError

    def _give_back(self, conn: Any, dead: bool) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    # -- the policy ----------------------------------------------------------------

    def count(self, n: int = 1) -> None:
        with self._count_lock:
            self.statements += n

    def send(self, cur: Any, sql: str, params: dict[str, Any] | None = None) -> Any:
        """One round trip."""
        self.count()
        cur.execute(sql, params or {})
        return cur

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        if self._errors is None:
            self._errors = self.driver.error_types()
        return self._errors

    def run(self, fn: Callable[[Any], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            conn, new = self._acquire()
            dead = False
            try:
                cur = conn.cursor()
                try:
                    return fn(cur)
                finally:
                    cur.close()
            except DatabaseError:
                raise
            except Exception as exc:
                if not isinstance(exc, self._driver_errors()):
                    raise
                dead = self.driver.is_disconnect(conn, exc)
                if not try_again(dead=dead, new=new, deadlock=is_deadlock(exc), attempt=attempt):
                    raise db_error(exc, self.holder(exc)) from exc
            finally:
                self._give_back(conn, dead)

    def holder(self, exc: BaseException) -> str | None:
        """For a statement that waited past its lock wait: the session that
        holds the rows, as :func:`~dblockrun.store.drivers.holder_text` says
        it (one statement, on a connection of its own; only then). None for
        any other error."""
        if self.held_by is None or not is_lock_wait(getattr(exc, "orig", None) or exc):
            return None
        try:
            conn, _new = self._acquire()
        except DatabaseError as refused:
            return holder_text(None, refused.message)
        dead = False
        try:
            cur = conn.cursor()
            try:
                return holder_text(self.send(cur, self.held_by).fetchone())
            finally:
                cur.close()
        except Exception as failed:
            if not isinstance(failed, self._driver_errors()):
                raise
            dead = self.driver.is_disconnect(conn, failed)
            why = db_error(failed)
            return holder_text(None, "not visible to this account (MariaDB: the PROCESS "
                                     "privilege shows it)" if why.kind == "refused"
                               else why.message)
        finally:
            self._give_back(conn, dead)


class DirectExecutor(Executor):
    """One connection of the driver's own, shared by a process's threads
    (``exec``: the run and its renewals) under a lock."""

    def __init__(self, driver: Driver) -> None:
        super().__init__(driver)
        self._conn: Any = None
        self._lock = threading.RLock()

    def _acquire(self) -> tuple[Any, bool]:
        self._lock.acquire()
        if self._conn is not None:
            return self._conn, False
        try:
            self._conn = self.driver.connect()
        except Exception as exc:
            self._lock.release()
            if isinstance(exc, self._driver_errors()):
                raise db_error(exc) from exc
            raise
        return self._conn, True

    def _give_back(self, conn: Any, dead: bool) -> None:
        try:
            if dead:
                self._conn = None
                _close_quietly(conn)
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            _close_quietly(conn)


class PooledExecutor(Executor):
    """Raw driver connections from a SQLAlchemy engine's pool."""

    def __init__(self, driver: Driver, engine: Any) -> None:
        super().__init__(driver)
        self.engine = engine

    def _acquire(self) -> tuple[Any, bool]:
        import sqlalchemy as sa

        try:
            return self.engine.raw_connection(), False
        except sa.exc.SQLAlchemyError as exc:
            raise db_error(exc) from exc
        except Exception as exc:  # the pool's connect raises the driver's own error
            if isinstance(exc, self._driver_errors()):
                raise db_error(exc) from exc
            raise

    def _give_back(self, conn: Any, dead: bool) -> None:
        if dead:
            conn.invalidate()
        conn.close()

    def close(self) -> None:
        self.engine.dispose()

    def run_core(self, fn: Callable[[Any], T]) -> T:
        """``fn(connection)`` on a SQLAlchemy connection (the cold statements
        written with SQLAlchemy Core), under the same policy."""
        import sqlalchemy as sa

        attempt = 0
        while True:
            attempt += 1
            try:
                with self.engine.connect() as conn:
                    return fn(conn)
            except sa.exc.DBAPIError as exc:
                if not try_again(dead=exc.connection_invalidated, new=False,
                                 deadlock=is_deadlock(exc.orig), attempt=attempt):
                    raise db_error(exc, self.holder(exc)) from exc
            except sa.exc.SQLAlchemyError as exc:
                raise db_error(exc) from exc


def _close_quietly(conn: Any) -> None:
    try:
        conn.close()
    except Exception:  # closing a dead connection
        pass


A = TypeVar("A")
R = TypeVar("R")


class _Call(Generic[A, R]):
    __slots__ = ("arg", "result", "error", "finished", "wake")

    def __init__(self, arg: A) -> None:
        self.arg = arg
        self.result: R | None = None
        self.error: BaseException | None = None
        self.finished = False
        self.wake = Latch()  # set once (to lead, or done), never cleared


class Together(Generic[A, R]):
    """``send_many(args)`` returns one result per argument, in order; a
    call's result (or the exception of the send it went in) is its own.

    One caller at a time sends (the leader): it takes every call waiting,
    its own among them; when its send returns, the oldest call that came in
    meanwhile leads the next send. So each call waits at most for one send
    before its own, and no thread serves others' calls once its own is done."""

    def __init__(self, send_many: Callable[[Sequence[A]], Sequence[R]]) -> None:
        self._send_many = send_many
        self._lock = threading.Lock()
        self._waiting: list[_Call[A, R]] = []
        self._sending = False

    def __call__(self, arg: A) -> R:
        me: _Call[A, R] = _Call(arg)
        with self._lock:
            self._waiting.append(me)
            lead = not self._sending
            self._sending = True
        if not lead:
            me.wake.wait()
        if not me.finished:  # the first, or woken to lead the next send
            self._lead()
        if me.error is not None:
            raise me.error
        return me.result  # type: ignore[return-value]

    def _lead(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting, []
        try:
            results = self._send_many([call.arg for call in batch])
            for call, result in zip(batch, results, strict=True):
                call.result = result
        except BaseException as exc:  # each caller decides (retries, or gives up)
            for call in batch:
                call.error = exc
        for call in batch:
            call.finished = True
        with self._lock:
            following = self._waiting[0] if self._waiting else None
            self._sending = following is not None
        for call in batch:
            call.wake.set()
        if following is not None:
            following.wake.set()
