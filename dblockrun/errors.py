"""The one exception family of dblockrun.

Each class's docstring is its default message. The CLI maps
:class:`ConfigError` and :class:`UsageError` to exit status 2 and every other
:class:`DblockrunError` to exit status 1.
"""

from __future__ import annotations

#: The exit status of a command interrupted by Ctrl-C (SIGINT), as shells
#: report it (128 + 2).
EXIT_INTERRUPTED = 130


class DblockrunError(Exception):
    """dblockrun failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class UsageError(DblockrunError):
    """Bad usage."""


class ConfigError(DblockrunError):
    """The jobs file is invalid.

    Rendered as ``file:line: job 'x': key: why`` (parts that are unknown are
    left out).
    """

    def __init__(
        self,
        why: str,
        *,
        file: str | None = None,
        line: int | None = None,
        job: str | None = None,
        key: str | None = None,
    ) -> None:
        self.why = why
        self.file = file
        self.line = line
        self.job = job
        self.key = key
        super().__init__(self.render())

    def render(self) -> str:
        parts: list[str] = []
        if self.file is not None:
            parts.append(f"{self.file}:{self.line}" if self.line is not None else self.file)
        if self.job is not None:
            parts.append(f"job '{self.job}'")
        if self.key is not None:
            parts.append(self.key)
        parts.append(self.why)
        return ": ".join(parts)

    def lines(self) -> list[str]:
        """One line per problem, as the command line prints them."""
        return [self.render()]


class ConfigErrors(ConfigError):
    """Several problems of one jobs file: each a :class:`ConfigError`, in
    the file's order. Its own fields are the first's; its message is every
    problem's, joined by ``; ``."""

    def __init__(self, errors: list[ConfigError]) -> None:
        first = errors[0]
        self.errors = tuple(errors)
        super().__init__(first.why, file=first.file, line=first.line, job=first.job,
                         key=first.key)
        self.args = ("; ".join(e.render() for e in self.errors),)

    def lines(self) -> list[str]:
        return [e.render() for e in self.errors]


class DatabaseError(DblockrunError):
    """The database could not be reached or refused a statement."""

    #: What went wrong: ``unreachable``, ``refused``, ``read-only``,
    #: ``deadlock``, ``lock-held`` (another session held the rows past the
    #: lock wait), ``schema``, ``bad-row`` (a row edited into a value the
    #: statement cannot take: not an outage) or ``error`` (anything else).
    kind = "error"
    #: ``lock-held``: the session holding the rows, as far as it could be
    #: seen (``id 812, user reader@10.0.0.5, since ...``).
    holder: str | None = None

    def __init__(self, message: str | None = None, *, kind: str | None = None,
                 holder: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.holder = holder


class DatabaseRefused(DatabaseError):
    """The database refused us: wrong password, unknown user or database, or
    missing privileges. Retrying will not help; a daemon stops at startup."""

    kind = "refused"


class SettingRefused(DatabaseRefused, UsageError):
    """The database, or a connection pooler in front of it, refused a
    setting of the connection (a startup parameter): a configuration error
    (exit status 2), not an outage."""


class SchemaTooNew(DatabaseError):
    """The database schema is newer than this dblockrun knows; upgrade dblockrun."""

    kind = "schema"


class ThreadCrashed(DblockrunError):
    """A background thread of the daemon kept crashing; the daemon stopped."""
