"""The tables, built for a table prefix. Times are epoch seconds (DOUBLE) on the
database clock, so the three dialects compare them the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from dblockrun.store.sql import SCHEMA_VERSION as SCHEMA_VERSION

#: Stored output tail of a run, in bytes.
OUTPUT_TAIL = 64 * 1024

_Text = sa.Text().with_variant(mysql.MEDIUMTEXT(), "mysql")


@dataclass(frozen=True)
class Tables:
    metadata: sa.MetaData
    meta: sa.Table
    locks: sa.Table
    runs: sa.Table
    hosts: sa.Table
    items: sa.Table


def _lease_columns() -> list[sa.Column[Any]]:
    """What makes a row lockable (a job's lock, a fan-out item): holder,
    lease, fencing token and the last slot and start claimed."""
    return [
        sa.Column("holder", sa.String(255)),
        sa.Column("lock_until", sa.Double()),
        sa.Column("locked_at", sa.Double()),
        sa.Column("token", sa.BigInteger(), nullable=False, default=0),
        sa.Column("last_slot", sa.Double()),
        sa.Column("last_start", sa.Double()),
    ]


def build_tables(prefix: str) -> Tables:
    md = sa.MetaData()
    meta = sa.Table(
        f"{prefix}meta",
        md,
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(255), nullable=False),
    )
    locks = sa.Table(
        f"{prefix}locks",
        md,
        sa.Column("name", sa.String(255), primary_key=True),
        *_lease_columns(),
        sa.Column("next_due", sa.Double()),
        sa.Column("disabled_until", sa.Double()),
        sa.Column("disabled_reason", sa.String(1000)),
        sa.Column("run_requested", sa.Double()),
    )
    runs = sa.Table(
        f"{prefix}runs",
        md,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("job", sa.String(255), nullable=False),
        sa.Column("item", sa.String(1000)),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("slot", sa.Double()),
        sa.Column("token", sa.BigInteger()),
        sa.Column("attempt", sa.Integer(), nullable=False, default=1),
        sa.Column("started", sa.Double(), nullable=False),
        sa.Column("finished", sa.Double()),
        sa.Column("exit_code", sa.Integer()),
        sa.Column("result", sa.String(16), nullable=False),
        sa.Column("output", _Text),
        sa.Index(f"{prefix}runs_job", "job", "id"),
        sa.Index(f"{prefix}runs_result", "result"),
    )
    hosts = sa.Table(
        f"{prefix}hosts",
        md,
        sa.Column("id", sa.String(255), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("started", sa.Double(), nullable=False),
        sa.Column("last_seen", sa.Double(), nullable=False),
        sa.Column("clock_offset", sa.Double()),
        sa.Column("running", sa.Integer(), nullable=False, default=0),
        sa.Column("jobs", _Text),
    )
    items = sa.Table(
        f"{prefix}items",
        md,
        sa.Column("job", sa.String(255), primary_key=True),
        # sha256 of the item, so items of any length have a short key.
        sa.Column("item_key", sa.String(64), primary_key=True),
        sa.Column("item", sa.Text(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False, default=False),
        *_lease_columns(),
        sa.Column("last_result", sa.String(16)),
    )
    return Tables(md, meta, locks, runs, hosts, items)
