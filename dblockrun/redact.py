"""Credentials hidden from everything dblockrun shows: the one redactor of
database URLs, commands, a command's output (its log lines and its stored
tail), log lines and the dashboard.

- :func:`url`: a string that is one database URL (``--db``, an error about
  it): the password of ``scheme://user:password@host``, of ``?password=``
  and of a libpq ``password=`` string; a string that only looks like a URL
  (``u:pw@host``) loses what may be its password.
- :func:`text`: any text (a command line, an output line, a log line):
  every credential pattern of :data:`PATTERNS` hidden as ``***``.
- :class:`Pieces`: a command's output as it is read, in lines of at most
  64 KiB: each redacted before it is kept or logged, and a credential a
  64 KiB cut splits in two dropped on both sides of the cut.
- :func:`tail`: a stored output tail as shown: redacted, and when the tail
  was cut, its first word dropped if it could be the end of a credential.

What is hidden (case does not matter): the password of a URL's
``user:password@``, up to the last ``@`` before a space, so that one holding
an ``@`` is hidden whole; the value of an assignment to a name holding
``password``, ``passwd``, ``pwd``, ``secret``, ``token``, ``api_key``,
``access_key``, ``private_key`` or ``credential`` (``PGPASSWORD=...``,
``password=...`` of libpq, ``--token=...``, ``?token=...``, JSON
``"password": "..."``); the query parameters ``key``, ``sig``,
``signature`` and ``auth``; and the value of an ``Authorization``,
``Proxy-Authorization``, ``Cookie``, ``X-Api-Key`` or ``X-Auth-Token``
header (its scheme, ``Bearer``, kept). A value may be quoted (``'a b'``).
More is hidden rather than less: ``tokens=3`` shows as ``tokens=***``
(``DBLOCKRUN_FENCING_TOKEN`` is not a secret and is left alone).

Cheap enough for every line a command prints: a line without any of the
:data:`TRIGGERS` (``://``, ``pass``, ``key`` ...) is returned as it is after
one lower-casing and a few substring searches, and every pattern is linear
(no nested or unbounded repeat that could backtrack over a 64 KiB line).
Imports only :mod:`re`: the daemon's and ``exec``'s paths load it.
"""

from __future__ import annotations

import re

#: Shown instead of a secret.
HIDDEN = "***"
#: Shown instead of a word cut off at the start or the end of a kept piece
#: of output, when it could be part of a credential.
CUT = "…"

#: Lower-case strings one of which a text must hold to hold a credential.
TRIGGERS = ("://", "pass", "pwd", "secret", "token", "key", "credential", "auth",
            "cookie", "sig")
_TRIGGERS_B = tuple(t.encode() for t in TRIGGERS)

#: Matched against the text lower-cased (ASCII letters only, so that every
#: index stays the original's): ``re.IGNORECASE`` is 5 times slower.
_KEYWORD = (r"(?:passw(?:or)?d|pwd|secret|(?<!fencing_)token|api[_-]?key|access[_-]?key"
            r"|private[_-]?key|credential)")
#: A value: quoted (the closing quote may be missing), or up to a space,
#: ``&`` or a quote.
_VALUE = r"(?:'[^'\n]{0,4096}+'?|\"[^\"\n]{0,4096}+\"?|[^\s&'\"]{1,4096}+)"

#: Each pattern: what comes before the secret, then the secret (group
#: ``secret``). Possessive repeats (``{0,64}+``) never give back what they
#: took: a keyword followed by 64 KiB of letters or spaces is looked at once.
PATTERNS = (
    # NAME=value, name = 'value' (libpq), --password=value, ?token=value;
    # JSON's "password": "value".
    re.compile(rf"{_KEYWORD}[\w.-]{{0,64}}+"
               rf"(?:[ \t]{{0,64}}+=[ \t]{{0,64}}+|\"[ \t]{{0,64}}+:[ \t]{{0,64}}+)"
               rf"(?P<secret>{_VALUE})"),
    # Query parameters whose name alone says secret: ?key=, &sig=.
    re.compile(rf"[?&;](?:key|sig|signature|auth)=(?P<secret>{_VALUE})"),
    # Headers: Authorization: Bearer value.
    re.compile(r"(?:authorization|cookie|x-api-key|x-auth-token)[ \t]{0,64}+:[ \t]{0,64}+"
               r"(?:(?:bearer|basic|token|digest|negotiate|ntlm)[ \t]{1,64}+)?"
               r"(?P<secret>[^\r\n'\"]{1,4096}+)"),
)
_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")

#: A URL's ``://user:``: what is after it up to the last ``@`` of the word is its password.
_USERINFO = re.compile(r"://[^\s:/@]{0,256}:")
#: The end of a word.
_SPACE = re.compile(r"\s")
#: The longest word looked through for a URL's ``@``.
_WORD = 4096


def text(value: str) -> str:
    """``value`` with every credential hidden (see the module's list)."""
    low = value.translate(_LOWER)
    if not any(t in low for t in TRIGGERS):
        return value
    spans = _userinfo(value) if "://" in value else []
    for pattern in PATTERNS:
        spans += [m.span("secret") for m in pattern.finditer(low)]
    if not spans:
        return value
    out: list[str] = []
    at = 0
    for start, end in sorted(spans):
        if start < at or start == end:  # overlaps the secret before it (hidden), or empty
            at = max(at, end)
            continue
        out += [value[at:start], HIDDEN]
        at = end
    out.append(value[at:])
    return "".join(out)


