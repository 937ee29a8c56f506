"""Load a jobs file (YAML) into frozen :class:`~dblockrun.jobs.Job` objects.

Every problem is a :class:`~dblockrun.errors.ConfigError` rendered as
``file:line: job 'x': key: why``; no other exception leaves
:func:`load_jobs_text`, whatever the text. The parser collects the problems
of the whole file rather than stop at the first: several are raised as one
:class:`~dblockrun.errors.ConfigErrors`, in the file's order. Only a file
whose shape hides the rest (not YAML, not a mapping, no ``jobs:``) stops at
once; a job with a bad key is not checked further (its other checks would
repeat the same mistake).

``defaults`` are merged under each job key by key, except ``env``, which is
merged variable by variable, and ``limits``, limit by limit (``memory: null``
lifts the default's memory limit; ``limits: null`` all of them). A ``null``
value unsets an optional key (``cron``, ``rate``, ``workdir``,
``starting-deadline``, ``items``, ``items-command``, ``on-failure``,
``run-on``, ``notify``, ``ping``, ``catch-up-limit``) that ``defaults`` set.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable, Iterator
from datetime import date, datetime
from typing import Any

import yaml

from dblockrun.config.secreturl import check_url
from dblockrun.durations import format_duration, parse_duration
from dblockrun.errors import ConfigError, ConfigErrors
from dblockrun.jobs import (
    AFTER_ON,
    CATCH_UP,
    DEFAULT_QUEUE,
    ENV,
    FILE,
    JOB_NAME,
    LIMIT_KEYS,
    LITERAL,
    MAX_ARG,
    MAX_COMMAND_BYTES,
    NOTIFY_EVENTS,
    NOTIFY_ON,
    OVERLAP,
    WHEN_FULL,
    Active,
    After,
    Calendar,
    Command,
    Expect,
    Job,
    JobsFile,
    Limits,
    Notify,
    OnFailure,
    RunOn,
    SecretUrl,
    Storm,
    Window,
    differing_fields,
    item_too_long,
)
from dblockrun.scheduling import calendars
from dblockrun.scheduling.cron import validate_cron, validate_timezone
from dblockrun.secretfile import whole_text
from dblockrun.withheld import DATABASE_VARS

TOP_LEVEL_KEYS = ("database", "database-file", "defaults", "jobs", "groups", "calendars",
                  "notify-storm")
MAX_JOB_NAME = 200
MAX_INT = 2**31 - 1
#: A group's seats are lock rows named ``group:NAME:N`` (dblockrun/scheduling/limits.py).
MAX_GROUP_NAME = 100
MAX_GROUP_LIMIT = 1000
#: A group's long form: ``{seats: N, when-full: skip|queue, queue: N}``.
GROUP_KEYS = ("seats", "when-full", "queue")
#: ``overlap: allow N``: each of a job's N lanes is a lock row, like a group's seats.
MAX_ALLOW = 1000
ON_FAILURE_KEYS = ("disable-for", "command")
NOTIFY_KEYS = ("urls", "on", "after")
#: ``expect:``'s keys (dblockrun/notify/alerts.py).
EXPECT_KEYS = ("max", "min", "finish-by", "start-within")
#: ``notify-storm:``'s keys (dblockrun/notify/storm.py).
STORM_KEYS = ("threshold", "window", "max-names", "wait")
#: ``finish-by:``: a time of day, ``HH:MM`` or ``HH:MM:SS``.
TIME_OF_DAY = re.compile(r"([01]?[0-9]|2[0-3]):([0-5][0-9])(?::([0-5][0-9]))?")
#: ``after:``'s long form: ``{jobs: [a, b], on: success|failure|any}``.
AFTER_KEYS = ("jobs", "on")
#: A calendar's keys (``calendars: {NAME: {dates: [...], file: PATH}}``).
CALENDAR_KEYS = ("dates", "file")
#: ``active:``'s keys.
ACTIVE_KEYS = ("from", "until")
#: The job keys of calendars (only a cron job without items has them).
CALENDAR_JOB_KEYS = ("exclude", "blackout", "active")
SECRET_SOURCES = (ENV, FILE)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Invalid(ValueError):
    """A value is wrong; the caller knows the file, line, job and key."""

    def __init__(self, why: str, *, line: int | None = None, key: str | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.line = line  # a nested key's line, if not the key's own
        self.key = key  # a nested key, appended to the key


# --- YAML with line numbers and duplicate keys --------------------------------------


class _Mapping(dict[Any, Any]):
    """A YAML mapping that remembers each key's line and the keys it repeats."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.lines: dict[Any, int] = {}
        self.duplicates: list[tuple[Any, int]] = []


class _Constructor(yaml.constructor.SafeConstructor):
    """A safe constructor whose mappings are :class:`_Mapping` objects."""

    _own_keys: dict[int, set[int]]

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:
            # e.g. `2026-02-30` is a timestamp to YAML, and a bare ValueError from PyYAML.
            what = repr(node.value) if isinstance(node, yaml.ScalarNode) else "value"
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {what}: {exc}", node.start_mark
            ) from exc

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Remember the keys written in the mapping itself before `<<` merges add others.
        if id(node) not in self._own_keys:
            self._own_keys[id(node)] = {id(key) for key, _ in node.value if key.tag != _MERGE_TAG}
        super().flatten_mapping(node)

    def fill_mapping(self, data: _Mapping, node: yaml.MappingNode) -> None:
        self.flatten_mapping(node)
        own = self._own_keys[id(node)]
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = self.construct_object(key_node)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found unhashable key",
                    key_node.start_mark,
                ) from None
            line = key_node.start_mark.line + 1
            if key is True and key_node.value.lower() == "on":
                key = key_node.value  # a key `on:` (every-host jobs): the word, not YAML's true
            if id(key_node) in own:
                if key in seen:
                    data.duplicates.append((key, line))
                seen.add(key)
            data[key] = self.construct_object(value_node)
            data.lines[key] = line


