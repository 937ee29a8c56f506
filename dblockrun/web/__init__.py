"""``dblockrun web``: a dashboard and a JSON API over the fleet's database.

Imported only by ``dblockrun web`` (Starlette, uvicorn, Jinja2 and argon2 are
the ``web`` extra): a daemon never loads this package. Every action calls the
operator commands' own functions (``dblockrun/ops``); the JSON is theirs too
(``ops/output.py``). Nothing here accepts a command or a job definition.
"""

from __future__ import annotations

#: The web extra's modules (pyproject.toml's ``web``), as imported.
EXTRA_MODULES = ("starlette", "uvicorn", "jinja2", "argon2", "itsdangerous", "multipart")
#: How to install them: by name (a release, or an index or wheelhouse that
#: has it), or from a checkout (dblockrun is not on PyPI yet).
INSTALL = "pip install 'dblockrun[web]', or in a checkout: pipx install --force '.[web]'"


def missing_extra() -> str | None:
    """The first module of the web extra that cannot be imported, or None."""
    from importlib import import_module

    for name in EXTRA_MODULES:
        try:
            import_module(name)
        except ImportError:
            return name
    return None
