"""A job name for a shell command: the program it runs (``dblockrun import-crontab``).

``cd /srv && ./backup.sh --all`` is ``backup.sh``; Debian's certbot line ``test -x
/usr/bin/certbot && perl -e 'sleep int(rand(43200))' && certbot -q renew`` is
``certbot-renew``; ``/usr/bin/php /var/www/cron.php`` is ``cron.php``.

The command is cut into simple commands at ``;``, ``&&``, ``||``, ``|`` and
``&`` (quotes respected). In each, ``VAR=value`` words, shell keywords (``if``,
``then``, ``{`` ...) and wrappers (``nice``, ``timeout 10``, ``flock FILE``,
``sudo -u www-data``, ``env`` ...) are skipped; an interpreter gives way to its
script (``python3 -m app``: ``app``) and a shell's ``-c`` to the code it runs.
The name is the program's basename, and its subcommand when the next argument
is a plain word (``certbot renew``, ``apt-get update``). ``run-parts DIR`` is
named after DIR, ``dblockrun exec --name N`` is ``N`` (the same lock). Set-up
commands (``cd``, ``test``, ``sleep``, ``source`` ...) and inline code
(``perl -e``) name the job only when nothing else does.
"""

from __future__ import annotations

import re
import shlex

_SEPARATORS = {";", "&&", "||", "|", "&", "|&", ";;"}
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
             "(", ")", "time", "exec", "command", "builtin", "nohup", "setsid", "chronic",
             "cronic", "run-one", "caffeinate", "systemd-cat"}
_SETUP = {"cd", "test", "[", "[[", "]", "true", ":", "sleep", "export", "set", "umask",
          "source", ".", "ulimit", "unset", "echo", "printf", "mkdir", "false"}
# Wrappers that run the rest of their words: options taking a value, positional words.
_WRAPPERS: dict[str, tuple[frozenset[str], int]] = {
    "nice": (frozenset({"-n", "--adjustment"}), 0),
    "ionice": (frozenset({"-c", "-n", "--class", "--classdata"}), 0),
    "timeout": (frozenset({"-s", "-k", "--signal", "--kill-after"}), 1),
    "flock": (frozenset({"-w", "-E", "--timeout", "--conflict-exit-code"}), 1),
    "env": (frozenset({"-u", "-C", "--unset", "--chdir"}), 0),
    "sudo": (frozenset({"-u", "-g", "-C", "-D", "-h", "-p", "-R", "-T", "-U", "--user"}), 0),
    "stdbuf": (frozenset({"-i", "-o", "-e"}), 0),
    "xargs": (frozenset({"-n", "-I", "-d", "-P", "-L", "-a", "-s", "-E"}), 0),
}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "su"}
# Interpreters: (options followed by inline code, options taking a value).
_INTERPRETERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "python": (frozenset({"-c"}), frozenset({"-W", "-X"})),
    "perl": (frozenset({"-e", "-E"}), frozenset({"-I", "-M"})),
    "ruby": (frozenset({"-e"}), frozenset({"-I", "-r"})),
    "node": (frozenset({"-e", "-p", "--eval"}), frozenset({"-r", "--require"})),
    "php": (frozenset({"-r"}), frozenset({"-d", "-c", "-z"})),
}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
_REDIRECT = re.compile(r"[0-9]*[<>&]+[0-9-]*")
_VERSION = re.compile(r"[0-9.]*$")  # python3.11 is python
_SHELL_CODE = re.compile(r"-[a-z]*c[a-z]*|--command")
_SUBCOMMAND = re.compile(r"[a-z][a-z0-9]*(?:[-_:][a-z0-9]+)*")


def program_name(command: str) -> str:
    """The name of the program ``command`` runs (may be empty; see the module doc)."""
    fallback = ""
    for words in _simple_commands(command):
        name, strong = _name(words)
        if strong:
            return name
        fallback = fallback or name
    return fallback


def _simple_commands(command: str) -> list[list[str]]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # an unclosed quote: plain words will do
        tokens = command.split()
    commands: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [words for words in commands if words]


def _name(words: list[str]) -> tuple[str, bool]:
    """The name of the simple command ``words``, and whether it is the real work."""
    index = 0
    while index < len(words):
        word, base = words[index], _base(words[index])
        if word in _KEYWORDS or _ASSIGNMENT.fullmatch(word):
            index += 1
        elif _REDIRECT.fullmatch(word):
            index += 2
        elif base in _WRAPPERS:
            index = _after_options(words, index + 1, *_WRAPPERS[base])
        elif base in _SETUP:
            return base, False
        elif not base:  # a directory (`/usr/bin/ x`): not a program
            return "", False
        elif word.startswith("$"):
            return word.strip("${}").lower().replace("_", "-"), False
        elif base in _SHELLS or _VERSION.sub("", base) in _INTERPRETERS:
            return _interpreted(words, index)
        else:
            return _with_subcommand(base, words, index + 1), True
    return "", False


def _interpreted(words: list[str], index: int) -> tuple[str, bool]:
    """``python3 x.py``, ``bash -c 'code'``, ``python -m app``: the script or the code's program."""
    base = _base(words[index])
    kind = _VERSION.sub("", base)
    code, valued = _INTERPRETERS.get(kind, (frozenset(), frozenset()))
    position = index + 1
    while position < len(words):
        word = words[position]
        following = words[position + 1] if position + 1 < len(words) else ""
        if base in _SHELLS and _SHELL_CODE.fullmatch(word):
            inner = program_name(following)
            return (inner, True) if inner else (base, False)
        if word in code:
            return base, False
        if (kind, word) in (("python", "-m"), ("php", "-f")):
            position += 1  # the module or the script follows
        elif word in valued:
            position += 2
            continue
        elif word.startswith("-") or base == "su":  # su's own words: options and a user
            position += 1
            continue
        script = words[position] if position < len(words) else ""
        return (_with_subcommand(_base(script), words, position + 1), True) if script else (
            base, False)
    return base, True


def _with_subcommand(name: str, words: list[str], index: int) -> str:
    """``name``, with its first argument after options if that is a plain word (``renew``)."""
    args = words[index:]
    positional = [word for word in args if not word.startswith("-")]
    if name == "run-parts" and positional:
        return f"{name}-{_base(positional[-1])}"
    if name == "dblockrun" and positional[:1] == ["exec"]:
        return _lock_name(args) or name
    if positional and _SUBCOMMAND.fullmatch(positional[0]):
        return f"{name}-{positional[0]}"
    return name


def _lock_name(words: list[str]) -> str:
    for position, word in enumerate(words):
        if word == "--":
            break
        if word.startswith("--name="):
            return word.removeprefix("--name=")
        if word in ("--name", "-n") and position + 1 < len(words):
            return words[position + 1]
    return ""


def _after_options(words: list[str], index: int, valued: frozenset[str], positional: int) -> int:
    """The index of the command a wrapper runs, past its options and ``positional`` words."""
    while index < len(words):
        word = words[index]
        if word == "--":
            return index + 1
        if word in valued:
            index += 2
        elif word.startswith("-") or _ASSIGNMENT.fullmatch(word):
            index += 1
        elif positional:
            positional -= 1
            index += 1
        else:
            break
    return index


def _base(word: str) -> str:
    return word.rsplit("/", 1)[-1]