class _Loader(_Constructor, yaml.SafeLoader):
    """PyYAML's own safe loader, with :class:`_Constructor`: the reference,
    whose errors are the ones shown."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._own_keys = {}


def _construct_mapping(loader: _Loader | _LibyamlLoader,
                       node: yaml.MappingNode) -> Iterator[_Mapping]:
    data = _Mapping(node.start_mark.line + 1)
    yield data
    loader.fill_mapping(data, node)


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)

if yaml.__with_libyaml__:  # PyYAML built with libyaml, as its wheels are

    class _LibyamlLoader(_Constructor, yaml.CSafeLoader):
        """libyaml's parser (a sixth of PyYAML's CPU: 30 ms against 160 for
        1,000 jobs), with the same constructor and resolver."""

        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self._own_keys = {}

    _LibyamlLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)


# --- entry points ------------------------------------------------------------------


def load_jobs(path: str) -> JobsFile:
    """Read and validate the jobs file at ``path``."""
    try:
        # A regular file only, bounded (a FIFO would hold `validate` and a
        # reload until a writer came): the reader of secret files.
        text = whole_text(path)
    except ValueError as exc:
        raise ConfigError(str(exc), file=path) from None
    return load_jobs_text(text, path)


def load_jobs_text(text: str, path: str) -> JobsFile:
    """Validate the jobs file ``text``; ``path`` is only used in messages."""
    try:
        return _Parser(path).parse(_load_yaml(text))
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        why = _yaml_hint(exc, text) or ", ".join(
            part for part in (exc.context, exc.problem) if part) or "cannot parse"
        line = mark.line + 1 if mark is not None else None
        raise ConfigError(f"invalid YAML: {why}", file=path, line=line) from exc
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        code = ord(exc.character) if isinstance(exc.character, str) else exc.character
        why = f"invalid YAML: {exc.reason} (character #x{code:04x})"
        raise ConfigError(why, file=path, line=line) from exc
    except RecursionError as exc:
        raise ConfigError("invalid YAML: nested too deeply", file=path) from exc
    except Exception as exc:
        # The contract: any text gives a JobsFile or a ConfigError (e.g. `2026-02-30`
        # makes PyYAML raise a bare ValueError).
        raise ConfigError(f"invalid YAML: {exc}", file=path) from exc


#: A plain (unquoted) ``key: value`` line, to show the value quoted.
_PLAIN_VALUE = re.compile(r"^\s*(?:-\s+)?([\w.-]+):\s+(.*?)\s*$")


def _yaml_hint(exc: yaml.MarkedYAMLError, text: str) -> str | None:
    """What to do about the YAML mistakes users make most, in their words
    rather than the scanner's; None for the others."""
    mark = exc.problem_mark
    problem = exc.problem or ""
    lines = text.splitlines()
    line = lines[mark.line] if mark is not None and mark.line < len(lines) else ""
    if "found character '\\t'" in problem:
        where = f"column {mark.column + 1}" if mark is not None else "this line"
        if mark is not None and not line[: mark.column].strip(" -"):
            return f"a tab in the indentation ({where}): indent with spaces, not tabs"
        return f"a tab ({where}): YAML wants spaces there, not tabs"
    start = ""
    if exc.context == "while scanning an alias" or problem.startswith("found undefined alias"):
        start = "*"  # *x is a YAML alias
    elif "found character '@'" in problem or "found character '`'" in problem:
        start = problem.split("'")[1]  # reserved indicators
    if not start:
        return None
    if start == "*":
        why = "a value starting with * must be quoted (* starts a YAML alias)"
    else:
        why = f"a value starting with {start} must be quoted"
    plain = _PLAIN_VALUE.match(line)
    if plain is not None and plain.group(2).startswith(start):
        key, value = plain.groups()
        return f'{why}: write {key}: "{value.replace(chr(34), chr(92) + chr(34))}"'
    return f'{why}; quote cron expressions: cron: "*/5 * * * *"'


def _load_yaml(text: str) -> Any:
    """The document in ``text``. libyaml reads it when PyYAML has it; a text
    libyaml cannot read, or with a character PyYAML refuses (libyaml takes a
    tab after ``key:``, PyYAML does not), is read by PyYAML's own loader, so
    every error and its hint is PyYAML's."""
    if (yaml.__with_libyaml__ and "\t" not in text
            and not yaml.reader.Reader.NON_PRINTABLE.search(text)):
        fast = _LibyamlLoader(text)
        try:
            return fast.get_single_data()
        except Exception:  # noqa: BLE001, S110 (read again below, for PyYAML's message)
            pass
        finally:
            fast.dispose()
    loader = _Loader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


# --- describing values -------------------------------------------------------------


def _kind(value: Any) -> str:
    """``value`` for a message: scalars shown (shortened), containers named."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, str | int | float):
        shown = repr(value)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return f"{'a string' if isinstance(value, str) else 'a number'} ({shown})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _suggest(key: Any, known: tuple[str, ...]) -> str:
    import difflib  # here: a mistake's hint only (a daemon keeps what it imports)

    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean '{close[0]}'?)"
    return f"unknown key (known: {', '.join(known)})"


# --- value parsers: each returns the Job field's value or raises _Invalid -----------


def _string(value: Any, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"must be a string, got {_kind(value)}")
    if not empty and not value.strip():
        raise _Invalid("must not be empty")
    if "\0" in value:
        raise _Invalid("must not contain a NUL character")
    return value


def _word(value: Any, what: str) -> str:
    """A string or number as the string a process sees (items, arguments, env values)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _Invalid(f"{what} must be a string or number, got {_kind(value)} (quote it)")
    text = str(value)
    if "\0" in text:
        raise _Invalid(f"{what} must not contain a NUL character")
    return text


def _duration(value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _Invalid(f"must be a duration like 90s, 5m or 1h30m, got {_kind(value)}")
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None
    if positive and seconds <= 0:
        raise _Invalid(f"must be more than zero, got {str(value).strip()}")
    return seconds


def _integer(value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"must be a whole number, got {_kind(value)}")
    if value < minimum:
        raise _Invalid(f"must be at least {minimum}, got {value}")
    if value > MAX_INT:
        raise _Invalid(f"must be at most {MAX_INT}, got {value}")
    return value


def _command(value: Any) -> Command:
    if isinstance(value, str):
        return _string(value, empty=False)
    if isinstance(value, list):
        if not value:
            raise _Invalid("must not be an empty list")
        words = tuple(_word(word, "each argument") for word in value)
        if not words[0].strip():
            raise _Invalid("the program (first item) must not be empty")
        return words
    raise _Invalid(f"must be a string or a list of arguments, got {_kind(value)}")


def _cron(value: Any, hash_id: str = "") -> str | tuple[str, ...]:
    """One expression, or a list of them (the union of their slots); ``H``
    is checked with ``hash_id`` (a job's name: parse_job checks again with it)."""
    if not isinstance(value, list):
        return _one_cron(value, hash_id)
    if not value:
        raise _Invalid("must not be an empty list")
    crons: list[str] = []
    for i, entry in enumerate(value):
        try:
            cron = _one_cron(entry, hash_id)
        except _Invalid as exc:
            raise _Invalid(f"[{i}]: {exc.why}") from None
        if cron in crons:
            raise _Invalid(f"[{i}]: {cron!r} is listed twice")
        crons.append(cron)
    return crons[0] if len(crons) == 1 else tuple(crons)


def _one_cron(value: Any, hash_id: str) -> str:
    text = _string(value)
    try:
        validate_cron(text, hash_id)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None
    return text.strip()


def _timezone(value: Any) -> str:
    name = _string(value)
    try:
        validate_timezone(name)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None
    return name


def _user(value: Any) -> str:
    name = _string(value, empty=False)
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise _Invalid(f"unknown user {name!r}") from None
    return name


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"must be true or false, got {_kind(value)}")
    return value


def _mapping(value: Any) -> _Mapping:
    if not isinstance(value, _Mapping):
        raise _Invalid(f"must be a mapping, got {_kind(value)}")
    return value


def _env(value: Any) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    mapping = _mapping(value)
    for name, raw in mapping.items():
        line = mapping.lines[name]
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise _Invalid(
                f"variable names must be non-empty strings without '=', got {_kind(name)}",
                line=line,
            )
        try:
            pairs.append((name, _word(raw, "the value")))
        except _Invalid as exc:
            raise _Invalid(exc.why, line=line, key=name) from None
    return tuple(sorted(pairs))


#: ``env-inherit:`` names: a variable, or a prefix ending in ``*`` (``LC_*``).
_INHERIT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?|\*")


