"""The budget gate (issue 33): the daemon's path measured in counts that a
noisy machine can't fool, against bench/budgets.toml.

bench/budget.py measures them (real daemons and commands, each database
behind a counting proxy, bench/wirecount.py); the slow test here runs all
of it once for PostgreSQL and MariaDB side by side (about two minutes) and
fails naming every figure over its budget. The fast tests hold the gate's
own parts to their word: the proxy's counting, the choice of the idle
minute, a connection's set-up left out, and the naming of what is over.

Run it alone: ``./scripts/test -m budget`` (or ``python bench/budget.py``,
which prints the table; ``--runs N`` for the spread).
"""

from __future__ import annotations

import sys
import time

import psycopg
import pymysql
import pytest
from conftest import ServerDatabases
from helpers import REPO, at_low_priority

sys.path.insert(0, str(REPO / "bench"))  # the one place tests import from bench/

import budget  # noqa: E402
from budget import Figure, Sample  # noqa: E402
from wirecount import Sent, counting  # noqa: E402

pytestmark = [pytest.mark.budget, pytest.mark.xdist_group("budget")]

SERVERS = ("postgresql", "mariadb")


def chosen(config: pytest.Config) -> list[str]:
    """The server backends among the run's ``--backends``."""
    return [b for b in str(config.getoption("--backends")).split(",") if b in SERVERS]


@pytest.fixture(scope="module")
def figures(request: pytest.FixtureRequest, server_databases: ServerDatabases) -> list[Figure]:
    """Every figure, on each chosen backend that is reachable (an
    unreachable one skips its test, or fails it under CI)."""
    reachable = []
    for backend in chosen(request.config):
        try:
            server_databases.url(backend)
        except pytest.skip.Exception:
            continue
        reachable.append(backend)
    # Counts, not times: niceness changes none of them, and the bursts' CPU
    # does not starve the other workers' daemons.
    return at_low_priority(lambda: budget.measure(reachable)) if reachable else []


@pytest.mark.parametrize("server", SERVERS)
def test_the_daemons_path_stays_within_its_budget(
        server: str, figures: list[Figure], server_databases: ServerDatabases,
        request: pytest.FixtureRequest) -> None:
    if server not in chosen(request.config):
        pytest.skip(f"{server} is not among --backends")
    server_databases.url(server)  # skips, or fails under CI
    mine = [f for f in figures if f.backend == server]
    assert {f.scenario for f in mine} == {"burst", "idle", "one_run", "commands", "imports"}
    budgets = budget.load_budgets()
    over = budget.over_budget(mine, budgets)
    if over:
        pytest.fail("over budget (a change that needs more raises it in bench/budgets.toml, "
                    "and says why in its commit message):\n"
                    + "\n".join(f"  {o}" for o in over) + "\n\n"
                    + "\n".join(budget.table(budget.rows([mine]), budgets).lines()),
                    pytrace=False)


# -- the gate's parts --------------------------------------------------------------


def figure(key: str, value: float, backend: str = "postgresql",
           modules: frozenset[str] = frozenset()) -> Figure:
    scenario, name = key.split(".")
    return Figure(backend, scenario, name, value, modules=modules)


BUDGETS = {"postgresql": {
    "idle": {"statements_per_minute": 6},
    "burst": {"statements_per_start": 1.1},
    "imports": {"exec": {"modules": 3, "packages": ["dblockrun", "psycopg"]}},
}}


def test_each_figure_over_its_budget_is_named_with_budget_and_backend() -> None:
    over = budget.over_budget([
        figure("idle.statements_per_minute", 6),  # at its budget: fine
        figure("burst.statements_per_start", 2.1),  # one more a start
        figure("one_run.statements", 6),  # no budget
        figure("burst.starts_not_once", 1),  # correctness: always 0
    ], BUDGETS)
    assert [str(o) for o in over] == [
        "postgresql burst.statements_per_start: 2.100 over its budget of 1.100",
        "postgresql one_run.statements: 6, and no budget in budgets.toml "
        "([postgresql.one_run] statements)",
        "postgresql burst.starts_not_once: 1 over its budget of 0",
    ]


def test_a_new_package_is_named_with_its_modules_and_private_names_pass() -> None:
    modules = frozenset({"dblockrun", "dblockrun.cli", "psycopg", "_json", "rich",
                         "rich.console"})
    over = budget.over_budget([figure("imports.exec", len(modules), modules=modules)],
                              BUDGETS)
    assert [str(o) for o in over] == [
        "postgresql imports.exec: imports rich, not on its list of packages "
        "(2 module(s): rich, rich.console)",
        "postgresql imports.exec: 6 modules, over its budget of 3",
    ]


