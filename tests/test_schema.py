"""Names are compared byte for byte on every database (schema version 3), and
a version-2 MariaDB database is migrated in place, or refused when names its
old collation merged already have rows."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from conftest import ServerDatabases
from harness import Fleet
from helpers import TestDb, clean_env, dblockrun_cmd, invoke, new_prefix

from dblockrun.store import Store
from dblockrun.store import models as m
from dblockrun.store.migrate import NamesCollide
from dblockrun.store.queries import SCHEMA_VERSION
from dblockrun.store.schema import name_columns
from dblockrun.store.status import report

#: Names the jobs file, ``exec --name`` and the API keep apart.
NAMES = ["Backup", "backup", "BACKUP", "report", "report ", "Ärger", "ärger"]

#: The version-2 tables as SQLAlchemy created them on MariaDB (``{p}``: the
#: prefix): the database's default collation on every name column.
V2_MARIADB = """\
CREATE TABLE `{p}hosts` (id VARCHAR(255) NOT NULL, hostname VARCHAR(255) NOT NULL,
  pid INTEGER NOT NULL, version VARCHAR(32) NOT NULL, started DOUBLE NOT NULL,
  last_seen DOUBLE NOT NULL, clock_offset DOUBLE, running INTEGER NOT NULL, jobs MEDIUMTEXT,
  PRIMARY KEY (id));
CREATE TABLE `{p}items` (job VARCHAR(255) NOT NULL, item_key VARCHAR(64) NOT NULL,
  item TEXT NOT NULL, retired BOOL NOT NULL, holder VARCHAR(255), lock_until DOUBLE,
  locked_at DOUBLE, token BIGINT NOT NULL, last_slot DOUBLE, last_start DOUBLE,
  last_result VARCHAR(16), PRIMARY KEY (job, item_key));
CREATE TABLE `{p}locks` (name VARCHAR(255) NOT NULL, holder VARCHAR(255), lock_until DOUBLE,
  locked_at DOUBLE, token BIGINT NOT NULL, last_slot DOUBLE, last_start DOUBLE,
  next_due DOUBLE, disabled_until DOUBLE, disabled_reason VARCHAR(1000), run_requested DOUBLE,
  PRIMARY KEY (name));
CREATE TABLE `{p}meta` (`key` VARCHAR(64) NOT NULL, value VARCHAR(255) NOT NULL,
  PRIMARY KEY (`key`));
CREATE TABLE `{p}runs` (id BIGINT NOT NULL AUTO_INCREMENT, job VARCHAR(255) NOT NULL,
  item VARCHAR(1000), host VARCHAR(255) NOT NULL, slot DOUBLE, token BIGINT,
  attempt INTEGER NOT NULL, started DOUBLE NOT NULL, finished DOUBLE, exit_code INTEGER,
  result VARCHAR(16) NOT NULL, output MEDIUMTEXT, PRIMARY KEY (id));
