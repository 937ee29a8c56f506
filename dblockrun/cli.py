"""The command line: parse, call one core function, map errors to exit codes.

Heavy modules (SQLAlchemy, drivers, rich, croniter) are imported inside the
commands so that ``exec`` and ``--help`` start fast. A plain ``exec``
command line started through :func:`dblockrun.__main__.main` does not come
here at all: it is parsed there without click and runs the same code.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import click

from dblockrun import __version__
from dblockrun.durations import FOREVER
from dblockrun.errors import EXIT_INTERRUPTED, ConfigError, DblockrunError, UsageError
from dblockrun.jobs import DEFAULT_QUEUE, WHEN_FULL

if TYPE_CHECKING:
    from dblockrun.jobs import JobsFile
    from dblockrun.ops.actions import Access
    from dblockrun.store import Store
    from dblockrun.store.control import Audit

P = ParamSpec("P")
R = TypeVar("R")

EXIT_RUNTIME = 1
EXIT_USAGE = 2
#: How often ``status --watch`` redraws (seconds).
WATCH_EVERY = 2.0
#: How long ``status --check`` waits for the lock rows before it calls them
#: held by another session (a daemon's claim holds them for milliseconds).
CHECK_LOCK_WAIT = 1.0
#: How long `run` waits for a daemon to start the job: a listening daemon
#: hears the request at once; through a transaction pooler it reads it in its
#: next bookkeeping round (every 12 s at the default heartbeat).
RUN_WAIT, RUN_WAIT_POOLED = 10.0, 30.0


@dataclass
class Globals:
    db: str | None
    db_file: str | None
    prefix: str
    debug: bool
    verbose: int
    #: ``-f FILE``: the jobs file (before or after the command).
    file: str | None = None
    #: The warning that ``--db`` holds a password was given.
    password_warned: bool = False


def _setup_logging(level: int, fmt: str = "text") -> None:
    from dblockrun.logs import setup

    setup(level, fmt)


def _duration(value: str, name: str, *, zero_ok: bool = False) -> float:
    """The seconds of a duration option; one line and exit 2 naming the
    option when it is not a duration (a number needs its unit), or zero
    where zero makes no sense."""
    from dblockrun.durations import parse_option_duration

    try:
        seconds = parse_option_duration(value)
    except ValueError as exc:
        raise UsageError(f"{name}: {exc}") from exc
    if seconds <= 0 and not zero_ok:
        raise UsageError(f"{name}: must be longer than 0s (got {value!r})")
    return seconds


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Map dblockrun's exceptions to one line on stderr and an exit status;
    Ctrl-C to status 130 without a word (not click's "Aborted!", status 1)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = click.get_current_context()
        debug = bool(ctx.find_object(Globals) and ctx.find_object(Globals).debug)  # type: ignore[union-attr]
        try:
            return fn(*args, **kwargs)
        except (ConfigError, UsageError) as exc:
            if debug:
                raise
            # A jobs file's problems: a line each (`validate` lists them all).
            for line in exc.lines() if isinstance(exc, ConfigError) else [exc.message]:
                click.echo(f"dblockrun: {_shown(line)}", err=True)
            ctx.exit(EXIT_USAGE)
        except DblockrunError as exc:
            if debug:
                raise
            click.echo(f"dblockrun: {_shown(exc.message)}", err=True)
            ctx.exit(EXIT_RUNTIME)
        except KeyboardInterrupt:
            ctx.exit(EXIT_INTERRUPTED)
        raise AssertionError("unreachable")

    return wrapper


def _shown(text: str) -> str:
    """Text from the database or a file, safe on a terminal (dblockrun/printable.py)."""
    from dblockrun.printable import printable

    return printable(text)


#: Column sizes of the lock table (store/schema.py): longer values are refused here.
MAX_NAME = 200
MAX_REASON = 1000


def _check_name(name: str, what: str = "job name", *, host_row: bool = False) -> str:
    """``host_row``: an every-host job's row on one host, ``JOB@HOST``, is
    also a name (operator commands; not ``exec``)."""
    from dblockrun.jobs import EVERY_HOST_SEP, JOB_NAME

    job, sep, host = name.partition(EVERY_HOST_SEP)
    checked = job if host_row and sep and JOB_NAME.fullmatch(host) else name
    if not JOB_NAME.fullmatch(checked) or len(checked) > MAX_NAME:
        raise UsageError(f"bad {what} {name[:60]!r}: use letters, digits, '.', '_' and '-' "
                         f"(at most {MAX_NAME})")
    return name


def _globals() -> Globals:
    obj = click.get_current_context().find_object(Globals)
    assert obj is not None
    return obj


def _prefix() -> str:
    from dblockrun.store.dburl import check_prefix

    return check_prefix(_globals().prefix)


def _load(path: str, *, secrets: bool = False) -> JobsFile:
    """``secrets``: read notification and ping URLs from their variables and
    files, as the daemon does (operator commands need only ``database:``)."""
    from dblockrun.config.load import load_jobs

    jobs = load_jobs(path)
    if secrets:
        from dblockrun.config.secreturl import resolve_secrets

        jobs = resolve_secrets(jobs)
    return jobs


def _jobs_path(argument: str | None) -> str:
    """The jobs file of daemon, validate and next: FILE, else -f, else
    DBLOCKRUN_JOBS, else /etc/dblockrun/jobs.yaml if it exists."""
    from dblockrun.store.dburl import DEFAULT_JOBS_FILE, JOBS_ENV, jobs_file

    given = _globals().file
    if argument is not None and given is not None and argument != given:
        raise UsageError(f"two jobs files ({argument} and -f {given}): give one")
    path, _named = jobs_file(argument if argument is not None else given)
    if path is None:
        raise UsageError(f"no jobs file: give FILE or -f FILE, set {JOBS_ENV}, "
                         f"or create {DEFAULT_JOBS_FILE}")
    return path


def _jobs_for_db(*, always: bool = False) -> JobsFile | None:
    """The jobs file an operator command reads: one named by -f or
    DBLOCKRUN_JOBS; the default /etc/dblockrun/jobs.yaml only when the
    database URL must come from it (nothing else names one) or ``always``."""
    from dblockrun.store.dburl import jobs_file, url_needs_jobs_file

    g = _globals()
    path, named = jobs_file(g.file)
    if path is None or not (named or always or url_needs_jobs_file(g.db, g.db_file)):
        return None
    return _load(path)


def _db_url(jobs: JobsFile | None = None) -> str:
    from dblockrun.store.dburl import password_in_argv, resolve_url

    g = _globals()
    warning = None if g.password_warned else password_in_argv(g.db)
    if warning is not None:
        g.password_warned = True
        click.echo(warning, err=True)
    return resolve_url(g.db, jobs.database if jobs else None, cli_db_file=g.db_file,
                       file_db_file=jobs.database_file if jobs else None)


def _open(access: Access, jobs: JobsFile | None = None, lock_wait: float | None = None) -> Store:
    """``lock_wait``: how long a statement waits for a row another session
    holds (None: store/drivers.py's default)."""
    from dblockrun.ops.actions import open_store

    return open_store(_db_url(jobs), _prefix(), access, lock_wait)


def _where(store: Store) -> str:
    from dblockrun.store.dburl import describe

    return describe(store.url, store.prefix)


#: Where global options given after the command wait during shell completion.
_GIVEN_LATER = "dblockrun.globals-after-command"


def _complete_job(ctx: click.Context, _param: click.Parameter,
                  incomplete: str) -> list[click.shell_completion.CompletionItem]:
    """Shell completion of a JOB argument: the names the database knows
    (the one the command would use: --db, -f, DBLOCKRUN_DB, ... as given
    so far), none when it cannot be read. Never creates anything."""
    from click.shell_completion import CompletionItem

    root = ctx.find_root()
    given = {**root.params, **root.meta.get(_GIVEN_LATER, {})}
    root.obj = Globals(db=given.get("db"), db_file=given.get("db_file"),
                       prefix=given.get("prefix") or "dblockrun_", debug=False, verbose=0,
                       file=given.get("file"), password_warned=True)
    try:
        from dblockrun.ops.actions import Access

        with ctx, _open(Access.READ, _jobs_for_db()) as store:
            names = store.job_names()
    except Exception:  # noqa: BLE001 - completion must never fail the shell
        return []
    return [CompletionItem(name) for name in names if name.startswith(incomplete)]


# -- global options: before the command name, or after it --------------------------

_DB_HELP = ("Database URL (postgresql://, mysql://, mariadb://, sqlite:///path). "
            "Default: --db-file, DBLOCKRUN_DB, DBLOCKRUN_DB_FILE, `database:` then "
            "`database-file:` in the jobs file, then "
            "~/.local/state/dblockrun/dblockrun.db.")
_DB_FILE_HELP = ("Read the database URL from the first line of this file (a mounted "
                 "secret); also DBLOCKRUN_DB_FILE.")
_FILE_HELP = ("The jobs file (default: DBLOCKRUN_JOBS, then /etc/dblockrun/jobs.yaml if it "
              "exists); the database is its `database:` unless named otherwise.")
_PREFIX_HELP = "Prefix of dblockrun's tables (also DBLOCKRUN_TABLE_PREFIX)."
_DEBUG_HELP = "Show tracebacks and debug logs."


def _set_global(ctx: click.Context, param: click.Parameter, value: object) -> None:
    """A global option given after the command name overrides one before it."""
    g = ctx.find_object(Globals)
    if param.name is None or value is None or value is False:
        return
    if g is not None:
        setattr(g, param.name, value)
    else:  # shell completion: the group's callback has not run (_complete_job)
        ctx.find_root().meta.setdefault(_GIVEN_LATER, {})[param.name] = value


def global_options(*, jobs_file: bool = True) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The group's options, accepted after a command's name too."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        # Described once, in `dblockrun --help`; a command's help points there.
        def option(*names: str, **attrs: Any) -> Callable[[Callable[P, R]], Callable[P, R]]:
            return click.option(*names, expose_value=False, callback=_set_global, hidden=True,
                                **attrs)

        opts = [
            option("--db", metavar="URL", help=_DB_HELP),
            option("--db-file", metavar="PATH", help=_DB_FILE_HELP),
            option("-f", "--file", metavar="FILE", help=_FILE_HELP),
            option("--table-prefix", "prefix", metavar="PREFIX", help=_PREFIX_HELP),
            option("--debug", is_flag=True, default=None, help=_DEBUG_HELP),
        ]
        if not jobs_file:
            del opts[2]
        names = ", ".join(["--db", "--db-file", *(["-f"] if jobs_file else []),
                           "--table-prefix", "--debug"])
        fn.__doc__ = (f"{(fn.__doc__ or '').rstrip()}\n\n"
                      f"Global options ({names}) may also follow the command name: see "
                      "`dblockrun --help`.")
        for opt in reversed(opts):
            fn = opt(fn)
        return fn

    return decorate


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dblockrun")
# DBLOCKRUN_DB and DBLOCKRUN_DB_FILE are read by dburl.resolve_url, which
# places them after both options.
@click.option("--db", metavar="URL", help=_DB_HELP)
@click.option("--db-file", metavar="PATH", help=_DB_FILE_HELP)
@click.option("-f", "--file", metavar="FILE", help=_FILE_HELP)
@click.option("--table-prefix", "prefix", envvar="DBLOCKRUN_TABLE_PREFIX", metavar="PREFIX",
              default="dblockrun_", show_default=True, help="Prefix of dblockrun's tables.")
@click.option("--debug", is_flag=True, help=_DEBUG_HELP)
@click.pass_context
def cli(ctx: click.Context, db: str | None, db_file: str | None, file: str | None,
        prefix: str, debug: bool) -> None:
    """A cron replacement for fleets: every host runs the same jobs file, a
    shared SQL database decides which one runs each slot.

    The options below (--db, --db-file, -f, --table-prefix, --debug) may also
    follow the command name: `dblockrun status --db URL`."""
    ctx.obj = Globals(db=db, db_file=db_file, prefix=prefix, debug=debug, verbose=0,
                      file=file)


@cli.command()
@click.argument("jobs_file", metavar="[FILE]", required=False)
@click.option("--heartbeat", default="10s", show_default=True, metavar="DURATION",
              help="How often running jobs' leases are renewed.")
@click.option("--lease", default="30s", show_default=True, metavar="DURATION",
              help="How long a lock outlives its last renewal (failover time).")
@click.option("--grace", default="30s", show_default=True, metavar="DURATION",
              help="On SIGTERM/SIGINT, how long running jobs may take to finish (0s: "
                   "stop them at once).")
@click.option("--metrics", "metrics_addr", metavar="[HOST:]PORT",
              help="Serve Prometheus /metrics and /healthz here.")
@click.option("--max-running", type=click.IntRange(min=1), metavar="N",
              help="Run at most N commands at once on this host; at the limit, slots are "
                   "left to other hosts (recorded skipped if none takes them).")
@click.option("--when-full", type=click.Choice(WHEN_FULL), default="skip", show_default=True,
              help="At --max-running, what becomes of a slot no other host takes: skip "
                   "(recorded skipped) or queue (it waits here for room, oldest first).")
@click.option("--queue", "queue_bound", type=click.IntRange(min=1), metavar="N",
              help=f"With --when-full queue: at most N slots wait here; more are recorded "
                   f"skipped.  [default: {DEFAULT_QUEUE}]")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: one object per line.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logs.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
              help="A label of this host, for run-on: (repeatable; added to DBLOCKRUN_LABELS "
                   "and the built-in hostname, which --label hostname=NAME replaces).")
