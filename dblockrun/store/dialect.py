"""What differs between SQLite, PostgreSQL and MySQL/MariaDB, decided once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from dblockrun.store.drivers import CONNECT_OPTIONS
from dblockrun.store.sql import NOW as _NOW


@dataclass(frozen=True)
class Dialect:
    name: str

    def now(self) -> ColumnElement[float]:
        return sa.literal_column(_NOW[self.name], sa.Double())

    def engine_options(self) -> dict[str, Any]:
        """The pool's connections get the options a direct one gets."""
        options: dict[str, Any] = {"connect_args": dict(CONNECT_OPTIONS[self.name])}
        if self.name == "mysql":
            options["pool_recycle"] = 3600
        return options

    def insert_ignore(self, table: sa.Table) -> Any:
        if self.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            return pg_insert(table).on_conflict_do_nothing()
        if self.name == "mysql":
            return table.insert().prefix_with("IGNORE")
        return table.insert().prefix_with("OR IGNORE")