def data(value: bytes) -> bytes:
    """:func:`text` of bytes (a command's output as read): bytes that are
    not UTF-8 are kept as they are."""
    low = value.lower()
    if not any(t in low for t in _TRIGGERS_B):
        return value
    return text(value.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


def _userinfo(value: str) -> list[tuple[int, int]]:
    """The password of each ``://user:password@``, up to the word's last
    ``@`` (a password may hold ``@``, ``/`` and ``?``)."""
    spans = []
    at = 0
    while (found := _USERINFO.search(value, at)) is not None:
        start = found.end()
        space = _SPACE.search(value, start, start + _WORD)
        end = space.start() if space is not None else min(len(value), start + _WORD)
        last = value.rfind("@", start, end)
        if last < 0:  # no password; nor has another ``://user:`` of this word
            at = end
            continue
        spans.append((start, last))
        at = last
    return spans


# -- a database URL -------------------------------------------------------------------

_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.S)
# As SQLAlchemy splits it: the password runs from the first ':' to the next '@'
# and may hold '/' (``u:ab/cd@host``), so redact exactly what it will use.
_PASSWORD = re.compile(r"^(?P<user>[^:/@]*):(?P<password>[^@]*)@")
# libpq's connection string: ``host=db password=secret`` or ``password = 'a b\'c'``.
_KEYWORD_PASSWORD = re.compile(r"(?i)\b(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)")
# Something that is not a URL but holds an '@' (``u:pw@host``,
# ``postgresql:/u:pw@host``): everything after the user's first ':' up to the
# last '@' is taken for the password, so that more is hidden, never less.
_MALFORMED = re.compile(r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*:?/+)?(?P<user>[^:@]*):.*@",
                        re.S)


def url(value: str) -> str:
    """The database URL ``value`` with any password replaced by ``***``; in a
    libpq ``key=value`` string, the value of ``password``."""
    match = _URL.match(value)
    if not match:
        return _malformed(_KEYWORD_PASSWORD.sub(r"\1***", value))
    rest = match.group("rest")
    # A password may hold '?' and '/' (SQLAlchemy reads it up to the first
    # '@'), and an unescaped '@' (``u:p@ss@host``): hide up to the last '@'
    # before the query that follows it, so that more is hidden, never less.
    user = _PASSWORD.match(rest)
    if user is not None:
        query_at = rest.find("?", user.end())
        authority = rest if query_at < 0 else rest[:query_at]
        host = authority.rpartition("@")[2]
        rest = f"{user.group('user')}:***@{host}{rest[len(authority):]}"
    rest = re.sub(r"(?i)(password=)[^&]*", r"\1***", rest)
    return f"{match.group('scheme')}://{rest}"


def _malformed(value: str) -> str:
    if "@" not in value:
        return value
    head, _, host = value.rpartition("@")
    match = _MALFORMED.match(head + "@")
    if match is None:
        return value  # no ':' before the '@': a user name, no password
    return f"{match.group('head') or ''}{match.group('user')}:***@{host}"


# -- output cut into pieces ---------------------------------------------------------

#: What makes a word cut off at a cut look like part of a credential.
_CREDENTIAL_MARKS = (":", "=", "@")


class Pieces:
    """One stream of a command's output, piece by piece as read (a line, or
    a ``limit``-byte piece of a longer one), each redacted
    (:func:`data`). Where a line was cut into pieces, a credential may be
    split in two, each half unrecognisable: the word the cut ends is
    dropped (shown as :data:`CUT`) when it holds ``:``, ``=`` or ``@``, and
    then the word the next piece starts with too."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: The last piece's final word was dropped: drop the next one's first.
        self._dropped = False

    def __call__(self, piece: bytes) -> bytes:
        if self._dropped:
            piece = _drop_first_word(piece)
            self._dropped = False
        piece = data(piece)
        if len(piece) >= self.limit and not piece.endswith(b"\n"):
            head, space, word = piece.rpartition(b" ")
            word_text = word.decode("utf-8", "replace")
            if any(mark in word_text for mark in _CREDENTIAL_MARKS):
                piece = head + space + CUT.encode()
                self._dropped = True
        return piece


def _drop_first_word(piece: bytes) -> bytes:
    found = re.search(rb"\s", piece)
    return CUT.encode() + (piece[found.start():] if found is not None else b"")


def tail(value: str, cut: bool) -> str:
    """A stored output tail as shown: :func:`text`, and when the tail was
    ``cut`` (its start is not the output's), its first word dropped if it
    could be the end of a credential (holds ``:``, ``=`` or ``@``): a tail
    stored before the output was redacted as it was read may start inside
    one (``app:TopSecret99@db/x``)."""
    if cut:
        end = _SPACE.search(value)
        first = value[: end.start() if end is not None else len(value)]
        if any(mark in first for mark in _CREDENTIAL_MARKS):
            value = CUT + value[len(first):]
    return text(value)