def test_the_budget_file_has_a_budget_for_every_figure_on_both_backends() -> None:
    budgets = budget.load_budgets()
    keys = {"burst.statements_per_start", "burst.connections", "burst.busiest_share",
            "idle.statements_per_minute",
            "idle.round_trips_per_minute", "idle.bytes_per_minute", "idle.connections",
            "one_run.statements",
            "commands.status", "commands.exec", "commands.run", "commands.kill"}
    for backend in SERVERS:
        for key in keys:
            assert budget.budget_of(budgets, figure(key, 0, backend)) is not None, (backend, key)
        for process in ("exec", "daemon"):
            entry = budget.budget_of(budgets, figure(f"imports.{process}", 0, backend))
            assert isinstance(entry["modules"], int) and "dblockrun" in entry["packages"]


def test_the_idle_minute_is_picked_with_its_ends_away_from_statements() -> None:
    # A loop every 12 s from 11.0; samples every 0.1 s over 68 s.
    arrivals = [11.0 + 12 * k for k in range(5)]
    samples = [Sample(t / 10, sum(a < t / 10 for a in arrivals), 0, 0) for t in range(681)]
    a, b, clear = budget.quiet_minute(samples, arrivals)
    assert b.at - a.at == pytest.approx(60.0)
    assert clear == pytest.approx(6.0)  # halfway between two rounds
    assert b.statements - a.statements == 5


def test_a_connections_opening_sets_are_left_out_and_its_later_ones_kept() -> None:
    log = [Sent(1.0, "SET", "SET NAMES ?", 0), Sent(1.1, "SELECT", "SELECT ?", 0),
           Sent(2.0, "SET", "SET NAMES ?", 1), Sent(2.1, "SET", "SET AUTOCOMMIT = ?", 1),
           Sent(2.2, "UPDATE", "UPDATE t", 1), Sent(2.3, "SET", "SET @x = ?", 1),
           Sent(3.0, "SELECT", "SELECT ?", 0)]
    sent, opened = budget.working(log, 1.5, 5.0)
    assert [s.shape for s in sent] == ["UPDATE t", "SET @x = ?", "SELECT ?"]
    assert opened == 1  # connection 1; connection 0 was open before


@pytest.mark.parametrize("server", SERVERS)
def test_the_proxy_counts_each_statement_by_its_first_word_and_round_trips(
        server: str, server_databases: ServerDatabases, request: pytest.FixtureRequest) -> None:
    if server not in chosen(request.config):
        pytest.skip(f"{server} is not among --backends")
    url = server_databases.url(server)
    with counting(server, url) as (proxy, through):
        if server == "postgresql":
            with psycopg.connect(through.replace("postgresql://", "postgres://"),
                                 autocommit=True) as conn:
                for i in range(7):  # psycopg prepares it at the 6th (a round trip not
                    conn.execute("SELECT %s::int", (i,))  # counted), then names it in Bind
                with conn.pipeline():  # three statements, one round trip
                    for _ in range(3):
                        conn.execute("/* why */ UPDATE pg_class SET relname = relname WHERE false")
            expected = {"SELECT": 7, "UPDATE": 3}
            trips = 7 + 1
        else:
            parts = through.split("@", 1)[1].split("/", 1)
            host, port = parts[0].split(":")
            my = pymysql.connect(host=host, port=int(port), user="root", password="",
                                 database=parts[1], autocommit=True)
            with my.cursor() as cur:
                for i in range(7):
                    cur.execute("SELECT %s", (i,))
                cur.execute("/* why */ DO 1")
            my.ping(reconnect=False)  # a round trip, no statement
            my.close()
            expected = {"SELECT": 7, "DO": 1}
            trips = 8 + 1
        time.sleep(0.2)  # the proxy's threads pass the last packets on
        counts = {k: v for k, v in proxy.counts().items() if k not in ("SET", "SHOW")}
        setup = proxy.statements() - sum(counts.values())
        assert counts == expected
        assert proxy.round_trips() == trips + setup
        shapes = {s.shape for s in proxy.log() if s.kind == "SELECT"}
        assert len(shapes) == 1  # the same statement, whatever its parameter
