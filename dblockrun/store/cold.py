"""What the cold path's SQL helpers (store/control.py, drain.py, items.py,
sessions.py, alerts.py, status.py) use of the store: its tables, dialect
and executor, the lock engine, and a statement run under the one retry
policy. :class:`~dblockrun.store.store.Store` has it all and hands itself
to them as a :class:`ColdPath`; they name this module, not the store's,
so that the store package imports one way (tests/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import sqlalchemy as sa

from dblockrun.store.drivers import DEFAULT_LOCK_WAIT, connect_options
from dblockrun.store.queries import NOW

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

    from dblockrun.store.engine import LockEngine
    from dblockrun.store.executor import PooledExecutor
    from dblockrun.store.schema import Tables

T = TypeVar("T")


@dataclass(frozen=True)
class Dialect:
    """What differs between SQLite, PostgreSQL and MySQL/MariaDB for
    SQLAlchemy, decided once."""

    name: str

    def now(self) -> sa.ColumnElement[float]:
        return sa.literal_column(NOW[self.name], sa.Double())

    def engine_options(self, pooler: str | None,
                       lock_wait: float = DEFAULT_LOCK_WAIT) -> dict[str, Any]:
        """The pool's connections get the options a direct one gets."""
        options: dict[str, Any] = {"connect_args": connect_options(self.name, pooler, lock_wait)}
        if self.name == "mysql":
            options["pool_recycle"] = 3600
            # PyMySQL sends ROLLBACK for each connection.rollback(), autocommit
            # or not: SQLAlchemy's at the end of each Core statement doubled
            # an idle daemon's statements (bench/idle.py).
            options["skip_autocommit_rollback"] = True
        return options

    def insert_ignore(self, table: sa.Table) -> Any:
        if self.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table).on_conflict_do_nothing()
        return table.insert().prefix_with("IGNORE" if self.name == "mysql" else "OR IGNORE")


class ColdPath(Protocol):
    """The store as its cold SQL helpers use it (SQLAlchemy Core)."""

    #: The tables of the store's prefix.
    t: Tables
    dialect: Dialect
    #: The pool mode of a connection pooler in front of the database, or None.
    pooler: str | None
    #: Raw driver connections from the pool, under the one retry policy.
    x: PooledExecutor
    #: The hot statements (store/engine.py), the schema not checked.
    lock: LockEngine

    @property
    def now(self) -> sa.ColumnElement[float]:
        """The database clock, as a column."""

    def _run(self, fn: Callable[[Connection], T]) -> T:
        """``fn`` on a pooled connection under the executor's retry policy,
        the schema checked."""

    def _conn(self) -> AbstractContextManager[Connection]:
        """A pooled connection, the schema checked (no retry)."""

    def lock_engine(self) -> LockEngine:
        """The hot statements, the schema checked."""

    def ring(self) -> None:
        """MySQL/MariaDB: wake the daemons waiting for requests."""

    def shown_runs(self, *, output: bool = True) -> sa.Select[Any]:
        """The runs as they are shown (history, status, alerts)."""
