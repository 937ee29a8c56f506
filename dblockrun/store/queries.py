"""Every lock and run statement, written once.

:class:`Queries` holds the SQL text every database shares (PostgreSQL's and
SQLite's spelling); :class:`MysqlQueries` and :class:`SqliteQueries`
override only what really differs: the clock, how a claim hands back its
token and run record, the result with the release, and the batch claim.

The text is bound with named parameters in the drivers' own style
(``%(name)s`` for psycopg and PyMySQL, ``:name`` for sqlite3) and runs on
whichever connection an :mod:`~dblockrun.store.executor` hands out: a pooled
SQLAlchemy raw connection (daemon, API) or a direct driver connection
(``exec``). This module imports neither SQLAlchemy nor a driver.

The conditions of a claim live in one place, :meth:`Queries.claimable`:
every claim (single, batch, run-now, ``exec``, the API, fan-out items) is
built from it, so no path can forget one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from dblockrun.store.models import LANE_PREFIX, OK, RUNNING, TOKEN_MAX, WAITING

SCHEMA_VERSION = 13  # 2: items (fan-out jobs); 3: names compared byte for byte (MySQL);
#                    4: the fleet features (labels, limits, kill, pause, audit): new
#                       nullable columns and tables, added by store/migrate.py;
#                    5: locks.prev_slot and prev_until (a claim's jump over held slots);
#                    6: hosts.heartbeat (liveness by each daemon's own --heartbeat);
#                    7: runs.covers_from (the range of a summary record of passed slots);
#                    8: hosts.fields (drift names the fields that differ)
#                    9: sessions (dblockrun web's), meta fleet_key (keyed definition hashes)
#                   10: triggers, runs.upstream_job and upstream_run (after:, job chains)
#                   11: runs.origin and origin_run (backfill and rerun runs)
#                   12: alerts (expect: alerts and notification storms, claimed once)
#                   13: drain (dblockrun drain HOST: a host's claims refused)

#: The operator actions each daemon logs as its bookkeeping reads them from
#: the audit trail (dblockrun/daemon/fleet.py).
TOLD_ACTIONS = ("pause", "resume", "disable", "enable", "drain", "undrain")

#: The database clock in epoch seconds, read per statement.
NOW = {
    # clock_timestamp(), not now(): now() is frozen at transaction start.
    "postgresql": "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)",
    # NOW(6) is the statement's start; the session runs in UTC (see CONNECT_OPTIONS).
    "mysql": "CAST(UNIX_TIMESTAMP(NOW(6)) AS DOUBLE)",
    # 'now' is stable within one statement.
    "sqlite": "((julianday('now') - 2440587.5) * 86400.0)",
}
#: The columns of a run record, in the order the INSERTs below give them.
RUN_COLUMNS = "job, item, host, slot, token, attempt, started, finished, result"


@dataclass(frozen=True)
class ClaimShape:
    """Which conditions a claim carries; each shape is one statement text."""

    slot: bool = False  # a cron slot: newer than the last one, not in the future
    rate: bool = False  # the last start is at least ``rate`` old
    next_due: bool = False  # publish the next slot
    record: bool = False  # also insert the run record of attempt 1 (and record the
    #                       run before it lost if its holder died)
    requested: bool = False  # an operator's run-now request (``dblockrun run``)
    check: bool = False  # also read the row's token and the schema version (exec, API)
    seat: bool = False  # a group's seat (scheduling/limits.py): note the job it is held for
    #: A batch's second look (what no other host took): wait for the rows
    #: other hosts are claiming instead of skipping them (no SKIP LOCKED).
    wait: bool = False
    #: A passed slot run again (``backfill``, ``rerun``; dblockrun/ops/backfill.py):
    #: the job's last slot is at or past it and no run of it is going on.
    again: bool = False
    #: With ``again`` (``backfill``): and no run of it ended ``ok``.
    undone: bool = False

    @property
    def cleans(self) -> bool:
        """Records the run before it lost if its holder died: the claims of
        exec and the API, which have no daemon's bookkeeping to do it (a
        daemon's bookkeeping records it, with the slots it blocked)."""
        return self.record and self.check


#: The claim of a group's seat.
SEAT = ClaimShape(seat=True)


