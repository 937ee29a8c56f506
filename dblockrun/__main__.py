"""``python -m dblockrun``, and :func:`main`, the ``dblockrun`` command.

``exec`` runs from crontabs, where its start is paid on every run, and
importing click and building the command line takes about a fifth of it. So
a plain ``exec`` command line is parsed here, without click, checked as
:func:`dblockrun.cli.exec_` checks it, and run by the same function
(:func:`dblockrun.running.execlock.exec_command`), with the same messages and exit
statuses. Anything else, and anything this parser is unsure of (another
command, ``--help``, ``-f``, ``-n=x`` or ``-vn x``, a repeated option, an
option value starting with ``-``, a value that click would reject, a global
option after ``exec``, a database URL to be read from a jobs file), goes to
click (:mod:`dblockrun.cli`) before anything is done, and click parses,
runs and reports it as always.
"""

from __future__ import annotations

import errno
import gc
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TypeAlias

#: The options before ``exec``, and exec's, as dblockrun.cli declares them:
#: option -> (key, takes a value). ``-f/--file`` is left to click (exec then
#: reads a jobs file with YAML: no fast start to keep). tests/test_main.py
#: holds these, the defaults and the name limit to dblockrun.cli's.
GROUP_OPTIONS = {"--db": ("db", True), "--db-file": ("db_file", True),
                 "--table-prefix": ("prefix", True), "--debug": ("debug", False)}
EXEC_OPTIONS = {"--name": ("name", True), "-n": ("name", True),
                "--lock-at-most": ("lock_at_most", True),
                "--lock-at-least": ("lock_at_least", True), "--lease": ("lease", True),
                "--busy-exit-code": ("busy_exit_code", True),
                "--verbose": ("verbose", False), "-v": ("verbose", False)}
EXEC_DEFAULTS = {"lock_at_most": "1h", "lock_at_least": "0s", "lease": "30s",
                 "busy_exit_code": "0"}
PREFIX_ENV, PREFIX_DEFAULT = "DBLOCKRUN_TABLE_PREFIX", "dblockrun_"
MAX_NAME = 200

Options: TypeAlias = dict[str, str | bool]


def _options(args: Sequence[str], known: Mapping[str, tuple[str, bool]]
             ) -> tuple[Options, int] | None:
    """The options at the start of ``args`` and the index of what follows them
    (``--`` or the first other argument); None when unsure."""
    found: Options = {}
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "--"):
        name, eq, attached = args[i].partition("=")
        if name not in known or (eq and not name.startswith("--")):
            return None
        key, takes_value = known[name]
        value: str | bool
        if not takes_value:
            if eq:
                return None
            value, i = True, i + 1
        elif eq:
            value, i = attached, i + 1
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, i = args[i + 1], i + 2
        else:
            return None  # click reads "-x" as the value, or reports a missing one
        if key in found:
            return None
        found[key] = value
    return found, i


def plain_exec(args: Sequence[str]) -> tuple[Options, Options, tuple[str, ...]] | None:
    """(options before exec, exec's options, the command) of a plain exec
    command line, else None."""
    if os.environ.get("_DBLOCKRUN_COMPLETE"):
        return None  # click's shell completion
    group = _options(args, GROUP_OPTIONS)
    if group is None or group[1] >= len(args) or args[group[1]] != "exec":
        return None
    rest = args[group[1] + 1:]
    parsed = _options(rest, EXEC_OPTIONS)
    if parsed is None or "name" not in parsed[0]:
        return None
    options, end = parsed
    command = tuple(rest[end + 1:] if end < len(rest) and rest[end] == "--" else rest[end:])
    if not command:
        return None
    return group[0], options, command


def _text(options: Options, key: str) -> str | None:
    value = options.get(key)
    return value if isinstance(value, str) else None