@click.option("--watch-file", is_flag=True,
              help="Reload when FILE changes (checked every second; a symlink swap, as of a "
                   "Kubernetes ConfigMap, counts), as on SIGHUP.")
@global_options()
@handle_errors
def daemon(jobs_file: str | None, heartbeat: str, lease: str, grace: str,
           metrics_addr: str | None, log_format: str, verbose: bool,
           labels: tuple[str, ...], max_running: int | None, when_full: str,
           queue_bound: int | None, watch_file: bool) -> None:
    """Run the scheduler on FILE (SIGHUP reloads it, SIGTERM stops).

    FILE defaults to -f, then DBLOCKRUN_JOBS, then /etc/dblockrun/jobs.yaml."""
    import gc

    # Starting allocates much and frees little (modules, the jobs, their
    # plans): no collections until the daemon has started (Daemon._run then
    # freezes what there is and enables them), a tenth of the start-up's CPU.
    gc.disable()
    try:
        import os
        import signal
        import threading

        from dblockrun.daemon.loop import Daemon, DaemonOptions
        from dblockrun.ops.actions import Access
        from dblockrun.scheduling.targeting import LABELS_ENV, host_labels

        g = _globals()
        if when_full == "queue" and max_running is None:
            raise UsageError("--when-full queue needs --max-running N (the limit it queues for)")
        if queue_bound is not None and when_full != "queue":
            raise UsageError("--queue needs --when-full queue")
        try:
            host = host_labels(labels, os.environ.get(LABELS_ENV))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        _setup_logging(logging.DEBUG if g.debug or verbose else logging.INFO, log_format)
        options = DaemonOptions(
            labels=tuple(sorted(host.items())),
            heartbeat=_duration(heartbeat, "--heartbeat"),
            lease=_duration(lease, "--lease"),
            grace=_duration(grace, "--grace", zero_ok=True),
            metrics_addr=metrics_addr,
            max_running=max_running,
            host_queue=(queue_bound or DEFAULT_QUEUE) if when_full == "queue" else None,
            watch_file=watch_file,
        )
        if metrics_addr:
            from dblockrun.metrics import parse_addr

            parse_addr(metrics_addr)
        if options.heartbeat * 2 > options.lease:
            raise UsageError("--lease must be at least twice --heartbeat")
        from dblockrun.durations import lease_too_short, too_short_message

        stop = lease_too_short(options.lease, options.heartbeat, options.kill_grace)
        if stop is not None:  # every run would be stopped as unrenewed (--lease 2s --heartbeat 1s)
            raise UsageError(f"{too_short_message(lease, heartbeat, stop)}; give a longer "
                             "--lease or a shorter --heartbeat")
        jobs = _load(_jobs_path(jobs_file), secrets=True)
        from dblockrun.store.drivers import lock_wait_for

        # Renewals and bookkeeping wait for a row another session holds at
        # most a quarter of the lease (set once per connection).
        store = _open(Access.CREATE, jobs, lock_wait_for(options.lease))
        d = Daemon(jobs, store, options, stop=threading.Event())
        from dblockrun.signals import handling

        with handling({
            signal.SIGTERM: lambda _s: d.request_stop(),
            signal.SIGINT: lambda _s: d.interrupt(),
            signal.SIGHUP: lambda _s: d.request_reload(),
        }):
            d.run()
        store.close()
    finally:
        gc.enable()


