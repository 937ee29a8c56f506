"""PostgreSQL URLs with several hosts, libpq's form
(`postgresql://u@h1:5441,h2:5442/db?target_session_attrs=read-write`): the
pooled engine (SQLAlchemy's psycopg dialect) and exec's direct connection
both hand the host list to libpq, which tries the hosts in order."""

from __future__ import annotations

import pytest
from conftest import ServerDatabases
from helpers import new_prefix
from sqlalchemy.engine import make_url

from dblockrun.errors import UsageError
from dblockrun.redact import url as redact
from dblockrun.store import Store
from dblockrun.store.dburl import dialect_of, driver_url
from dblockrun.store.drivers import direct_driver, libpq_hosts

PAIR = "postgresql://postgres@127.0.0.1:5441,127.0.0.1:5442/ops?target_session_attrs=read-write"


def test_a_url_with_several_hosts_is_written_as_the_psycopg_dialect_reads_it() -> None:
    parsed = make_url(driver_url(PAIR))
    assert parsed.drivername == "postgresql+psycopg"
    assert parsed.query["host"] == ("127.0.0.1:5441", "127.0.0.1:5442")
    assert parsed.query["target_session_attrs"] == "read-write"
    assert (parsed.username, parsed.database) == ("postgres", "ops")
    assert dialect_of(PAIR) == "postgresql"
    assert redact(PAIR) == PAIR
    secret = make_url(driver_url("postgres://u:p/w@h1,h2:5442/ops"))
    assert (secret.password, secret.query["host"]) == ("p/w", ("h1", "h2:5442"))
    assert redact("postgres://u:p/w@h1,h2:5442/ops") == "postgres://u:***@h1,h2:5442/ops"
    # One host: as before.
    assert driver_url("postgresql://u@h1:5441/ops") == "postgresql+psycopg://u@h1:5441/ops"
    for bad in ("postgresql://u@h1:x,h2/ops", "postgresql://u@h1,,h2/ops",
                "postgresql://u@[::1]:5441,h2/ops"):
        with pytest.raises(UsageError, match="bad host list"):
            driver_url(bad)


def test_libpq_host_lists() -> None:
    assert libpq_hosts("h1:5441,h2") == ("h1,h2", "5441,")
    assert libpq_hosts("a,b:2,c:3") == ("a,b,c", ",2,3")
    assert libpq_hosts("h1:x,h2") is None
    assert libpq_hosts("h1,,h2") is None


def test_exec_connects_directly_with_a_host_list_and_target_session_attrs() -> None:
    assert direct_driver(PAIR) is not None
    assert direct_driver(PAIR.replace("?", "?sslmode=require&")) is None  # the pool reads it
    assert direct_driver("postgresql://u@h/ops?target_session_attrs=") is None
    assert direct_driver("mysql://u@h/ops?target_session_attrs=read-write") is None


def test_a_dead_first_host_is_passed_over_on_postgresql(
    server_databases: ServerDatabases,
) -> None:
    url = server_databases.url("postgresql")  # postgresql://postgres@127.0.0.1:5432/<db>
    several = url.replace("@127.0.0.1:5432/", "@127.0.0.1:9,127.0.0.1:5432/")
    assert several != url
    several += "?target_session_attrs=read-write"
    store = Store(several, new_prefix())
    try:
        assert store.db_now() > 0  # the pooled engine, through the second host
    finally:
        store.drop_schema()
        store.close()
    driver = direct_driver(several)  # exec's own connection
    assert driver is not None
    conn = driver.connect()
    try:
        assert conn.info.port == 5432
        assert conn.execute("SHOW transaction_read_only").fetchone() == ("off",)
    finally:
        conn.close()
