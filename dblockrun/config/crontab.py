"""Translate a crontab into a dblockrun jobs file (``dblockrun import-crontab``).

The rules, as Vixie/Debian cron reads a crontab:

* Blank lines and comments are skipped. The comment lines directly above a job
  (no blank line between) become its ``description``, joined with spaces; a
  commented-out entry or the ``m h dom mon dow command`` header of the stock
  crontabs stops that block and is never used.
* ``NAME=value`` (``NAME = "value"``, quotes optional) applies to the jobs that
  follow, as ``env:``. ``SHELL=`` sets ``shell:``; ``CRON_TZ=`` and ``TZ=`` set
  ``timezone:`` (``TZ`` also stays in ``env:``: cron passes it to commands);
  ``MAILTO=a@b,c@d`` gives the jobs that follow ``notify:`` with
  ``mailto://localhost/a@b/c@d`` (the local mail server, as cron's
  sendmail; ``MAILFROM=`` its ``from=``) on failure and timeout, with a
  warning: cron mailed any output, dblockrun keeps output in ``history`` and
  mails only failures. An empty ``MAILTO=""`` turns it off again.
* Five schedule fields, checked with :func:`dblockrun.scheduling.cron.validate_cron`, or
  one of the macros ``@hourly @daily @midnight @weekly @monthly @yearly
  @annually`` (kept as written); ``@reboot`` is reported.
* System crontabs (``/etc/crontab``, ``/etc/cron.d/*``: ``system=True``, or a path
  under ``/etc/``) have a user field after the schedule. Elsewhere the file is
  read as one (with a warning) when more than half of its jobs have a user name
  of this host there, as a copied ``cron.d`` file or a Docker crontab does. A
  job of ``root`` (the daemon's user on a host that replaces cron) gets a
  comment; another user of this host ``user: NAME``; a user this host does not
  know a comment, ``enabled: false`` and a warning (run as the daemon's user,
  it could do harm).
* In the command an unescaped ``%`` ends the command and feeds the rest to its
  stdin, lines split at each further ``%``: reported. ``\\%`` becomes ``%``.
* ``flock -n FILE COMMAND`` (or ``flock -n FILE -c 'CODE'``) is unwrapped: the
  job's own lock replaces it (a run still going makes the next slot skip, as
  ``flock -n`` did), with a comment naming the file. Jobs that shared one lock
  file share a group of one seat (``groups:``), so they still never overlap.
  A ``flock`` that waits (no ``-n``), or whose command is followed by ``;``,
  ``&&``, ``|`` ... (only part of the line was under it), is kept as written.
* Job names: the program the command runs (:func:`dblockrun.config.cmdname.program_name`),
  other characters than ``[A-Za-z0-9._-]`` replaced by ``-``, made unique with
  ``-2``, ``-3`` ...

Each line that cannot be translated is a :class:`Problem`; the jobs from the
other lines are still written, and the lines left out are written at the end
of the jobs file as comments saying why (``import-crontab`` then exits 1).
What was translated with a caveat is a warning. The output always loads
with :func:`dblockrun.config.load.load_jobs_text`.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from dblockrun.config.cmdname import program_name
from dblockrun.errors import UsageError
from dblockrun.scheduling.cron import MACROS, validate_cron, validate_timezone

#: What a crontab path must start with to be read as a system crontab by default.
SYSTEM_PREFIX = "/etc/"
#: A job name's base (before ``-2`` ...) is cut to this length (YAML writes longer keys oddly).
MAX_BASE_NAME = 100
#: The user a daemon that replaces cron runs as: its jobs need no ``user:``.
DAEMON_USER = "root"

_BLANKS = re.compile(r"[ \t]+")
# Vixie cron's test: a name (no blanks, no '='), optional blanks, '='.
_ASSIGNMENT = re.compile(r"([^ \t=]+)[ \t]*=[ \t]*(.*)")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
# The words of a column header (`# m h dom mon dow command`, `# min hour day month weekday cmd`).
_HEADER_WORDS = frozenset(
    "m min mins minute minutes h hr hour hours d dom day days mday day-of-month month months "
    "mon dow wday weekday weekdays day-of-week user username user-name who cmd command "
    "commands to be executed".split()
)
_MAIL = ("MAILTO", "MAILFROM")
_TIMEZONE = ("CRON_TZ", "TZ")


@dataclass(frozen=True)
class Problem:
    """A crontab line that was left out of the jobs file, and why (line 0:
    the whole file)."""

    line: int
    why: str
    #: The crontab's line as written (a problem's: written back as a comment).
    text: str = ""


@dataclass(frozen=True)
class Translation:
    """A jobs file made from a crontab, the lines it could not translate (``problems``)
    and the caveats of those it did (``warnings``)."""

    path: str
    text: str
    jobs: int
    problems: tuple[Problem, ...]
    warnings: tuple[Problem, ...] = ()

    @property
    def messages(self) -> list[str]:
        """``FILE:LINE: cannot translate: why`` and ``FILE:LINE: warning: why``, by line."""
        tagged = [(p.line, "cannot translate", p.why) for p in self.problems]
        tagged += [(p.line, "warning", p.why) for p in self.warnings]
        return [f"{self.path}{f':{line}' if line else ''}: {tag}: {why}"
                for line, tag, why in sorted(tagged)]


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
    """Read the crontab at ``path`` and translate it (see :func:`translate_crontab`)
    with this host's time zone, as cron read it."""
    text = read_crontab(path)
    zone = host_timezone()
    translation = translate_crontab(text, path, system=system, host_zone=zone)
    if zone is None and translation.jobs and _local_offsets_differ_from_utc():
        translation = translate_crontab(text, path, system=system, host_zone=zone,
                                        unnamed_zone=True)
    return translation


