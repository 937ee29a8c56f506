"""The test infrastructure itself: real databases per backend, polling helpers."""

from __future__ import annotations

import re
import sqlite3
import sys
from collections.abc import Callable
from contextlib import closing
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pymysql
import pytest
from helpers import TestDb, dblockrun_cmd, wait_for


def roundtrip_dbapi(db: TestDb) -> list[tuple[Any, ...]]:
    """Create, fill, read and drop a prefixed table with the plain DB-API driver."""
    table = f"{db.prefix}probe"
    statements = [
        f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name VARCHAR(20))",
        f"INSERT INTO {table} (id, name) VALUES (1, 'one')",
    ]
    select, drop = f"SELECT id, name FROM {table}", f"DROP TABLE {table}"
    if db.backend == "sqlite":
        path = db.url.removeprefix("sqlite:///")
        with closing(sqlite3.connect(path, isolation_level=None)) as lite:
            for statement in statements:
                lite.execute(statement)
            rows = lite.execute(select).fetchall()
            lite.execute(drop)
        return rows
    if db.backend == "postgresql":
        with psycopg.connect(db.url, autocommit=True) as pg:
            for statement in statements:
                pg.execute(statement)
            rows = pg.execute(select).fetchall()
            pg.execute(drop)
        return rows
    parts = urlsplit(db.url)
    my = pymysql.connect(
        host=parts.hostname,
        port=parts.port or 3306,
        user=parts.username,
        password=parts.password or "",
        database=parts.path.lstrip("/"),
        autocommit=True,
    )
    with my, my.cursor() as cur:
        for statement in statements:
            cur.execute(statement)
        cur.execute(select)
        rows = list(cur.fetchall())
        cur.execute(drop)
    return rows


def test_each_backend_takes_a_prefixed_table(db: TestDb, backend: str) -> None:
    assert db.backend == backend
    assert re.fullmatch(r"t[0-9a-f]{8}_", db.prefix)
    assert roundtrip_dbapi(db) == [(1, "one")]


def test_server_databases_are_fresh_per_run(db: TestDb) -> None:
    if db.backend == "sqlite":
        assert re.fullmatch(r"sqlite:////.+\.db", db.url)
    else:
        scheme = {"postgresql": "postgresql", "mariadb": "mysql"}[db.backend]
        pattern = rf"{scheme}://\w+@127\.0\.0\.1:\d+/dblockrun_t_\d+_[0-9a-f]{{8}}"
        assert re.fullmatch(pattern, db.url)


def test_session_url_is_shared_and_sqlite_db_is_not(
    session_db_url: Callable[[str], str], sqlite_db: TestDb
) -> None:
    assert session_db_url("sqlite") == session_db_url("sqlite")
    assert session_db_url("sqlite").startswith("sqlite:////")
    assert sqlite_db.url != session_db_url("sqlite")
    assert roundtrip_dbapi(sqlite_db) == [(1, "one")]


def test_wait_for_returns_the_first_done_value() -> None:
    values = iter([None, False, 0])
    assert wait_for(lambda: next(values), timeout=5, interval=0.001) == 0


def test_wait_for_raises_naming_what_on_timeout() -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.1s waiting for the lock"):
        wait_for(lambda: False, timeout=0.1, interval=0.01, what="the lock")


def test_dblockrun_cmd_runs_this_interpreter() -> None:
    assert dblockrun_cmd() == [sys.executable, "-m", "dblockrun"]
