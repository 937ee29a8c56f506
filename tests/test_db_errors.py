"""What a database error is, said in one line: the kind of trouble (the
outage log line names it), the driver's text without raw tuples, and never a
password. Real errors from each backend."""

from __future__ import annotations

import logging

import pytest
from helpers import TestDb

from dblockrun.errors import DatabaseError, DatabaseRefused
from dblockrun.store import Store
from dblockrun.store.drivers import direct_driver
from dblockrun.store.engine import LockEngine
from dblockrun.store.executor import DirectExecutor
from dblockrun.store.outage import Outage


def _engine(url: str, prefix: str = "dblockrun_") -> LockEngine:
    driver = direct_driver(url)
    assert driver is not None
    return LockEngine(DirectExecutor(driver), prefix)


def _error_of(engine: LockEngine) -> DatabaseError:
    with pytest.raises(DatabaseError) as caught:
        engine.claim("j", "h", 30)
    engine.close()
    return caught.value


@pytest.mark.parametrize("url", ["postgresql://nobody@127.0.0.1:1/none",
                                 "mysql://nobody@127.0.0.1:1/none"])
def test_a_server_that_is_not_there_is_unreachable(url: str) -> None:
    assert _error_of(_engine(url)).kind == "unreachable"


def test_a_wrong_password_is_refused_and_not_shown(db: TestDb) -> None:
    if db.backend == "sqlite":
        pytest.skip("SQLite has no passwords")
    scheme, rest = db.url.split("://", 1)
    host_db = rest.split("@", 1)[1]
    url = f"{scheme}://nobody_here:s3cret-pw@{host_db}"
    error = _error_of(_engine(url))
    assert isinstance(error, DatabaseRefused) and error.kind == "refused"
    assert "s3cret-pw" not in str(error)


def test_a_missing_table_is_a_schema_problem(db: TestDb) -> None:
    if db.backend == "sqlite":
        Store(db.url, db.prefix, create=False).close()  # the file, without tables
    assert _error_of(_engine(db.url, "nothing_here_")).kind == "schema"


def test_a_read_only_database_is_read_only(db: TestDb, store: Store) -> None:
    store.ensure_jobs(["j"])
    engine = _engine(db.url, db.prefix)
    setting = {"postgresql": "SET default_transaction_read_only = on",
               "mariadb": "SET SESSION TRANSACTION READ ONLY",
               "sqlite": "PRAGMA query_only = ON"}[db.backend]
    engine.x.run(lambda cur: cur.execute(setting))  # on its one connection
    error = _error_of(engine)
    assert error.kind == "read-only", error


def test_mariadb_errors_read_as_text_not_tuples(db: TestDb, store: Store) -> None:
    if db.backend != "mariadb":
        pytest.skip("PyMySQL's (code, text) errors")
    engine = _engine(db.url, db.prefix)
    with pytest.raises(DatabaseError) as caught:
        engine.x.run(lambda cur: engine.x.send(cur, "SELECT no_such_column FROM dual"))
    engine.close()
    assert str(caught.value) == (
        "database error: Unknown column 'no_such_column' in 'SELECT' (error 1054)")


@pytest.mark.parametrize(("kind", "said"), [
    ("unreachable", "database unreachable"),
    ("refused", "database refused us"),
    ("read-only", "database is read-only (a standby, or read_only set)"),
    ("deadlock", "database deadlock"),
    ("schema", "database schema missing or different"),
    ("error", "database error"),
])
def test_the_outage_line_says_what_happened_once(kind: str, said: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage()
    with caplog.at_level(logging.ERROR, logger="dblockrun"):
        for _ in range(3):
            outage.failed("claim j", DatabaseError(f"database error: {kind} detail", kind=kind))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"{said} (claim j): database error: {kind} detail; retrying with backoff"]


def test_the_end_of_an_outage_is_told_once() -> None:
    """The daemon's loop is woken when the database answers again (its
    resyncs waiting for the backoff are due then): once per outage, not
    per statement, and not for rows another session held."""
    told: list[int] = []
    outage = Outage(on_back=lambda: told.append(outage.ended))
    outage.ok()
    outage.failed("claim j", DatabaseError("gone", kind="unreachable"))
    outage.failed("heartbeat", DatabaseError("gone", kind="unreachable"))
    outage.ok()
    outage.ok()
    outage.failed("claim j", DatabaseError("held", kind="lock-held"))
    outage.ok()
    assert told == [1] and outage.ended == 1
