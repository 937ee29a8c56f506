"""What the dashboard's tests share: a users file, and an app over a test database."""

from __future__ import annotations

import re
from pathlib import Path

from starlette.applications import Starlette

from dblockrun.store import Store
from dblockrun.web.app import create_app
from dblockrun.web.context import WebConfig
from dblockrun.web.users import hash_password, load_users, token_hash

PASSWORD = "correct horse battery staple"
#: An API token per role.
TOKENS = {"vera": "viewer-token-" + "v" * 32, "olga": "operator-token-" + "o" * 32,
          "adam": "admin-token-" + "a" * 32}
ROLE = {"vera": "viewer", "olga": "operator", "adam": "admin"}


def users_file(path: Path) -> Path:
    """A users file: vera (viewer), olga (operator), adam (admin), each with
    :data:`PASSWORD` and a token of :data:`TOKENS`."""
    digest = hash_password(PASSWORD)
    path.write_text("users:\n" + "".join(
        f"  - name: {name}\n    role: {ROLE[name]}\n    password: '{digest}'\n"
        f"    token-sha256: {token_hash(token)}\n" for name, token in TOKENS.items()))
    return path


def web_config(store: Store, users: Path | None) -> WebConfig:
    return WebConfig(store=store, users=None if users is None else load_users(str(users)))


def app_for(store: Store, users: Path | None) -> Starlette:
    return create_app(web_config(store, users))


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html[:500]
    return found.group(1)


def bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}
