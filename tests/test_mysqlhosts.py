"""MySQL/MariaDB URLs with several hosts (`mysql://u@h1:3401,h2:3402/db`): each
new connection goes to the first host that takes one, in order."""

from __future__ import annotations

from typing import Any

import pymysql
import pytest
from conftest import ServerDatabases, selected_backends
from helpers import new_prefix
from sqlalchemy.engine import make_url

from dblockrun.errors import UsageError
from dblockrun.redact import url as redact
from dblockrun.store import Store
from dblockrun.store.dburl import dialect_of, driver_url, mysql_nodes
from dblockrun.store.drivers import connect_first, direct_driver, mysql_hosts


def test_host_lists_parse_with_default_ports() -> None:
    assert mysql_hosts("a:3401,b,c:3403") == [("a", 3401), ("b", 3306), ("c", 3403)]
    assert mysql_hosts("a:x,b") is None
    assert mysql_hosts("a,,b") is None


def test_a_url_with_several_hosts_is_the_first_hosts_url_and_its_host_list() -> None:
    url = "mysql://u:p/w@h1:3401,h2/ops?charset=utf8mb4"
    parsed = make_url(driver_url(url))
    assert parsed.drivername == "mysql+pymysql"  # SQLAlchemy's own dialect
    assert (parsed.host, parsed.port) == ("h1", 3401)
    assert parsed.query == {"charset": "utf8mb4"}
    assert (parsed.username, parsed.password, parsed.database) == ("u", "p/w", "ops")
    assert mysql_nodes(url) == [("h1", 3401), ("h2", 3306)]
    assert dialect_of(url) == "mysql"
    assert redact(url) == "mysql://u:***@h1:3401,h2/ops?charset=utf8mb4"
    # One host: the plain PyMySQL dialect, as before.
    assert driver_url("mariadb://u@h1:3401/ops") == "mysql+pymysql://u@h1:3401/ops"
    assert mysql_nodes("mariadb://u@h1:3401/ops") is None
    assert mysql_nodes("postgresql://u@h1:5432,h2/ops") is None
    with pytest.raises(UsageError, match="bad host list"):
        driver_url("mysql://u@h1:x,h2/ops")


def refused(host: str) -> pymysql.err.OperationalError:
    return pymysql.err.OperationalError(2003, f"Can't connect to MySQL server on '{host}'")


def test_connect_first_passes_over_hosts_that_are_down() -> None:
    tried: list[str] = []

    def connect(kw: dict[str, Any]) -> str:
        tried.append(f"{kw['host']}:{kw['port']}")
        if kw["host"] != "c":
            raise refused(kw["host"])
        return f"conn to {kw['host']} as {kw['user']}"

    hosts = [("a", 1), ("b", 2), ("c", 3)]
    assert connect_first(connect, hosts, {"user": "u"}) == "conn to c as u"
    assert tried == ["a:1", "b:2", "c:3"]
    with pytest.raises(pymysql.err.OperationalError, match="'b'"):
        connect_first(connect, hosts[:2], {"user": "u"})  # all down: the last error


def test_connect_first_stops_at_an_error_that_is_not_a_dead_host() -> None:
    tried: list[str] = []

    def connect(kw: dict[str, Any]) -> str:
        tried.append(kw["host"])
        raise pymysql.err.OperationalError(1045, "Access denied for user 'u'")

    with pytest.raises(pymysql.err.OperationalError, match="Access denied"):
        connect_first(connect, [("a", 1), ("b", 2)], {})
    assert tried == ["a"]  # a wrong password is not a reason to try the next node


def test_a_dead_first_host_is_passed_over_on_mariadb(server_databases: ServerDatabases,
                                                    request: pytest.FixtureRequest) -> None:
    if "mariadb" not in selected_backends(request.config):
        pytest.skip("mariadb is not among the selected backends")
    url = server_databases.url("mariadb")  # mysql://root@127.0.0.1:3306/<db>
    several = url.replace("@127.0.0.1:3306/", "@127.0.0.1:9,127.0.0.1:3306/")
    assert several != url
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
        with conn.cursor() as cur:
            cur.execute("SELECT @@port")
            assert cur.fetchone() == (3306,)
    finally:
        conn.close()
