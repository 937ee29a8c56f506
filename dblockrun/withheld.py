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


def add(name: str) -> None:
    """The variable ``name`` holds a secret: no command gets it from now on."""
    _SECRETS.add(name)


def withheld(name: str) -> bool:
    """Whether the variable ``name`` holds one of this process's secrets."""
    return name.startswith(DATABASE_VARS) or name == WEB_SECRET or name in _SECRETS
