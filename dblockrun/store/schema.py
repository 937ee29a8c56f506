"""The tables, built for a table prefix. Times are epoch seconds (DOUBLE) on the
database clock, so the three dialects compare them the same way.

Names and keys (job names, items, host and holder ids, meta keys) are
compared byte for byte everywhere, as the jobs file compares job names:
``Backup`` and ``backup``, ``report`` and ``report `` are different jobs
with different locks. SQLite and PostgreSQL compare text so already;
MySQL/MariaDB get a binary collation without padding on these columns
(:func:`binary_collation`), set on existing tables by
:mod:`~dblockrun.store.migrate`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.compiler import compiles

from dblockrun.jobs import MAX_ITEM
from dblockrun.store.queries import SCHEMA_VERSION as SCHEMA_VERSION

#: Stored output tail of a run, in bytes.
OUTPUT_TAIL = 64 * 1024


class LongText(sa.Text):
    """A long text column (a run's output tail, a host's jobs): TEXT, and
    MEDIUMTEXT on MySQL, whose TEXT holds 64 KiB. Compiled here rather
    than as ``mysql.MEDIUMTEXT``: importing SQLAlchemy's MySQL dialect
    costs a PostgreSQL or SQLite daemon's start-up 8 ms of CPU."""

    cache_ok = True


_Text = LongText()


class Name(sa.String):
    """A name or key column: VARCHAR, compared byte for byte."""

    cache_ok = True


class NameText(sa.Text):
    """A name of any length (a fan-out item): TEXT, compared byte for byte."""

    cache_ok = True


def binary_collation(dialect: Dialect) -> str:
    """The collation that makes MySQL/MariaDB compare like ``memcmp``: case
    and trailing spaces count. ``utf8mb4_bin`` is not enough: it pads, so
    ``'report' = 'report '`` is true under it (MySQL before 8.0.17 has
    nothing better)."""
    version = dialect.server_version_info or ()
    if getattr(dialect, "is_mariadb", False):
        return "utf8mb4_nopad_bin" if version >= (10, 2, 2) else "utf8mb4_bin"
    return "utf8mb4_0900_bin" if version >= (8, 0, 17) else "utf8mb4_bin"


@compiles(Name, "mysql")
def _name_mysql(type_: Name, compiler: Any, **_kw: Any) -> str:
    return (f"VARCHAR({type_.length}) CHARACTER SET utf8mb4 "
            f"COLLATE {binary_collation(compiler.dialect)}")


@compiles(LongText, "mysql")
def _long_text_mysql(_type: LongText, _compiler: Any, **_kw: Any) -> str:
    return "MEDIUMTEXT"


@compiles(NameText, "mysql")
def _name_text_mysql(_type: NameText, compiler: Any, **_kw: Any) -> str:
    return f"TEXT CHARACTER SET utf8mb4 COLLATE {binary_collation(compiler.dialect)}"


def name_columns(tables: Tables) -> list[sa.Column[Any]]:
    """Every column compared byte for byte, table by table."""
    return [c for t in tables.metadata.sorted_tables for c in t.columns
            if isinstance(c.type, Name | NameText)]


def job_name_columns(tables: Tables) -> list[sa.Column[Any]]:
    """The columns holding job names: a name in one is the same job (the
    same lock) as that name in another."""
    return [tables.locks.c.name, tables.runs.c.job, tables.items.c.job]


@dataclass(frozen=True)
class Tables:
    metadata: sa.MetaData
    meta: sa.Table
    locks: sa.Table
    runs: sa.Table
    hosts: sa.Table
    items: sa.Table
    pause: sa.Table
    audit: sa.Table
    sessions: sa.Table
    triggers: sa.Table
    alerts: sa.Table
    drain: sa.Table


