"""Modules import one another one way (issue 20 item 8): no import circle, and
a store module imports no feature module. Every import counts: at the top,
under TYPE_CHECKING and inside functions.

And a running daemon imports a heavy library only when a job or an option
asks for it (issue 21 item 3): apprise for notify:, prometheus_client with
--metrics, rich never (it draws no table)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from harness import Process, daemon_argv, database_options
from helpers import REPO, TestDb, clean_env, free_port, imported_modules, wait_for

from dblockrun.store import Store

PACKAGE = REPO / "dblockrun"

#: What a store module may import from outside the store package.
STORE_MAY_IMPORT = {"dblockrun.errors", "dblockrun.jobs", "dblockrun.durations",
                    "dblockrun.secretfile", "dblockrun.redact", "dblockrun.supervise",
                    "dblockrun.latch"}


def imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a package's name when
    its ``__init__`` is imported itself)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}"
                           if f"{node.module}.{alias.name}" in modules else node.module
                           for alias in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module."""
    found: list[set[str]] = []
    seen: set[str] = set()
    for start in sorted(graph):
        if start in seen:
            continue
        reach = _reachable(graph, start)
        component = {m for m in reach if start in _reachable(graph, m)} | {start}
        seen |= component
        if len(component) > 1:
            found.append(component)
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    stack, out = [start], set()
    while stack:
        for nxt in graph[stack.pop()]:
            if nxt not in out:
                out.add(nxt)
                stack.append(nxt)
    return out


def test_no_import_circle() -> None:
    """Not even inside the store package (issue 34 item 6): its SQL helpers
    name what they use of the store (store/cold.py ``ColdPath``), not the
    store's own module, which imports them."""
    assert circles(imports()) == []


def layer(module: str) -> str:
    """A module's package inside dblockrun (``store``, ``daemon`` ...), or
    the module itself for one at the top (``jobs``, ``errors`` ...)."""
    return module.split(".")[1] if module.count(".") else module


def test_no_circle_between_packages() -> None:
    """Issue 34 item 6: the packages import one another one way (the job
    model, ``jobs.py``, sits below ``config`` and ``scheduling`` both)."""
    graph: dict[str, set[str]] = {}
    for name, targets in imports().items():
        graph.setdefault(layer(name), set()).update(
            layer(t) for t in targets if layer(t) != layer(name))
    assert circles(graph) == []


#: The layers, lowest first (ARCHITECTURE.md): a module imports its own
#: layer's and lower ones' only. The root package (``dblockrun``, for
#: ``__version__``) counts as the lowest; it names the API (``api``) lazily,
#: as the facade it is, and that arrow alone is not counted.
LAYERS = [
    {"dblockrun", "durations", "errors", "printable", "redact", "secretfile", "withheld",
     "signals", "supervise", "latch"},
    {"jobs", "timetext", "logs"},
    {"scheduling"},
    {"config"},
    {"store"},
    {"events", "metrics", "prometheus"},
    {"running"},
    {"notify"},
    {"ops", "daemon"},
    {"web"},
    {"cli", "api", "__main__"},
]


def test_no_import_from_a_lower_layer_to_a_higher_one() -> None:
    rank = {name: i for i, names in enumerate(LAYERS) for name in names}
    upward = {(name, target) for name, targets in imports().items() if name != "dblockrun"
              for target in targets if rank[layer(target)] > rank[layer(name)]}
    assert upward == set()  # e.g. scheduling/ (it decides) imports no store module


def test_the_daemon_uses_no_store_internals() -> None:
    """The daemon goes through the store's public modules: not its
    statements (``queries``), the lock engine's module or the executor."""
    internals = {"dblockrun.store.queries", "dblockrun.store.engine", "dblockrun.store.executor"}
    reached = {(name, target) for name, targets in imports().items()
               if name.startswith("dblockrun.daemon") for target in targets & internals}
    assert reached == set()


#: The store's insides (store/store.py, store/cold.py): its tables, the lock
#: engine and its statements, the SQLAlchemy engine, the executor, its
#: connections. Code outside the store package reaches the store through a
#: role's members (store/roles.py, store/runstore.py), never these.
STORE_INSIDES = {"t", "lock", "engine", "x", "q", "_run", "_conn"}


def _a_store(node: ast.expr) -> bool:
    """Whether ``node`` names a store as the package's code names one:
    ``store``, ``self.store``, ``self._store``, ``cfg.store``, ``self.store()``."""
    if isinstance(node, ast.Call):
        node = node.func
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.endswith("store")


def _a_lock_engine(node: ast.expr) -> bool:
    """``store.lock_engine()``, or a name ending in ``engine``."""
    if isinstance(node, ast.Call):
        return getattr(node.func, "attr", None) == "lock_engine"
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return isinstance(name, str) and name.endswith("engine")


