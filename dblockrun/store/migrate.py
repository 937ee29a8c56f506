"""Schema changes beyond creating missing tables, run by
:meth:`Store.ensure_schema <dblockrun.store.store.Store.ensure_schema>` before
it records the new version. Each step is idempotent: it looks at what the
database has, so a migration cut short is simply run again.

Version 3: a lease's last renewal (``renewed_at``), where a lost run ends;
and names compared byte for byte. MySQL/MariaDB compared names
with the database's default collation (``utf8mb4_general_ci``): ``Backup``
and ``backup``, ``report`` and ``report ``, were one lock row, so one job
blocked or fenced the other. The name columns get a binary collation
(:func:`~dblockrun.store.schema.binary_collation`). Jobs whose names the old
collation already merged have history under both names and one token
sequence; splitting them would restart one job's fencing tokens, so the
migration refuses, naming them, until an operator keeps one name.
SQLite and PostgreSQL always compared text byte for byte: nothing to do.

Version 4: the fleet features' nullable columns and tables, added by
:func:`_new_columns` and ``create_all``:

- hosts ``labels`` and ``targets``: a daemon's labels and its jobs file's
  ``run-on``/``every-host`` (JSON), written with its host row (host targeting).
- kill, pause, audit: ``kill_token`` and ``kill_by`` on the locks and the
  items, ``disabled_by`` on the locks, tables ``pause`` (the fleet-wide
  pause) and ``audit`` (operator actions). Nothing is converted.
- limits: ``locks.held_for``, the job a group seat row (``group:NAME:N``,
  :mod:`dblockrun.scheduling.limits`) is held for.

Version 5: ``locks.prev_slot`` and ``prev_until``, written by each slot
claim (the slot it moved the job on from, and a lock held a second or more
past it), from which a host's bookkeeping records the slots such a lock kept
from every host that nobody recorded. Nullable; nothing is converted.

Version 6: ``hosts.heartbeat``, each daemon's ``--heartbeat``, written with
its host row: ``status`` calls a host live by its own heartbeat, not a
fixed 15 s (:func:`~dblockrun.store.status.live_window`). Nullable: a row
of an older daemon is live for 15 s, as before.

Version 7: ``runs.covers_from``, the first slot a summary record of passed
slots stands for (its ``slot`` is the last), so the bookkeeping that records
the slots a held lock kept sees the summarized ones as recorded. Nullable:
older summaries keep their range only in their text.

Version 8: ``hosts.fields``, per job a short digest of each field the
daemon's file sets (JSON), written when its jobs file is (re)loaded, so
drift between hosts names the fields that differ
(:func:`~dblockrun.jobs.differing_fields`). Nullable: an older
daemon's drift is named by its definition hash only, as before.

Version 9: the table ``sessions`` (``dblockrun web``'s signed-in sessions,
shared by every web server on the database, so that signing out ends a
session everywhere), made by ``create_all``; and the fleet's key in
``meta`` (``fleet_key``, 32 random bytes, written by the first process that
upgrades the schema: :meth:`Store.fleet_key
<dblockrun.store.store.Store.fleet_key>`), with which daemons key their
definition hashes and per-key digests (HMAC), so that a reader of the
dashboard can compare hosts but not test guesses of a job's secrets. A
daemon of version 8 keeps writing unkeyed hashes: while both run, their
hosts' definitions show as different.

Version 10: job chains (``after:``): the table ``triggers`` (one row per
downstream job and upstream run, made by ``create_all``) and the runs'
``upstream_job`` and ``upstream_run`` (nullable: the runs before have none).

Version 11: ``runs.origin`` and ``origin_run``: a run of a passed slot run
again (``dblockrun backfill``, ``dblockrun rerun``) and the run it runs
again, which ``history`` shows (nullable: the runs before have none).

Version 12: the alerts ledger, the table ``alerts`` (made by ``create_all``):
a job's ``expect:`` alerts (late, slow, fast) and notification storms, each
a row inserted once across the fleet. Nothing is converted: a daemon of
version 11 knows no ``expect:`` and sends no storm.

Version 13: the table ``drain`` (``dblockrun drain HOST``: a row per host
name, made by ``create_all``), which the one claim predicate consults. A
daemon of an older version still running does not read it: drain a host
only once its daemon is upgraded (``status`` shows each host's version).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from dblockrun.errors import DatabaseRefused
from dblockrun.store.queries import SCHEMA_VERSION
from dblockrun.store.schema import Tables, binary_collation, job_name_columns, name_columns

#: Colliding names shown in the refusal, at most.
SHOWN = 10


class NamesCollide(DatabaseRefused):
    """Job names in the database differ only in case or trailing spaces."""

    kind = "schema"

    def __init__(self, message: str, groups: list[list[str]]) -> None:
        super().__init__(message)
        #: The colliding names, each group sorted.
        self.groups = groups


def migrate(conn: Connection, tables: Tables) -> None:
    """Bring existing tables to the current schema (all exist by now)."""
    if conn.dialect.name == "mysql":
        _binary_names(conn, tables)  # first: it may refuse, and then changes nothing
    _new_columns(conn, tables)


def _new_columns(conn: Connection, tables: Tables) -> None:
    """Add the (nullable) columns a table lacks: version 3 adds ``renewed_at``
    to the locks and the items."""
    inspector = sa.inspect(conn)
    prep = conn.dialect.identifier_preparer
    for table in tables.metadata.sorted_tables:
        have = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name not in have:
                assert column.nullable, f"{table.name}.{column.name}: a new column is nullable"
                kind = column.type.compile(dialect=conn.dialect)
                conn.exec_driver_sql(f"ALTER TABLE {prep.quote(table.name)} "
                                     f"ADD COLUMN {prep.quote(column.name)} {kind}")


def _binary_names(conn: Connection, tables: Tables) -> None:
    target = binary_collation(conn.dialect)
    current = _collations(conn, [t.name for t in tables.metadata.sorted_tables])

    def collation(column: sa.Column[Any]) -> str | None:
        return current.get((column.table.name, column.name))

    # A column the table lacks yet (runs.upstream_job, schema 10) is added
    # by _new_columns, with the binary collation already.
    stale = [c for c in name_columns(tables) if (c.table.name, c.name) in current
             and collation(c) != f"utf8mb4/{target}"]
    if not stale:
        return
    # A job name column still compared the old way may hold names that
    # column merged (in the lock row, or in its own rows).
    old = {collation(c) for c in job_name_columns(tables)}
    groups = _collisions(conn, tables, target, {o for o in old if o and o != f"utf8mb4/{target}"})
    if groups:
        raise NamesCollide(_refusal(tables, groups), groups)
    by_table: dict[str, list[sa.Column[Any]]] = defaultdict(list)
    for column in stale:
        by_table[column.table.name].append(column)
    prep = conn.dialect.identifier_preparer
    for table, columns in by_table.items():
        changes = ", ".join(
            f"MODIFY {prep.quote(c.name)} {c.type.compile(dialect=conn.dialect)} "
            f"{'NULL' if c.nullable else 'NOT NULL'}" for c in columns)
        conn.exec_driver_sql(f"ALTER TABLE {prep.quote(table)} {changes}")


def _collations(conn: Connection, table_names: list[str]) -> dict[tuple[str, str], str | None]:
    """(table, column) -> ``charset/collation`` of each column (None: not text)."""
    rows = conn.execute(
        sa.text("SELECT TABLE_NAME, COLUMN_NAME, CHARACTER_SET_NAME, COLLATION_NAME "
                "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() "
                "AND TABLE_NAME IN :tables").bindparams(sa.bindparam("tables", expanding=True)),
        {"tables": table_names},
    )
    return {(str(r[0]), str(r[1])): None if r[3] is None else f"{r[2]}/{r[3]}" for r in rows}


def _collisions(conn: Connection, tables: Tables, target: str,
                old: set[str]) -> list[list[str]]:
    """Groups of job names, distinct byte for byte, that one of the old
    collations (``charset/collation``) of the job name columns compares equal."""
    prep = conn.dialect.identifier_preparer
    names = " UNION ".join(
        f"SELECT CONVERT({prep.quote(c.name)} USING utf8mb4) COLLATE {target} AS n "
        f"FROM {prep.quote(c.table.name)}" for c in job_name_columns(tables))
    pairs: set[tuple[str, str]] = set()
    for spec in sorted(old):
        charset, collation = spec.split("/")
        loose = f"USING {charset}) COLLATE {collation}"
        rows = conn.exec_driver_sql(
            f"SELECT a.n, b.n FROM ({names}) a JOIN ({names}) b "
            f"ON CONVERT(a.n {loose} = CONVERT(b.n {loose} AND a.n < b.n")
        pairs.update((str(a), str(b)) for a, b in rows)
    return _groups(pairs)


def _groups(pairs: set[tuple[str, str]]) -> list[list[str]]:
    """The names of ``pairs`` joined into groups that collide (a, A, a ...)."""
    group: dict[str, set[str]] = {}
    for a, b in pairs:
        merged = group.get(a, {a}) | group.get(b, {b})
        for name in merged:
            group[name] = merged
    unique = {id(g): g for g in group.values()}.values()
    return sorted(sorted(g) for g in unique)


def _refusal(tables: Tables, groups: list[list[str]]) -> str:
    def names(group: list[str]) -> str:
        quoted = [repr(n) for n in group]
        return ", ".join(quoted[:-1]) + " and " + quoted[-1]

    shown = "; ".join(f"jobs {names(g)}" for g in groups[:SHOWN])
    more = f" (and {len(groups) - SHOWN} more)" if len(groups) > SHOWN else ""
    return (
        f"cannot migrate the dblockrun schema (tables {tables.locks.name} ...) to version "
        f"{SCHEMA_VERSION}: {shown}{more} differ only in case or trailing spaces and have "
        "shared one lock and one fencing-token sequence, because the database compared names "
        "without case and trailing spaces; now they would be two locks. Keep one name of each: "
        "rename or remove the others in every jobs file, delete their rows "
        "(docs/getting-started.md, \"Schema versions\"), then run `dblockrun init-db`"
    )
