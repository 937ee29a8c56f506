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
from typing import TYPE_CHECKING, ParamSpec, TypeVar

import click

from dblockrun import __version__
from dblockrun.errors import ConfigError, DblockrunError, UsageError

if TYPE_CHECKING:
    from dblockrun.jobs import JobsFile
    from dblockrun.store import Store

P = ParamSpec("P")
R = TypeVar("R")

EXIT_RUNTIME = 1
EXIT_USAGE = 2
#: Hosts seen this recently are live in `status` (3 default heartbeats).
LIVE_HOST_WINDOW = 30.0


@dataclass
class Globals:
    db: str | None
    db_file: str | None
    prefix: str
    debug: bool
    verbose: int


def _setup_logging(level: int, fmt: str = "text") -> None:
    from dblockrun.logs import setup

    setup(level, fmt)


def _duration(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    from dblockrun.durations import parse_duration

    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=name) from exc


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Map dblockrun's exceptions to one line on stderr and an exit status."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        ctx = click.get_current_context()
        debug = bool(ctx.find_object(Globals) and ctx.find_object(Globals).debug)  # type: ignore[union-attr]
        try:
            return fn(*args, **kwargs)
        except (ConfigError, UsageError) as exc:
            if debug:
                raise
            click.echo(f"dblockrun: {exc.message}", err=True)
            ctx.exit(EXIT_USAGE)
        except DblockrunError as exc:
            if debug:
                raise
            click.echo(f"dblockrun: {exc.message}", err=True)
            ctx.exit(EXIT_RUNTIME)
        raise AssertionError("unreachable")

    return wrapper


#: Column sizes of the lock table (store/schema.py): longer values are refused here.
MAX_NAME = 200
MAX_REASON = 1000


def _check_name(name: str, what: str = "job name") -> str:
    from dblockrun.jobs import JOB_NAME

    if not JOB_NAME.fullmatch(name) or len(name) > MAX_NAME:
        raise UsageError(f"bad {what} {name[:60]!r}: use letters, digits, '.', '_' and '-' "
                         f"(at most {MAX_NAME})")
    return name


def _globals() -> Globals:
    obj = click.get_current_context().find_object(Globals)
    assert obj is not None
    return obj


def _load(path: str) -> JobsFile:
    from dblockrun.config import load_jobs

    return load_jobs(path)


def _db_url(jobs: JobsFile | None = None) -> str:
    from dblockrun.dburl import resolve_url

    g = _globals()
    return resolve_url(g.db, jobs.database if jobs else None, cli_db_file=g.db_file,
                       file_db_file=jobs.database_file if jobs else None)


def _open_store(jobs: JobsFile | None = None, *, create: bool = True) -> Store:
    from dblockrun.store import Store

    return Store(_db_url(jobs), _globals().prefix, create=create)


def _store_for(file: str | None) -> Store:
    return _open_store(_load(file) if file else None)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dblockrun")
# DBLOCKRUN_DB and DBLOCKRUN_DB_FILE are read by dburl.resolve_url, which
# places them after both options.
@click.option("--db", metavar="URL",
              help="Database URL (postgresql://, mysql://, mariadb://, sqlite:///path). "
                   "Default: --db-file, DBLOCKRUN_DB, DBLOCKRUN_DB_FILE, `database:` then "
                   "`database-file:` in the jobs file, then "
                   "~/.local/state/dblockrun/dblockrun.db.")
@click.option("--db-file", metavar="PATH",
              help="Read the database URL from the first line of this file (a mounted "
                   "secret); also DBLOCKRUN_DB_FILE.")
@click.option("--table-prefix", "prefix", envvar="DBLOCKRUN_TABLE_PREFIX",
              default="dblockrun_", show_default=True, help="Prefix of dblockrun's tables.")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, db: str | None, db_file: str | None, prefix: str,
        debug: bool) -> None:
    """A cron replacement for fleets: every host runs the same jobs file, a
    shared SQL database decides which one runs each slot."""
    ctx.obj = Globals(db=db, db_file=db_file, prefix=prefix, debug=debug, verbose=0)


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--heartbeat", default="10s", show_default=True,
              help="How often running jobs' leases are renewed.")
@click.option("--lease", default="30s", show_default=True,
              help="How long a lock outlives its last renewal (failover time).")
@click.option("--grace", default="30s", show_default=True,
              help="On SIGTERM/SIGINT, how long running jobs may take to finish.")
@click.option("--metrics", "metrics_addr", metavar="[HOST:]PORT",
              help="Serve Prometheus /metrics and /healthz here.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: one object per line.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logs.")