@cli.command()
@click.argument("jobs", nargs=-1, shell_complete=_complete_job)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--live-within", metavar="DURATION",
              help="A daemon is live if its last heartbeat is this recent (default: 1.5 of "
                   "its --heartbeat, at least its heartbeat and 3s: 15s at the default).")
@click.option("--wide", is_flag=True,
              help="Every fact: holder, token, absolute times, pid, version, labels, and "
                   "the jobs file's limits (the default table fits 80 columns).")
@click.option("--watch", is_flag=True,
              help="Redraw the table in place every 2 seconds, until Ctrl-C (piped: "
                   "one table after another, without escape sequences).")
@click.option("--check", is_flag=True,
              help="For monitoring: print the problems (no live daemon, the fleet paused, a "
                   "last run failed, slots recorded missed or skipped, a job not started for "
                   "twice its period) and exit 1 if there is one.")
@click.option("--allow", "allowed", multiple=True, metavar="WHAT",
              help="With --check: not a problem: paused (the fleet's pause), missed, skipped "
                   "(a job's slots recorded so); repeatable, or comma-separated.")
@global_options()
@handle_errors
def status(jobs: tuple[str, ...], as_json: bool, live_within: str | None, wide: bool, watch: bool,
           check: bool, allowed: tuple[str, ...]) -> None:
    """Show jobs (state, last and next run; --wide: holder, lock, token...)
    and live hosts."""
    import time

    from dblockrun.ops import output
    from dblockrun.ops.actions import Access, no_such_job

    if watch and (as_json or check):
        raise UsageError("--watch draws the table: not with --json or --check")
    allow = {word.strip() for given in allowed for word in given.split(",") if word.strip()}
    if allow and not check:
        raise UsageError("--allow goes with --check")
    from dblockrun.ops.check import ALLOWABLE

    if unknown := sorted(allow - set(ALLOWABLE)):
        raise UsageError(f"--allow {', '.join(unknown)}: want {', '.join(ALLOWABLE)}")
    within = None if live_within is None else _duration(live_within, "--live-within")
    # --wide: the jobs file's limits too (the database has none of a job's definition).
    jobs_file = _jobs_for_db(always=wide)
    limits = {job.name: job.limits.text() for job in jobs_file.jobs
              if job.limits.any} if jobs_file is not None and wide else None
    # --check looks whether another session holds the lock rows: a second's wait.
    with _open(Access.READ, jobs_file, CHECK_LOCK_WAIT) as store:
        # An every-host job: its own row and every host's (JOB@HOST).
        got = store.status(store.with_every_host(list(jobs)) or None, within)
        missing = sorted(set(jobs) - {r.lock.name for r in got.jobs})
        if missing:
            raise no_such_job(store, missing)
        where = _where(store)
        # On a terminal each table is drawn over the last; piped (`| cat`, a
        # file), one follows another after a blank line, with no escapes.
        first, redraw = True, sys.stdout.isatty()
        while watch:  # until Ctrl-C (exit status 130)
            sys.stdout.write(output.REDRAW if redraw else "" if first else "\n")
            first = False
            click.echo(f"database: {where}")
            output.print_status(got.jobs, got.hosts, got.db_now, within, got.paused,
                                got.groups, wide=wide, limits=limits)
            sys.stdout.flush()
            time.sleep(WATCH_EVERY)
            got = store.status(store.with_every_host(list(jobs)) or None, within)
        if check:  # the jobs whose slots are being recorded passed: since when, why
            passed = store.passed_since(got.jobs)
            held = store.held_rows()
    if check:
        from dblockrun.ops.check import problems

        found = problems(got, allow, passed, held)
        if as_json:
            click.echo(output.dumps({"version": output.JSON_VERSION, "ok": not found,
                                     "problems": found}))
        elif found:
            for line in found:
                click.echo(_shown(f"problem: {line}"))
        else:
            click.echo(f"ok: {len(got.jobs)} job(s), {len(got.hosts)} live daemon(s) in {where}")
        if found:
            sys.exit(EXIT_RUNTIME)
    elif as_json:
        click.echo(output.status_json(got.jobs, got.hosts, got.db_now, within, got.paused,
                                      got.groups))
    else:
        click.echo(f"database: {where}")
        output.print_status(got.jobs, got.hosts, got.db_now, within, got.paused, got.groups,
                            wide=wide, limits=limits)


@cli.command()
@click.argument("job", shell_complete=_complete_job)
@click.option("--for", "for_", metavar="DURATION", help="How long, e.g. 3h.")
@click.option("--until", metavar="TIME",
              help="ISO 8601 time, e.g. 2026-12-01T06:00:00Z; without a zone, local time.")
@click.option("--reason", metavar="TEXT", help="Shown in status.")
@click.option("--create", is_flag=True,
              help="Also a job the database does not know yet (before it is deployed).")