def _env_inherit(value: Any) -> str | tuple[str, ...]:
    """``all``, ``none`` or a list of variable names (``LC_*``: a prefix)."""
    if value in ("all", "none"):
        return str(value)
    if not isinstance(value, list):
        raise _Invalid(f"must be all, none or a list of variable names, got {_kind(value)}")
    names: list[str] = []
    for name in value:
        if not isinstance(name, str) or not _INHERIT_NAME.fullmatch(name):
            raise _Invalid("each name must be a variable name (letters, digits, '_'), or a "
                           f"prefix ending in '*' (LC_*), got {_kind(name)}")
        if name == "*":
            raise _Invalid("'*' is every variable: write env-inherit: all")
        if name.startswith(DATABASE_VARS):
            raise _Invalid(f"{name} would pass on the daemon's database URL "
                           f"({DATABASE_VARS}*), which no command inherits")
        names.append(name)
    return tuple(names)


def _items(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _Invalid(f"must be a list, got {_kind(value)}")
    items = tuple(_word(item, "each item") for item in value)
    for item in items:
        if (why := item_too_long(item)) is not None:
            raise _Invalid(why)
        if items.count(item) > 1:
            raise _Invalid(f"item {item!r} is listed twice")
    return items


def _on_failure(value: Any) -> OnFailure:
    if value is None:
        return OnFailure()
    mapping = _mapping(value)
    parsed: dict[str, Any] = {}
    for key, raw in mapping.items():
        line = mapping.lines[key]
        if key not in ON_FAILURE_KEYS:
            raise _Invalid(_suggest(key, ON_FAILURE_KEYS), line=line, key=str(key))
        try:
            if key == "disable-for":
                parsed["disable_for"] = _duration(raw, positive=True)
            else:
                parsed["command"] = _command(raw)
        except _Invalid as exc:
            raise _Invalid(exc.why, line=line, key=key) from None
    return OnFailure(**parsed)


def _label_word(value: Any, what: str) -> str:
    # Here: a file without run-on: (validate, next) needs no targeting (json, socket).
    from dblockrun.scheduling.targeting import check_word

    text = _word(value, what)
    try:
        return check_word(text, what)
    except ValueError as exc:
        raise _Invalid(str(exc)) from None


def _run_on(value: Any) -> RunOn:
    mapping = _mapping(value)
    if not mapping:
        raise _Invalid("must name at least one label, e.g. run-on: {role: db}")
    pairs: list[tuple[str, tuple[str, ...]]] = []
    for key, raw in mapping.items():
        line = mapping.lines[key]
        try:
            name = _label_word(key, "the label name")
            values = raw if isinstance(raw, list) else [raw]
            if not values:
                raise _Invalid("must list at least one value")
            words = tuple(sorted({_label_word(v, "each value") for v in values}))
        except _Invalid as exc:
            raise _Invalid(exc.why, line=line, key=str(key)) from None
        pairs.append((name, words))
    return tuple(sorted(pairs))


def _after(value: Any) -> After:
    """``after: extract`` or ``after: {jobs: [load, rebuild], on: failure}``;
    the names are checked against the file's jobs once all are read
    (:meth:`_Parser.check_chains`)."""
    if isinstance(value, str):
        return After((_word(value, "the upstream job"),))
    if not isinstance(value, _Mapping):
        raise _Invalid(f"must be a job's name or a mapping with jobs: and on:, got "
                       f"{_kind(value)}")
    parsed: dict[str, Any] = {}
    for key, raw in value.items():
        line = value.lines[key]
        if key not in AFTER_KEYS:
            raise _Invalid(_suggest(key, AFTER_KEYS), line=line, key=str(key))
        try:
            if key == "on":
                if raw not in AFTER_ON:
                    raise _Invalid(f"must be success, failure or any, got {_kind(raw)}")
                parsed["on"] = raw
                continue
            parsed["jobs"] = _distinct_words(raw, "each upstream job",
                                             "must name at least one job")
        except _Invalid as exc:
            raise _Invalid(exc.why, line=line, key=str(key)) from None
    if "jobs" not in parsed:
        raise _Invalid("needs jobs: (the upstream jobs whose runs start this one)")
    return After(**parsed)


def _day(value: Any) -> date:
    """A day: ``2026-12-25`` (YAML reads it as a date; quoted, a string)."""
    if isinstance(value, datetime):
        raise _Invalid(f"must be a day like 2026-12-25, not a time ({value})")
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise _Invalid(f"must be a day like 2026-12-25, got {_kind(value)}")


def _names(value: Any) -> tuple[str, ...]:
    """``exclude:``: the names of calendars (``calendars:`` at the top),
    checked against them by :meth:`_Parser.check_job`."""
    return _distinct_words(value, "each calendar",
                           "must name at least one calendar (calendars: at the top)")


def _distinct_words(value: Any, each: str, none: str) -> tuple[str, ...]:
    """A name or a list of names (``after: {jobs:}``, ``exclude:``): each a
    word, at least one (else ``none``), none twice."""
    names = value if isinstance(value, list) else [value]
    if not names:
        raise _Invalid(none)
    out = tuple(_word(name, each) for name in names)
    twice = sorted({name for name in out if out.count(name) > 1})
    if twice:
        raise _Invalid(f"names {twice[0]!r} twice")
    return out


def _blackout(value: Any) -> tuple[Window, ...]:
    windows = value if isinstance(value, list) else [value]
    if not windows:
        raise _Invalid("must list at least one window (sat 22:00/6h)")
    out: list[Window] = []
    for i, text in enumerate(windows):
        if not isinstance(text, str):
            raise _Invalid(f"[{i}]: a window is a string like \"sat 22:00/6h\", got "
                           f"{_kind(text)}")
        try:
            out.append(calendars.parse_window(text))
        except ValueError as exc:
            raise _Invalid(f"[{i}]: {exc}") from None
    return tuple(out)


def _active(value: Any) -> Active:
    """``active: {from: DAY, until: DAY}`` (either may be left out); an
    empty range (from after until) is refused."""
    mapping = _mapping(value)
    parsed: dict[str, date] = {}
    for key, raw in mapping.items():
        line = mapping.lines[key]
        if key not in ACTIVE_KEYS:
            raise _Invalid(_suggest(key, ACTIVE_KEYS), line=line, key=str(key))
        try:
            parsed[key] = _day(raw)
        except _Invalid as exc:
            raise _Invalid(exc.why, line=line, key=key) from None
    if not parsed:
        raise _Invalid("needs from:, until: or both (active: {from: 2026-12-01, "
                       "until: 2027-06-30})")
    first, last = parsed.get("from"), parsed.get("until")
    if first is not None and last is not None and first > last:
        raise _Invalid(f"an empty range: from {first} is after until {last} (no day has a "
                       "slot)", line=mapping.lines["until"], key="until")
    return Active(first, last)


#: ``on:``: which hosts run each slot.
ON_VALUES = ("one-host", "every-host")


def _on(value: Any) -> bool:
    """True for ``every-host``."""
    if value not in ON_VALUES:
        raise _Invalid(f"must be every-host (each matching host runs each slot) or one-host "
                       f"(the default), got {_kind(value)}")
    return bool(value == "every-host")
def _secret_url(value: Any, key: str, line: int = 0) -> SecretUrl:
    """A URL that may hold a secret: a literal, ``{env: VAR}`` or ``{file:
    PATH}``; the variable and file are read by
    :func:`~dblockrun.config.secreturl.resolve_secrets`. Messages never show it."""
    if isinstance(value, str):
        why = check_url(value)
        if why is not None:
            raise _Invalid(f"{why}; or write {{env: VARIABLE}} or {{file: PATH}}")
        return SecretUrl(LITERAL, value=value.strip(), line=line, key=key)
    if isinstance(value, _Mapping):
        if len(value) != 1 or next(iter(value)) not in SECRET_SOURCES:
            raise _Invalid("must be a URL, {env: VARIABLE} or {file: PATH}", line=value.line)
        source, ref = next(iter(value.items()))
        try:
            name = _string(ref, empty=False)
        except _Invalid as exc:
            raise _Invalid(f"{source}: {exc.why}", line=value.line) from None
        if source == ENV and ("=" in name or name.strip() != name):
            raise _Invalid("env: must be a variable name", line=value.line)
        return SecretUrl(source, ref=name, line=value.line, key=key)
    kind = "a string" if isinstance(value, str) else _kind(value)
    raise _Invalid(f"must be a URL, {{env: VARIABLE}} or {{file: PATH}}, got {kind}")


def _notify(value: Any) -> Notify | None:
    if value is None:
        return None
    mapping = _mapping(value)
    urls: tuple[SecretUrl, ...] = ()
    on: tuple[str, ...] = NOTIFY_EVENTS
    after = 1
    for written, raw in mapping.items():
        line = mapping.lines[written]
        # YAML 1.1 (PyYAML) reads a bare `on` key as the boolean true.
        key = "on" if written is True else written
        if key not in NOTIFY_KEYS:
            raise _Invalid(_suggest(key, NOTIFY_KEYS), line=line, key=str(key))
        if key == "after":
            try:
                after = _integer(raw, 1)
            except _Invalid as exc:
                raise _Invalid(f"{exc.why} (failure notifications start with the Nth "
                               "failure in a row)", line=line, key=key) from None
            continue
        if key == "on" and isinstance(raw, str):
            raw = [raw]  # on: change
        if not isinstance(raw, list) or not raw:
            kind = "an empty list" if raw == [] else _kind(raw)
            raise _Invalid(f"must be a non-empty list, got {kind}", line=line, key=key)
        if key == "urls":
            parsed = []
            for i, entry in enumerate(raw):
                try:
                    parsed.append(_secret_url(entry, f"notify.urls[{i}]", line))
                except _Invalid as exc:
                    raise _Invalid(exc.why, line=exc.line or line, key=f"urls[{i}]") from None
            urls = tuple(parsed)
        else:
            for event in raw:
                if event not in NOTIFY_ON:
                    why = (f"unknown event {_kind(event)} (known: {', '.join(NOTIFY_ON)})")
                    raise _Invalid(why, line=line, key=key)
            on = tuple(e for e in NOTIFY_ON if e in raw)
    if not urls:
        raise _Invalid("needs urls: a list of apprise URLs", line=mapping.line)
    return Notify(urls=urls, on=on, after=after)


def _time_of_day(value: Any) -> str:
    """``finish-by:``: ``HH:MM`` or ``HH:MM:SS``, kept as written (hours without a 0)."""
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads an unquoted 6:00 as the number 360 (base 60).
        raise _Invalid('must be a time of day in quotes, like "06:00" (unquoted, YAML reads '
                       '6:00 as a number)')
    if not isinstance(value, str) or not TIME_OF_DAY.fullmatch(value.strip()):
        raise _Invalid(f'must be a time of day like "06:00" or "06:00:30", got {_kind(value)}')
    return value.strip()


def _expect(value: Any) -> Expect | None:
    """``expect: {max: 2h, min: 30s, finish-by: "06:00", start-within: 5m}``."""
    if value is None:
        return None
    mapping = _mapping(value)
    parsed: dict[str, Any] = {}
    for key, raw in mapping.items():
        line = mapping.lines[key]
        if key not in EXPECT_KEYS:
            raise _Invalid(_suggest(key, EXPECT_KEYS), line=line, key=str(key))
        try:
            parsed[key.replace("-", "_")] = (_time_of_day(raw) if key == "finish-by"
                                             else _duration(raw, positive=True))
        except _Invalid as exc:
            raise _Invalid(exc.why, line=line, key=key) from None
    if not parsed:
        raise _Invalid(f"needs at least one of {', '.join(EXPECT_KEYS)}", line=mapping.line)
    expect = Expect(**parsed)
    if expect.min is not None and expect.max is not None and expect.min >= expect.max:
        raise _Invalid(f"min {format_duration(expect.min)} is not shorter than max "
                       f"{format_duration(expect.max)}", line=mapping.lines["min"], key="min")
    return expect


def _ping(value: Any) -> SecretUrl:
    url = _secret_url(value, "ping")
    if url.source == LITERAL and not url.value.lower().startswith(("http://", "https://")):
        raise _Invalid("must be an http:// or https:// URL")
    return url
#: The largest ``backoff:`` factor.
MAX_BACKOFF = 100


def _backoff(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"must be a number like 2 (each retry waits that many times longer), "
                       f"got {_kind(value)}")
    if not 1 <= value <= MAX_BACKOFF:
        raise _Invalid(f"must be from 1 to {MAX_BACKOFF}, got {value}")
    return float(value)


def _catch_up(value: Any) -> str:
    if value not in CATCH_UP:
        raise _Invalid(f"must be one of {', '.join(CATCH_UP)}, got {_kind(value)}")
    return str(value)


def _overlap(value: Any) -> str:
    """One of :data:`OVERLAP`; ``allow N`` (N from 1 to :data:`MAX_ALLOW`)
    kept as ``allow N``."""
    kind, _, bound = value.strip().partition(" ") if isinstance(value, str) else ("", "", "")
    if kind == "allow":
        bound = bound.strip()
        if not bound:
            raise _Invalid("allow needs a bound: allow N, at most N runs of the job at once "
                           "across the fleet (e.g. allow 2)")
        if not bound.isdigit() or not 1 <= int(bound) <= MAX_ALLOW:
            raise _Invalid(f"allow N: N must be a whole number from 1 to {MAX_ALLOW} (runs of "
                           f"the job at once across the fleet), got {bound!r}")
        return f"allow {int(bound)}"
    if value not in OVERLAP:
        raise _Invalid(f"must be one of forbid, queue, replace, allow N (what a slot due "
                       f"while the job's run is still going becomes), got {_kind(value)}")
    return str(value)


#: A job's ``limits:`` as written: (Limits field, value; None: lifted), sorted.
WrittenLimits = tuple[tuple[str, Any], ...]


def _limits(value: Any) -> WrittenLimits | None:
    """``limits:`` as written (None: ``limits: null``); the job's own are
    merged over its defaults' limit by limit, then frozen into
    :class:`~dblockrun.jobs.Limits` (:meth:`_Parser.parse_job`)."""
    if value is None:
        return None
    # Imported here: a daemon keeps every module it imports, and few jobs
    # set limits (issue 33 item 4).
    from dblockrun.config import resources

    mapping = _mapping(value)
    written: list[tuple[str, Any]] = []
    for key, raw in mapping.items():
        line = mapping.lines[key]
        if key not in resources.PARSERS:
            raise _Invalid(_suggest(key, LIMIT_KEYS), line=line, key=str(key))
        field_name, parse = resources.PARSERS[key]
        try:
            written.append((field_name, None if raw is None else parse(raw)))
        except resources.WrongKind as exc:
            raise _Invalid(f"must be {exc.what}, got {_kind(raw)}", line=line, key=key) from None
        except ValueError as exc:
            raise _Invalid(str(exc), line=line, key=key) from None
    return tuple(sorted(written))


def _optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``parse``, with ``null`` meaning unset."""

    def parse_optional(value: Any) -> Any:
        return None if value is None else parse(value)

    return parse_optional


def _required(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse_required(value: Any) -> Any:
        if value is None:
            raise _Invalid("needs a value")
        return parse(value)

    return parse_required


#: YAML key -> (Job field, parser).
JOB_KEYS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "cron": ("cron", _optional(_cron)),
    "rate": ("rate", _optional(lambda v: _duration(v, positive=True))),
    "command": ("command", _required(_command)),
    "lock-at-most": ("lock_at_most", _required(lambda v: _duration(v, positive=True))),
    "lock-at-least": ("lock_at_least", _required(_duration)),
    "timezone": ("timezone", _required(_timezone)),
    "env": ("env", _required(_env)),
    "env-inherit": ("env_inherit", _optional(_env_inherit)),
    "workdir": ("workdir", _optional(lambda v: _string(v, empty=False))),
    "shell": ("shell", _required(lambda v: _string(v, empty=False))),
    "starting-deadline": ("starting_deadline", _optional(lambda v: _duration(v, positive=True))),
    "retries": ("retries", _required(lambda v: _integer(v, 0))),
    "retry-delay": ("retry_delay", _required(_duration)),
    "backoff": ("backoff", _required(_backoff)),
    "max-delay": ("max_delay", _optional(lambda v: _duration(v, positive=True))),
    "on-failure": ("on_failure", _on_failure),
    "jitter": ("jitter", _required(_duration)),
    "description": ("description", _required(_string)),
    "enabled": ("enabled", _required(_bool)),
    "items": ("items", _optional(_items)),
    "items-command": ("items_command", _optional(_command)),
    "parallel": ("parallel", _required(lambda v: _integer(v, 1))),
    "batch": ("batch", _required(lambda v: _integer(v, 1))),
    "history-limit": ("history_limit", _required(lambda v: _integer(v, 1))),
    "user": ("user", _optional(_user)),
    "run-on": ("run_on", lambda v: () if v is None else _run_on(v)),
    "on": ("every_host", _required(_on)),
    "notify": ("notify", _notify),
    "ping": ("ping", _optional(_ping)),
    "catch-up": ("catch_up", _required(_catch_up)),
    "catch-up-limit": ("catch_up_limit", _optional(lambda v: _integer(v, 1))),
    "group": ("group", _optional(lambda v: _string(v, empty=False))),
    "overlap": ("overlap", _required(_overlap)),
    "limits": ("limits", _limits),
    "after": ("after", _optional(_after)),
    "expect": ("expect", _expect),
    "exclude": ("exclude", lambda v: () if v is None else _names(v)),
    "blackout": ("blackout", lambda v: () if v is None else _blackout(v)),
    "active": ("active", _optional(_active)),
}
_KNOWN_JOB_KEYS = tuple(JOB_KEYS)
_KEY_OF_FIELD = {field: key for key, (field, _parse) in JOB_KEYS.items()}


def job_key(field: str) -> str:
    """The jobs file's key of a :class:`Job` field (``lock_at_most`` ->
    ``lock-at-most``)."""
    return _KEY_OF_FIELD.get(field, field.replace("_", "-"))


def differing_keys(mine: dict[str, str], theirs: dict[str, str] | None) -> list[str]:
    """The jobs file keys in which two hosts' definitions of a job differ,
    from their field digests (:meth:`Job.field_digests`); none known when
    ``theirs`` is None (the host did not write them)."""
    if theirs is None:
        return []
    return sorted({job_key(field) for field in differing_fields(mine, theirs)})


def _size(text: str) -> int:
    """Bytes of ``text`` as the command gets it (with its NUL)."""
    return len(text.encode("utf-8", "surrogateescape")) + 1


def _too_large(job: Job) -> tuple[str, str] | None:
    """(key, why) if what ``job`` hands its command cannot be executed or
    is more than a job may hand it (jobs.MAX_ARG, jobs.MAX_COMMAND_BYTES)."""
    def words(command: Command | None) -> tuple[str, ...]:
        return () if command is None else (command,) if isinstance(command, str) else command

    def over_arg(key: str, text: str, what: str) -> tuple[str, str] | None:
        size = _size(text)
        if size <= MAX_ARG:
            return None
        return key, (f"{what} is {size:,} bytes: at most {MAX_ARG:,} (Linux's limit for "
                     "one argument or variable)")

    for key, command in (("command", job.command), ("on-failure.command",
                                                    job.on_failure.command),
                         ("items-command", job.items_command)):
        for word in words(command):
            if (bad := over_arg(key, word, "an argument")) is not None:
                return bad
    for name, value in job.env:
        if (bad := over_arg(f"env.{name}", f"{name}={value}", "the variable")) is not None:
            return bad
    total = sum(_size(word) for word in words(job.command)) + sum(
        _size(f"{name}={value}") for name, value in job.env)
    if total > MAX_COMMAND_BYTES:
        return "command", (f"the command and env: are {total:,} bytes together: at most "
                     f"{MAX_COMMAND_BYTES:,}")
    if job.items:
        for item in job.items:
            if (bad := over_arg("items", f"DBLOCKRUN_ITEM={item}", "an item")) is not None:
                return bad
        largest = sorted((_size(item) for item in job.items), reverse=True)[:job.batch]
        batch = len("DBLOCKRUN_ITEMS=") + sum(largest)
        if job.batch > 1 and batch > MAX_ARG:
            return "batch", (f"{len(largest)} of the items make a DBLOCKRUN_ITEMS of "
                             f"{batch:,} bytes: at most {MAX_ARG:,} (Linux's limit for one "
                             "variable); lower batch")
    return None


def _cycles(jobs: dict[str, Job]) -> list[list[str]]:
    """Each cycle of ``after:`` once (its jobs in the order each runs after
    the next, from the one first in the file)."""
    order = {name: i for i, name in enumerate(jobs)}
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        path.append(name)
        job = jobs[name]
        for up in job.after.jobs if job.after is not None else ():
            if up not in jobs:
                continue
            if state.get(up) == 1:
                cycle = path[path.index(up):]
                key = frozenset(cycle)
                if key not in seen:
                    seen.add(key)
                    start = min(range(len(cycle)), key=lambda i: order[cycle[i]])
                    found.append(cycle[start:] + cycle[:start])
            elif state.get(up) is None:
                visit(up, path)
        path.pop()
        state[name] = 2

    for name in jobs:
        if state.get(name) is None:
            visit(name, [])
    return found


# --- the file ------------------------------------------------------------------------


_NEEDS_JOBS = ("a jobs file needs a jobs: mapping of job names to jobs "
               "(see dblockrun-jobs(5))")


class _Parser:
    def __init__(self, path: str) -> None:
        self.path = path
        self.groups: dict[str, int] = {}
        #: Groups named under ``groups:`` whose definition is wrong: a job in
        #: one is not also told its group is unknown.
        self.bad_groups: set[str] = set()
        #: Every problem found so far, in the order found.
        self.errors: list[ConfigError] = []
        #: The line of each job's ``after:`` (dblockrun/daemon/chains.py).
        self.after_lines: dict[str, int] = {}
        #: ``calendars:``: each by its name; those with a problem (told
        #: once, not again for each job that excludes them).
        self.calendars: dict[str, Calendar] = {}
        self.bad_calendars: set[str] = set()

    def error(
        self, why: str, line: int | None, job: str | None = None, key: str | None = None
    ) -> ConfigError:
        return ConfigError(why, file=self.path, line=line, job=job, key=key)

    def fail(self, why: str, line: int | None, job: str | None = None,
             key: str | None = None) -> None:
        """Note a problem and go on: the file's other problems are found too."""
        self.errors.append(self.error(why, line, job, key))

    def parse(self, data: Any) -> JobsFile:
        """The file's jobs; every problem found, raised at the end (one
        ConfigError, or several as ConfigErrors in the file's order)."""
        try:
            parsed = self.parse_file(data)
        except ConfigError as exc:  # one that hides the rest of the file
            self.errors.append(exc)
        if not self.errors:
            return parsed
        if len(self.errors) == 1:
            raise self.errors[0]
        # Stable: two problems of one line keep the order they were found in.
        raise ConfigErrors(sorted(self.errors, key=lambda e: e.line or 0))

    def parse_file(self, data: Any) -> JobsFile:
        if data is None:
            raise self.error(f"the file is empty: {_NEEDS_JOBS}", None)
        if not isinstance(data, _Mapping):
            raise self.error(f"the file must be a mapping with a jobs: key, got {_kind(data)}", 1)
        self.check_duplicates(data)
        for key in data:
            if key not in TOP_LEVEL_KEYS:
                self.fail(_suggest(key, TOP_LEVEL_KEYS), data.lines[key], key=str(key))
        if "jobs" not in data:
            raise self.error(f"no jobs: key: {_NEEDS_JOBS}", data.line)
        database = data.get("database")
        if database is not None:
            try:
                database = _string(database, empty=False)
            except _Invalid as exc:
                self.fail(exc.why, data.lines["database"], key="database")
        database_file = data.get("database-file")
        if database_file is not None:
            try:
                database_file = _string(database_file, empty=False)
                # Relative to the jobs file, like any path a reader of the file would follow.
                database_file = os.path.join(os.path.dirname(self.path), database_file)
            except _Invalid as exc:
                self.fail(exc.why, data.lines["database-file"], key="database-file")
        self.calendars = self.parse_calendars(data)
        before = len(self.errors)
        defaults = self.parse_defaults(data)
        if "exclude" in defaults:  # its calendars once, not again for each job
            names, line = defaults["exclude"]
            for calendar in names:
                if calendar not in self.calendars and calendar not in self.bad_calendars:
                    self.fail(self.unknown_calendar(calendar), line, key="defaults.exclude")
        #: A bad key under defaults: would show again in every job's checks.
        self.defaults_ok = len(self.errors) == before
        self.groups, queues = self.parse_groups(data)
        groups = tuple(sorted(self.groups.items()))
        group_queues = tuple(sorted(queues.items()))
        storm = self.parse_storm(data)
        jobs = data["jobs"]
        if jobs is None:
            return JobsFile(path=self.path, database=database, jobs=(),
                            database_file=database_file, groups=groups,
                            group_queues=group_queues, storm=storm)
        if not isinstance(jobs, _Mapping):
            why = f"must be a mapping of job names to jobs, got {_kind(jobs)}"
            raise self.error(why, data.lines["jobs"], key="jobs")
        parsed = tuple(job for name, body in jobs.items()
                       if (job := self.parse_job(name, body, jobs.lines[name], defaults))
                       is not None)
        self.check_chains(parsed, set(jobs))
        return JobsFile(path=self.path, database=database, jobs=parsed,
                        database_file=database_file, groups=groups, group_queues=group_queues,
                        storm=storm)

    def parse_storm(self, data: _Mapping) -> Storm:
        """``notify-storm: {threshold: 10, window: 1m, max-names: 20, wait: 5s}``
        (each key optional; dblockrun/notify/storm.py)."""
        raw = data.get("notify-storm")
        if raw is None:
            return Storm()
        if not isinstance(raw, _Mapping):
            why = (f"must be a mapping with threshold:, window:, max-names: or wait:, "
                   f"got {_kind(raw)}")
            self.fail(why, data.lines["notify-storm"], key="notify-storm")
            return Storm()
        parsed: dict[str, Any] = {}
        for key, value in raw.items():
            line = raw.lines[key]
            if key not in STORM_KEYS:
                self.fail(_suggest(key, STORM_KEYS), line, key=f"notify-storm.{key}")
                continue
            try:
                if key in ("threshold", "max-names"):
                    parsed[key.replace("-", "_")] = _integer(value, 1)
                else:
                    parsed[key] = _duration(value, positive=True)
            except _Invalid as exc:
                self.fail(exc.why, line, key=f"notify-storm.{key}")
        storm = Storm(**parsed)
        if storm.wait > storm.window:
            self.fail(f"wait {format_duration(storm.wait)} is longer than window "
                      f"{format_duration(storm.window)}", raw.lines.get("wait", raw.line),
                      key="notify-storm.wait")
        return storm

    def parse_calendars(self, data: _Mapping) -> dict[str, Calendar]:
        """``calendars:``: each calendar's days, from its ``dates:`` and its
        iCalendar ``file:`` (relative to the jobs file's folder)."""
        raw = data.get("calendars")
        if raw is None:
            return {}
        if not isinstance(raw, _Mapping):
            why = f"must be a mapping of calendar names to calendars, got {_kind(raw)}"
            self.fail(why, data.lines["calendars"], key="calendars")
            return {}
        out: dict[str, Calendar] = {}
        for name, body in raw.items():
            try:
                out[name] = self.parse_calendar(name, body, raw.lines[name])
            except ConfigError as exc:
                self.errors.append(exc)
                self.bad_calendars.add(str(name))
        return out

    def parse_calendar(self, name: Any, body: Any, line: int) -> Calendar:
        key = f"calendars.{name}"
        if not isinstance(name, str):
            raise self.error(f"calendar names must be strings, got {_kind(name)} (quote it)",
                             line, key="calendars")
        if not JOB_NAME.fullmatch(name):
            raise self.error("bad calendar name: use letters, digits, '.', '_' and '-'", line,
                             key=key)
        if not isinstance(body, _Mapping):
            raise self.error(f"must be a mapping with dates: and/or file:, got {_kind(body)}",
                             line, key=key)
        for k in body:
            if k not in CALENDAR_KEYS:
                raise self.error(_suggest(k, CALENDAR_KEYS), body.lines[k], key=f"{key}.{k}")
        if "dates" not in body and "file" not in body:
            raise self.error("needs dates: (a list of days), file: (an iCalendar file) or "
                             "both", line, key=key)
        days: set[date] = set()
        dates = body.get("dates")
        if "dates" in body:
            where = body.lines["dates"]
            if not isinstance(dates, list):
                raise self.error(f"must be a list of days like 2026-12-25, got {_kind(dates)}",
                                 where, key=f"{key}.dates")
            for i, value in enumerate(dates):
                try:
                    days.add(_day(value))
                except _Invalid as exc:
                    raise self.error(exc.why, where, key=f"{key}.dates[{i}]") from None
        written = None
        if "file" in body:
            where = body.lines["file"]
            try:
                written = _string(body["file"], empty=False)
            except _Invalid as exc:
                raise self.error(exc.why, where, key=f"{key}.file") from None
            days |= self.read_calendar_file(written, where, f"{key}.file")
        return Calendar(name, frozenset(days), written)

    def read_calendar_file(self, written: str, line: int, key: str) -> frozenset[date]:
        """The days of the iCalendar file ``written`` names (relative to the
        jobs file's folder): read again with the file on each reload."""
        path = os.path.join(os.path.dirname(self.path), written)
        try:
            # A regular file only, bounded: the reader of the jobs file itself.
            text = whole_text(path)
        except ValueError as exc:
            raise self.error(f"{written}: {exc}", line, key=key) from None
        try:
            return calendars.read_ics(text)
        except ValueError as exc:
            raise self.error(f"{written}: {exc}", line, key=key) from None

    def parse_groups(self, data: _Mapping) -> tuple[dict[str, int], dict[str, int]]:
        """``groups:``: each group's fleet-wide limit (jobs of it at once),
        and the bound of the groups whose slots queue when it is full
        (``when-full: queue``; the short form ``NAME: N`` skips them)."""
        raw = data.get("groups")
        if raw is None:
            return {}, {}
        if not isinstance(raw, _Mapping):
            why = f"must be a mapping of group names to limits, got {_kind(raw)}"
            self.fail(why, data.lines["groups"], key="groups")
            return {}, {}
        groups: dict[str, int] = {}
        queues: dict[str, int] = {}
        for name, value in raw.items():
            try:
                seats, bound = self.parse_group(name, value, raw.lines[name])
            except ConfigError as exc:
                self.errors.append(exc)
                self.bad_groups.add(str(name))
                continue
            groups[name] = seats
            if bound is not None:
                queues[name] = bound
        return groups, queues

    def parse_group(self, name: Any, value: Any, line: int) -> tuple[int, int | None]:
        """A group's seats, and its queue's bound (None: its full group skips)."""
        key = f"groups.{name}"
        if not isinstance(name, str) or not JOB_NAME.fullmatch(name):
            why = "bad group name: use letters, digits, '.', '_' and '-'"
            raise self.error(why, line, key=key)
        if len(name) > MAX_GROUP_NAME:
            why = f"group name is {len(name)} characters long (at most {MAX_GROUP_NAME})"
            raise self.error(why, line, key=key)
        seats, bound = value, None
        if isinstance(value, _Mapping):
            seats, bound = self.parse_group_body(name, value, line)
            key = f"groups.{name}.seats"
            line = value.lines.get("seats", line)
        try:
            limit = _integer(seats, 1)
        except _Invalid as exc:
            raise self.error(exc.why, line, key=key) from None
        if limit > MAX_GROUP_LIMIT:
            raise self.error(f"must be at most {MAX_GROUP_LIMIT}, got {seats}", line, key=key)
        return limit, bound

    def parse_group_body(self, name: str, body: _Mapping, line: int) -> tuple[Any, int | None]:
        """A group's long form: (its seats, unchecked; its queue's bound,
        None when its full group skips)."""
        for k in body:
            if k not in GROUP_KEYS:
                raise self.error(_suggest(k, GROUP_KEYS), body.lines[k],
                                 key=f"groups.{name}.{k}")
        if "seats" not in body:
            raise self.error("needs seats: (at most this many of its jobs at once)", line,
                             key=f"groups.{name}")
        when = body.get("when-full", "skip")
        if when not in WHEN_FULL:
            why = f"must be skip or queue, got {when!r}"
            raise self.error(why, body.lines["when-full"], key=f"groups.{name}.when-full")
        bound = body.get("queue")
        if bound is not None:
            if when != "queue":
                why = "a queue's bound needs when-full: queue"
                raise self.error(why, body.lines["queue"], key=f"groups.{name}.queue")
            try:
                bound = _integer(bound, 1)
            except _Invalid as exc:
                raise self.error(exc.why, body.lines["queue"],
                                 key=f"groups.{name}.queue") from None
        if when == "queue":
            return body["seats"], DEFAULT_QUEUE if bound is None else bound
        return body["seats"], None

    def check_chains(self, jobs: tuple[Job, ...], names: set[Any]) -> None:
        """``after:`` names jobs of the file (not fan-out or every-host ones,
        and not itself a fan-out or every-host job) and makes no cycle."""
        by_name = {job.name: job for job in jobs}
        for job in jobs:
            if job.after is None:
                continue
            line = self.after_lines.get(job.name, job.line)
            if job.fan_out or job.every_host:
                kind = "a fan-out job (items, items-command)" if job.fan_out else \
                    "an every-host job (on: every-host)"
                self.fail(f"{kind} cannot run after another job: a run of its upstream "
                          "starts one run on one host", line, job.name, "after")
            for up in job.after.jobs:
                upstream = by_name.get(up)
                if upstream is None:
                    if up in names:
                        continue  # a job with problems of its own, told already
                    import difflib  # a mistake's hint only

                    close = difflib.get_close_matches(up, sorted(map(str, names)), n=1,
                                                      cutoff=0.6)
                    hint = f" (did you mean '{close[0]}'?)" if close else ""
                    self.fail(f"unknown job {up!r}{hint}", line, job.name, "after")
                elif upstream.fan_out or upstream.every_host:
                    self.fail(f"{up!r} is a fan-out or every-host job: its runs are per item "
                              "or per host, so none can start one run of this job", line,
                              job.name, "after")
        for cycle in _cycles(by_name):
            first = cycle[0]
            self.fail(f"a cycle: {' after '.join([*cycle, first])} (a chain must end)",
                      self.after_lines.get(first, by_name[first].line), first, "after")

    def check_duplicates(self, data: _Mapping) -> None:
        """Note each key written twice in any mapping of the file."""
        stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
        seen: set[int] = set()
        while stack:
            value, where = stack.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, _Mapping):
                for key, line in value.duplicates:
                    self.errors.append(self.duplicate(where, key, line))
                children = [(child, (*where, str(key))) for key, child in value.items()]
            elif isinstance(value, list | tuple | set):
                children = [(child, where) for child in value]
            else:
                continue
            stack.extend(reversed(children))

    def duplicate(self, where: tuple[str, ...], key: Any, line: int) -> ConfigError:
        if where == ("jobs",):
            return self.error(f"duplicate job {str(key)!r}", line)
        why = f"duplicate key {str(key)!r}"
        if len(where) >= 2 and where[0] == "jobs":
            nested = ".".join(where[2:]) or None
            return self.error(why, line, job=where[1], key=nested)
        return self.error(why, line, key=".".join(where) or None)

    def parse_defaults(self, data: _Mapping) -> dict[str, tuple[Any, int]]:
        raw = data.get("defaults")
        if raw is None:
            return {}
        if not isinstance(raw, _Mapping):
            why = f"must be a mapping of job keys, got {_kind(raw)}"
            self.fail(why, data.lines["defaults"], key="defaults")
            return {}
        return self.parse_keys(raw, job=None, prefix="defaults.")

    def parse_keys(
        self, raw: _Mapping, job: str | None, prefix: str = ""
    ) -> dict[str, tuple[Any, int]]:
        """Each key of a job (or of defaults) -> (Job field value, line);
        a bad key is noted and left out."""
        parsed: dict[str, tuple[Any, int]] = {}
        for key, value in raw.items():
            line = raw.lines[key]
            if key not in JOB_KEYS:
                self.fail(_suggest(key, _KNOWN_JOB_KEYS), line, job, f"{prefix}{key}")
                continue
            _field, parse = JOB_KEYS[key]
            try:
                parsed[key] = (parse(value), line)
            except _Invalid as exc:
                nested = f"{prefix}{key}.{exc.key}" if exc.key else f"{prefix}{key}"
                self.fail(exc.why, exc.line or line, job, nested)
        return parsed

    def parse_job(
        self, name: Any, body: Any, line: int, defaults: dict[str, tuple[Any, int]]
    ) -> Job | None:
        """The job, or None after noting its problems."""
        try:
            return self.check_job(name, body, line, defaults)
        except ConfigError as exc:
            self.errors.append(exc)
            return None

    def check_job(
        self, name: Any, body: Any, line: int, defaults: dict[str, tuple[Any, int]]
    ) -> Job | None:
        """The job; raises its first problem that hides the others, notes
        the others (then None)."""
        if not isinstance(name, str):
            raise self.error(f"job names must be strings, got {_kind(name)} (quote it)", line)
        if not JOB_NAME.fullmatch(name):
            why = "bad job name: use letters, digits, '.', '_' and '-'"
            raise self.error(why, line, job=name)
        if len(name) > MAX_JOB_NAME:
            why = f"job name is {len(name)} characters long (at most {MAX_JOB_NAME})"
            raise self.error(why, line, job=name[:40] + "...")
        if not isinstance(body, _Mapping):
            raise self.error(f"must be a mapping of job keys, got {_kind(body)}", line, job=name)
        before = len(self.errors)
        own = self.parse_keys(body, job=name)
        if len(self.errors) > before or not self.defaults_ok:
            return None  # its keys as written are wrong: the checks below would say it again
        keys = {**defaults, **own}
        if "env" in defaults and "env" in own:
            env = dict(defaults["env"][0]) | dict(own["env"][0])
            keys["env"] = (tuple(sorted(env.items())), own["env"][1])
        if "limits" in keys:  # the job's limits over its defaults', limit by limit
            mine, where = keys["limits"]
            if "limits" in own and mine is not None and "limits" in defaults:
                mine = tuple(sorted((dict(defaults["limits"][0] or ()) | dict(mine)).items()))
            keys["limits"] = (Limits(**dict(mine or ())), where)

        def value(key: str) -> Any:
            return keys[key][0] if key in keys else None

        if value("command") is None:
            self.fail("missing (every job needs a command)", line, name, "command")
        if value("cron") is None and value("rate") is None and value("after") is None:
            self.fail("missing (a job needs cron, rate, after or several of them)", line,
                      name, "cron")
        if "after" in defaults:
            self.fail("not under defaults (each job names the jobs it runs after)",
                      defaults["after"][1], None, "defaults.after")
        if "after" in keys:
            self.after_lines[name] = keys["after"][1]
        if value("items") is not None and value("items-command") is not None:
            why = "cannot be used together with items (use one)"
            self.fail(why, keys["items-command"][1], name, "items-command")
        if value("on") and (value("items") is not None or value("items-command") is not None):
            why = ("every-host cannot be used with items or items-command (fan-out spreads "
                   "items over the hosts; every-host runs the whole job on each)")
            self.fail(why, keys["on"][1], name, "on")
        if "cron" in keys and value("cron") is not None:
            try:  # H's values come from the job's name (`0 0 31 H *` may never match)
                cron = value("cron")
                _cron(list(cron) if isinstance(cron, tuple) else cron, name)
            except _Invalid as exc:
                self.fail(exc.why, keys["cron"][1], name, "cron")
        self.check_calendar_keys(name, keys, own, defaults)
        if len(self.errors) > before:
            return None
        job = Job(
            name=name,
            line=line,
            **{JOB_KEYS[key][0]: parsed for key, (parsed, _line) in keys.items()},
        )
        for key, why in self.job_problems(job, keys):
            self.fail(why, keys[key.split(".", 1)[0]][1] if key.split(".", 1)[0] in keys
                      else line, name, key)
        return job if len(self.errors) == before else None

    def check_calendar_keys(self, name: str, keys: dict[str, tuple[Any, int]],
                            own: dict[str, tuple[Any, int]],
                            defaults: dict[str, tuple[Any, int]]) -> None:
        """``exclude``, ``blackout``, ``active``: only for a cron job without
        items (a rate job has no slots to exclude; a fan-out job's items
        have their own); under ``defaults:`` they apply to the jobs that
        can have them. ``exclude`` names calendars of ``calendars:``: its
        names become them."""
        slotted = keys.get("cron", (None, 0))[0] is not None and not any(
            keys.get(k, (None, 0))[0] is not None for k in ("items", "items-command"))
        for key in CALENDAR_JOB_KEYS:
            if key not in keys or slotted:
                continue
            if key in own and keys[key][0] not in ((), None):
                self.fail("only for a cron job without items (a rate job has no slots; a "
                          "fan-out job's items have their own)", own[key][1], name, key)
            del keys[key]  # from defaults: for the jobs it fits
        if "exclude" not in keys:
            return
        names, line = keys["exclude"]
        known: list[Calendar] = []
        for calendar in names:
            if calendar in self.calendars:
                known.append(self.calendars[calendar])
            elif calendar not in self.bad_calendars:  # (else: told already; nothing runs)
                self.fail(self.unknown_calendar(calendar), line, name, "exclude")
        keys["exclude"] = (tuple(known), line)

    def unknown_calendar(self, calendar: str) -> str:
        listed = ", ".join(sorted(self.calendars))
        if listed:
            return f"unknown calendar {calendar!r} (calendars: {listed})"
        return (f"unknown calendar {calendar!r}: define it under calendars: at the top "
                f"(calendars: {{{calendar}: {{dates: [2026-12-25]}}}})")

    def job_problems(self, job: Job, keys: dict[str, tuple[Any, int]]) -> Iterator[
            tuple[str, str]]:
        """(key, why) of each problem between the keys of a job whose keys
        are each valid."""
        if job.lock_at_least > job.lock_at_most:
            yield "lock-at-least", (f"{format_duration(job.lock_at_least)} is longer than "
                                    f"lock-at-most {format_duration(job.lock_at_most)}")
        too_large = _too_large(job)
        if too_large is not None:
            yield too_large
        if job.max_delay is not None and job.backoff == 1:
            yield "max-delay", "only with backoff above 1 (without it every retry waits " \
                               "retry-delay)"
        if job.max_delay is not None and job.max_delay < job.retry_delay:
            yield "max-delay", (f"{format_duration(job.max_delay)} is shorter than retry-delay "
                                f"{format_duration(job.retry_delay)}")
        if job.catch_up_limit is not None and job.catch_up != "all":
            yield "catch-up-limit", f"only with catch-up: all (this job's catch-up is " \
                                    f"{job.catch_up})"
        if job.overlap != "forbid" and (job.cron is None or job.fan_out):
            yield "overlap", ("only for a cron job without items (a rate job starts when its "
                              "last start is a rate old; a fan-out job's items have their own "
                              "slots)")
        if job.expect is not None and (job.cron is None or job.fan_out):
            for key in ("start-within", "finish-by"):
                if getattr(job.expect, key.replace("-", "_")) is not None:
                    yield f"expect.{key}", ("only for a cron job without items (a slot is "
                                            "what starts within it or finishes by it)")
        if job.group is not None and job.group not in self.bad_groups:
            if job.group not in self.groups:
                known = ", ".join(sorted(self.groups))
                yield "group", (f"unknown group {job.group!r} (groups: {known})" if known else
                                f"unknown group {job.group!r}: define it under groups: at "
                                "the top (groups: {" + job.group + ": 1})")
            if job.fan_out:
                yield "group", "a fan-out job (items, items-command) cannot be in a group"