@handle_errors
def daemon(file: str, heartbeat: str, lease: str, grace: str, metrics_addr: str | None,
           log_format: str, verbose: bool) -> None:
    """Run the scheduler on FILE (SIGHUP reloads it, SIGTERM stops)."""
    import signal
    import threading

    from dblockrun.daemon import Daemon, DaemonOptions

    g = _globals()
    _setup_logging(logging.DEBUG if g.debug or verbose else logging.INFO, log_format)
    options = DaemonOptions(
        heartbeat=_duration(heartbeat, "--heartbeat") or 10.0,
        lease=_duration(lease, "--lease") or 30.0,
        grace=_duration(grace, "--grace") or 0.0,
        metrics_addr=metrics_addr,
    )
    if metrics_addr:
        from dblockrun.metrics import parse_addr

        parse_addr(metrics_addr)
    if options.heartbeat * 2 > options.lease:
        raise UsageError("--lease must be at least twice --heartbeat")
    jobs = _load(file)
    store = _open_store(jobs)
    d = Daemon(jobs, store, options, stop=threading.Event())
    from dblockrun.signals import handling

    with handling({
        signal.SIGTERM: lambda _s: d.request_stop(),
        signal.SIGINT: lambda _s: d.request_stop(),
        signal.SIGHUP: lambda _s: d.request_reload(),
    }):
        d.run()
    store.close()


@cli.command()
@click.argument("jobs", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def status(jobs: tuple[str, ...], as_json: bool, file: str | None) -> None:
    """Show jobs (state, holder, lock, last and next run) and live hosts."""
    from dblockrun import output

    with _store_for(file) as store:
        rows = store.status(list(jobs) or None)
        hosts = store.hosts(seen_within=LIVE_HOST_WINDOW)
        now = store.db_now()
    missing = set(jobs) - {r.lock.name for r in rows}
    if missing:
        raise UsageError(f"no such job in the database: {', '.join(sorted(missing))}")
    if as_json:
        click.echo(output.status_json(rows, hosts, now))
    else:
        output.print_status(rows, hosts, now)


@cli.command()
@click.argument("job")
@click.option("--for", "for_", metavar="DURATION", help="How long, e.g. 3h.")
@click.option("--until", metavar="TIME", help="ISO 8601 time, e.g. 2026-12-01T06:00:00Z.")
@click.option("--reason", help="Shown in status.")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def disable(job: str, for_: str | None, until: str | None, reason: str | None,
            file: str | None) -> None:
    """Pause JOB on every host (no duration: until `enable`)."""
    from dblockrun.output import iso

    if for_ and until:
        raise UsageError("give --for or --until, not both")
    _check_name(job)
    if reason is not None and len(reason) > MAX_REASON:
        raise UsageError(f"--reason is {len(reason)} characters long (at most {MAX_REASON})")
    seconds = _duration(for_, "--for")
    until_ts = _parse_time(until) if until else None
    with _store_for(file) as store:
        end = store.disable(job, for_seconds=seconds, until=until_ts, reason=reason)
    click.echo(f"{job} disabled until {iso(end)}")


def _parse_time(text: str) -> float:
    from datetime import datetime

    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time", param_hint="--until") from exc
    if dt.tzinfo is None:
        dt = dt.astimezone()
    return dt.timestamp()


@cli.command()
@click.argument("job")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def enable(job: str, file: str | None) -> None:
    """Clear a `disable` of JOB."""
    _check_name(job)
    with _store_for(file) as store:
        if not store.enable(job):
            raise UsageError(f"no such job in the database: {job}")
    click.echo(f"{job} enabled")


@cli.command()
@click.argument("job")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def unlock(job: str, file: str | None) -> None:
    """Free JOB's lock now, whoever holds it (a lock row edited into nonsense,
    a lock_until far in the future). The fencing token is incremented, so a
    holder that is still running loses its lease and stops its command at its
    next heartbeat."""
    _check_name(job)
    with _store_for(file) as store:
        token = store.force_unlock(job)
    if token is None:
        raise UsageError(f"no such job in the database: {job}")
    click.echo(f"{job} unlocked (token now {token})")


# Options end at the command's first word: in `exec -n x grep -v foo`, `-v` is grep's.
@cli.command(name="exec", context_settings={"ignore_unknown_options": True,
                                           "allow_interspersed_args": False})
@click.option("--name", "-n", required=True, help="Lock name (shared with a daemon job).")
@click.option("--lock-at-most", default="1h", show_default=True,
              help="Stop the command after this long.")
@click.option("--lock-at-least", default="0s", show_default=True,
              help="Keep the lock at least this long after the start.")
@click.option("--lease", default="30s", show_default=True, help="Lease renewed while it runs.")
@click.option("--busy-exit-code", default=0, show_default=True, type=int,
              help="Exit status when the lock is busy elsewhere.")
@click.option("-v", "--verbose", is_flag=True, help="Say when the lock is busy.")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handle_errors
def exec_(name: str, lock_at_most: str, lock_at_least: str, lease: str, busy_exit_code: int,
          verbose: bool, file: str | None, command: tuple[str, ...]) -> None:
    """Run COMMAND under the lock NAME; its exit status passes through."""
    # dblockrun.__main__ takes a plain exec command line without click, checks
    # it as below and calls exec_command too (tests/test_main.py).
    from dblockrun.execlock import ExecOptions, exec_command

    g = _globals()
    _setup_logging(logging.DEBUG if g.debug else logging.INFO if verbose else logging.ERROR)
    _check_name(name, "lock name")
    most = _duration(lock_at_most, "--lock-at-most") or 3600.0
    least = _duration(lock_at_least, "--lock-at-least") or 0.0
    if least > most:
        raise UsageError("--lock-at-least is longer than --lock-at-most")
    lease_s = _duration(lease, "--lease") or 30.0
    opts = ExecOptions(name=name, argv=command, lock_at_most=most, lock_at_least=least,
                       lease=lease_s, heartbeat=lease_s / 3, busy_exit_code=busy_exit_code,
                       verbose=verbose)
    jobs = _load(file) if file else None
    sys.exit(exec_command(opts, _db_url(jobs), g.prefix))


@cli.command()
@click.argument("file", type=click.Path(dir_okay=False))
@handle_errors
def validate(file: str) -> None:
    """Check a jobs file; exit 2 with `file:line: job: key: why` if invalid."""
    jobs = _load(file)
    click.echo(f"{file}: ok, {len(jobs.jobs)} job(s)")


@cli.command(name="next")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--count", "-c", default=3, show_default=True, type=click.IntRange(1, 1000))
@handle_errors
def next_(file: str, count: int) -> None:
    """Show the next fire times of each job, in the job's timezone."""
    from datetime import UTC, datetime
    from zoneinfo import ZoneInfo

    from dblockrun.durations import format_duration
    from dblockrun.schedule import describe_next

    jobs = _load(file)
    now = datetime.now(UTC)
    for job in jobs.jobs:
        if job.cron is None:
            click.echo(f"{job.name}: every {format_duration(job.rate or 0)} (rate)")
            continue
        tz = ZoneInfo(job.timezone)
        times = [t.astimezone(tz).isoformat() for t in describe_next(job.cron, job.timezone,
                                                                     now, count)]
        click.echo(f"{job.name}: {', '.join(times)}")


@cli.command(name="init-db")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def init_db(file: str | None) -> None:
    """Create or migrate the schema (for setups where services may not run DDL)."""
    from dblockrun.dburl import redact

    with _store_for(file) as store:
        version = store.ensure_schema(create=True)
        click.echo(f"schema version {version} ready in {redact(store.url)}")


@cli.command()
@click.argument("job", required=False)
@click.option("--limit", "-n", default=20, show_default=True, type=click.IntRange(1, 100000))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--output", "output_of", type=int, metavar="RUN",
              help="Print the stored output tail of run RUN.")
