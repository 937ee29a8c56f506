"""Translate a crontab into a dblockrun jobs file (``dblockrun import-crontab``).

The rules, as Vixie/Debian cron reads a crontab:

* Blank lines and comments are skipped. The comment lines directly above a job
  (no blank line between) become its ``description``, joined with spaces; a
  commented-out entry or the ``m h dom mon dow command`` header of the stock
  crontabs stops that block and is never used.
* ``NAME=value`` (``NAME = "value"``, quotes optional) applies to the jobs that
  follow, as ``env:``. ``SHELL=`` sets ``shell:``; ``CRON_TZ=`` and ``TZ=`` set
  ``timezone:`` (``TZ`` also stays in ``env:``: cron passes it to commands);
  ``MAILTO=`` / ``MAILFROM=`` are reported (dblockrun keeps output in
  ``history`` and mails nothing), except an empty ``MAILTO=""``, which is what
  dblockrun does anyway.
* Five schedule fields, checked with :func:`dblockrun.schedule.validate_cron`, or
  one of the macros ``@hourly @daily @midnight @weekly @monthly @yearly
  @annually`` (kept as written); ``@reboot`` is reported.
* System crontabs (``/etc/crontab``, ``/etc/cron.d/*``: ``system=True``, or a path
  under ``/etc/``) have a user field after the schedule. dblockrun runs every
  job as the daemon's user, so the user becomes a comment in the job.
* In the command an unescaped ``%`` ends the command and feeds the rest to its
  stdin, lines split at each further ``%``: reported. ``\\%`` becomes ``%``.
* Job names: the basename of the command's first word, other characters than
  ``[A-Za-z0-9._-]`` replaced by ``-``, made unique with ``-2``, ``-3`` ...

Each line that cannot be translated is a :class:`Problem`; the jobs from the
other lines are still written. The output always loads with
:func:`dblockrun.config.load_jobs_text`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from dblockrun.errors import UsageError
from dblockrun.schedule import MACROS, validate_cron, validate_timezone

#: What a crontab path must start with to be read as a system crontab by default.
SYSTEM_PREFIX = "/etc/"
#: A job name's base (before ``-2`` ...) is cut to this length (YAML writes longer keys oddly).
MAX_BASE_NAME = 100

_BLANKS = re.compile(r"[ \t]+")
# Vixie cron's test: a name (no blanks, no '='), optional blanks, '='.
_ASSIGNMENT = re.compile(r"([^ \t=]+)[ \t]*=[ \t]*(.*)")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
# The column header of Debian's stock crontab(5) template and /etc/crontab.
_HEADER = re.compile(r"m\s+h\s+dom\s+mon\s+dow\s+(user\s+)?command", re.IGNORECASE)
_MAIL = ("MAILTO", "MAILFROM")
_TIMEZONE = ("CRON_TZ", "TZ")


@dataclass(frozen=True)
class Problem:
    """A crontab line that was left out of the jobs file, and why."""

    line: int
    why: str


@dataclass(frozen=True)
class Translation:
    """A jobs file made from a crontab, and the lines it could not translate."""

    path: str
    text: str
    jobs: int
    problems: tuple[Problem, ...]

    @property
    def messages(self) -> list[str]:
        """One ``FILE:LINE: cannot translate: why`` per problem."""
        return [f"{self.path}:{p.line}: cannot translate: {p.why}" for p in self.problems]


def is_system_path(path: str) -> bool:
    """Whether ``path`` is read as a system crontab (with a user field) by default."""
    return path != "-" and os.path.abspath(path).startswith(SYSTEM_PREFIX)


def read_crontab(path: str) -> str:
    """The text of the crontab at ``path`` (``-``: standard input)."""
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path}: cannot read: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def write_jobs(path: str, text: str) -> None:
    """Write the jobs file ``text`` to ``path``."""
    try:
        with open(path, "w", encoding="utf-8") as stream:
            stream.write(text)
    except OSError as exc:
        raise UsageError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def import_crontab(path: str, *, system: bool | None = None) -> Translation:
    """Read the crontab at ``path`` and translate it (see :func:`translate_crontab`)."""
    return translate_crontab(read_crontab(path), path, system=system)


def translate_crontab(text: str, path: str, *, system: bool | None = None) -> Translation:
    """Translate the crontab ``text``; ``path`` names it in messages and the header.

    ``system``: whether lines have a user field; ``None``: if ``path`` is under /etc/.
    """
    if system is None:
        system = is_system_path(path)
    translator = _Translator(system)
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, start=1):
        translator.line(number, line.removesuffix("\r"))
    return Translation(
        path=path,
        text=_render(path, translator.jobs),
        jobs=len(translator.jobs),
        problems=tuple(translator.problems),
    )


# --- reading lines -----------------------------------------------------------------


class _Skip(Exception):
    """This line cannot be translated."""


@dataclass
class _Job:
    name: str
    keys: dict[str, Any]
    user: str | None


@dataclass
class _Translator:
    system: bool
    jobs: list[_Job] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    shell: str | None = None
    timezone: str | None = None
    comments: list[str] = field(default_factory=list)  # the block right above
    names: set[str] = field(default_factory=set)

    def line(self, number: int, line: str) -> None:
        text = line.lstrip(" \t")
        if text.startswith("#"):
            self.comment(text)
            return
        comments, self.comments = self.comments, []
        if not text.strip():
            return
        try:
            if "\0" in text:
                raise _Skip("the line contains a NUL character")
            assignment = _ASSIGNMENT.fullmatch(text)
            if assignment:
                self.assign(_unquote(assignment[1]), _unquote(assignment[2]))
            else:
                self.entry(text, " ".join(comments))
        except _Skip as exc:
            self.problems.append(Problem(number, str(exc)))

    def comment(self, text: str) -> None:
        words = text.lstrip("#").strip()
        if not words or "\0" in words or _HEADER.fullmatch(words) or _looks_like_entry(words):
            self.comments = []  # ends the block: what was above is not this job's
        else:
            self.comments.append(words)

    def assign(self, name: str, value: str) -> None:
        if not name:
            raise _Skip("a variable without a name")
        if name in _MAIL:
            if name == "MAILTO" and not value:
                return  # no mail: dblockrun's behaviour too
            raise _Skip(
                f"{name}={value}: dblockrun does not mail output (`dblockrun history` keeps it); "
                "the jobs below are translated without it"
            )
        if name == "SHELL":
            if not value:
                raise _Skip("SHELL= is empty; the jobs below use the default /bin/sh")
            self.shell = value
            return
        if name == "TZ":
            self.env[name] = value
        if name in _TIMEZONE:
            zone = value.removeprefix(":")
            if not zone:
                self.timezone = None
                return
            try:
                validate_timezone(zone)
            except ValueError as exc:
                kept = self.timezone or "UTC"
                raise _Skip(f"{name}={value}: {exc}; the jobs below keep {kept}") from None
            self.timezone = zone
            return
        self.env[name] = value

    def entry(self, text: str, description: str) -> None:
        user_part = ", a user" if self.system else ""
        if text.startswith("@"):
            schedule, rest = _split(text)
            if schedule.lower() == "@reboot":
                raise _Skip("@reboot: a fleet has no single boot (use a cron expression or rate)")
            if schedule.lower() not in MACROS:
                known = " ".join(MACROS)
                raise _Skip(f"unknown macro {schedule!r} (known: {known}; @reboot is not)")
            expected = f"expected a macro{user_part} and a command"
        else:
            fields = _BLANKS.split(text, maxsplit=5)
            schedule = " ".join(fields[:5])
            rest = fields[5] if len(fields) > 5 else ""
            expected = f"expected 5 schedule fields{user_part} and a command"
            if len(fields) < 5:
                raise _Skip(f"not a job or a variable: {expected}")
            try:
                validate_cron(schedule)
            except ValueError as exc:
                why = str(exc)
                if repr(schedule) not in why:
                    why = f"schedule {schedule!r}: {why}"
                raise _Skip(why) from None
        user = None
        if self.system:
            user, rest = _split(rest)
        if not rest.strip():
            raise _Skip(f"no command: {expected}")
        command = _unescape(rest)
        keys: dict[str, Any] = {}
        if description:
            keys["description"] = description
        keys["cron"] = schedule
        if self.timezone is not None:
            keys["timezone"] = self.timezone
        if self.shell is not None:
            keys["shell"] = self.shell
        if self.env:
            keys["env"] = dict(self.env)
        keys["command"] = command
        self.jobs.append(_Job(self.unique_name(command), keys, user or None))

    def unique_name(self, command: str) -> str:
        first = _BLANKS.split(command.strip(" \t"), maxsplit=1)[0]
        sanitized = _NAME_CHARS.sub("-", first.rsplit("/", 1)[-1])
        base = sanitized.strip(".-")[:MAX_BASE_NAME].strip(".-") or "job"
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}-{n}"
        self.names.add(name)
        return name


def _split(text: str) -> tuple[str, str]:
    """The first word of ``text`` and the rest (leading blanks removed)."""
    parts = _BLANKS.split(text, maxsplit=1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def _looks_like_entry(text: str) -> bool:
    """Whether ``text`` starts like a crontab entry (a macro or 5 valid fields)."""
    words = _BLANKS.split(text.strip(" \t"), maxsplit=5)
    if words[0].lower() in MACROS or words[0].lower() == "@reboot":
        return True
    if len(words) < 5:
        return False
    try:
        validate_cron(" ".join(words[:5]))
    except ValueError:
        return False
    return True


def _unquote(value: str) -> str:
    """An assignment's value as cron reads it: quotes removed, else trailing blanks."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value.rstrip(" \t")


