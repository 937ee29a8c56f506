"""A MySQL/MariaDB URL with several hosts (``mysql://u@h1:3401,h2:3402/db``),
for the pooled engine: SQLAlchemy's PyMySQL dialect, except that each new
connection goes to the first host that takes one, tried in order
(:func:`~dblockrun.store.drivers.connect_first`). A Galera cluster's nodes, so
that a daemon whose node died reconnects to the next one.

:func:`dblockrun.dburl.driver_url` writes such a URL as
``mysql+dblockrun_hosts://u@/db?host=h1:3401&host=h2:3402`` and registers
this dialect under that name; this module is imported only then.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from typing import Any

from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql
from sqlalchemy.engine import URL
from sqlalchemy.engine.default import DefaultDialect

from dblockrun.store.drivers import connect_first, mysql_hosts

#: The driver name in a rewritten URL.
NAME = "dblockrun_hosts"
_HOSTS = "dblockrun_hosts"


class MultiHostMySQL(MySQLDialect_pymysql):
    """PyMySQL, connecting to the first of the URL's ``host`` values that answers."""

    supports_statement_cache = True

    def create_connect_args(
        self, url: URL, _translate_args: dict[str, Any] | None = None
    ) -> tuple[Sequence[str], MutableMapping[str, Any]]:
        given = url.query.get("host", ())
        hosts = mysql_hosts(",".join((given,) if isinstance(given, str) else given))
        if hosts is None:
            raise ValueError("bad host list")
        args, kw = super().create_connect_args(url.difference_update_query(["host"]),
                                               _translate_args)
        kw[_HOSTS] = hosts
        return args, kw

    def connect(self, *cargs: Any, **cparams: Any) -> Any:
        hosts = cparams[_HOSTS]
        rest = {k: v for k, v in cparams.items() if k != _HOSTS}
        return connect_first(lambda kw: DefaultDialect.connect(self, *cargs, **kw), hosts, rest)


def register() -> None:
    """Make ``mysql+dblockrun_hosts://`` known to SQLAlchemy."""
    from sqlalchemy.dialects import registry

    registry.register(f"mysql.{NAME}", __name__, "MultiHostMySQL")
