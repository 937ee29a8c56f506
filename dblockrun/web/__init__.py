"""``dblockrun web``: a dashboard and a JSON API over the fleet's database.

Imported only by ``dblockrun web`` (Starlette, uvicorn, Jinja2 and argon2 are
the ``web`` extra): a daemon never loads this package. Every action calls the
operator commands' own functions (``dblockrun/ops``); the JSON is theirs too
(``ops/output.py``). Nothing here accepts a command or a job definition.
"""