def host_timezone() -> str | None:
    """The name of this host's time zone, in which cron reads a schedule
    without ``CRON_TZ``: ``TZ`` (``:Europe/Berlin`` or a zoneinfo path),
    else ``/etc/timezone``, else where ``/etc/localtime`` links into a
    zoneinfo folder; None when it is UTC (what dblockrun reads schedules in
    anyway) or none of them names a zone dblockrun knows."""
    candidates: list[str] = []
    tz = os.environ.get("TZ")
    if tz is not None:
        candidates.append(tz)
    else:
        try:
            with open("/etc/timezone", encoding="utf-8") as stream:
                candidates.append(stream.readline().strip())
        except (OSError, UnicodeDecodeError):
            pass
        candidates.append(os.path.realpath("/etc/localtime"))
    for candidate in candidates:
        zone = candidate.removeprefix(":")
        if "zoneinfo/" in zone:
            zone = zone.split("zoneinfo/", 1)[1]
        try:
            validate_timezone(zone)
        except ValueError:
            continue
        return None if zone.removeprefix("Etc/") in _UTC_NAMES else zone
    return None


#: The zone names of UTC itself (a zone such as Europe/London is not one).
_UTC_NAMES = frozenset("UTC UCT Universal Zulu GMT GMT0 GMT+0 GMT-0 Greenwich".split())


def _local_offsets_differ_from_utc() -> bool:
    """Whether this host's local time is not UTC (now, or half a year away)."""
    import time

    now = time.time()
    return any(time.localtime(t).tm_gmtoff != 0 for t in (now, now + 182 * 86400))


def shown_path(path: str) -> str:
    """How messages and the header name the crontab: ``-`` is stdin."""
    return "stdin" if path == "-" else path


def translate_crontab(text: str, path: str, *, system: bool | None = None,
                      host_zone: str | None = None, unnamed_zone: bool = False) -> Translation:
    """Translate the crontab ``text``; ``path`` names it in messages and the header.

    ``system``: whether lines have a user field; ``None``: if ``path`` is under /etc/.
    ``host_zone``: the zone cron read schedules in where no ``CRON_TZ``/``TZ``
    line says otherwise (written as their ``timezone:``); ``unnamed_zone``:
    the host's local time is not UTC and has no name (a warning says so).
    """
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    found = None
    if system is None:
        system = is_system_path(path)
        if not system:
            found = _user_column(lines)
            system = found is not None
    translator = _Translator(system, host_zone=host_zone, timezone=host_zone)
    if found is not None:
        translator.warnings.append(found)
    if unnamed_zone:
        translator.warnings.append(Problem(0, (
            "this host's local time is not UTC and TZ, /etc/timezone and /etc/localtime "
            "name no zone: cron read these schedules in local time, dblockrun reads them "
            "in UTC: add timezone: (under defaults:)")))
    for number, line in enumerate(lines, start=1):
        translator.line(number, line)
    return Translation(
        path=shown_path(path),
        text=_render(shown_path(path), translator.jobs, host_zone, translator.problems),
        jobs=len(translator.jobs),
        problems=tuple(translator.problems),
        warnings=tuple(translator.warnings),
    )