class Queries:
    """The statements of one database kind and table prefix."""

    dialect = "postgresql"
    double = "DOUBLE PRECISION"
    #: A job name as a bound parameter is cast to (one type wherever it is used).
    name_type = "VARCHAR(255)"
    greatest = "GREATEST"
    arrays = True  # psycopg binds a list as an array
    skip_locked = " FOR UPDATE SKIP LOCKED"
    for_update = " FOR UPDATE"
    insert_ignore = ("INSERT INTO", " ON CONFLICT DO NOTHING")
    #: A bookkeeping round is one statement (:attr:`books_round`), and run-now
    #: requests are announced (NOTIFY on :attr:`channel`); else daemons are
    #: woken (MySQL) or poll (SQLite) for requests.
    one_round = True
    #: A bookkeeping round is one round trip (:attr:`books_round`; MySQL:
    #: statements of one query); else (SQLite) its statements go one by one.
    books_in_one_trip = True

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.locks, self.runs, self.items, self.meta, self.hosts, self.triggers = (
            self.quote(f"{prefix}{table}")
            for table in ("locks", "runs", "items", "meta", "hosts", "triggers"))
        self.now = NOW[self.dialect]
        #: The fleet-wide pause (``dblockrun pause``): no claim wins while it lasts.
        self.pause = self.quote(f"{prefix}pause")
        #: Drained hosts (``dblockrun drain HOST``): their holders' claims lose.
        self.drain = self.quote(f"{prefix}drain")
        #: Operator actions (read by the bookkeeping round: :data:`TOLD_ACTIONS`).
        self.audit = self.quote(f"{prefix}audit")
        #: Where ``dblockrun run`` announces a request (PostgreSQL; payload: the job).
        self.channel = f"{prefix}run"
        #: Where ``dblockrun kill`` announces a request (PostgreSQL; payload: the job):
        #: its holder renews at once, and so reads it, instead of at its next heartbeat.
        self.kill_channel = f"{prefix}kill"

    # -- spelling -------------------------------------------------------------

    @staticmethod
    def quote(name: str) -> str:
        """A table name (prefixes are validated: letters, digits, ``_``)."""
        return name

    @staticmethod
    def p(name: str) -> str:
        """A bound parameter."""
        return f"%({name})s"

    def returning(self, columns: str) -> str:
        return f" RETURNING {columns}"

    @staticmethod
    def concat(*parts: str) -> str:
        """The text of ``parts`` joined (none of them NULL)."""
        return "(" + " || ".join(parts) + ")"

    @staticmethod
    def iso(seconds: str) -> str:
        """Epoch ``seconds`` as ``2026-11-22T21:53:17.123Z`` (as
        ``dblockrun.timetext.iso`` writes them)."""
        return (f"to_char(to_timestamp({seconds}) AT TIME ZONE 'UTC', "
                "'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')")

    @staticmethod
    def last_char(text: str) -> str:
        return f"right({text}, 1)"

    def listed(self, stem: str, count: int) -> str:
        """``count`` parameters ``stem0``, ``stem1``..., comma-separated."""
        return ", ".join(self.p(f"{stem}{i}") for i in range(count))

    def held(self, table: str, key: str, stem: str, count: int) -> str:
        """Rows of ``table`` the holder still holds: ``(key, token)`` among
        the pairs ``(stem0, t0)``, ``(stem1, t1)``..."""
        pairs = ", ".join(f"({self.p(f'{stem}{i}')}, {self.p(f't{i}')})" for i in range(count))
        return (f"{table}.holder = {self.p('holder')} "
                f"AND ({table}.{key}, {table}.token) IN ({pairs})")

    def records(self, source: str, job: str, item: str, slot: str) -> str:
        """The first attempt's run records of rows just claimed in ``source``
        (the claimed locks or items, or a CTE of them): ``INSERT ... SELECT``."""
        return (f"INSERT INTO {self.runs} ({RUN_COLUMNS}) SELECT {job}, {item}, "
                f"{self.p('holder')}, CAST({slot} AS {self.double}), {source}.token, 1, "
                f"{source}.locked_at, NULL, '{RUNNING}' FROM {source}")

    @staticmethod
    def counted(first: str, second: str) -> str:
        """Two writes (each ``... RETURNING``) in one statement; row: the
        number of rows each wrote."""
        return (f"WITH r AS ({first}), l AS ({second}) "
                "SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM l)")

    @cached_property
    def lease(self) -> str:
        """The SET list of a renewal."""
        return f"lock_until = ({self.now} + {self.p('lease')}), renewed_at = {self.now}"

    def released(self, table: str, least: str | None = None) -> str:
        """The SET of a release: the lease ends now, not before ``locked_at +
        least`` (default: the parameter ``least``)."""
        least = self.p("least") if least is None else least
        return f"lock_until = {self.greatest}({self.now}, {table}.locked_at + {least})"

    # -- the one claim predicate ------------------------------------------------

    def claimable(self, table: str, shape: ClaimShape) -> str:
        """The conditions under which a claim of a row of ``table`` (the locks,
        or a job's items) wins: free, not disabled, and as the shape asks, a
        newer slot not in the future, a last start at least a rate old, an
        operator's request."""
        p, now, locks = self.p, self.now, self.locks
        # A negative token, or one at the BIGINT maximum, is a row edited by
        # hand: never claimed (MySQL's LAST_INSERT_ID(expr) could not hand a
        # negative one back, and the increment of the maximum overflows, which
        # would fail the whole batch claim); `unlock` repairs it.
        conds = [f"{table}.token >= 0 AND {table}.token < {TOKEN_MAX}",
                 f"({table}.lock_until IS NULL OR {table}.lock_until <= {now})"]
        # Not while the fleet is paused (another table: MySQL cannot read the
        # UPDATE's own in a subquery).
        conds.append(f"NOT EXISTS (SELECT 1 FROM {self.pause} WHERE {self.pause}.ends > {now})")
        if not shape.seat and not shape.again:
            # Nor by a holder on a drained host (``HOST:pid:random``). Not
            # for a seat (taken for a slot already claimed, which runs), nor
            # for a backfill or rerun (an operator's own command, run in its
            # process, not the host's share of the fleet's slots).
            conds.append(self.not_drained)
        if table == locks:
            conds.append(f"({locks}.disabled_until IS NULL OR {locks}.disabled_until <= {now})")
        else:  # an item: its job must not be disabled
            conds.append(f"NOT EXISTS (SELECT 1 FROM {locks} WHERE {locks}.name = {table}.job "
                         f"AND {locks}.disabled_until > {now})")
        if shape.slot:
            conds.append(f"({table}.last_slot IS NULL OR {table}.last_slot < {p('slot')})")
            conds.append(f"{p('slot')} <= {now} + {p('tol')}")
        if shape.rate:
            # ``rate_tol``: a cron + rate job started one period later is a few
            # milliseconds short of the rate; the claim's tolerance absorbs it.
            conds.append(f"({table}.last_start IS NULL OR "
                         f"{table}.last_start <= {now} - {p('rate')} + {p('rate_tol')})")
        if shape.requested:
            conds.append(f"{table}.run_requested IS NOT NULL")
        if shape.again:
            # A slot the fleet has passed (its claims are over: no daemon
            # claims it any more), not running now; for a backfill, not run
            # ok either. The lease serializes the claims of one job, so a
            # slot's run record is written (and its result, before the
            # release) by the time the next claim of the job can win.
            runs = self.runs
            done = f"'{RUNNING}', '{WAITING}'" + (f", '{OK}'" if shape.undone else "")
            conds.append(f"{table}.last_slot >= {p('again')}")
            conds.append(f"NOT EXISTS (SELECT 1 FROM {runs} WHERE {runs}.job = {table}.name "
                         f"AND {runs}.item IS NULL AND {runs}.slot = {p('again')} "
                         f"AND {runs}.result IN ({done}))")
        return " AND ".join(conds)

    @cached_property
    def not_drained(self) -> str:
        """The claiming holder's host (its id up to the first ``:``) is not drained."""
        return self.undrained(f"CAST({self.p('holder')} AS {self.name_type})")

    def undrained(self, holder: str) -> str:
        """The host of ``holder`` (an expression: ``HOST:pid:random``, a
        holder or a host row's id) is not drained."""
        drain = self.drain
        return (f"NOT EXISTS (SELECT 1 FROM {drain} WHERE {drain}.ends > {self.now} "
                f"AND {drain}.host = substr({holder}, 1, length({drain}.host)) "
                f"AND substr({holder}, length({drain}.host) + 1, 1) = ':')")

    def claim_write(self, table: str, shape: ClaimShape, rows: str, *, token: str = "",
                    join: str = "") -> str:
        """The claim's conditional UPDATE of the ``rows`` (a condition) of
        ``table``: the write that decides, on every path."""
        p, now = self.p, self.now
        # prev_* first: MySQL assigns left to right, from new values.
        sets = [f"prev_renewed_at = {table}.renewed_at"]
        if table == self.locks and shape.slot:
            # The slot the row moves on from, and a lock held a second or more
            # past it (a lock-at-least window, a retry's delay, a dead
            # holder's lease): the slots between may have no record
            # (FleetBooks.held_slots records them). A gap not looked at yet
            # (prev_until set) is kept and widened, never overwritten.
            sets += [f"prev_slot = CASE WHEN {table}.prev_until IS NULL THEN {table}.last_slot "
                     f"ELSE {table}.prev_slot END",
                     f"prev_until = CASE WHEN {table}.lock_until >= {table}.last_slot + 1 "
                     f"THEN {table}.lock_until ELSE {table}.prev_until END"]
        sets += [f"holder = {p('holder')}",
                f"lock_until = ({now} + {p('lease')})", f"locked_at = {now}",
                f"token = {token or f'{table}.token + 1'}", f"last_start = {now}",
                f"renewed_at = {now}"]
        if table == self.locks:
            sets.append("run_requested = NULL")
            if shape.next_due:
                sets.append(f"next_due = {p('next')}")
            elif shape.rate:
                sets.append(f"next_due = {now} + {p('rate')}")
        if shape.slot:
            sets.append(f"last_slot = {p('slot')}")
        if shape.seat:
            sets.append(f"held_for = {p('job')}")
        if table != self.locks:
            sets.append(f"last_result = '{RUNNING}'")
        return (f"UPDATE {table} SET {', '.join(sets)}{join} "
                f"WHERE {rows} AND {self.claimable(table, shape)}")

    def token_expr(self) -> str:
        """The new token of a single claim."""
        return f"{self.locks}.token + 1"

    def claim_update(self, shape: ClaimShape) -> str:
        locks = self.locks
        return self.claim_write(locks, shape, f"{locks}.name = {self.p('name')}",
                                token=self.token_expr())

    def known(self) -> str:
        """The job's token as the claim found it (NULL: no lock row yet, so
        ``exec`` and the API create it; negative: edited by hand), and the
        schema's version: read with every claim, in the same round trip."""
        locks = self.locks
        return (f"(SELECT {locks}.token FROM {locks} WHERE {locks}.name = {self.p('name')}), "
                f"({self.version})")

    @cached_property
    def version(self) -> str:
        meta = self.meta
        return (f"SELECT {meta}.value FROM {meta} WHERE {meta}.{self.quote('key')} "
                "= 'schema_version'")

    @cached_property
    def known_row(self) -> str:
        return f"SELECT {self.known()}"

    def lost_where(self, jobs: str) -> str:
        """Runs of ``jobs`` (a condition on the runs table) still ``running``
        (or ``waiting``) though no live lease holds them: their holder died or
        was fenced."""
        runs, locks, items = self.runs, self.locks, self.items
        # The job's own row first: a run it holds, the common case, is
        # decided there by its key. The runs the lanes hold (overlap: allow
        # N) are read once, not looked for run by run (the lanes have no key
        # by job: a scan of the locks each).
        lanes = (f"SELECT {self.lane_job(f'{locks}.held_for', True)}, {locks}.token "
                 f"FROM {locks} WHERE {self.lane_row(locks)} AND {locks}.held_for IS NOT NULL "
                 f"AND {locks}.lock_until > {self.now}")
        return (f"{jobs} AND {runs}.result IN ('{RUNNING}', '{WAITING}') "
                f"AND {runs}.token IS NOT NULL "
                f"AND NOT EXISTS (SELECT 1 FROM {locks} WHERE {self.holding(locks, True, False)}) "
                f"AND NOT EXISTS (SELECT 1 FROM {items} WHERE {self.holding(items, True)}) "
                f"AND ({self.lane_job(f'{runs}.job', False)}, {runs}.token) NOT IN ({lanes})")

    @staticmethod
    def lane_job(column: str, held_for: bool) -> str:
        """A job name as the lanes' runs are looked up by (``held_for``:
        the lanes' column, else the runs')."""
        return column

    def lost_end(self) -> str:
        """When a lost run ended: its lease's last renewal, kept on its lock
        row, or by the claim that took the lease over next (now, if the lock
        has moved on further since)."""
        locks, items, runs = self.locks, self.items, self.runs
        taken_over = (f"{locks}.name = {runs}.job AND {runs}.item IS NULL "
                      f"AND {locks}.token = {runs}.token + 1")
        # max(): a lane's run may find the job's row with its token too (freed
        # when the run took the lane); the lane's renewals are the later.
        return (f"COALESCE((SELECT max({locks}.renewed_at) FROM {locks} "
                f"WHERE {self.holding(locks, False)}), (SELECT {items}.renewed_at FROM {items} "
                f"WHERE {self.holding(items, False)}), (SELECT {locks}.prev_renewed_at "
                f"FROM {locks} WHERE {taken_over}), {self.now})")

    # -- a row lock held by another session ---------------------------------------

    @cached_property
    def held_by(self) -> str | None:
        """The session, not this one, that has held a lock on dblockrun's
        rows the longest: (id, user, when its transaction began, epoch
        seconds; NULL where not visible). Read when a statement waited past
        the lock wait, and by ``status --check``. PostgreSQL: from
        ``pg_locks`` (another user's transaction start is visible to a
        role with ``pg_read_all_stats`` only); dblockrun's own sessions last."""
        tables = ", ".join(f"to_regclass('{t}')" for t in (self.locks, self.items, self.runs))
        return ("SELECT a.pid, a.usename, CAST(EXTRACT(EPOCH FROM a.xact_start) AS "
                "DOUBLE PRECISION) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                f"WHERE l.relation IN ({tables}) AND l.granted AND l.pid <> pg_backend_pid() "
                "AND l.mode <> 'AccessShareLock' "
                "ORDER BY a.application_name = 'dblockrun', a.xact_start NULLS LAST LIMIT 1")

    @cached_property
    def held_probe(self) -> str | None:
        """A read that waits for the lock rows while another session holds
        them (its connection's lock wait, :func:`dblockrun.store.drivers.lock_wait_for`,
        ends it): ``status --check``. Needs UPDATE on PostgreSQL, SELECT on MySQL."""
        return f"SELECT count(*) FROM (SELECT 1 FROM {self.locks} FOR SHARE) held"

    def lost_output(self, ended: str, recorder: str) -> str:
        """A lost run's output with the line that says why it ended: who
        recorded it lost, its holder, and that holder's last renewal
        (``ended``). Its own line (after a newline the output lacks)."""
        out = f"{self.runs}.output"
        newline = "'\n'"  # a newline in the literal: the same in every dialect
        sep = (f"CASE WHEN {out} IS NULL OR {out} = '' OR {self.last_char(out)} = {newline} "
               f"THEN '' ELSE {newline} END")
        return self.concat(f"COALESCE({out}, '')", sep, "'lost: its holder '", f"{self.runs}.host",
                           "' last renewed its lease at '", self.iso(ended),
                           "', then stopped (its host or daemon died, froze or lost the "
                           "database); recorded lost by '", recorder, newline)

    @cached_property
    def supersede(self) -> str:
        """Record lost the dead runs of the job ``name``: a claim of exec or
        the API does it before it claims (whoever next touches a job cleans
        up after the run before)."""
        job = f"{self.runs}.job = {self.p('name')}"
        ended = self.lost_end()
        return (f"UPDATE {self.runs} SET output = {self.lost_output(ended, self.p('holder'))}, "
                f"result = 'lost', finished = {ended} WHERE {self.lost_where(job)}")

    def claim(self, shape: ClaimShape) -> str:
        """The claim, in one round trip. A plain claim: ``UPDATE ...
        RETURNING token`` (a row when won). With ``record`` or ``check``, one
        row: (token, run id, found, version): token and run id NULL when lost;
        with ``check``, found is the row's token as it was (NULL: no row) and
        version the schema's; with ``record`` the run record is made (and
        with ``cleans`` the run before it recorded lost if its holder died)."""
        locks, runs, p = self.locks, self.runs, self.p
        update = self.claim_update(shape)
        if not (shape.record or shape.check):
            return f"{update} RETURNING {locks}.token"
        known = self.known() if shape.check else "NULL, NULL"
        if not shape.record:
            return (f"WITH c AS ({update} RETURNING {locks}.token) "
                    f"SELECT (SELECT token FROM c), NULL, {known}")
        lost = f"s AS ({self.supersede}), " if shape.cleans else ""
        return (f"WITH {lost}"
                f"c AS ({update} RETURNING {locks}.name, {locks}.token, {locks}.locked_at), "
                f"r AS ({self.records('c', 'c.name', 'NULL', p('run_slot'))} "
                f"RETURNING {runs}.token, {runs}.id) "
                f"SELECT (SELECT token FROM r), (SELECT id FROM r), {known}")

    @cached_property
    def claim_record(self) -> str:
        """A claim's run record as a statement of its own (SQLite, where
        that costs no round trip)."""
        p = self.p
        return (f"INSERT INTO {self.runs} ({RUN_COLUMNS}) VALUES ({p('name')}, NULL, "
                f"{p('holder')}, {p('run_slot')}, {p('token')}, 1, {p('started')}, NULL, "
                f"'{RUNNING}') RETURNING id")

    # -- a batch of jobs of one slot ---------------------------------------------

    def names_in(self, count: int) -> str:
        """``IN`` the batch's names: one array parameter ``names`` where the
        driver binds arrays, else ``count`` parameters ``n0``..."""
        if self.arrays:
            return f"= ANY({self.p('names')})"
        return f"IN ({self.listed('n', count)})"

    def batch_pick(self, shape: ClaimShape, count: int) -> str:
        """The rows of a batch this host takes (``count`` names): skipping
        those another host is claiming at this moment, or (``shape.wait``)
        waiting for that claim's end, which may roll back (its host died)."""
        locks = self.locks
        return (f"SELECT {locks}.name FROM {locks} WHERE {locks}.name {self.names_in(count)} "
                f"AND {self.claimable(locks, shape)} LIMIT {self.p('limit')}"
                f"{self.for_update if shape.wait else self.skip_locked}")

    def batch_claim(self, shape: ClaimShape, count: int) -> str:
        """PostgreSQL: pick, claim and record ``count`` candidates in one statement."""
        locks, runs = self.locks, self.runs
        claim = self.claim_write(locks, shape, f"{locks}.name = pick.name", join=" FROM pick")
        return (f"WITH pick AS ({self.batch_pick(shape, count)}), "
                f"c AS ({claim} RETURNING {locks}.name, {locks}.token, {locks}.locked_at) "
                f"{self.records('c', 'c.name', 'NULL', self.p('slot'))} "
                f"RETURNING {runs}.job, {runs}.token, {runs}.id")

    def batch_update(self, shape: ClaimShape, count: int) -> str:
        """MySQL and SQLite: claim the picked names ``c0``... (in a transaction)."""
        locks = self.locks
        return self.claim_write(locks, shape, f"{locks}.name IN ({self.listed('c', count)})")

    def batch_record(self, count: int) -> str:
        """The run records of the names ``c0``... this holder claimed for the slot."""
        locks, p = self.locks, self.p
        return (f"{self.records(locks, f'{locks}.name', 'NULL', p('slot'))} "
                f"WHERE {locks}.name IN ({self.listed('c', count)}) "
                f"AND {locks}.holder = {p('holder')} AND {locks}.last_slot = {p('slot')}")

    def batch_read(self, count: int) -> str:
        locks, runs, p = self.locks, self.runs, self.p
        return (f"SELECT {runs}.job, {runs}.token, {runs}.id FROM {runs} "
                f"JOIN {locks} ON {locks}.name = {runs}.job AND {locks}.token = {runs}.token "
                f"WHERE {locks}.name IN ({self.listed('c', count)}) "
                f"AND {locks}.holder = {p('holder')} "
                f"AND {runs}.attempt = 1 AND {runs}.finished IS NULL")

    # -- a group's seats (dblockrun/scheduling/limits.py) ----------------------------------------

    def seat_claim(self, count: int, lane: bool = False) -> str:
        """Take one free seat of a group for the job ``job``: the same
        conditional write as a job's claim, of the first of the ``count``
        seat rows that no other claim is taking at this moment. Row: (name,
        token) when won. ``lane``: a lane of an ``overlap: allow N`` job,
        which takes the fencing token ``token`` of the job's claim (so a
        run's token is the job's, and a lane taken again fences the run
        that held it before)."""
        locks = self.locks
        pick = self.batch_pick(SEAT, count)
        token = self.p("token") if lane else ""
        return (self.claim_write(locks, SEAT, f"{locks}.name = ({pick})", token=token)
                + self.returning(f"{locks}.name, {locks}.token"))

    # -- fan-out items ---------------------------------------------------------------

    def items_pick(self, shape: ClaimShape, *, lock: bool = True) -> str:
        """A job's due items, oldest start first, ``limit`` of them; ``lock``:
        skipping and locking rows other hosts are claiming right now."""
        items = self.items
        return (f"SELECT {items}.item_key FROM {items} WHERE {items}.job = {self.p('job')} "
                f"AND {items}.retired = FALSE AND {self.claimable(items, shape)} "
                f"ORDER BY {items}.last_start IS NOT NULL, {items}.last_start, "
                f"{items}.item_key LIMIT {self.p('limit')}" + (self.skip_locked if lock else ""))

    def items_keys(self, count: int) -> str:
        """A job's items ``k0``... by key."""
        items = self.items
        return f"{items}.job = {self.p('job')} AND {items}.item_key IN ({self.listed('k', count)})"

    def items_lock(self, shape: ClaimShape, count: int) -> str:
        """MySQL: lock the candidates ``k0``... by key, skipping taken ones."""
        items = self.items
        return (f"SELECT {items}.item_key FROM {items} WHERE {self.items_keys(count)} "
                f"AND {self.claimable(items, shape)} LIMIT {self.p('limit')}{self.skip_locked}")

    def items_claim(self, shape: ClaimShape, count: int) -> str:
        """Claim the picked items ``k0``...: the same conditional write as a job's."""
        return self.claim_write(self.items, shape, self.items_keys(count))

    def items_record(self, count: int) -> str:
        """The run records of the claimed items ``k0``... (in the claim's
        transaction)."""
        items = self.items
        return (f"{self.records(items, f'{items}.job', f'{items}.item', self.p('run_slot'))} "
                f"WHERE {self.items_keys(count)}")

    def items_claimed(self, count: int) -> str:
        """The claimed items ``k0``... with their run records."""
        items, runs = self.items, self.runs
        return (f"SELECT {items}.item, {items}.item_key, {items}.token, {runs}.id "
                f"FROM {items} JOIN {runs} ON {runs}.job = {items}.job "
                f"AND {runs}.item = {items}.item AND {runs}.token = {items}.token "
                f"WHERE {self.items_keys(count)} AND {items}.holder = {self.p('holder')}")

    def items_mine(self, count: int) -> str:
        """A holder's batch of items (``k0``/``t0``...) whose tokens are current."""
        items = self.items
        return f"{items}.job = {self.p('job')} AND {self.held(items, 'item_key', 'k', count)}"

    def items_renew(self, count: int) -> str:
        """Rows: each item renewed, with its kill request (:meth:`kill_of`)."""
        items = self.items
        return (f"UPDATE {items} SET {self.lease} WHERE {self.items_mine(count)}"
                + self.returning(f"{items}.item_key, {self.kill_of(items)}"))

    def items_release(self, count: int) -> str:
        items = self.items
        return (f"UPDATE {items} SET {self.released(items)}, last_result = {self.p('result')} "
                f"WHERE {self.items_mine(count)}")

    def items_finish(self, count: int) -> str:
        """The batch's runs ``r0``... get its result while all its items are ours."""
        items, runs = self.items, self.runs
        ids = self.listed("r", count)
        return (f"UPDATE {runs} SET {self.run_result()} WHERE {runs}.id IN ({ids}) "
                f"AND (SELECT count(*) FROM {items} WHERE {self.items_mine(count)}) = {count}")

    def items_finish_and_release(self, count: int) -> str:
        """Row: (runs written, items released), in one statement."""
        return self.counted(f"{self.items_finish(count)} RETURNING {self.runs}.id",
                            f"{self.items_release(count)} RETURNING {self.items}.item_key")

    # -- while it runs, and its end ---------------------------------------------

    @staticmethod
    def kill_of(table: str) -> str:
        """A held row's kill request (``dblockrun kill``: who and why), NULL
        if none was made for the run holding it now (its token)."""
        return f"CASE WHEN {table}.kill_token = {table}.token THEN {table}.kill_by END"

    def renew_many(self, count: int, outputs: int = 0) -> str:
        """Renew ``count`` leases of one holder (``n0``/``t0``...); rows: the
        names renewed (a lease whose token moved on is not among them), each
        with its kill request: a holder learns of a kill with its renewal.
        ``outputs``: with the live output of that many runs
        (:meth:`live_outputs`), in the same statement."""
        locks = self.locks
        renew = (f"UPDATE {locks} SET {self.lease} WHERE {self.held(locks, 'name', 'n', count)} "
                 f"RETURNING {locks}.name, {self.kill_of(locks)}")
        return f"WITH o AS ({self.live_outputs(outputs)}) {renew}" if outputs else renew

    def live_outputs(self, count: int) -> str:
        """The output tails ``o0``... of ``count`` runs ``r0``... still
        running (a run's result, written meanwhile, is never overwritten)."""
        runs, p = self.runs, self.p
        cases = " ".join(f"WHEN {p(f'r{i}')} THEN {p(f'o{i}')}" for i in range(count))
        return (f"UPDATE {runs} SET output = CASE {runs}.id {cases} END "
                f"WHERE {runs}.id IN ({self.listed('r', count)}) "
                f"AND {runs}.result = '{RUNNING}'")

    def next_due_many(self, count: int) -> str:
        """Write the next slots ``d0``... of ``count`` jobs ``n0``...
        (``status`` shows them), leaving alone the rows that have it: every
        host of a fleet computes the same next slots, and all of them
        starting at once on 10,000 jobs queued each behind the others' row
        locks."""
        locks, p = self.locks, self.p
        cases = " ".join(f"WHEN {p(f'n{i}')} THEN {p(f'd{i}')}" for i in range(count))
        due = f"CASE {locks}.name {cases} END"
        return (f"UPDATE {locks} SET next_due = {due} "
                f"WHERE {locks}.name IN ({self.listed('n', count)}) "
                f"AND ({locks}.next_due IS NULL OR {locks}.next_due <> {due})")

    @cached_property
    def release(self) -> str:
        locks, p = self.locks, self.p
        return (f"UPDATE {locks} SET {self.released(locks)} WHERE {locks}.name = {p('name')} "
                f"AND {locks}.holder = {p('holder')} AND {locks}.token = {p('token')}")

    def run_result(self, table: str = "", values: str | None = None) -> str:
        """The SET list of a run's end: it ended ``took`` seconds (its
        command's duration, measured by the daemon) after its start, not
        when the write got through (an outage may hold it back for a
        minute); with ``took`` NULL, now. ``values``: taken from the columns
        of that table (:meth:`ends`), not from the parameters."""
        t = f"{table}." if table else ""

        def v(name: str) -> str:
            return self.p(name) if values is None else f"{values}.{name}"

        ended = f"COALESCE({t}started + CAST({v('took')} AS {self.double}), {self.now})"
        return (f"{t}finished = {ended}, {t}exit_code = {v('code')}, "
                f"{t}result = {v('result')}, {t}output = {v('output')}")

    #: The columns of :meth:`ends` (each run's end), their parameters' stems
    #: (``r0``, ``n0``...) and their types.
    END_COLUMNS = (("run_id", "r", "BIGINT"), ("name", "n", "TEXT"), ("holder", "h", "TEXT"),
                   ("token", "t", "BIGINT"), ("result", "x", "TEXT"), ("code", "c", "INTEGER"),
                   ("output", "o", "TEXT"), ("took", "d", "DOUBLE PRECISION"),
                   ("least", "a", "DOUBLE PRECISION"))

    def ends(self, count: int) -> str:
        """The ends of ``count`` runs (their results and releases) as rows of
        a derived table. PostgreSQL: from one JSON parameter ``ends``
        (:meth:`end_params`), so the text is the same whatever the count:
        psycopg parses it once and the server prepares it (16 ends as 144
        parameters were parsed again at each call, 47 µs an end here,
        against 8 as JSON)."""
        columns = ", ".join(f"{name} {kind}" for name, _stem, kind in self.END_COLUMNS)
        return f"SELECT * FROM jsonb_to_recordset(CAST({self.p('ends')} AS jsonb)) AS e({columns})"

    def end_params(self, ends: Sequence[Sequence[object]]) -> dict[str, Any]:
        """The parameters of :meth:`ends`: each end's values in the order of
        :attr:`END_COLUMNS`."""
        names = [name for name, _stem, _kind in self.END_COLUMNS]
        return {"ends": json.dumps([dict(zip(names, end, strict=True)) for end in ends],
                                   allow_nan=False)}

    def finish_run(self, fenced: bool) -> str:
        """A run's end; ``fenced``: only while the job's lock has its token."""
        locks, runs, p = self.locks, self.runs, self.p
        text = f"UPDATE {runs} SET {self.run_result()} WHERE {runs}.id = {p('run_id')}"
        return text + (f" AND EXISTS (SELECT 1 FROM {locks} WHERE {locks}.name = {p('name')} "
                       f"AND {locks}.token = {p('token')})" if fenced else "")

    def finish_and_release(self, count: int) -> str:
        """The results and the releases of ``count`` runs (:meth:`ends`) in
        one statement, each as one run's alone: its result only while its
        job's lock has its token, its release only while the holder holds
        it with that token. Rows: (run id, written, released), one a run."""
        locks, runs = self.locks, self.runs
        result = (f"UPDATE {runs} SET {self.run_result(values='v')} FROM v "
                  f"WHERE {runs}.id = v.run_id AND EXISTS (SELECT 1 FROM {locks} "
                  f"WHERE {locks}.name = v.name AND {locks}.token = v.token) "
                  f"RETURNING {runs}.id")
        release = (f"UPDATE {locks} SET {self.released(locks, 'v.least')} FROM v "
                   f"WHERE {locks}.name = v.name AND {locks}.holder = v.holder "
                   f"AND {locks}.token = v.token RETURNING v.run_id")
        return (f"WITH v AS ({self.ends(count)}), r AS ({result}), l AS ({release}) "
                "SELECT v.run_id, v.run_id IN (SELECT id FROM r), "
                "v.run_id IN (SELECT run_id FROM l) FROM v")

    @cached_property
    def seat_release(self) -> str:
        """Free the group seat ``seat`` a run held with token ``seat_token``."""
        locks, p = self.locks, self.p
        return (f"UPDATE {locks} SET lock_until = {self.now} WHERE {locks}.name = {p('seat')} "
                f"AND {locks}.holder = {p('holder')} AND {locks}.token = {p('seat_token')}")

    @cached_property
    def finish_release_seat(self) -> str:
        """A run's result and release (as :meth:`finish_and_release`) and its
        seat freed, in one statement."""
        locks, runs = self.locks, self.runs
        return (f"WITH r AS ({self.finish_run(True)} RETURNING {runs}.id), "
                f"l AS ({self.release} RETURNING {locks}.name), "
                f"s AS ({self.seat_release} RETURNING {locks}.name) "
                "SELECT (SELECT count(*) FROM r), (SELECT count(*) FROM l)")

    @cached_property
    def run_waits(self) -> str:
        """A claimed run's slot waits (``when-full: queue``): its record says
        for what (``output``) until its command starts."""
        runs, p = self.runs, self.p
        return (f"UPDATE {runs} SET result = '{WAITING}', output = {p('output')} "
                f"WHERE {runs}.id = {p('run_id')} AND {runs}.result IN ('{RUNNING}', "
                f"'{WAITING}')")

    @cached_property
    def run_admitted(self) -> str:
        """A waiting slot's command starts now: its record is ``running``
        from now (its slot stays: the delay shows)."""
        runs, p = self.runs, self.p
        return (f"UPDATE {runs} SET result = '{RUNNING}', started = {self.now}, output = NULL "
                f"WHERE {runs}.id = {p('run_id')} AND {runs}.result = '{WAITING}'")

    def start_run(self, running: bool) -> str:
        p = self.p
        finished = "NULL" if running else self.now
        return (f"INSERT INTO {self.runs} ({RUN_COLUMNS}, output) VALUES ({p('job')}, "
                f"{p('item')}, {p('host')}, {p('slot')}, {p('token')}, {p('attempt')}, "
                f"{self.now}, {finished}, {p('result')}, {p('output')})"
                + self.returning(f"{self.runs}.id"))

    # -- job chains (after:, dblockrun/daemon/chains.py) ----------------------------------

    def make_triggers(self, jobs: int, results: int, ids: int) -> str:
        """The triggers of the downstream job ``down``: a row for each
        finished run of the upstream jobs ``u0``... whose result is one of
        ``r0``... and that has none yet. ``ids`` 0: the runs that ended since
        ``since`` and are over (no later attempt, no live lease holds their
        token: not waiting for a retry or an on-failure command), what a
        host's bookkeeping looks at; else the runs ``i0``... (their host
        knows they are over: it just recorded their end)."""
        runs, locks, triggers, p = self.runs, self.locks, self.triggers, self.p
        insert, ignore = self.insert_ignore
        conds = [f"{runs}.job IN ({self.listed('u', jobs)})", f"{runs}.item IS NULL",
                 f"{runs}.result IN ({self.listed('r', results)})",
                 f"{runs}.token IS NOT NULL", f"{runs}.finished IS NOT NULL",
                 f"NOT EXISTS (SELECT 1 FROM {triggers} t WHERE t.job = {p('down')} "
                 f"AND t.upstream_run = {runs}.id)"]
        if ids:
            conds.append(f"{runs}.id IN ({self.listed('i', ids)})")
        else:
            conds += [f"{runs}.finished >= {p('since')}",
                      f"NOT EXISTS (SELECT 1 FROM {runs} n WHERE n.job = {runs}.job "
                      f"AND n.token = {runs}.token AND n.attempt > {runs}.attempt)",
                      f"NOT EXISTS (SELECT 1 FROM {locks} WHERE {self.holding(locks, True)})"]
        return (f"{insert} {triggers} (job, upstream_run, upstream_job, result, ended, taken) "
                f"SELECT CAST({p('down')} AS {self.name_type}), {runs}.id, {runs}.job, "
                f"{runs}.result, {runs}.finished, "
                f"NULL FROM {runs} WHERE {' AND '.join(conds)}{ignore}")

    def pending_triggers(self, jobs: int) -> str:
        """The triggers of the jobs ``j0``... not taken yet, oldest first."""
        t = self.triggers
        return (f"SELECT {t}.job, {t}.upstream_run, {t}.upstream_job, {t}.result, {t}.ended "
                f"FROM {t} WHERE {t}.taken IS NULL AND {t}.job IN ({self.listed('j', jobs)}) "
                f"ORDER BY {t}.upstream_run")

    @cached_property
    def chained_before(self) -> str:
        """Whether the job ``name`` has a trigger (its chain is not new)."""
        t = self.triggers
        return f"SELECT 1 FROM {t} WHERE {t}.job = {self.p('name')} LIMIT 1"

    @cached_property
    def take_trigger(self) -> str:
        """Take a trigger, in the transaction of its one claim (or of its one
        record of why it did not run): the row lock orders the hosts that try."""
        t, p = self.triggers, self.p
        return (f"UPDATE {t} SET taken = {self.now} WHERE {t}.job = {p('name')} "
                f"AND {t}.upstream_run = {p('upstream_run')} AND {t}.taken IS NULL")

    @cached_property
    def run_upstream(self) -> str:
        """A run record's upstream run (written in its trigger's transaction)."""
        runs, p = self.runs, self.p
        return (f"UPDATE {runs} SET upstream_job = {p('upstream_job')}, "
                f"upstream_run = {p('upstream_run')} WHERE {runs}.id = {p('run_id')}")

    @cached_property
    def run_origin(self) -> str:
        """A run record's origin (``backfill``, ``rerun``) and the run it
        runs again (written in the transaction that records it)."""
        runs, p = self.runs, self.p
        return (f"UPDATE {runs} SET origin = {p('origin')}, origin_run = {p('origin_run')} "
                f"WHERE {runs}.id = {p('run_id')}")

    @cached_property
    def prune_triggers(self) -> str:
        """Forget the taken triggers of upstream runs that ended before
        ``before`` (older than any run the bookkeeping looks at)."""
        t = self.triggers
        return (f"DELETE FROM {t} WHERE {t}.taken IS NOT NULL "
                f"AND {t}.ended < {self.p('before')}")

    # -- bookkeeping ---------------------------------------------------------------

    @cached_property
    def ensure_job(self) -> str:
        insert, ignore = self.insert_ignore
        return f"{insert} {self.locks} (name, token) VALUES ({self.p('name')}, 0){ignore}"

    @cached_property
    def pass_slots(self) -> str:
        """Advance the job's last slot to ``slot`` without running the slots
        from ``first`` up to it: only while none of them is handled yet (the
        last slot still before ``first``), so one host records them
        (dblockrun/running/slotbook.py)."""
        locks, p = self.locks, self.p
        # ``next``: the job's next slot after them, for ``status`` (None:
        # left as it is; the claim of a slot the plan runs publishes it).
        return (f"UPDATE {locks} SET last_slot = {p('slot')}, "
                f"next_due = COALESCE({p('next')}, {locks}.next_due) "
                f"WHERE {locks}.name = {p('name')} "
                f"AND ({locks}.last_slot IS NULL OR {locks}.last_slot < {p('first')})")

    @cached_property
    def held_gaps(self) -> str:
        """The rows whose last slot claim moved on over a lock held a second or
        more past the slot before (:meth:`claim_write`), not looked at yet:
        (name, token, that slot, the lock's end, the last slot)."""
        locks = self.locks
        return (f"SELECT {locks}.name, {locks}.token, {locks}.prev_slot, {locks}.prev_until, "
                f"{locks}.last_slot FROM {locks} WHERE {locks}.prev_until IS NOT NULL "
                f"AND {locks}.prev_slot IS NOT NULL")

    @cached_property
    def held_gap_seen(self) -> str:
        """A row's held gap looked at, while the claim that made it is still
        the last (its token): one host does."""
        locks, p = self.locks, self.p
        return (f"UPDATE {locks} SET prev_until = NULL WHERE {locks}.name = {p('name')} "
                f"AND {locks}.token = {p('token')} AND {locks}.prev_until IS NOT NULL")

    def passed_runs(self, count: int) -> str:
        """The records of ``count`` passed slots in one statement (``slotN``,
        ``resultN``, ``outN``, ``fromN``: a summary's first slot; they ran
        nowhere: no token, started and finished now)."""
        p, now = self.p, self.now
        rows = ", ".join(
            f"({p('job')}, NULL, {p('host')}, {p(f'slot{i}')}, NULL, 1, {now}, {now}, "
            f"{p(f'result{i}')}, {p(f'out{i}')}, {p(f'from{i}')})" for i in range(count))
        return f"INSERT INTO {self.runs} ({RUN_COLUMNS}, output, covers_from) VALUES {rows}"

    @staticmethod
    def lane_row(table: str) -> str:
        """``table``'s row is a lane (no ``LIKE``: a literal percent sign
        would need escaping for the drivers' parameter style)."""
        return f"SUBSTR({table}.name, 1, {len(LANE_PREFIX)}) = '{LANE_PREFIX}'"

    def lanes_of(self, table: str, job: str) -> str:
        """The lane rows of ``table`` held for the job ``job`` (a column)."""
        return f"{table}.held_for = {job} AND {self.lane_row(table)}"

    def holding(self, table: str, alive: bool, lane: bool | None = None) -> str:
        """The lock row (a job's, one of its lanes, or a fan-out item's) that
        holds a run with its token; ``alive``: and its lease has not run
        out. Of the locks, ``lane`` False: the job's own row only; True: a
        lane only (``overlap: allow N``); None: either."""
        runs, now = self.runs, self.now
        if table == self.locks:
            own = f"{table}.name = {runs}.job"
            lanes = self.lanes_of(table, f"{runs}.job")
            match = {False: own, True: lanes, None: f"({own} OR ({lanes}))"}[lane]
            match += f" AND {runs}.item IS NULL"
        else:
            match = f"{table}.job = {runs}.job AND {table}.item = {runs}.item"
        lease = f" AND {table}.lock_until > {now}" if alive else ""
        return f"{match} AND {table}.token = {runs}.token{lease}"

    @cached_property
    def lost_runs(self) -> str:
        """The dead runs of all jobs (each daemon's heartbeat): (id, job,
        item, host, token, the lease's end, when the run ended, its slot, the
        id of the run's first attempt: a retry's attempts share its token)."""
        runs, locks = self.runs, self.locks
        first = (f"(SELECT min(f.id) FROM {runs} f WHERE f.job = {runs}.job "
                 f"AND f.token = {runs}.token AND f.host = {runs}.host "
                 f"AND (f.item = {runs}.item OR (f.item IS NULL AND {runs}.item IS NULL)))")
        return (f"SELECT {runs}.id, {runs}.job, {runs}.item, {runs}.host, {runs}.token, "
                f"(SELECT max({locks}.lock_until) FROM {locks} "
                f"WHERE {self.holding(locks, False)}), "
                f"{self.lost_end()}, {runs}.slot, {first} "
                f"FROM {runs} WHERE {self.lost_where('1 = 1')}")

    @cached_property
    def mark_lost(self) -> str:
        """One run lost: it ended at its lease's last renewal (``ended``);
        ``recorder`` is the daemon that records it."""
        runs, p = self.runs, self.p
        return (f"UPDATE {runs} SET output = {self.lost_output(p('ended'), p('recorder'))}, "
                f"result = 'lost', finished = {p('ended')} "
                f"WHERE {runs}.id = {p('id')} AND {runs}.result IN ('{RUNNING}', '{WAITING}')")

    @cached_property
    def prune_cutoff(self) -> str:
        runs, p = self.runs, self.p
        return (f"SELECT {runs}.id FROM {runs} WHERE {runs}.job = {p('job')} "
                f"ORDER BY {runs}.id DESC LIMIT 1 OFFSET {p('keep')}")

    @cached_property
    def prune(self) -> str:
        runs, p = self.runs, self.p
        return f"DELETE FROM {runs} WHERE {runs}.job = {p('job')} AND {runs}.id <= {p('cutoff')}"

    @cached_property
    def request_run(self) -> str:
        """File a run-now request and, on PostgreSQL, announce it (``NOTIFY``
        on :attr:`channel`, delivered when the statement commits): one statement."""
        locks, p = self.locks, self.p
        update = (f"UPDATE {locks} SET run_requested = {self.now} "
                  f"WHERE {locks}.name = {p('name')}")
        if not self.one_round:  # MySQL, SQLite: the daemons poll
            return update
        return (f"WITH r AS ({update} RETURNING {locks}.name) "
                f"SELECT pg_notify({p('channel')}, r.name) FROM r")

    @cached_property
    def books_round(self) -> str:
        """A daemon's idle bookkeeping round in one statement: this host's
        row written (inserted the first time; with its labels and targeting),
        and read back in one row: the database time, how many other hosts
        are live and how many of them are not drained (a burst's share,
        dblockrun/daemon/firing.py), the other live hosts whose definitions
        differ from this one's (JSON ``[[id, jobs]...]``),
        the jobs with a run-now request (JSON names), the dead runs (JSON
        rows of :attr:`lost_runs`) and the operator actions daemons log
        (:data:`TOLD_ACTIONS`) audited after ``audit_after``. Reads all run
        on the snapshot before the write, so this host is counted apart."""
        hosts, locks, p, now = self.hosts, self.locks, self.p, self.now
        others = (f"FROM {hosts} h WHERE h.id <> {p('id')} "
                  f"AND h.last_seen >= {now} - {p('within')}")
        return (f"WITH me AS (INSERT INTO {hosts} (id, hostname, pid, version, started, "
                f"last_seen, clock_offset, running, jobs, labels, targets, heartbeat, fields) "
                f"VALUES ({p('id')}, {p('hostname')}, {p('pid')}, {p('version')}, {now}, {now}, "
                f"{p('offset')}, {p('running')}, {p('jobs')}, {p('labels')}, {p('targets')}, "
                f"{p('heartbeat')}, {p('fields')}) "
                "ON CONFLICT (id) DO UPDATE SET last_seen = EXCLUDED.last_seen, "
                "clock_offset = EXCLUDED.clock_offset, running = EXCLUDED.running, "
                "jobs = EXCLUDED.jobs, labels = EXCLUDED.labels, targets = EXCLUDED.targets, "
                # NULL: unchanged (written only when the jobs file is loaded).
                f"fields = COALESCE(EXCLUDED.fields, {hosts}.fields) "
                "RETURNING last_seen) "
                f"SELECT (SELECT last_seen FROM me), (SELECT count(*) {others}), "
                f"(SELECT count(*) {others} AND {self.undrained('h.id')}), "
                f"(SELECT json_agg(json_build_array(h.id, h.jobs) ORDER BY h.hostname, h.id) "
                f"{others} "
                f"AND h.jobs IS DISTINCT FROM {p('jobs')}), "
                f"(SELECT json_agg({locks}.name) FROM {locks} "
                f"WHERE {locks}.run_requested IS NOT NULL), "
                "(SELECT json_agg(json_build_array(d.id, d.job, d.item, d.host, d.token, "
                f"d.lock_until, d.ended, d.slot, d.first_id)) FROM ({self.lost_runs}) "
                "AS d(id, job, item, host, token, lock_until, ended, slot, first_id)), "
                f"(SELECT json_agg(json_build_array(a.id, a.who, a.action, a.job, a.detail, "
                f"a.reason) ORDER BY a.id) FROM {self.audit} a WHERE a.id > {p('audit_after')} "
                f"AND a.action IN ({', '.join(repr(a) for a in TOLD_ACTIONS)}))")

    @cached_property
    def clock(self) -> str:
        return f"SELECT {self.now}"


