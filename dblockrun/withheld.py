"""The variables of this process's environment that hold its secrets, which
no command inherits (dblockrun/running/runjob.py ``inherited_env``): the database
URL and its file (``DBLOCKRUN_DB*``), the dashboard's session key
(``DBLOCKRUN_WEB_SECRET``), and every variable a notification or
ping URL is read from (``{env: VAR}``, registered by
:mod:`dblockrun.config.secreturl` as it reads one; a reload adds names, none is
dropped). Its own module: ``exec`` starts faster without secreturl's."""

from __future__ import annotations

#: The daemon's database URL and its file (dblockrun/store/dburl.py).
DATABASE_VARS = "DBLOCKRUN_DB"
#: ``dblockrun web``'s session key (dblockrun/web/serve.py).
WEB_SECRET = "DBLOCKRUN_WEB_SECRET"

_SECRETS: set[str] = set()
#: Bumped when a name is added: what was filtered before may pass no more.
_generation = 0


def add(name: str) -> None:
    """The variable ``name`` holds a secret: no command gets it from now on."""
    global _generation
    if name not in _SECRETS:
        _SECRETS.add(name)
        _generation += 1


def generation() -> int:
    """Changes whenever a name is added: a filter kept from before is stale."""
    return _generation


def withheld(name: str) -> bool:
    """Whether the variable ``name`` holds one of this process's secrets."""
    return name.startswith(DATABASE_VARS) or name == WEB_SECRET or name in _SECRETS