@global_options()
@handle_errors
def disable(job: str, for_: str | None, until: str | None, reason: str | None,
            create: bool) -> None:
    """Pause JOB on every host (no duration: until `enable`)."""
    from dblockrun.ops.actions import Access, disable_job
    from dblockrun.timetext import iso

    if for_ and until:
        raise UsageError("give --for or --until, not both")
    _check_name(job, host_row=True)
    _reason(reason)
    seconds = None if for_ is None else _duration(for_, "--for")
    from dblockrun.timetext import parse_time

    until_ts = parse_time(until) if until is not None else None
    with _open(Access.CREATE if create else Access.WRITE, _jobs_for_db()) as store:
        done = disable_job(store, job, for_seconds=seconds, until=until_ts, reason=reason,
                           create=create, audit=_audit("disable", job, reason=reason,
                                                       detail=_for_until(for_, until)))
        where = _where(store)
    line = f"{job} disabled until {iso(done.until)} in {where}"
    was = done.replaced
    if was is not None:
        by = f" by {was.by}" if was.by else ""
        why = f" ({was.reason})" if was.reason else ""
        line += f"; this replaces the disable until {iso(was.until)}{by}{why}"
    click.echo(_shown(line))


def _audit(action: str, job: str | None = None, *, reason: str | None = None,
           detail: str | None = None) -> Audit:
    """The audit record of an operator's action, naming the operator."""
    from dblockrun.ops.who import operator_id
    from dblockrun.store.control import Audit

    return Audit(operator_id(), action, job, detail, reason)


def _for_until(for_: str | None, until: str | None) -> str:
    """An action's duration as the operator gave it."""
    return f"for {for_}" if for_ else f"until {until}" if until else "until enabled"


def _reason(reason: str | None) -> str | None:
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"--reason is {len(reason)} characters long (at most {MAX_REASON})")
    return reason


@cli.command()
@click.argument("job", shell_complete=_complete_job)
@global_options()
@handle_errors
def enable(job: str) -> None:
    """Clear a `disable` of JOB."""
    from dblockrun.ops.actions import Access, enable_job

    _check_name(job, host_row=True)
    with _open(Access.WRITE, _jobs_for_db()) as store:
        cleared = enable_job(store, job, _audit("enable", job))
        where = _where(store)
    if cleared:
        click.echo(f"{job} enabled in {where}")
    else:
        click.echo(f"{job} was not disabled in {where}: nothing to do (nothing recorded)")


@cli.command()
@click.argument("job", shell_complete=_complete_job)
@global_options()
@handle_errors
def unlock(job: str) -> None:
    """Free JOB's lock now, whoever holds it (a lock row edited into nonsense,
    a lock_until far in the future). The fencing token is incremented, so a
    holder that is still running loses its lease and stops its command at its
    next heartbeat."""
    from dblockrun.ops.actions import Access, no_such_job

    _check_name(job, host_row=True)
    with _open(Access.WRITE, _jobs_for_db()) as store:
        token = store.force_unlock(job, _audit("unlock", job))
        if token is None:
            raise no_such_job(store, [job])
        where = _where(store)
    click.echo(f"{job} unlocked (token now {token}) in {where}")


@cli.command()
@click.argument("job", required=False, shell_complete=_complete_job)
@click.option("--run", "run_id", type=click.IntRange(1), metavar="ID",
              help="Kill this run (an id from `history`) instead of JOB's runs.")
@click.option("--item", metavar="ITEM", help="Only this item's run (fan-out jobs).")
@click.option("--reason", metavar="TEXT", help="Recorded with the run and in the audit trail.")
@click.option("--timeout", default="30s", show_default=True, metavar="DURATION",
              help="How long to wait for the runs to end.")
@click.option("--no-wait", is_flag=True, help="Only file the request.")
@global_options()
@handle_errors
def kill(job: str | None, run_id: int | None, item: str | None, reason: str | None,
         timeout: str, no_wait: bool) -> None:
    """Stop JOB's running command (or run ID's) on whichever host runs it:
    its holder reads the request with its next lease renewal, stops the
    command's process group, records the run `killed` and frees the lock."""
    from dblockrun.ops.actions import Access
    from dblockrun.ops.kill import kill as kill_runs

    if (job is None) == (run_id is None):
        raise UsageError("give JOB or --run ID")
    if item is not None and job is None:
        raise UsageError("--item goes with JOB")
    if job is not None:
        _check_name(job)
    _reason(reason)
    wait = None if no_wait else _duration(timeout, "--timeout")
    from dblockrun.ops.who import operator_id

    with _open(Access.WRITE, _jobs_for_db()) as store:
        runs = kill_runs(store, operator_id(), job=job, item=item, run_id=run_id,
                         reason=reason, wait=wait)
        where = _where(store)
    for run in runs:
        what = _shown(f"{run.job}: run {run.id}" + (f" (item {run.item})" if run.item else "")
                      + f" on {run.host}")
        if wait is None:
            click.echo(f"{what}: kill requested in {where}")
        elif run.result == "killed":
            click.echo(f"{what} killed in {where}")
        else:
            click.echo(f"{what} ended {run.result} before the kill reached it in {where}")


@cli.command()
@click.argument("job", shell_complete=_complete_job)
@global_options()
@handle_errors
def forget(job: str) -> None:
    """Delete JOB's rows, items and runs from the database: a job no live
    daemon defines (an exec one-off, a job deleted from the jobs file; JOB@HOST:
    a renamed host's every-host row). Refused while a live daemon has it."""
    from dblockrun.ops.actions import Access, forget_job

    _check_name(job, host_row=True)
    with _open(Access.WRITE, _jobs_for_db()) as store:
        rows, runs = forget_job(store, job, _audit("forget", job))
        where = _where(store)
    click.echo(f"{job} forgotten in {where}: {rows} lock row(s) and {runs} run(s) deleted")


@cli.command()
@click.option("--for", "for_", metavar="DURATION", help="How long, e.g. 1h (default: until "
              "`resume`).")
@click.option("--reason", metavar="TEXT", help="Shown in status and the audit trail.")
@global_options()
@handle_errors
def pause(for_: str | None, reason: str | None) -> None:
    """Pause the whole fleet: no new run starts on any host (running ones
    finish) until `resume`, or for a while."""
    from dblockrun.ops.actions import Access
    from dblockrun.timetext import iso

    seconds = None if for_ is None else _duration(for_, "--for")
    entry = _audit("pause", reason=_reason(reason), detail=f"for {for_}" if for_ else None)
    with _open(Access.WRITE, _jobs_for_db()) as store:
        paused = store.control.pause(entry, seconds)
        where = _where(store)
    until = "until resumed" if paused.ends >= FOREVER else f"until {iso(paused.ends)}"
    click.echo(f"fleet paused {until} in {where}: no new run starts; running ones finish")


@cli.command()
@global_options()
@handle_errors
def resume() -> None:
    """End a `pause`: slots that come due from now on run again."""
    from dblockrun.ops.actions import Access

    with _open(Access.WRITE, _jobs_for_db()) as store:
        was = store.control.resume(_audit("resume"))
        where = _where(store)
    if was is None:
        click.echo(f"fleet was not paused in {where}")
    else:
        click.echo(f"fleet resumed in {where} (paused by {_shown(was.who)})")


@cli.command()
@click.argument("host")
@click.option("--for", "for_", metavar="DURATION", help="How long, e.g. 2h (default: until "
              "`undrain`).")
@click.option("--reason", metavar="TEXT", help="Shown in status and the audit trail.")
@click.option("--wait", is_flag=True, help="Return once the runs going on HOST have finished, "
              "saying which it waits for.")
@click.option("--timeout", metavar="DURATION", help="With --wait: give up after this long "
              "(exit 1; the host stays drained).")
@click.option("--force", is_flag=True, help="Drain HOST though no live daemon has that name "
              "(a host that is down or not started yet).")