CREATE INDEX `{p}runs_job` ON `{p}runs` (job, id);
CREATE INDEX `{p}runs_result` ON `{p}runs` (result);
INSERT INTO `{p}meta` VALUES ('schema_version', '2')"""


def test_names_differing_in_case_or_trailing_spaces_are_different_locks(store: Store) -> None:
    store.ensure_jobs(NAMES)
    tokens = {n: store.claim(n, f"h:{i}", 30) for i, n in enumerate(NAMES)}
    assert tokens == {n: 1 for n in NAMES}
    for i, name in enumerate(NAMES):
        lock = store.lock_state(name)
        assert lock is not None and (lock.name, lock.holder) == (name, f"h:{i}")
        store.start_run(name, f"h:{i}", token=1, item=name, result=m.OK)
    for name in NAMES:
        assert [(r.job, r.item) for r in store.history(name)] == [(name, name)]
        assert [r.item for r in store.history(item=name)] == [name]
    assert sorted(s.lock.name for s in report(store).jobs) == sorted(NAMES)


def test_items_and_hosts_differing_in_case_are_different_rows(store: Store) -> None:
    items = ["acme", "ACME", "acme "]
    assert store.items.sync("fan", items) == (3, 0)
    assert store.items.sync("Fan", ["acme"]) == (1, 0)
    claimed = store.items.claim("fan", "h:1", 30, slot=None, rate=None, limit=10)
    assert sorted(c.item for c in claimed) == sorted(items)
    assert [c.item for c in store.items.claim("Fan", "h:2", 30, slot=None, rate=None,
                                              limit=10)] == ["acme"]
    for host in ("web1:7:aa", "Web1:7:aa", "web1:7:aa "):
        store.heartbeat_host(host, hostname="web1", pid=7, version="t", clock_offset=0.0,
                             running=0, jobs=None)
    assert sorted(h.id for h in store.hosts()) == sorted(["web1:7:aa", "Web1:7:aa", "web1:7:aa "])


def test_a_version_2_schema_becomes_the_current_one(store: Store) -> None:
    # SQLite and PostgreSQL compared names exactly in version 2 already: the
    # version is all that changes there (MariaDB: the tests below).
    store.ensure_schema()
    meta = store.t.meta
    with store.engine.connect() as conn:
        conn.execute(meta.update().values(value="2"))
    with Store(store.url, store.prefix) as again:
        assert again.schema_version() == 2
        assert again.ensure_schema() == SCHEMA_VERSION
        assert again.schema_version() == SCHEMA_VERSION


# -- MariaDB ------------------------------------------------------------------------


@pytest.fixture
def maria(server_databases: ServerDatabases) -> Iterator[Store]:
    """A Store on MariaDB whose tables are not created yet."""
    s = Store(server_databases.url("mariadb"), new_prefix())
    yield s
    s.close()


def make_v2(store: Store, sql: str = "") -> None:
    """The version-2 tables, and ``sql`` run in them (``{p}``: the prefix)."""
    with store.engine.connect() as conn:
        for stmt in (V2_MARIADB + (";\n" + sql if sql else "")).split(";\n"):
            conn.exec_driver_sql(stmt.replace("{p}", store.prefix))


def collations(store: Store) -> dict[str, str]:
    """``table.column`` -> collation of each name column."""
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
            "WHERE TABLE_SCHEMA = DATABASE()").all()
    wanted = {f"{c.table.name}.{c.name}" for c in name_columns(store.t)}
    return {f"{t}.{c}": str(coll) for t, c, coll in rows if f"{t}.{c}" in wanted}


def test_mariadb_creates_name_columns_with_a_binary_collation_without_padding(
    maria: Store,
) -> None:
    maria.ensure_schema()
    found = collations(maria)
    assert sorted(found) == sorted(f"{c.table.name}.{c.name}" for c in name_columns(maria.t))
    assert set(found.values()) == {"utf8mb4_nopad_bin"}


def test_mariadb_version_2_is_converted_in_place(maria: Store) -> None:
    p = maria.prefix
    make_v2(maria, f"INSERT INTO `{p}locks` (name, token, last_slot) VALUES ('Backup', 7, 100);\n"
                   f"INSERT INTO `{p}runs` (job, host, token, attempt, started, result) "
                   "VALUES ('Backup', 'h', 7, 1, 100, 'ok');\n"
                   f"INSERT INTO `{p}hosts` VALUES ('web1:7:aa', 'web1', 7, 'v', 1, 2, 0, 0, NULL)")
    assert set(collations(maria).values()) == {"utf8mb4_general_ci"}  # as version 2 left them

    assert maria.ensure_schema() == SCHEMA_VERSION
    assert set(collations(maria).values()) == {"utf8mb4_nopad_bin"}
    # The rows are kept, and the names now compare exactly.
    backup = maria.lock_state("Backup")
    assert backup is not None and (backup.token, backup.last_slot) == (7, 100.0)
    assert maria.lock_state("backup") is None
    assert [r.job for r in maria.history("Backup")] == ["Backup"]
    assert maria.history("backup") == []
    maria.ensure_jobs(["backup", "Backup "])
    assert maria.claim("backup", "h:1", 30) == 1
    assert maria.claim("Backup ", "h:2", 30) == 1
    assert maria.claim("Backup", "h:3", 30) == 8
    assert [h.id for h in maria.hosts()] == ["web1:7:aa"]
    # A second run finds nothing to do.
    with Store(maria.url, maria.prefix) as again:
        assert again.ensure_schema() == SCHEMA_VERSION


COLLIDING = {
    # The lock row is Backup's; backup won it on some slots and recorded its runs.
    "case": ("INSERT INTO `{p}locks` (name, token) VALUES ('Backup', 9);\n"
             "INSERT INTO `{p}runs` (job, host, token, attempt, started, result) VALUES "
             "('Backup', 'h', 8, 1, 1, 'ok'), ('backup', 'h', 9, 1, 2, 'ok')",
             ["Backup", "backup"]),
    "trailing space": ("INSERT INTO `{p}locks` (name, token) VALUES ('report', 3);\n"
                       "INSERT INTO `{p}runs` (job, host, token, attempt, started, result) "
                       "VALUES ('report ', 'h', 3, 1, 1, 'ok')",
                       ["report", "report "]),
    "fan-out items": ("INSERT INTO `{p}locks` (name, token) VALUES ('scrape', 1);\n"
                      "INSERT INTO `{p}items` (job, item_key, item, retired, token) VALUES "
                      "('SCRAPE', 'k1', 'a', 0, 4), ('Scrape', 'k2', 'b', 0, 2)",
                      ["SCRAPE", "Scrape", "scrape"]),
}


@pytest.mark.parametrize("case", list(COLLIDING))
def test_mariadb_migration_refuses_names_that_already_collide(maria: Store,
                                                              case: str) -> None:
    rows, names = COLLIDING[case]
    make_v2(maria, rows)
    with pytest.raises(NamesCollide) as refused:
        maria.ensure_schema()
    assert refused.value.groups == [names]
    message = str(refused.value)
    for name in names:
        assert repr(name) in message
    # Nothing changed: still version 2, still the old collation (in the
    # version-2 tables; tables of later versions may have been created, empty).
    assert maria.schema_version() == 2
    v2 = {f"{maria.prefix}{t}" for t in ("hosts", "items", "locks", "meta", "runs")}
    assert {c for name, c in collations(maria).items()
            if name.split(".")[0] in v2} == {"utf8mb4_general_ci"}


def test_mariadb_refusal_from_the_command_line_and_its_way_out(maria: Store) -> None:
    make_v2(maria, COLLIDING["case"][0])
    cmd = [*dblockrun_cmd(), "--db", maria.url, "--table-prefix", maria.prefix, "init-db"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "jobs 'Backup' and 'backup' differ only in case or trailing spaces" in lines[0]
    assert f"version {SCHEMA_VERSION}" in lines[0] and "dblockrun init-db" in lines[0]
    # The way out the README gives: keep one name, delete the other's rows.
    with maria.engine.connect() as conn:
        for table, column in (("runs", "job"), ("items", "job"), ("locks", "name")):
            conn.exec_driver_sql(f"DELETE FROM {maria.prefix}{table} "
                                 f"WHERE CAST({column} AS BINARY) = 'backup'")
    # (The refusal above is a real process's stderr; the way out need not be.)
    ready = invoke(*cmd[len(dblockrun_cmd()):])
    assert ready.returncode == 0, ready.stderr
    assert ready.stdout.startswith(f"schema version {SCHEMA_VERSION} ready in ")
    assert [r.job for r in maria.history()] == ["Backup"]


# -- a real daemon --------------------------------------------------------------------


@pytest.mark.slow
def test_jobs_differing_only_in_case_both_run_every_slot(
        db: TestDb, store: Store, fleet: Fleet) -> None:
    d = fleet.start('jobs:\n'
                    '  Backup: {cron: "* * * * * *", command: "true"}\n'
                    '  backup: {cron: "* * * * * *", command: "true"}\n')
    try:
        d.wait(lambda: all(len(store.history(n, 100)) >= 6 for n in ("Backup", "backup")), 40,
               interval=0.2, what="six slots of each job")
    finally:
        code = d.stop()
    assert code == 0, d.text()
    runs = {n: sorted(store.history(n, 100), key=lambda r: r.id) for n in ("Backup", "backup")}
    for name, records in runs.items():
        assert {r.job for r in records} == {name}
        assert {r.result for r in records} == {m.OK}, (name, records)
        # Its own lock: its own token sequence, one token per run.
        assert [r.token for r in records] == list(range(1, len(records) + 1))
    slots = {n: [r.slot for r in records] for n, records in runs.items()}
    # Both ran every slot: the same slots, one second apart.
    assert slots["Backup"] == slots["backup"], slots
    first = slots["Backup"][0]
    assert first is not None
    assert slots["Backup"] == [first + i for i in range(len(slots["Backup"]))], slots