def fast_exec(group: Options, options: Options, command: tuple[str, ...]) -> int | None:
    """Check and run it as dblockrun.cli.exec_ does; its exit status, or None
    (nothing done) when click should take it."""
    from dblockrun.durations import lease_too_short
    from dblockrun.durations import parse_option_duration as parse_duration
    from dblockrun.jobs import JOB_NAME
    from dblockrun.running.execlock import ExecOptions, exec_command

    name = _text(options, "name") or ""
    if not JOB_NAME.fullmatch(name) or len(name) > MAX_NAME:
        return None

    def given(key: str) -> str:
        value = _text(options, key)
        return EXEC_DEFAULTS[key] if value is None else value

    try:
        most = parse_duration(given("lock_at_most"))
        least = parse_duration(given("lock_at_least"))
        lease = parse_duration(given("lease"))
        busy_exit_code = int(given("busy_exit_code"))  # as click.INT
    except ValueError:
        return None
    if most <= 0 or lease <= 0 or least > most or lease_too_short(lease, lease / 3) is not None:
        return None
    from dblockrun.store.dburl import (
        DEFAULT_JOBS_FILE,
        JOBS_ENV,
        MAX_PREFIX,
        TABLE_PREFIX,
        password_in_argv,
        resolve_url,
        url_needs_jobs_file,
    )

    prefix = _text(group, "prefix")
    if prefix is None:  # click's envvar: unset or empty means the default
        prefix = os.environ.get(PREFIX_ENV) or PREFIX_DEFAULT
    if not TABLE_PREFIX.fullmatch(prefix) or len(prefix) > MAX_PREFIX:
        return None
    db, db_file = _text(group, "db"), _text(group, "db_file")
    if url_needs_jobs_file(db, db_file) and (
            JOBS_ENV in os.environ or os.path.isfile(DEFAULT_JOBS_FILE)):
        return None  # the URL comes from a jobs file: click reads it (YAML)
    # Checked: from here on, as dblockrun.cli.exec_ past its checks.
    import logging

    from dblockrun.logs import setup

    verbose = bool(options.get("verbose"))
    setup(logging.DEBUG if group.get("debug") else logging.INFO if verbose else logging.ERROR)
    opts = ExecOptions(name=name, argv=command, lock_at_most=most, lock_at_least=least,
                       lease=lease, heartbeat=lease / 3, busy_exit_code=busy_exit_code,
                       verbose=verbose)
    warning = password_in_argv(db)
    if warning is not None:
        _echo_err(warning)
    url = resolve_url(db, None, cli_db_file=db_file)
    return exec_command(opts, url, prefix)


def _echo_err(message: str = "") -> None:
    import click  # on an error's path only: the very echo of the click path

    click.echo(message, err=True)


def _run_fast(group: Options, options: Options, command: tuple[str, ...]) -> int | None:
    """fast_exec with what dblockrun.cli.handle_errors and click's main do
    around a command: one line and status 2 (usage) or 1 for our errors,
    status 130 and no noise on ^C, status 1 and no noise on a closed pipe."""
    from dblockrun.errors import EXIT_INTERRUPTED, ConfigError, DblockrunError, UsageError

    try:
        try:
            return fast_exec(group, options, command)
        except DblockrunError as exc:
            if group.get("debug"):
                raise
            for line in exc.lines() if isinstance(exc, ConfigError) else [exc.message]:
                _echo_err(f"dblockrun: {line}")
            return 2 if isinstance(exc, ConfigError | UsageError) else 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # as dblockrun.cli.handle_errors
    except EOFError:
        _echo_err()
        _echo_err("Aborted!")
        return 1
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        # As click: nothing more to a closed pipe, no error when Python flushes it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):
                pass
        return 1


def main() -> None:
    """The ``dblockrun`` command."""
    parsed = plain_exec(sys.argv[1:])
    if parsed is not None:
        # Starting up allocates much and frees little: no collections until
        # exec_command has started (it freezes what there is, then enables
        # the collector for the run).
        gc.disable()
        try:
            code = _run_fast(*parsed)
        finally:
            gc.enable()
        if code is not None:
            sys.exit(code)
    from dblockrun.cli import main as click_main

    click_main()


if __name__ == "__main__":
    main()