def _user_column(lines: list[str]) -> Problem | None:
    """A warning if most jobs have a user of this host after the schedule, else None."""
    jobs, users, first = 0, [], 0
    for number, line in enumerate(lines, start=1):
        text = line.lstrip(" \t")
        if not text or text.startswith("#") or _ASSIGNMENT.fullmatch(text):
            continue
        at = 1 if text.startswith("@") else 5  # where a user field would be
        words = _BLANKS.split(text.strip(" \t"), maxsplit=at + 1)
        jobs += 1
        if len(words) == at + 2 and _looks_like_user(words[at], _split(words[at + 1])[0]):
            users.append(words[at])
            first = first or number
    if not users or 2 * len(users) <= jobs:
        return None
    names = ", ".join(dict.fromkeys(users))
    return Problem(
        first,
        f"a user name follows the schedule on {len(users)} of {jobs} jobs ({names}): "
        "read as a system crontab, with a user field",
    )


def _looks_like_user(word: str, following: str) -> bool:
    """Whether ``word`` reads as a user field: a user of this host, not a program on the
    PATH (``mail``), and not followed by an option (``backup --now``)."""
    if following.startswith("-") or not _is_user(word):
        return False
    return word == DAEMON_USER or shutil.which(word) is None


def _is_user(name: str) -> bool:
    """Whether ``name`` is a user of this host."""
    try:
        pwd.getpwnam(name)
    except (KeyError, ValueError):  # ValueError: a NUL in the name
        return False
    return True


# --- reading lines -----------------------------------------------------------------


class _Skip(Exception):
    """This line cannot be translated."""


@dataclass
class _Job:
    name: str
    keys: dict[str, Any]
    user: str | None
    #: The lock file of the ``flock -n`` the command was unwrapped from.
    lock_file: str | None = None


@dataclass
class _Translator:
    system: bool
    #: The zone of the schedules before any CRON_TZ= or TZ= line (the host's).
    host_zone: str | None = None
    jobs: list[_Job] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    shell: str | None = None
    timezone: str | None = None
    mailto: str | None = None
    mailfrom: str | None = None
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
                self.assign(number, _unquote(assignment[1]), _unquote(assignment[2]))
            else:
                self.entry(number, text, " ".join(comments))
        except _Skip as exc:
            self.problems.append(Problem(number, str(exc), line))

    def comment(self, text: str) -> None:
        words = text.lstrip("#").strip()
        if not words or "\0" in words or _is_header(words) or _looks_like_entry(words):
            self.comments = []  # ends the block: what was above is not this job's
        else:
            self.comments.append(words)

    def assign(self, number: int, name: str, value: str) -> None:
        if not name:
            raise _Skip("a variable without a name")
        if name in _MAIL:
            if name == "MAILFROM":
                self.mailfrom = value or None
            elif not value:
                self.mailto = None  # no mail: dblockrun's behaviour too
            else:
                self.mailto = value
                self.warnings.append(Problem(number, (
                    f"MAILTO={value}: the jobs below mail it through localhost on failure and "
                    "timeout (notify: mailto://...); cron mailed any output, `dblockrun "
                    "history` keeps it"
                )))
            return
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
                self.timezone = self.host_zone  # cron: local time again
                return
            try:
                validate_timezone(zone)
            except ValueError as exc:
                kept = self.timezone or "UTC"
                raise _Skip(f"{name}={value}: {exc}; the jobs below keep {kept}") from None
            self.timezone = zone
            return
        self.env[name] = value

    def entry(self, number: int, text: str, description: str) -> None:
        user_part = ", a user" if self.system else ""
        if text.startswith("@"):
            schedule, rest = _split(text)
            if schedule == "@reboot":
                raise _Skip("@reboot: a fleet has no single boot (use a cron expression or rate)")
            if schedule.lower() in MACROS and schedule not in MACROS:
                raise _Skip(f"unknown macro {schedule!r} (macros are lower case, as in cron: "
                            f"{schedule.lower()})")
            if schedule not in MACROS:
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
        command, lock_file = _unwrap_flock(_unescape(rest))
        keys: dict[str, Any] = {}
        if description:
            keys["description"] = description
        keys["cron"] = schedule
        if self.timezone is not None:
            keys["timezone"] = self.timezone
        if self.shell is not None:
            keys["shell"] = self.shell
        name = self.unique_name(command)
        if user is not None and user != DAEMON_USER:
            if _is_user(user):
                keys["user"] = user
            else:
                keys["enabled"] = False
                self.warnings.append(Problem(number, (
                    f"user {_shown(user)} does not exist on this host: job {name!r} is written "
                    "with enabled: false (add user: where the user exists)"
                )))
        if self.env:
            keys["env"] = dict(self.env)
        if self.mailto is not None:
            keys["notify"] = {"urls": [_mail_url(self.mailto, self.mailfrom)],
                              "on": ["failure", "timeout"]}
        keys["command"] = command
        self.jobs.append(_Job(name, keys, user or None, lock_file))

    def unique_name(self, command: str) -> str:
        sanitized = _NAME_CHARS.sub("-", program_name(command))
        base = sanitized.strip(".-")[:MAX_BASE_NAME].strip(".-") or "job"
        name, n = base, 1
        while name in self.names:
            n += 1
            name = f"{base}-{n}"
        self.names.add(name)
        return name