def store_insides_reached(path: Path) -> list[str]:
    """Where the module at ``path`` reaches into a store (by the names
    above) or a lock engine's statements (``.q``), or takes a raw driver
    connection: ``line: .attribute``."""
    return [f"{node.lineno}: .{node.attr}" for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute)
            and (node.attr == "raw_connection"
                 or (node.attr in STORE_INSIDES and _a_store(node.value))
                 or (node.attr == "q" and _a_lock_engine(node.value)))]


def test_code_outside_the_store_uses_no_store_insides() -> None:
    """Issue 34 item 1: a consumer depends on the role it uses, not on the
    store's tables, lock engine, statements or connections (status goes
    through ``StatusReading.status``, the round's bad tokens through
    ``FleetBookkeeping.log_bad_tokens``). Tests may reach in; the package's
    modules outside store/ may not."""
    reached = {f"{path.relative_to(REPO)}:{where}" for path in PACKAGE.rglob("*.py")
               if not path.is_relative_to(PACKAGE / "store")
               for where in store_insides_reached(path)}
    assert reached == set()


def test_the_store_insides_check_sees_a_reach(tmp_path: Path) -> None:
    """The check above finds what it looks for (so its passing says something)."""
    module = tmp_path / "reach.py"
    module.write_text("def f(self, store, cfg):\n"
                      "    self.store.lock.bad_token('a', -1)\n"
                      "    store.t.locks\n"
                      "    cfg.store.engine.raw_connection()\n"
                      "    self.store().lock_engine().q.held_probe\n"
                      "    self._store._run(len)\n"
                      "    s.lock.name, query.q, store.status(), engine.claim\n")
    assert set(store_insides_reached(module)) == {
        "2: .lock", "3: .t", "4: .raw_connection", "4: .engine", "5: .q", "6: ._run"}


def test_no_role_hands_out_the_store_insides() -> None:
    """A role (store/roles.py, store/runstore.py, store/inbox.py) has no
    member that is one of the store's insides, nor ``lock_engine`` that
    hands the engine out, declared or inherited: a consumer typed by its
    role cannot reach them (mypy holds it to its role's members)."""
    from typing_extensions import get_protocol_members

    from dblockrun.store import inbox, roles, runstore

    protocols = {f"{module.__name__}.{name}": kind for module in (roles, runstore, inbox)
                 for name, kind in vars(module).items()
                 if isinstance(kind, type) and getattr(kind, "_is_protocol", False)
                 and kind.__module__ == module.__name__}
    assert {"dblockrun.store.roles.StatusReading", "dblockrun.store.roles.FleetBookkeeping",
            "dblockrun.store.runstore.RunStore"} <= set(protocols)
    exposed = {name: sorted(get_protocol_members(kind) & (STORE_INSIDES | {"lock_engine"}))
               for name, kind in protocols.items()}
    assert {name: found for name, found in exposed.items() if found} == {}


def test_store_modules_import_no_feature_module() -> None:
    graph = imports()
    outside = {(name, target) for name, targets in graph.items()
               if name.startswith("dblockrun.store") for target in targets
               if not target.startswith("dblockrun.store") and target not in STORE_MAY_IMPORT}
    assert outside == set()


# -- what a running daemon imports (issue 21 item 3) ----------------------------------

#: Libraries (and modules of ours) a daemon imports only when a job or an option
#: asks for them:
#: module -> what asks for it. Imported alone over the interpreter they cost
#: apprise 19 MB, prometheus_client 14 (with http.server), rich 6; difflib
#: 0.14 (issue 33 item 4: a daemon keeps every module it imports).
ASKED_FOR = {"apprise": "a job's notify:", "prometheus_client": "--metrics",
             "http.server": "--metrics", "rich": "a table (status, history ...)",
             "difflib": "a mistake's hint (did you mean ...?)",
             "dblockrun.running.fanout": "a job with items:",
             "dblockrun.config.resources": "a job's limits:"}


#: The ``web`` extra's libraries: ``dblockrun web`` only, never a daemon.
WEB_ONLY = {"starlette", "uvicorn", "jinja2", "argon2", "itsdangerous", "multipart",
            "python_multipart"}


def test_only_the_web_command_imports_the_web_package() -> None:
    importers = {name for name, targets in imports().items()
                 if any(t.startswith("dblockrun.web") for t in targets)
                 and not name.startswith("dblockrun.web")}
    assert importers == {"dblockrun.cli"}