@click.option("--item", help="Only the runs of this item (fan-out jobs).")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def history(job: str | None, limit: int, as_json: bool, output_of: int | None,
            item: str | None, file: str | None) -> None:
    """Past runs, newest first."""
    from dblockrun import output

    with _store_for(file) as store:
        if output_of is not None:
            run = store.run(output_of)
            if run is None:
                raise UsageError(f"no run {output_of}")
            click.echo(run.output or "", nl=False)
            return
        runs = store.history(job, limit, item=item)
        now = store.db_now()
    if as_json:
        click.echo(output.history_json(runs))
    else:
        output.print_history(runs, now)


@cli.command(name="run")
@click.argument("job")
@click.option("--timeout", default="10s", show_default=True,
              help="How long to wait for a daemon to start it.")
@click.option("--no-wait", is_flag=True, help="Only file the request.")
@click.option("-f", "--file", type=click.Path(dir_okay=False),
              help="Jobs file to take `database:` from.")
@handle_errors
def run_(job: str, timeout: str, no_wait: bool, file: str | None) -> None:
    """Ask the fleet to run JOB now: some daemon that has it claims it, under
    the same lock, within about a second."""
    from dblockrun.ops import request_run

    _check_name(job)
    wait = None if no_wait else (_duration(timeout, "--timeout") or 10.0)
    with _store_for(file) as store:
        run = request_run(store, job, wait)
    if run is None:
        click.echo(f"{job}: run requested")
    else:
        click.echo(f"{job}: run {run.id} started on {run.host} (token {run.token})")


@cli.command(name="import-crontab")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--system", is_flag=True, default=None,
              help="Lines have a user field (/etc/crontab, /etc/cron.d); "
                   "the default for files under /etc/.")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False),
              help="Write the jobs file here instead of to stdout.")
@handle_errors
def import_crontab(file: str, system: bool | None, out: str | None) -> None:
    """Translate the crontab FILE (- for stdin) into a jobs file.

    Each line that cannot be translated (@reboot, MAILTO=, an unescaped %, a bad
    schedule...) is reported on stderr as `FILE:LINE: cannot translate: why`; the
    other jobs are still written. Exit status 0 if every line translated, 1 if
    some were skipped, 2 if FILE cannot be read or OUT written.
    """
    from dblockrun.crontab import import_crontab as translate
    from dblockrun.crontab import write_jobs

    result = translate(file, system=system)
    if out is None:
        click.echo(result.text, nl=False)
    else:
        write_jobs(out, result.text)
    for message in result.messages:
        click.echo(message, err=True)
    if result.problems:
        sys.exit(EXIT_RUNTIME)


def main() -> None:
    cli(prog_name="dblockrun")