#: ``flock [OPTIONS] FILE`` at the start of a command: the options ``-n``
#: may come with (exclusive, the default; close, of a descriptor dblockrun
#: never hands a command), and a lock file written without quotes.
_FLOCK = re.compile(
    r"(?:\S*/)?flock(?P<flags>(?:[ \t]+(?:-[nxeo]+|--nonblock|--nb|--exclusive|--close))+)"
    r"[ \t]+(?P<file>[A-Za-z0-9_./@+=:,~-]+)[ \t]+(?P<rest>\S.*)", re.S)
_FLOCK_SEPARATORS = {";", "&", "|", "&&", "||", "|&", ";;", "(", ")"}


def _unwrap_flock(command: str) -> tuple[str, str | None]:
    """``flock -n FILE COMMAND`` (or ``... -c CODE``) as ``COMMAND`` and
    ``FILE``; any other command as it is, and None: one that is no such
    wrapper, or that dblockrun's lock would not replace (a flock that waits,
    a line only part of which runs under it)."""
    found = _FLOCK.fullmatch(command.strip(" \t"))
    if found is None:
        return command, None
    flags = found["flags"].split()
    if not any(f in ("--nonblock", "--nb") or (not f.startswith("--") and "n" in f)
               for f in flags):
        return command, None  # it waits for the lock: a queue, not a skip
    rest = found["rest"]
    lexer = shlex.shlex(rest, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote
        return command, None
    if words[0] in ("-c", "--command"):
        if len(words) != 2 or not words[1].strip():
            return command, None
        return words[1], found["file"]
    if words[0].startswith("-") or _FLOCK_SEPARATORS & set(words):
        return command, None
    return rest.rstrip(" \t"), found["file"]


def _mail_url(mailto: str, mailfrom: str | None) -> str:
    """An apprise URL mailing ``MAILTO``'s recipients (a bare user name is
    ``user@localhost``, as cron's local delivery) through localhost:25."""
    from urllib.parse import quote, urlencode

    to = [r if "@" in r else f"{r}@localhost" for r in re.split(r"[,\s]+", mailto) if r]
    url = "mailto://localhost/" + "/".join(quote(r, safe="@+") for r in to)
    return url + ("?" + urlencode([("from", mailfrom)], safe="@") if mailfrom else "")


def _split(text: str) -> tuple[str, str]:
    """The first word of ``text`` and the rest (leading blanks removed)."""
    parts = _BLANKS.split(text, maxsplit=1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def _is_header(text: str) -> bool:
    """Whether the comment ``text`` is a column header (``m h dom mon dow command``)."""
    words = [word.strip("()[]:,|.").lower() for word in _BLANKS.split(text)]
    return len(words) >= 5 and all(word in _HEADER_WORDS for word in words if word)


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


#: Keys that go under ``defaults:`` when every job has the same value
#: (``env``: each variable every job has with the same value).
_SHARED_KEYS = ("timezone", "shell", "notify")


def _shared(jobs: list[_Job]) -> dict[str, Any]:
    """The keys every job has with the same value, taken out of the jobs
    (two jobs at least: one job keeps its keys)."""
    if len(jobs) < 2:
        return {}
    shared: dict[str, Any] = {}
    for key in _SHARED_KEYS:
        values = [job.keys.get(key) for job in jobs]
        if values[0] is not None and all(v == values[0] for v in values):
            shared[key] = values[0]
    envs = [job.keys.get("env", {}) for job in jobs]
    env = {k: v for k, v in envs[0].items() if all(e.get(k, None) == v for e in envs)}
    if env:
        shared["env"] = env
    for job in jobs:
        for key in shared:
            if key == "env":
                left = {k: v for k, v in job.keys["env"].items() if k not in env}
                if left:
                    job.keys["env"] = left
                else:
                    del job.keys["env"]
            else:
                del job.keys[key]
    return shared


def _render(path: str, jobs: list[_Job], host_zone: str | None = None,
            problems: list[Problem] | None = None) -> str:
    zone = ([f"# cron read schedules in this host's time zone ({_shown(host_zone)}): "
             "written as timezone:.", "# Commands get the daemon's environment plus env:."]
            if host_zone else
            ["# cron read schedules in the host's local time; dblockrun reads them in UTC",
             "# unless a job sets timezone:. Commands get the daemon's environment plus env:."])
    head = [f"# Translated from {_shown(path)} by `dblockrun import-crontab`.", *zone]
    left_out = _left_out(problems or [])
    if left_out:
        head.append(f"# {len(problems or [])} line(s) could not be translated: see the end of "
                    "this file.")
    if not jobs:
        return "\n".join([*head, "jobs: {}", *left_out, ""])
    groups = _lock_groups(jobs)
    shared = _shared(jobs)
    out = head
    if groups:
        out += ["# Jobs that shared a flock lock file: one at a time, as under flock -n.",
                "groups:", *(f"  {line}" for line in _dump(
                    {name: 1 for name in dict.fromkeys(groups.values())}).splitlines())]
    if shared:
        out += ["defaults:", *(f"  {line}" for line in _dump(shared).splitlines())]
    out.append("jobs:")
    for job in jobs:
        if job.lock_file in groups:
            job.keys = {**{k: v for k, v in job.keys.items() if k != "command"},
                        "group": groups[job.lock_file], "command": job.keys["command"]}
        dumped = _dump({job.name: job.keys}).splitlines()
        out.append(f"  {dumped[0]}")
        if job.user is not None and "user" not in job.keys:
            user = _shown(job.user)
            if job.user == DAEMON_USER:
                out.append(f"    # cron ran this as user {user}; dblockrun runs it as the "
                           "daemon's user")
            else:
                out.append(f"    # cron ran this as user {user}, unknown on this host")
        if job.lock_file is not None:
            out.append(f"    # was run by `flock -n {_shown(job.lock_file)}`: the job's lock "
                       "replaces it")
            out.append("    # (a run still going makes the next slot skip)")
            if job.lock_file in groups:
                out.append(f"    # group {groups[job.lock_file]}: one at a time with the "
                           "other jobs of that lock file")
        out.extend(f"  {line}" for line in dumped[1:])
    return "\n".join([*out, *left_out]) + "\n"


def _left_out(problems: list[Problem]) -> list[str]:
    """The lines not translated, as comments saying why (the end of the file)."""
    if not problems:
        return []
    out = ["", "# Not translated (`dblockrun import-crontab` exits with status 1 when a line "
           "is here):"]
    for p in problems:
        out.append(f"# line {p.line}: {_comment(p.why)}")
        if p.text.strip():
            out.append(f"#   {_comment(p.text)}")
    return out


def _comment(text: str) -> str:
    """``text`` safe in a one-line YAML comment."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _lock_groups(jobs: list[_Job]) -> dict[str, str]:
    """Lock file -> group name, for the lock files of ``flock -n`` that
    several jobs shared: a group of one seat keeps them apart."""
    sharing: dict[str, int] = {}
    for job in jobs:
        if job.lock_file is not None:
            sharing[job.lock_file] = sharing.get(job.lock_file, 0) + 1
    groups: dict[str, str] = {}
    for lock_file, count in sharing.items():
        if count < 2:
            continue
        stem = os.path.basename(lock_file).split(".", 1)[0] or "lock"
        base = _NAME_CHARS.sub("-", stem).strip(".-")[:MAX_BASE_NAME - 10] or "lock"
        name, n = base, 1
        while name in groups.values():
            n += 1
            name = f"{base}-{n}"
        groups[lock_file] = name
    return groups


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