class MysqlQueries(Queries):
    """MySQL/MariaDB: no UPDATE ... RETURNING. The new token comes back through
    ``LAST_INSERT_ID(expr)`` in the OK packet; the claim and its run record go
    as statements of one round trip (CLIENT.MULTI_STATEMENTS), the INSERT only
    where the UPDATE matched (``ROW_COUNT() = 1``)."""

    dialect = "mysql"
    double = "DOUBLE"
    name_type = "CHAR(255)"
    arrays = False
    insert_ignore = ("INSERT IGNORE INTO", "")
    one_round = False

    @staticmethod
    def quote(name: str) -> str:
        return f"`{name}`"

    def returning(self, columns: str) -> str:
        return ""

    @staticmethod
    def lane_job(column: str, held_for: bool) -> str:
        """Both sides in one collation, so that the lanes' runs are read
        once (materialized), not looked for run by run: ``held_for`` has
        the table's default collation (and charset), the runs' job a
        binary one. ``utf8mb4_bin`` pads, but a job name has no spaces."""
        text = f"CONVERT({column} USING utf8mb4)" if held_for else column
        return f"{text} COLLATE utf8mb4_bin"


    # -- the request doorbell (dblockrun/store/doorbell.py) ----------------------------

    @cached_property
    def wait_mark(self) -> str:
        """What marks a daemon's request wait in the process list: a
        comment with the table prefix (letters, digits and ``_``)."""
        return f"/* dblockrun requests {self.prefix} */"

    @cached_property
    def request_wait(self) -> str:
        """A daemon's wait for run-now and kill requests: ended early by
        ``KILL QUERY`` from ``run`` and ``kill`` (:attr:`waiting`)."""
        return f"SELECT SLEEP({self.p('seconds')}) {self.wait_mark}"

    @cached_property
    def waiting(self) -> str:
        """The connections waiting in :attr:`request_wait` in this database
        on this server that this user may see (all with the PROCESS privilege, else its
        own). The pattern, a parameter, ends with the mark, so this
        statement does not match itself."""
        return ("SELECT ID FROM information_schema.PROCESSLIST WHERE COMMAND = 'Query' "
                "AND DB = DATABASE() AND ID <> CONNECTION_ID() "
                f"AND INFO LIKE {self.p('mark')}")

    @cached_property
    def wake(self) -> str:
        return f"KILL QUERY {self.p('id')}"

    @cached_property
    def books_round(self) -> str:
        """A daemon's idle bookkeeping round in one round trip, as
        statements of one query: (1) the database time, how many other
        hosts are live and how many of them are not drained, (2) the other
        live hosts whose definitions differ from this one's, (3) the jobs
        with a run-now request, (4) the dead runs (:attr:`lost_runs`), (5)
        the operator actions daemons log audited after ``audit_after``, then
        this host's row written
        (inserted the first time). The reads come first, so this host is
        counted apart."""
        hosts, locks, p, now = self.hosts, self.locks, self.p, self.now
        others = (f"FROM {hosts} h WHERE h.id <> {p('id')} "
                  f"AND h.last_seen >= {now} - {p('within')}")
        return (f"SELECT {now}, (SELECT count(*) {others}), "
                f"(SELECT count(*) {others} AND {self.undrained('h.id')}); "
                f"SELECT h.id, h.jobs {others} AND NOT (h.jobs <=> {p('jobs')}) "
                "ORDER BY h.hostname, h.id; "
                f"SELECT {locks}.name FROM {locks} WHERE {locks}.run_requested IS NOT NULL; "
                f"{self.lost_runs}; "
                f"SELECT a.id, a.who, a.action, a.job, a.detail, a.reason FROM {self.audit} a "
                f"WHERE a.id > {p('audit_after')} "
                f"AND a.action IN ({', '.join(repr(a) for a in TOLD_ACTIONS)}) ORDER BY a.id; "
                f"INSERT INTO {hosts} (id, hostname, pid, version, started, last_seen, "
                "clock_offset, running, jobs, labels, targets, heartbeat, fields) "
                f"VALUES ({p('id')}, {p('hostname')}, {p('pid')}, {p('version')}, {now}, {now}, "
                f"{p('offset')}, {p('running')}, {p('jobs')}, {p('labels')}, {p('targets')}, "
                f"{p('heartbeat')}, {p('fields')}) "
                "ON DUPLICATE KEY UPDATE last_seen = VALUES(last_seen), "
                "clock_offset = VALUES(clock_offset), running = VALUES(running), "
                "jobs = VALUES(jobs), labels = VALUES(labels), targets = VALUES(targets), "
                # NULL: unchanged (written only when the jobs file is loaded).
                f"fields = COALESCE(VALUES(fields), {hosts}.fields)")

    def token_expr(self) -> str:
        return f"LAST_INSERT_ID({self.locks}.token + 1)"

    @staticmethod
    def concat(*parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    @cached_property
    def held_by(self) -> str | None:
        """The oldest transaction, not this connection's and not itself
        waiting for a lock, that holds row locks, of a session using this
        database: InnoDB does not say on which table once nobody waits (a
        server's other databases, another application's, are not suspects),
        and a daemon's transaction that took a run's row and now waits for
        the held lock row is older than the holder but not it. ``INNODB_TRX``
        needs the PROCESS privilege."""
        return ("SELECT t.trx_mysql_thread_id, CONCAT(p.USER, '@', SUBSTRING_INDEX(p.HOST, "
                "':', 1)), UNIX_TIMESTAMP(t.trx_started) FROM information_schema.INNODB_TRX t "
                "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                "WHERE t.trx_mysql_thread_id <> CONNECTION_ID() AND t.trx_rows_locked > 0 "
                "AND t.trx_state <> 'LOCK WAIT' AND p.DB = DATABASE() "
                "ORDER BY t.trx_started LIMIT 1")

    @cached_property
    def held_probe(self) -> str | None:
        return f"SELECT count(*) FROM {self.locks} LOCK IN SHARE MODE"

    @staticmethod
    def iso(seconds: str) -> str:
        # The session's time zone is UTC (store/drivers.py); %% for PyMySQL's format.
        return (f"CONCAT(SUBSTRING(DATE_FORMAT(FROM_UNIXTIME({seconds}), "
                "'%%Y-%%m-%%dT%%H:%%i:%%s.%%f'), 1, 23), 'Z')")

    def claim(self, shape: ClaimShape) -> str:
        """Results, as the shape has them: the UPDATE (rowcount, lastrowid =
        token), the INSERT (lastrowid = run id; ``record``), one row (found,
        version; ``check``), the dead run's loss (``cleans``). Each statement
        reads its own NOW(): the loss comes after the claim, where a dead
        run's token no longer holds the row the claim took (before it, a
        lease that ran out between the two statements was live to the first
        and over for the second, and the dead run stayed ``running``)."""
        locks, p = self.locks, self.p
        parts = [self.claim_update(shape)]
        if shape.record:
            parts.append(
                f"{self.records(locks, f'{locks}.name', 'NULL', p('run_slot'))} "
                f"WHERE {locks}.name = {p('name')} "
                f"AND {locks}.token = LAST_INSERT_ID() AND ROW_COUNT() = 1")
        if shape.check:
            parts.append(self.known_row)
        if shape.cleans:
            parts.append(self.supersede)
        return "; ".join(parts)

    def seat_claim(self, count: int, lane: bool = False) -> str:
        """No subquery on the UPDATE's own table: the UPDATE takes the first
        free seat itself (``ORDER BY ... LIMIT 1``; the token comes back in
        the OK packet), then names it, in one round trip. Of two seats this
        holder has with that token, the newest claim is this one."""
        locks, p = self.locks, self.p
        names = f"{locks}.name IN ({self.listed('n', count)})"
        token = f"LAST_INSERT_ID({p('token')})" if lane else self.token_expr()
        update = self.claim_write(locks, SEAT, names, token=token)
        return (f"{update} ORDER BY {locks}.name LIMIT 1; "
                f"SELECT {locks}.name FROM {locks} WHERE {names} "
                f"AND {locks}.holder = {p('holder')} AND {locks}.token = LAST_INSERT_ID() "
                f"ORDER BY {locks}.locked_at DESC LIMIT 1")

    def renew_many(self, count: int, outputs: int = 0) -> str:
        """The UPDATE, then the names it renewed, in one round trip; the
        live outputs first, with ``outputs``."""
        locks, mine = self.locks, self.held(self.locks, "name", "n", count)
        first = f"{self.live_outputs(outputs)}; " if outputs else ""
        return (f"{first}UPDATE {locks} SET {self.lease} WHERE {mine}; "
                f"SELECT {locks}.name, {self.kill_of(locks)} FROM {locks} WHERE {mine}")

    def items_renew(self, count: int) -> str:
        """The UPDATE, then the items it renewed with their kill requests."""
        items, mine = self.items, self.items_mine(count)
        return (f"UPDATE {items} SET {self.lease} WHERE {mine}; "
                f"SELECT {items}.item_key, {self.kill_of(items)} FROM {items} WHERE {mine}")

    def finish_and_release(self, count: int) -> str:
        """One multi-table UPDATE of ``count`` runs (:meth:`ends`): twice
        ``count`` matched rows when every result and release was written."""
        locks, runs = self.locks, self.runs
        return (f"UPDATE {runs} r JOIN ({self.ends(count)}) v ON r.id = v.run_id "
                f"JOIN {locks} l ON l.name = v.name AND l.holder = v.holder "
                f"AND l.token = v.token "
                f"SET {self.run_result('r', 'v')}, l.{self.released('l', 'v.least')}")

    def ends(self, count: int) -> str:
        """The ends of ``count`` runs as rows of a derived table, from the
        parameters ``r0``, ``n0``... (PyMySQL inlines them: nothing to parse
        again but the text itself)."""
        rows = []
        for i in range(count):
            rows.append("SELECT " + ", ".join(
                f"{self.p(f'{stem}{i}')} AS {name}" for name, stem, _kind in self.END_COLUMNS))
        return " UNION ALL ".join(rows)

    def end_params(self, ends: Sequence[Sequence[object]]) -> dict[str, Any]:
        """The parameters of :meth:`ends`."""
        return {f"{stem}{i}": value for i, end in enumerate(ends)
                for (_name, stem, _kind), value in zip(self.END_COLUMNS, end, strict=True)}

    @cached_property
    def finish_release_seat(self) -> str:
        """The result with the release (one run's :meth:`ends`), then the
        seat's release: two results of one round trip."""
        return f"{self.finish_and_release(1)}; {self.seat_release}"

    def items_finish_and_release(self, count: int) -> str:
        """The result, then the release: two results of one round trip."""
        return f"{self.items_finish(count)}; {self.items_release(count)}"


class SqliteQueries(Queries):
    """SQLite: embedded, so no round trips to save; a claim's run record is a
    second statement, and the batch runs in one ``BEGIN IMMEDIATE``."""

    dialect = "sqlite"
    greatest = "max"
    arrays = False
    skip_locked = ""
    for_update = ""
    insert_ignore = ("INSERT OR IGNORE INTO", "")
    one_round = False
    books_in_one_trip = False

    @staticmethod
    def quote(name: str) -> str:
        return f'"{name}"'

    @staticmethod
    def p(name: str) -> str:
        return f":{name}"

    @staticmethod
    def iso(seconds: str) -> str:
        return f"strftime('%Y-%m-%dT%H:%M:%fZ', {seconds}, 'unixepoch')"

    #: One host: a writer waits ``busy_timeout``, and no other session is told apart.
    held_by = None
    held_probe = None

    @staticmethod
    def last_char(text: str) -> str:
        return f"substr({text}, -1)"

    def renew_many(self, count: int, outputs: int = 0) -> str:
        """Embedded: the live outputs are a statement of their own
        (:meth:`LockEngine.renew_many <dblockrun.store.engine.LockEngine.renew_many>`)."""
        return super().renew_many(count)

    def claim(self, shape: ClaimShape) -> str:
        """Row: (token, locked_at, version) when won (the record follows with
        :meth:`claim_record`), none when lost."""
        locks = self.locks
        return (f"{self.claim_update(shape)} RETURNING {locks}.token, {locks}.locked_at, "
                f"({self.version})")


def queries_for(dialect: str, prefix: str) -> Queries:
    kind = {"postgresql": Queries, "mysql": MysqlQueries, "sqlite": SqliteQueries}[dialect]
    return kind(prefix)