@global_options()
@handle_errors
def drain(host: str, for_: str | None, reason: str | None, wait: bool, timeout: str | None,
          force: bool) -> None:
    """Take HOST out of rotation: its daemon starts nothing new (its running
    runs finish; its every-host jobs' slots are recorded skipped) and the
    other hosts take its slots, until `undrain` or for a while. HOST is the
    daemon's hostname label (its machine's name unless --label hostname=)."""
    from dblockrun.errors import DblockrunError
    from dblockrun.ops import drain as ops
    from dblockrun.ops.actions import Access

    seconds = None if for_ is None else _duration(for_, "--for")
    limit = None if timeout is None else _duration(timeout, "--timeout")
    entry = _audit("drain", reason=_reason(reason),
                   detail=f"host {host}" + (f" for {for_}" if for_ else ""))
    with _open(Access.WRITE, _jobs_for_db()) as store:
        drained = ops.drain(store, host, entry, seconds, force=force)
        going = ops.host_runs(store, host)
        click.echo(_shown(ops.drained_line(drained, _where(store), len(going))))
        if wait and going:
            try:
                waited = ops.wait_for_runs(store, host, lambda line: click.echo(_shown(line)),
                                           limit)
            except TimeoutError as exc:
                raise DblockrunError(str(exc)) from exc
            click.echo(f"host {host}: no run going any more (waited {waited.seconds:.1f}s "
                       f"for {len(waited.runs)})")


@cli.command()
@click.argument("host")
@global_options()
@handle_errors
def undrain(host: str) -> None:
    """End HOST's drain: its daemon claims slots again."""
    from dblockrun.ops import drain as ops
    from dblockrun.ops.actions import Access

    with _open(Access.WRITE, _jobs_for_db()) as store:
        was = ops.undrain(store, host, _audit("undrain", detail=f"host {host}"))
        where = _where(store)
    if was is None:
        click.echo(f"host {host} was not drained in {where}")
    else:
        click.echo(_shown(f"host {host} undrained in {where} (drained by {was.who}): "
                          "it claims slots again"))


@cli.command()
@click.argument("job", required=False, shell_complete=_complete_job)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100000),
              metavar="N", help="How many entries, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@global_options()
@handle_errors
def audit(job: str | None, limit: int, as_json: bool) -> None:
    """Operator actions (disable, enable, run, cancel-run, kill, unlock, forget, pause,
    resume, drain, undrain, backfill, rerun), newest first: when, who, what and why."""
    from dblockrun.ops import output
    from dblockrun.ops.actions import Access, require_job

    with _open(Access.READ, _jobs_for_db()) as store:
        if job is not None:
            require_job(store, job)
        entries = store.control.entries(job, limit)
    if as_json:
        click.echo(output.audit_json(entries))
    else:
        output.print_audit(entries)


@cli.group(invoke_without_command=True)
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="[HOST:]PORT",
              help="Where to serve (127.0.0.1 only, by default).")
@click.option("--users", "users_file", metavar="FILE",
              help="Users (name, role viewer|operator|admin, password hash or API token "
                   "hash); without it the dashboard is read-only for anyone.")
@click.option("--cert", metavar="FILE", help="TLS certificate (PEM), with --key.")
@click.option("--key", metavar="FILE", help="TLS private key (PEM), with --cert.")
@click.option("--secret-file", metavar="FILE",
              help="The key that signs session cookies (also DBLOCKRUN_WEB_SECRET; default: "
                   "a new one each start, so a restart signs everyone out).")
@click.option("--proxy-headers", is_flag=True,
              help="Trust X-Forwarded-For/-Proto from a reverse proxy on 127.0.0.1 (off by "
                   "default); session cookies are then sent over HTTPS only.")
@click.option("--hide-commands/--show-commands", default=None,
              help="Show the jobs' commands to operators and admins only (default without "
                   "--users: hidden from everyone), or to every reader (default with --users). "
                   "Credentials in them are hidden either way.")
@click.option("--session-lifetime", metavar="DURATION", default="12h", show_default=True,
              help="How long a sign-in lasts, whatever the session does (e.g. 8h).")
@click.option("--access-log", is_flag=True,
              help="Log every request (off by default: the pages poll every 2 seconds).")
@global_options()
@click.pass_context
@handle_errors
def web(ctx: click.Context, listen: str, users_file: str | None, cert: str | None,
        key: str | None, secret_file: str | None, proxy_headers: bool,
        hide_commands: bool | None, session_lifetime: str, access_log: bool) -> None:
    """Serve the dashboard and the JSON API (/api/v1) over the database: the
    fleet, jobs, runs and their output, hosts, the audit trail, and the
    operator actions for signed-in users. Needs the web extra:
    `pip install 'dblockrun[web]'` (from a checkout, `pipx install '.[web]'`)."""
    from dblockrun.web import INSTALL, missing_extra

    if (missing := missing_extra()) is not None:  # `web` and `web hash-password`
        raise UsageError(f"dblockrun web needs the web extra ({missing} is missing): {INSTALL}")
    if ctx.invoked_subcommand is not None:
        return
    from dblockrun.ops.actions import Access
    from dblockrun.web.serve import WebOptions, check, serve

    options = WebOptions(listen=listen, users_file=users_file, cert=cert, key=key,
                         secret_file=secret_file, proxy_headers=proxy_headers,
                         hide_commands=hide_commands,
                         session_lifetime=_duration(session_lifetime, "--session-lifetime"),
                         access_log=access_log)
    checked = check(options)  # before the database: a bad file says so at once
    _setup_logging(logging.DEBUG if _globals().debug else logging.INFO)
    jobs = _jobs_for_db()
    with _open(Access.WRITE if users_file else Access.READ, jobs) as store:
        serve(store, checked, jobs)


@web.command(name="hash-password")
@click.option("--token", is_flag=True,
              help="Make a new API token instead: print it, and the token-sha256 line for "
                   "the users file.")
@handle_errors
def web_hash_password(token: bool) -> None:
    """Read a password (prompted, or from stdin) and print its argon2 hash
    for the users file's `password:`."""
    from dblockrun.web.users import hash_password, new_token

    if token:
        secret, digest = new_token()
        click.echo(f"token: {secret}\ntoken-sha256: {digest}")
        return
    if sys.stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise UsageError("an empty password")
    click.echo(hash_password(password))


# Options end at the command's first word: in `exec -n x grep -v foo`, `-v` is grep's.
@cli.command(name="exec", context_settings={"ignore_unknown_options": True,
                                           "allow_interspersed_args": False})
@click.option("--name", "-n", required=True, help="Lock name (shared with a daemon job).")
@click.option("--lock-at-most", default="1h", show_default=True, metavar="DURATION",
              help="Stop the command after this long.")
@click.option("--lock-at-least", default="0s", show_default=True, metavar="DURATION",
              help="Keep the lock at least this long after the start.")
@click.option("--lease", default="30s", show_default=True, metavar="DURATION",
              help="Lease renewed while it runs.")
@click.option("--busy-exit-code", default=0, show_default=True, type=int, metavar="N",
              help="Exit status when the lock is busy elsewhere.")
@click.option("-v", "--verbose", is_flag=True,
              help="Say when the lock is busy, and what holds it (a run, or lock-at-least "
                   "after one, until when).")