def daemon_imports(tmp_path: Path, url: str, prefix: str, jobs: str,
                   *options: str) -> set[str]:
    """Every module a real ``dblockrun daemon`` imported in its life: it
    starts with ``jobs`` plus a job due at once, is stopped (SIGTERM) once
    that job's command has run, and Python's ``-X importtime`` names each
    module the process imported, on stderr, as it is first imported."""
    ran = tmp_path / "ran"
    path = tmp_path / "jobs.yaml"
    path.write_text(f"jobs:\n  first:\n    rate: 365d\n    command: 'touch {ran}'\n{jobs}")
    proc = Process(daemon_argv(database_options(url, prefix), path, "--grace", "5s", *options,
                               program=[sys.executable, "-X", "importtime", "-m", "dblockrun"]),
                   tmp_path / "daemon.log", cwd=tmp_path, env=clean_env())
    try:
        wait_for(lambda: ran.exists() or not proc.alive(), 60, what="the first run")
    finally:
        code = proc.stop(60)
    text = proc.text()
    assert ran.exists() and code == 0, text
    return imported_modules(text)


def test_a_daemon_imports_no_library_no_job_or_option_asks_for(
        tmp_path: Path, db: TestDb) -> None:
    imported = daemon_imports(
        tmp_path, db.url, db.prefix,
        "  idle:\n    cron: '0 0 1 1 *'\n    command: 'true'\n"
        f"    ping: 'http://127.0.0.1:{free_port()}/ping'\n")  # pings: urllib, not apprise
    assert "dblockrun.daemon.loop" in imported  # the log is read right
    assert {m for m in imported if m.split(".")[0] in ASKED_FOR or m in ASKED_FOR} == set()
    assert {m for m in imported if m.split(".")[0] in WEB_ONLY | {"dblockrun.web"}
            or m.startswith("dblockrun.web")} == set()


def test_a_daemon_imports_apprise_and_prometheus_client_when_asked(
        tmp_path: Path, sqlite_db: TestDb) -> None:
    imported = daemon_imports(
        tmp_path, sqlite_db.url, sqlite_db.prefix,
        "  notifies:\n    cron: '0 0 1 1 *'\n    command: 'true'\n"
        f"    notify:\n      urls: ['json://127.0.0.1:{free_port()}/hook']\n",
        "--metrics", f"127.0.0.1:{free_port()}")
    assert {"apprise", "prometheus_client", "http.server"} <= imported
    assert "rich" not in imported  # a daemon draws no table


# -- what a command imports ------------------------------------------------------------

#: The jobs file's reader and the cron library: a command that reads no
#: jobs file and computes no fire time needs neither (yaml 18 modules,
#: croniter with dateutil 17).
FILE_READING = {"yaml", "croniter", "dateutil", "dblockrun.config.load"}


def command_imports(tmp_path: Path,
                    *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """A real ``dblockrun ARGS`` under ``python -X importtime``: its result
    and every module it imported (dblockrun's and the libraries')."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dblockrun", *args],
                          capture_output=True, text=True, env=clean_env(), cwd=tmp_path,
                          timeout=60)
    return done, imported_modules(done.stderr, after="runpy")


def heavy(imported: set[str], names: set[str]) -> set[str]:
    return {m for m in imported if m in names or m.split(".")[0] in names}


def test_status_without_a_jobs_file_reads_none(tmp_path: Path, sqlite_db: TestDb) -> None:
    """``status`` shows what the database holds: the jobs file's reader and
    croniter load only with ``--wide`` (its limits) or ``--check`` (a
    passed slot's reason), not for the table every operator runs."""
    with Store(sqlite_db.url, sqlite_db.prefix) as store:
        store.ensure_jobs(["backup"])
    done, imported = command_imports(tmp_path, "--db", sqlite_db.url, "--table-prefix",
                                     sqlite_db.prefix, "status")
    assert done.returncode == 0 and "backup" in done.stdout, done.stderr[-2000:]
    assert "dblockrun.store.status" in imported  # the log is read right
    assert heavy(imported, FILE_READING) == set()


def test_next_opens_no_database(tmp_path: Path) -> None:
    """``next FILE`` computes fire times from the file alone: no SQLAlchemy
    (about 180 modules), no driver."""
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  nightly:\n    cron: '0 3 * * *'\n    command: 'true'\n")
    done, imported = command_imports(tmp_path, "next", str(path), "--count", "1")
    assert done.returncode == 0 and done.stdout.startswith("nightly: "), done.stderr[-2000:]
    assert "croniter" in imported  # the log is read right
    assert heavy(imported, {"sqlalchemy", "sqlite3", "psycopg", "pymysql"}) == set()


def test_validate_reads_the_file_alone(tmp_path: Path) -> None:
    """``validate`` checks the file: no database library, and for a file
    without ``run-on:`` none of the targeting (labels: json, socket)."""
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  nightly:\n    cron: '0 3 * * *'\n    command: 'true'\n")
    done, imported = command_imports(tmp_path, "validate", str(path))
    assert done.returncode == 0 and "ok, 1 job(s)" in done.stdout, done.stderr[-2000:]
    assert "dblockrun.config.load" in imported  # the log is read right
    assert heavy(imported, {"sqlalchemy", "sqlite3", "psycopg", "pymysql", "socket",
                            "dblockrun.scheduling.targeting"}) == set()
