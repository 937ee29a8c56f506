"""Text from elsewhere (a command's output, the database, a jobs file) made
safe for a terminal or a text log: the one escaping function.

A control character (ESC, CR, BEL, DEL, the C1 range, NUL) or an invisible
formatting one (a bidirectional override) could set a window's title, clear
the screen, draw a fake hyperlink, erase a line and forge another, or (a
newline) forge a log line. Each is shown escaped instead, as Python writes it
(``\\x1b``, ``\\r``, ``\\u202e``); printable text, in any script, is left
alone. The JSON log needs none of this: each object is one line, its strings
escaped by the encoder.
"""

from __future__ import annotations

#: What multi-line text (``history --output``) keeps: its lines and tabs.
_LINES = "\n\t"


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character that is not printable escaped;
    ``lines``: newlines and tabs kept (a command's output shown as lines)."""
    if text.isprintable():  # the common case, at C speed
        return text
    keep = _LINES if lines else ""
    # repr's escape of a character that is not printable: \n, \x1b, \u202e...
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)