@global_options()
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def exec_(name: str, lock_at_most: str, lock_at_least: str, lease: str, busy_exit_code: int,
          verbose: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND under the lock NAME; its exit status passes through."""
    # dblockrun.__main__ takes a plain exec command line without click, checks
    # it as below and calls exec_command too (tests/test_main.py).
    from dblockrun.running.execlock import ExecOptions, exec_command

    g = _globals()
    _setup_logging(logging.DEBUG if g.debug else logging.INFO if verbose else logging.ERROR)
    _check_name(name, "lock name")
    most = _duration(lock_at_most, "--lock-at-most")
    least = _duration(lock_at_least, "--lock-at-least", zero_ok=True)
    if least > most:
        raise UsageError("--lock-at-least is longer than --lock-at-most")
    lease_s = _duration(lease, "--lease")
    from dblockrun.durations import format_duration, lease_too_short, too_short_message

    stop = lease_too_short(lease_s, lease_s / 3)
    if stop is not None:  # the command would be stopped before the lease's first renewal
        every = f"{format_duration(lease_s / 3)} (a third of it)"
        raise UsageError(f"{too_short_message(lease, every, stop)}; give a longer --lease")
    opts = ExecOptions(name=name, argv=command, lock_at_most=most, lock_at_least=least,
                       lease=lease_s, heartbeat=lease_s / 3, busy_exit_code=busy_exit_code,
                       verbose=verbose)
    url = _db_url(_jobs_for_db())
    sys.exit(exec_command(opts, url, _prefix()))


@cli.command()
@click.argument("jobs_file", metavar="[FILE]", required=False)
@click.option("--max-running", type=click.IntRange(min=1), metavar="N",
              help="Also warn of jobs due together beyond a daemon's --max-running N.")
@global_options()
@handle_errors
def validate(jobs_file: str | None, max_running: int | None) -> None:
    """Check a jobs file; if invalid, exit 2 with a line per problem,
    `file:line: job: key: why`.
    Warns (stderr) of jobs that share a group, or --max-running N, and come
    due together beyond its limit: all but the limit's are skipped."""
    import time

    from dblockrun.scheduling.limits import starving

    path = _jobs_path(jobs_file)
    jobs = _load(path, secrets=True)
    for warning in starving(jobs, time.time(), max_running):
        click.echo(f"{_shown(path)}: warning: {warning}", err=True)
    click.echo(f"{_shown(path)}: ok, {len(jobs.jobs)} job(s)")


@cli.command(name="next")
@click.argument("arguments", nargs=-1, metavar="[FILE] [JOB]...")
@click.option("--count", "-c", default=5, show_default=True, type=click.IntRange(1, 1000),
              metavar="N", help="How many fire times per job.")
@global_options()
@handle_errors
def next_(arguments: tuple[str, ...], count: int) -> None:
    """Show the next fire times of each job (or of the JOBs named), in the
    job's timezone; the slots a calendar, blackout window or the active
    range excludes are shown among them, marked skipped with the reason."""
    import time

    from dblockrun.ops.output import next_lines

    path, names = _file_and_jobs(arguments)
    jobs = _load(_jobs_path(path))
    chosen = list(jobs.jobs)
    if names:
        missing = [name for name in names if jobs.job(name) is None]
        if missing:
            raise UsageError(f"no job {missing[0]!r} in {_shown(jobs.path)}")
        chosen = [job for name in dict.fromkeys(names) if (job := jobs.job(name)) is not None]
    for line in next_lines(chosen, time.time(), count):
        click.echo(line)


def _file_and_jobs(arguments: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    """``next [FILE] [JOB]...``: the first argument is the jobs file when it
    names a path that exists, has a ``/`` or ends in ``.yaml``/``.yml``;
    the others (all of them, else) are jobs of the file (-f, DBLOCKRUN_JOBS...)."""
    import os

    if not arguments:
        return None, ()
    first = arguments[0]
    if os.path.lexists(first) or "/" in first or first.endswith((".yaml", ".yml")):
        return first, arguments[1:]
    return None, arguments


@cli.command()
@click.argument("new_file", metavar="NEW")
@click.option("--current", metavar="FILE",
              help="The jobs file the fleet runs now (default: -f, DBLOCKRUN_JOBS, then "
                   "/etc/dblockrun/jobs.yaml if it exists); checked against the hashes the "
                   "live daemons publish.")
@click.option("--count", "-c", type=click.IntRange(1, 1000), metavar="N",
              help="How many slots before and after per job (default 10; with --days: at "
                   "most N).")
@click.option("--days", type=click.FloatRange(min=0, min_open=True), metavar="D",
              help="The slots within the next D days (at most 1000, or --count).")
@click.option("--max-running", type=click.IntRange(min=1), metavar="N",
              help="Also warn of jobs due together beyond a daemon's --max-running N.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@global_options()
@handle_errors
def plan(new_file: str, current: str | None, count: int | None, days: float | None,
         max_running: int | None, as_json: bool) -> None:
    """Show what deploying the jobs file NEW would do, against the database
    the fleet uses: each job added, removed or changed (the keys, old ->
    new), its next slots before and after, the passed slots a daemon
    started with NEW would run or record missed, the limits NEW makes full,
    and which live hosts run which definition now.

    Exit status 0: nothing changes; 1: something does; 2: an error (a bad
    file, the database unreachable)."""
    from dblockrun.ops import plantext
    from dblockrun.ops.actions import Access
    from dblockrun.ops.plan import DEFAULT_COUNT, MOST_SLOTS, make_plan, read_fleet
    from dblockrun.store.dburl import jobs_file

    new = _load(new_file)
    current_path = current if current is not None else jobs_file(_globals().file)[0]
    now_file = _load(current_path) if current_path is not None else None
    try:
        with _open(Access.READ, now_file if now_file is not None else new) as store:
            facts = read_fleet(store)
            where = _where(store)
    except (ConfigError, UsageError):
        raise
    except DblockrunError as exc:  # exit 1 says "changes": an error is 2 here
        if _globals().debug:
            raise
        click.echo(f"dblockrun: {_shown(exc.message)}", err=True)
        sys.exit(EXIT_USAGE)
    shown = count if count is not None else MOST_SLOTS if days is not None else DEFAULT_COUNT
    got = make_plan(new, now_file, facts, count=shown, days=days, max_running=max_running)
    if as_json:
        click.echo(plantext.plan_json(got, new.path, current_path, where))
    else:
        for line in plantext.plan_text(got, new.path, where):
            click.echo(line)
    if got.changed:
        sys.exit(EXIT_RUNTIME)


@cli.command(name="init-db")
@global_options()
@handle_errors
def init_db() -> None:
    """Create or migrate the schema (for setups where services may not run DDL)."""
    from dblockrun.ops.actions import Access

    with _open(Access.CREATE, _jobs_for_db()) as store:
        version = store.ensure_schema(create=True)
        click.echo(f"schema version {version} ready in {_where(store)}")


@cli.command()
@click.argument("job", required=False, shell_complete=_complete_job)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100000),
              metavar="N", help="How many runs, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--output", "output_of", type=int, metavar="RUN",
              help="Print the stored output tail of run RUN (control characters escaped, "
                   "passwords in URLs hidden).")
@click.option("--raw", is_flag=True,
              help="With --output: control characters as the command wrote them.")
@click.option("--item", metavar="ITEM", help="Only the runs of this item (fan-out jobs).")
@global_options()
@handle_errors
def history(job: str | None, limit: int, as_json: bool, output_of: int | None, raw: bool,
            item: str | None) -> None:
    """Past runs, newest first."""
    from dblockrun.ops import output
    from dblockrun.ops.actions import Access, require_job

    if raw and output_of is None:
        raise UsageError("--raw goes with --output RUN")
    with _open(Access.READ, _jobs_for_db()) as store:
        if output_of is not None:
            run = store.run(output_of)
            if run is None:
                raise UsageError(f"no run {output_of} in {_where(store)}")
            if run.live:
                click.echo(_shown(f"run {run.id} of {run.job} is running on {run.host}: its "
                                  "output so far, as of its holder's last heartbeat "
                                  f"(`dblockrun tail --run {run.id}` follows it)"), err=True)
            # color: click would strip some escape sequences, --raw or not, off a terminal
            click.echo(output.output_text(run.output or "", raw=raw), nl=False, color=raw)
            return
        if job is not None:
            require_job(store, job)
        runs = store.history(job, limit, item=item, output=False)  # not shown
        now = store.db_now()
    if as_json:
        click.echo(output.history_json(runs))
    else:
        output.print_history(runs, now)


@cli.command()
@click.argument("job", required=False, shell_complete=_complete_job)
@click.option("--run", "run_id", type=click.IntRange(1), metavar="ID",
              help="Follow this run (an id from `history`) instead of JOB's running one.")
@click.option("--raw", is_flag=True, help="Control characters as the command wrote them.")
@global_options()
@handle_errors
def tail(job: str | None, run_id: int | None, raw: bool) -> None:
    """Print JOB's running output as it grows, from any host, until the run
    ends; then exit with its status (0 ok, the command's exit status if it
    failed, else 1). Its holder writes the newest 64 KiB with each lease
    renewal, when it grew."""
    from dblockrun.ops import output
    from dblockrun.ops.actions import Access, exit_status
    from dblockrun.ops.follow import follow, running_run

    if (job is None) == (run_id is None):
        raise UsageError("give JOB or --run ID")
    if job is not None:
        _check_name(job, host_row=True)

    def write(text: str) -> None:
        click.echo(output.output_text(text, raw=raw), nl=False, color=raw)
        sys.stdout.flush()

    with _open(Access.READ, _jobs_for_db()) as store:
        if run_id is None:
            assert job is not None
            run_id = running_run(store, job).id
        elif store.run(run_id) is None:
            raise UsageError(f"no run {run_id} in {_where(store)}")
        run = follow(store, run_id, write)
    code = "" if run.exit_code is None else f" (exit {run.exit_code})"
    took = "" if run.duration is None else f" in {run.duration:.2f}s"
    click.echo(_shown(f"{run.job}: run {run.id} on {run.host} ended {run.result}{code}{took}"),
               err=True)
    status = exit_status(run)
    if status:
        sys.exit(status)


@cli.command(name="run")
@click.argument("job", shell_complete=_complete_job)
@click.option("--timeout", default=None, metavar="DURATION",
              help="How long to wait for a daemon to start it (default 10s; 30s "
                   "through a transaction pooler, ?pooler=transaction, whose daemons "
                   "read requests once a bookkeeping round).")
@click.option("--no-wait", is_flag=True, help="Only file the request.")
@click.option("--wait", "wait_end", is_flag=True,
              help="Also print the run's output as it grows (from any host, as `tail`), "
                   "wait for it to end, and exit with its status: 0 ok, the command's exit "
                   "status if it failed, else 1.")
@click.option("--cancel", is_flag=True, help="Withdraw JOB's filed request instead.")
@global_options()
@handle_errors
def run_(job: str, timeout: str | None, no_wait: bool, wait_end: bool, cancel: bool) -> None:
    """Ask the fleet to run JOB now: some daemon that has it claims it, under
    the same lock, within about a second. When none can (the fleet paused, no
    live daemon, the job busy), it says why; the request stays filed."""
    from dblockrun.ops.actions import (
        Access,
        exit_status,
        no_such_job,
        request_runs,
    )

    _check_name(job, host_row=True)
    if sum((no_wait, wait_end, cancel)) > 1:
        raise UsageError("give one of --no-wait, --wait and --cancel")
    if cancel:
        with _open(Access.WRITE, _jobs_for_db()) as store:
            withdrawn = store.cancel_request(job, _audit("cancel-run", job))
            if withdrawn is None:
                raise no_such_job(store, [job])
            where = _where(store)
        click.echo(f"{job}: run request withdrawn in {where}" if withdrawn else
                   f"{job}: no run request filed in {where}: nothing to do (nothing recorded)")
        return
    given = None if no_wait or timeout is None else _duration(timeout, "--timeout")
    jobs = _jobs_for_db(always=True)
    defined = jobs.job(job) if jobs is not None else None
    if jobs is not None and defined is not None and not defined.enabled:
        # Its daemons would not run it either (daemon.py _poll_requests).
        raise UsageError(f"{job} has `enabled: false` in {jobs.path}: no daemon with that "
                         "file runs it")
    with _open(Access.WRITE, jobs) as store:
        wait = None if no_wait else given if given is not None else (
            RUN_WAIT_POOLED if store.pooler == "transaction" else RUN_WAIT)
        runs = request_runs(store, job, wait, _audit("run", job))
        where = _where(store)
        if runs is None:
            click.echo(f"{job}: run requested in {where}")
            return
        status = 0
        for row, run in runs:  # an every-host job: a line per host
            if run is None:
                continue
            if run.result == "skipped":  # its group was at its limit (scheduling/limits.py)
                why = (run.output or "skipped").strip().removeprefix("skipped: ")
                click.echo(_shown(f"dblockrun: {row}: run {run.id} not started on {run.host}: "
                                  f"{why}"), err=True)
                status = EXIT_RUNTIME
            else:
                click.echo(_shown(f"{row}: run {run.id} started on {run.host} "
                                  f"(token {run.token}) in {where}"))
        late = [row for row, run in runs if run is None]
        if late:
            raise DblockrunError(f"no daemon started {', '.join(late)} within {wait:g}s; the "
                                 "request stays filed")
        if wait_end:
            from dblockrun.ops import output
            from dblockrun.ops.follow import follow

            def write(text: str) -> None:
                click.echo(output.output_text(text), nl=False)
                sys.stdout.flush()

            started = [run for _row, run in runs if run is not None and run.result != "skipped"]
            for run in started:  # each run's output as it grows, as `tail` prints it
                if len(started) > 1:
                    click.echo(_shown(f"{run.job}: run {run.id} on {run.host}:"))
                run = follow(store, run.id, write)
                code = "" if run.exit_code is None else f" (exit {run.exit_code})"
                took = "" if run.duration is None else f" in {run.duration:.2f}s"
                click.echo(_shown(f"{run.job}: run {run.id} on {run.host} ended "
                                  f"{run.result}{code}{took}"))
                status = status or exit_status(run)
    if status:
        sys.exit(status)


def _lease_option(lease: str) -> float:
    """``--lease`` of backfill and rerun, checked as exec's."""
    from dblockrun.durations import format_duration, lease_too_short, too_short_message

    seconds = _duration(lease, "--lease")
    stop = lease_too_short(seconds, seconds / 3)
    if stop is not None:
        every = f"{format_duration(seconds / 3)} (a third of it)"
        raise UsageError(f"{too_short_message(lease, every, stop)}; give a longer --lease")
    return seconds


def _say(line: str) -> None:
    click.echo(_shown(line))
    sys.stdout.flush()


@cli.command()
@click.argument("job", shell_complete=_complete_job)
@click.option("--from", "from_", required=True, metavar="TIME",
              help="The first slot's time: ISO 8601; without a zone, in the job's timezone "
                   "(e.g. 2026-11-28T02:00, or 2026-11-28T01:00:00Z).")
@click.option("--to", "to", required=True, metavar="TIME",
              help="The last slot's time (included), as --from; later than now is now.")
@click.option("--only", "only", multiple=True, metavar="KINDS",
              help="Only slots recorded missed, skipped, whose last run failed (failed, "
                   "timeout, killed, lost), or with no record: missed, skipped, failed, "
                   "unrecorded; comma-separated or repeated (default: all of them).")
@click.option("--dry-run", is_flag=True, help="List the slots it would run, and why; run none.")
@click.option("--keep-going", is_flag=True,
              help="Run the other slots after one that did not end ok (default: stop there).")
@click.option("--lease", default="30s", show_default=True, metavar="DURATION",
              help="Lease of each run, renewed every third of it.")
@click.option("--reason", metavar="TEXT", help="Recorded in the audit trail.")
@global_options()
@handle_errors
def backfill(job: str, from_: str, to: str, only: tuple[str, ...], dry_run: bool,
             keep_going: bool, lease: str, reason: str | None) -> None:
    """Run JOB's passed slots from --from to --to that have no run that ended
    ok, here, oldest first, one at a time across the fleet, each as its own
    slot (DBLOCKRUN_SLOT). The command comes from the local jobs file.
    Exit status 0 if every slot ran ok (or none was left), 1 if one did not,
    or the fleet's pause or the job's disable stopped it."""
    from dblockrun.ops.actions import Access
    from dblockrun.ops.again import backfill as run_backfill
    from dblockrun.ops.backfill import KINDS, local_job, plan
    from dblockrun.timetext import parse_time, stamp

    _check_name(job)
    _reason(reason)
    kinds = [k.strip() for given in only for k in given.split(",") if k.strip()]
    if unknown := sorted(set(kinds) - set(KINDS)):
        raise UsageError(f"--only {', '.join(unknown)}: want {', '.join(KINDS)}")
    lease_s = _lease_option(lease)
    jobs = _jobs_for_db(always=True)
    defined = local_job(jobs, job)
    assert jobs is not None
    first = parse_time(from_, "--from", defined.timezone)
    last = parse_time(to, "--to", defined.timezone)
    _setup_logging(logging.DEBUG if _globals().debug else logging.ERROR)
    with _open(Access.WRITE, jobs) as store:
        now = store.db_now()
        if first > now:
            raise UsageError(f"--from {stamp(first)} has not come yet (the database's clock "
                             f"reads {stamp(now)}): only passed slots are backfilled")
        chosen = plan(store, defined, first, min(last, now), kinds)
        span = f"from {stamp(first)} to {stamp(chosen.last)}"
        notes = [f"{n} {what}" for n, what in (
            (chosen.done, "ran ok"), (chosen.running, "running now"),
            (chosen.left_out, "left out by --only"),
            (chosen.not_passed, "not passed yet (the daemons')")) if n]
        also = f"; other slots: {', '.join(notes)}" if notes else ""
        if not chosen.pending:
            click.echo(f"{job}: no slot to backfill {span}{also}")
            return
        if dry_run:
            click.echo(f"{job}: would backfill {len(chosen.pending)} slot(s) {span} "
                       f"({chosen.counts()}){also}; nothing run (--dry-run)")
            for pending in chosen.pending:
                click.echo(f"{stamp(pending.slot)}  {pending.kind:<10}  {pending.detail}")
            return
        _say(f"{job}: backfilling {len(chosen.pending)} slot(s) {span} ({chosen.counts()})"
             f"{also}")
        detail = (f"{len(chosen.pending)} slot(s) {span}"
                  + (f", only {','.join(kinds)}" if kinds else "")
                  + (", keep going" if keep_going else ""))
        tally = run_backfill(store, jobs, chosen, lease=lease_s, keep_going=keep_going,
                             audit=_audit("backfill", job, reason=reason, detail=detail),
                             say=_say)
    _say(f"{job}: backfill done: {tally.text()}")
    if tally.bad:
        sys.exit(EXIT_RUNTIME)


@cli.command()
@click.argument("run_id", metavar="RUN_ID", type=click.IntRange(1))
@click.option("--lease", default="30s", show_default=True, metavar="DURATION",
              help="Lease of the run, renewed every third of it.")
@click.option("--reason", metavar="TEXT", help="Recorded in the audit trail.")
@global_options()
@handle_errors
def rerun(run_id: int, lease: str, reason: str | None) -> None:
    """Run the slot of run RUN_ID (an id from `history`) again, here, as a
    new run under a new token, with the command of the local jobs file.
    Refused (exit 1) while a run of that slot is going on. Exit status as
    `run --wait`: 0 ok, the command's exit status if it failed, else 1."""
    from dblockrun.ops.actions import Access, exit_status
    from dblockrun.ops.again import rerun as run_again

    _reason(reason)
    lease_s = _lease_option(lease)
    jobs = _jobs_for_db(always=True)
    _setup_logging(logging.DEBUG if _globals().debug else logging.ERROR)
    with _open(Access.WRITE, jobs) as store:
        def audit(detail: str) -> Audit:
            run = store.run(run_id)
            return _audit("rerun", run.job if run else None, reason=reason, detail=detail)

        run = run_again(store, jobs, run_id, lease=lease_s, audit=audit, say=_say)
    status = exit_status(run)
    if status:
        sys.exit(status)


@cli.command(name="import-crontab")
@click.argument("file")
@click.option("--system", is_flag=True, default=None,
              help="Lines have a user field (/etc/crontab, /etc/cron.d); "
                   "the default for files under /etc/.")
@click.option("-o", "--output", "out", metavar="OUT",
              help="Write the jobs file here instead of to stdout.")
@global_options(jobs_file=False)
@handle_errors
def import_crontab(file: str, system: bool | None, out: str | None) -> None:
    """Translate the crontab FILE (- for stdin) into a jobs file.

    Each line that cannot be translated (@reboot, an unescaped %, a bad
    schedule...) is reported on stderr as `FILE:LINE: cannot translate: why`
    and written at the end of the jobs file as a comment saying why; the other
    jobs are still written. `flock -n FILE` wrappers are removed, with a
    comment (the job's lock replaces them; jobs that shared a lock file share
    a group of one seat). MAILTO= becomes a mail notification on failure and
    timeout, with a `FILE:LINE: warning: why`. Schedules keep this host's time
    zone (TZ, /etc/timezone, /etc/localtime) as timezone:, and keys every job
    shares go under defaults:. Exit status 0 if every line translated; 1 if
    some could not be (the jobs file is still written, without them); 2 if
    FILE cannot be read or OUT written.
    """
    from dblockrun.config.crontab import import_crontab as translate
    from dblockrun.config.crontab import write_jobs

    result = translate(file, system=system)
    if out is None:
        click.echo(result.text, nl=False)
    else:
        write_jobs(out, result.text)
    for message in result.messages:
        click.echo(message, err=True)
    if result.problems:
        where = "written" if out is None else f"written to {out}"
        click.echo(_shown(f"dblockrun: {result.jobs} job(s) {where}; {len(result.problems)} "
                          "line(s) not translated, left out as comments at the end of the "
                          "jobs file (exit status 1)"), err=True)
        sys.exit(EXIT_RUNTIME)


def main() -> None:
    cli(prog_name="dblockrun")


