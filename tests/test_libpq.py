"""The ctypes binding to libpq of the lean exec path (dblockrun/store/libpq.py),
against the local PostgreSQL."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from conftest import ServerDatabases, pg_admin

from dblockrun.errors import DatabaseError, DatabaseRefused
from dblockrun.store import Store, libpq
from dblockrun.store.lean import _numbered, open_lean

SECRET = "s3cr3t-Pa55"


@pytest.fixture
def pg_url(server_databases: ServerDatabases) -> str:
    return server_databases.url("postgresql")


def params_of(url: str, **extra: str) -> dict[str, str]:
    parts = urlsplit(url)
    return {"host": parts.hostname or "", "port": str(parts.port), "user": parts.username or "",
            "dbname": parts.path.lstrip("/"), "client_encoding": "UTF8", **extra}


@pytest.fixture
def conn(pg_url: str) -> Iterator[libpq.Connection]:
    c = libpq.connect(params_of(pg_url, application_name="dblockrun-test"))
    yield c
    c.close()


def test_a_libpq_loads() -> None:
    # psycopg-binary bundles one: the lean path must not fall back to psycopg here.
    assert libpq.load() is not None
    assert libpq.load() is libpq.load()  # loaded once


@pytest.mark.parametrize("value", [
    "plain", "", "O'Reilly", 'say "hi"', "back\\slash", "$1 %s %% ?", "'); DROP TABLE x; --",
    "naïve café ß", "日本語 ✓ 🎉", "line\nbreak\ttab", " spaces ",
])
def test_text_parameters_round_trip(conn: libpq.Connection, value: str) -> None:
    result = conn.execute("SELECT $1::text, length($1::text)", [value])
    assert result.rows == [(value, str(len(value)))]


def test_null_numbers_and_booleans(conn: libpq.Connection) -> None:
    row = conn.execute(
        "SELECT $1::text IS NULL, $2::bigint + 1, $3::float8 * 2, $4::boolean, $5::int",
        [None, 2**40, 0.1, True, -7]).rows[0]
    assert row == ("t", str(2**40 + 1), "0.2", "t", "-7")
    assert conn.execute("SELECT NULL::text, 'x'").rows == [(None, "x")]
    assert conn.execute("SELECT $1::float8", [1e-05]).rows == [("1e-05",)]


def test_parameters_are_data_not_sql(conn: libpq.Connection) -> None:
    table = f"t{secrets.token_hex(4)}"
    conn.execute(f"CREATE TEMPORARY TABLE {table} (name text)")
    evil = f"x'); DROP TABLE {table}; --"
    assert conn.execute(f"INSERT INTO {table} VALUES ($1), ($2)", [evil, "b"]).rowcount == 2
    assert conn.execute(f"SELECT name FROM {table} ORDER BY name").rows == [("b",), (evil,)]


def test_row_counts(conn: libpq.Connection) -> None:
    table = f"t{secrets.token_hex(4)}"
    assert conn.execute(f"CREATE TEMPORARY TABLE {table} (n int)").rowcount == -1
    assert conn.execute(f"INSERT INTO {table} SELECT generate_series(1, 5)").rowcount == 5
    assert conn.execute(f"UPDATE {table} SET n = n + 1 WHERE n > $1", [3]).rowcount == 2
    assert conn.execute(f"UPDATE {table} SET n = 0 WHERE n > $1", [99]).rowcount == 0
    result = conn.execute(f"DELETE FROM {table} WHERE n = $1 RETURNING n", [1])
    assert (result.rows, result.rowcount) == ([("1",)], 1)
    cur = conn.cursor().execute(f"SELECT n FROM {table} ORDER BY n")
    assert cur.rowcount == 4
    assert [cur.fetchone() for _ in range(5)] == [("2",), ("3",), ("5",), ("6",), None]
    cur.close()


def test_cursor_reads_rows_in_order(conn: libpq.Connection) -> None:
    cur = conn.cursor().execute("SELECT generate_series(1, 3)")
    assert (cur.fetchone(), cur.fetchone(), cur.fetchone(), cur.fetchone()) == (
        ("1",), ("2",), ("3",), None)


def test_nul_is_refused_before_sending(conn: libpq.Connection) -> None:
    with pytest.raises(libpq.DataError, match="NUL"):
        conn.execute("SELECT $1::text", ["a\0b"])
    with pytest.raises(libpq.DataError, match="bytes"):
        conn.execute("SELECT $1::text", [b"raw"])
    assert conn.execute("SELECT 1").rows == [("1",)]  # the connection is fine


def test_server_errors_carry_the_sqlstate(conn: libpq.Connection) -> None:
    with pytest.raises(libpq.Error) as info:
        conn.execute("SELECT * FROM no_such_table_here")
    assert info.value.sqlstate == "42P01"
    assert str(info.value).startswith('relation "no_such_table_here" does not exist')
    assert not isinstance(info.value, libpq.OperationalError)
    assert not conn.broken
    with pytest.raises(libpq.Error) as info:
        conn.execute("SELECT 1 / $1::int", [0])
    assert info.value.sqlstate == "22012"  # division_by_zero
    assert conn.execute("SELECT 2").rows == [("2",)]


def test_autocommit(conn: libpq.Connection, pg_url: str) -> None:
    table = f"t{secrets.token_hex(4)}"
    conn.execute(f"CREATE TABLE {table} (n int)")
    try:
        conn.execute(f"INSERT INTO {table} VALUES (1)")
        other = libpq.connect(params_of(pg_url))
        try:
            assert other.execute(f"SELECT n FROM {table}").rows == [("1",)]
        finally:
            other.close()
    finally:
        conn.execute(f"DROP TABLE {table}")


def test_notices_are_not_printed(conn: libpq.Connection, capfd: pytest.CaptureFixture[str]
                                 ) -> None:
    conn.execute("DO $$ BEGIN RAISE NOTICE 'hello from the server'; END $$")
    out, err = capfd.readouterr()
    assert "hello" not in out + err


def test_a_terminated_backend_is_broken(conn: libpq.Connection) -> None:
    with pg_admin() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.backend_pid,))
    with pytest.raises(libpq.OperationalError):
        conn.execute("SELECT 1")
    assert conn.broken
    conn.close()
    assert conn.closed and not conn.broken
    with pytest.raises(libpq.OperationalError, match="closed"):
        conn.execute("SELECT 1")
    conn.close()  # twice is fine


def test_connection_errors() -> None:
    with pytest.raises(libpq.OperationalError, match="connection failed: .*(refused|127.0.0.1)"):
        libpq.connect({"host": "127.0.0.1", "port": "1", "connect_timeout": "5"})


def test_a_dbname_is_never_a_connection_string(pg_url: str) -> None:
    # expand_dbname=0: "host=... " in a database name is a (missing) name.
    params = params_of(pg_url, dbname="dbname=postgres host=127.0.0.1")
    with pytest.raises(libpq.OperationalError, match="does not exist"):
        libpq.connect(params)


def test_values_with_spaces_and_quotes_reach_the_server(pg_url: str) -> None:
    name = "it's a \"name\" \\ with spaces"
    c = libpq.connect(params_of(pg_url, application_name=name))
    try:
        assert c.execute("SELECT current_setting('application_name')").rows == [(name,)]
    finally:
        c.close()


def test_numbered_placeholders() -> None:
    assert _numbered("a = %s AND b IN (%s, %s)") == "a = $1 AND b IN ($2, $3)"
    assert _numbered("SELECT 1") == "SELECT 1"


# -- through the lean store: the project's errors, passwords redacted --------------


def test_lean_errors_are_database_errors_without_the_password(pg_url: str) -> None:
    parts = urlsplit(pg_url)
    unreachable = f"postgresql://someone:{SECRET}@127.0.0.1:1/db"
    with pytest.raises(DatabaseError) as info:
        open_lean(unreachable, "dblockrun_")
    assert SECRET not in str(info.value) and "Connection refused" in str(info.value)
    missing = (f"postgresql://{parts.username}:{SECRET}@{parts.hostname}:{parts.port}/"
               f"dbr_missing_{secrets.token_hex(3)}")
    with pytest.raises(DatabaseRefused) as refused:
        open_lean(missing, "dblockrun_")
    assert SECRET not in str(refused.value) and "does not exist" in str(refused.value)
    # The same class and text as the SQLAlchemy path (psycopg on the same libpq).
    with Store(missing, "dblockrun_") as store, pytest.raises(DatabaseRefused) as by_store:
        store.ensure_schema()
    assert type(by_store.value) is type(refused.value)
    assert str(by_store.value) == str(refused.value)
