"""A MySQL/MariaDB URL with several hosts (``mysql://u@h1:3401,h2:3402/db``)
for the pooled engine: each new connection goes to the first host that takes
one, tried in order (:func:`~dblockrun.store.drivers.connect_first`). A
Galera cluster's nodes, so that a daemon whose node died reconnects to the
next one.

:func:`dblockrun.store.dburl.driver_url` gives SQLAlchemy the URL of the first
host (a plain PyMySQL URL), and :func:`connect_in_order` makes each of the
engine's connections through SQLAlchemy's public ``do_connect`` event, with
the arguments the PyMySQL dialect built from that URL and the hosts in turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dblockrun.store.drivers import connect_first


def connect_in_order(engine: Engine, hosts: Sequence[tuple[str, int]]) -> None:
    """Make ``engine``'s new connections go to the first of ``hosts`` that
    takes one (a host that is down is passed over)."""

    def connect(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
        import pymysql

        return connect_first(lambda kw: pymysql.connect(*cargs, **kw), hosts, cparams)

    sa.event.listen(engine, "do_connect", connect)