def _lease_columns() -> list[sa.Column[Any]]:
    """What makes a row lockable (a job's lock, a fan-out item): holder,
    lease, fencing token, the last slot and start claimed, and when the
    holder (and the one before it) last renewed the lease: a lost run ends
    there (schema 3)."""
    return [
        sa.Column("holder", Name(255)),
        sa.Column("lock_until", sa.Double()),
        sa.Column("locked_at", sa.Double()),
        sa.Column("token", sa.BigInteger(), nullable=False, default=0),
        sa.Column("last_slot", sa.Double()),
        sa.Column("last_start", sa.Double()),
        sa.Column("renewed_at", sa.Double()),
        # The previous holder's last renewal, kept by the claim that took the
        # lease over: where that holder's run ended if it died.
        sa.Column("prev_renewed_at", sa.Double()),
        # `dblockrun kill` (schema 4): the token of the run to stop, and who
        # asked and why; its holder reads it with its next renewal.
        sa.Column("kill_token", sa.BigInteger()),
        sa.Column("kill_by", sa.String(1000)),
    ]


def build_tables(prefix: str) -> Tables:
    md = sa.MetaData()
    meta = sa.Table(
        f"{prefix}meta",
        md,
        sa.Column("key", Name(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False),
    )
    locks = sa.Table(
        f"{prefix}locks",
        md,
        sa.Column("name", Name(255), primary_key=True),
        *_lease_columns(),
        sa.Column("next_due", sa.Double()),
        sa.Column("disabled_until", sa.Double()),
        sa.Column("disabled_reason", sa.String(1000)),
        sa.Column("run_requested", sa.Double()),
        sa.Column("disabled_by", sa.String(255)),  # user@host of `disable` (schema 4)
        # A group's seat (a row named group:NAME:N, dblockrun/scheduling/limits.py): the
        # job its holder took it for (schema 4).
        sa.Column("held_for", sa.String(255)),
        # The claim of a slot keeps the slot it moved the row on from and, when
        # the lock was held a second or more past that slot, until when (schema
        # 5): the slots between, which that lock kept from every host and nobody
        # recorded, are recorded by a host's bookkeeping (dblockrun/daemon/fleet.py).
        sa.Column("prev_slot", sa.Double()),
        sa.Column("prev_until", sa.Double()),
    )
    runs = sa.Table(
        f"{prefix}runs",
        md,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("job", Name(255), nullable=False),
        sa.Column("item", Name(MAX_ITEM)),
        sa.Column("host", Name(255), nullable=False),
        sa.Column("slot", sa.Double()),
        sa.Column("token", sa.BigInteger()),
        sa.Column("attempt", sa.Integer(), nullable=False, default=1),
        sa.Column("started", sa.Double(), nullable=False),
        sa.Column("finished", sa.Double()),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("output", _Text),
        # A summary record of passed slots: the first slot it stands for
        # (``slot`` is the last). Null for every other record.
        sa.Column("covers_from", sa.Double()),
        # A run started by another job's run (``after:``, schema 10): that
        # job and that run's record (the trigger's key, dblockrun/daemon/chains.py).
        sa.Column("upstream_job", Name(255)),
        sa.Column("upstream_run", sa.BigInteger()),
        # A passed slot run again (schema 11, dblockrun/ops/backfill.py):
        # ``backfill`` or ``rerun``, and the run it runs again (a rerun's;
        # a backfill's: the slot's record that said why it had not run ok).
        sa.Column("origin", sa.String(16)),
        sa.Column("origin_run", sa.BigInteger()),
        sa.Index(f"{prefix}runs_job", "job", "id"),
        sa.Index(f"{prefix}runs_result", "result"),
    )
    hosts = sa.Table(
        f"{prefix}hosts",
        md,
        sa.Column("id", Name(255), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("started", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("clock_offset", sa.Double()),
        sa.Column("running", sa.Integer(), nullable=False, default=0),
        sa.Column("jobs", _Text),
        # Schema 4: the daemon's labels, and its file's run-on/every-host (JSON).
        sa.Column("labels", _Text),
        sa.Column("targets", _Text),
        # Schema 6: the daemon's --heartbeat (seconds): how long its row
        # stays live in `status` (dblockrun/store/status.py live_window).
        sa.Column("heartbeat", sa.Double()),
        # Schema 7: per job, a digest of each field its file sets (JSON;
        # jobs.py field_digests): drift names the fields that differ.
        sa.Column("fields", _Text),
    )
    items = sa.Table(
        f"{prefix}items",
        md,
        sa.Column("job", Name(255), primary_key=True),
        # sha256 of the item, so items of any length have a short key.
        sa.Column("item_key", Name(64), primary_key=True),
        sa.Column("item", NameText(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False, default=False),
        *_lease_columns(),
        sa.Column("last_result", sa.String(16)),
    )
    # `dblockrun pause` (schema 4): at most one row (id 'fleet'); while its
    # end is ahead of the database clock no claim wins (Queries.claimable).
    pause = sa.Table(
        f"{prefix}pause",
        md,
        sa.Column("id", Name(16), primary_key=True),
        sa.Column("ends", sa.Double(), nullable=False),
        sa.Column("since", sa.Double(), nullable=False),
        sa.Column("who", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(1000)),
    )
    # Every operator action (schema 4): who, when (database clock), what, why.
    audit = sa.Table(
        f"{prefix}audit",
        md,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("at", sa.Double(), nullable=False),
        sa.Column("who", sa.String(255), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("job", Name(255)),
        sa.Column("detail", sa.String(1000)),
        sa.Column("reason", sa.String(1000)),
        sa.Index(f"{prefix}audit_job", "job", "id"),
    )
    # `dblockrun web`'s signed-in sessions (schema 9): the cookie holds a
    # random id, the row its SHA-256 (a reader of the table cannot sign in
    # with it), whose session it is and when it ends (database clock, an
    # absolute end no request moves). Signing out deletes the row, so every
    # `dblockrun web` on the database ends the session at once.
    sessions = sa.Table(
        f"{prefix}sessions",
        md,
        sa.Column("id", Name(64), primary_key=True),
        sa.Column("username", sa.String(255), nullable=False),
        sa.Column("started", sa.Double(), nullable=False),
        sa.Column("ends", sa.Double(), nullable=False),
    )
    # ``after:`` (schema 10): one row per (downstream job, upstream run) whose
    # result its ``on:`` takes, made by whichever host first sees the
    # upstream run finished; ``taken`` (database clock) once the one claim of
    # the downstream job for it won, or its one record says why it did not
    # run (dblockrun/daemon/chains.py).
    triggers = sa.Table(
        f"{prefix}triggers",
        md,
        sa.Column("job", Name(255), primary_key=True),
        sa.Column("upstream_run", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("upstream_job", Name(255), nullable=False),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("ended", sa.Double(), nullable=False),
        sa.Column("taken", sa.Double()),
    )
    # The alerts ledger (schema 12, dblockrun/notify/alerts.py and storm.py):
    # one row per (job, kind, ref), inserted by whichever host sees the
    # alert first (the key decides: the others' inserts are ignored), so each
    # is sent once across the fleet; ``cleared`` (database clock) by the one
    # conditional update that sends its recovery. ``kind`` is late, slow or
    # fast (``ref`` names its slot or run), ``slot`` (a passed slot, with its
    # ``cause``, counted for a storm) or ``storm`` (job empty, ``ref`` the
    # cause; ``cleared``: when the storm was last seen).
    alerts = sa.Table(
        f"{prefix}alerts",
        md,
        sa.Column("job", Name(255), primary_key=True),
        sa.Column("kind", Name(16), primary_key=True),
        sa.Column("ref", Name(64), primary_key=True),
        sa.Column("opened", sa.Double(), nullable=False),
        sa.Column("cleared", sa.Double()),
        sa.Column("host", Name(255), nullable=False),
        sa.Column("cause", sa.String(32)),
        sa.Column("detail", sa.String(1000)),
        sa.Index(f"{prefix}alerts_opened", "kind", "opened"),
    )
    # `dblockrun drain HOST` (schema 13): a row per host name (a daemon's
    # ``hostname`` label); while its end is ahead of the database clock no
    # claim of a holder on that host wins (Queries.claimable). Undrained, the
    # row stays, ending then (``status`` and the audit trail say who and why).
    drain = sa.Table(
        f"{prefix}drain",
        md,
        sa.Column("host", Name(64), primary_key=True),
        sa.Column("ends", sa.Double(), nullable=False),
        sa.Column("since", sa.Double(), nullable=False),
        sa.Column("who", sa.String(255), nullable=False),
        sa.Column("reason", sa.String(1000)),
    )
    return Tables(md, meta, locks, runs, hosts, items, pause, audit, sessions, triggers,
                  alerts, drain)