def _unescape(command: str) -> str:
    """The command with ``\\%`` made ``%``; an unescaped ``%`` cannot be translated.

    As cron does it: a backslash escapes only a following ``%``, and is kept
    before anything else (``\\\\%`` is a backslash, a backslash, then the end).
    """
    out: list[str] = []
    escaped = False
    for char in command:
        if escaped:
            escaped = False
            if char == "%":
                out[-1] = "%"
                continue
        elif char == "\\":
            escaped = True
        elif char == "%":
            raise _Skip(
                "unescaped % in the command: cron ends the command there and feeds the "
                "rest to its stdin (write \\% for a literal %)"
            )
        out.append(char)
    return "".join(out)


# --- writing the jobs file ---------------------------------------------------------


def _render(path: str, jobs: list[_Job]) -> str:
    head = [
        f"# Translated from {_shown(path)} by `dblockrun import-crontab`.",
        "# cron read schedules in the host's local time; dblockrun reads them in UTC",
        "# unless a job sets timezone:. Commands get the daemon's environment plus env:.",
    ]
    if not jobs:
        return "\n".join([*head, "jobs: {}", ""])
    out = [*head, "jobs:"]
    for job in jobs:
        dumped = _dump({job.name: job.keys}).splitlines()
        out.append(f"  {dumped[0]}")
        if job.user is not None:
            user = _shown(job.user)
            out.append(f"    # cron ran this as user {user}; dblockrun runs it as its own user")
        out.extend(f"  {line}" for line in dumped[1:])
    return "\n".join(out) + "\n"


def _shown(text: str) -> str:
    """``text`` for a YAML comment: as it is if printable, else quoted and escaped."""
    return text if text.isprintable() else repr(text)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, with strings holding a YAML line break double-quoted.

    Plain and single-quoted scalars would keep ``\\x85``, ``\\u2028`` or ``\\u2029``
    as they are, and a loader folds them into a space.
    """


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = '"' if any(char in _YAML_BREAKS for char in data) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_YAML_BREAKS = "\x85\u2028\u2029"
_Dumper.add_representer(str, _represent_str)


def _dump(data: dict[str, Any]) -> str:
    return yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=float("inf"),
    )
