"""Who may use the dashboard: the users file, roles, passwords and API tokens.

The file is YAML::

    users:
      - name: alice
        role: operator            # viewer | operator | admin
        password: "$argon2id$..."  # `dblockrun web hash-password`
        token-sha256: "9f86d0..."  # sha256 of an API token (`hash-password --token`)

Passwords are argon2id hashes (argon2-cffi); API tokens are long random
strings, so their SHA-256 is enough and costs nothing per request.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass

import yaml

from dblockrun.errors import ConfigError
from dblockrun.secretfile import whole_text

ROLES = ("viewer", "operator", "admin")
KEYS = {"name", "role", "password", "token-sha256"}
#: The largest users file read, in bytes.
USERS_LIMIT = 1024 * 1024


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password: str | None = None
    token_sha256: str | None = None

    def can(self, role: str) -> bool:
        """Whether this user has ``role`` or a higher one."""
        return ROLES.index(self.role) >= ROLES.index(role)


def load_users(path: str) -> dict[str, User]:
    """The users of ``path`` by name; ConfigError naming file, line and key."""
    try:  # a regular file only, bounded: a named pipe would hold the start for good
        text = whole_text(path, USERS_LIMIT)
    except ValueError as exc:
        raise ConfigError(f"{path}: the users file: {exc}") from None
    try:
        doc = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from None
    if not isinstance(doc, yaml.MappingNode):
        raise ConfigError(f"{path}:1: the users file is a mapping with `users:`")
    entries = next((v for k, v in doc.value if k.value == "users"), None)
    if not isinstance(entries, yaml.SequenceNode):
        raise ConfigError(f"{path}:1: users: a list of users is needed")
    users: dict[str, User] = {}
    for node in entries.value:
        line = node.start_mark.line + 1
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(f"{path}:{line}: a user is a mapping (name, role, password)")
        fields: dict[str, str] = {}
        for key, value in node.value:
            where = f"{path}:{key.start_mark.line + 1}: {key.value}"
            if key.value not in KEYS:
                raise ConfigError(f"{where}: unknown key (known: {', '.join(sorted(KEYS))})")
            if not isinstance(value, yaml.ScalarNode) or not str(value.value):
                raise ConfigError(f"{where}: a string is needed")
            fields[key.value] = str(value.value)
        name = fields.get("name")
        if not name:
            raise ConfigError(f"{path}:{line}: name: missing")
        role = fields.get("role", "viewer")
        if role not in ROLES:
            raise ConfigError(f"{path}:{line}: user {name}: role: {role!r} is not one of "
                              f"{', '.join(ROLES)}")
        password, token = fields.get("password"), fields.get("token-sha256")
        if password is None and token is None:
            raise ConfigError(f"{path}:{line}: user {name}: password or token-sha256 needed")
        if password is not None and not password.startswith("$argon2"):
            raise ConfigError(f"{path}:{line}: user {name}: password: not an argon2 hash "
                              "(make one with `dblockrun web hash-password`)")
        if token is not None and (len(token) != 64 or not _hex(token)):
            raise ConfigError(f"{path}:{line}: user {name}: token-sha256: not 64 hex digits")
        if name in users:
            raise ConfigError(f"{path}:{line}: user {name}: named twice")
        users[name] = User(name, role, password, token.lower() if token else None)
    return users


def _hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def hash_password(password: str) -> str:
    from argon2 import PasswordHasher

    return PasswordHasher().hash(password)


def new_token() -> tuple[str, str]:
    """A new API token and its SHA-256 (what the users file holds)."""
    token = secrets.token_urlsafe(32)
    return token, token_hash(token)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@functools.cache
def _nobody() -> str:
    """A hash to check an unknown name's password against: it takes as long
    as a known one's, so the time does not say which names exist."""
    return hash_password(secrets.token_urlsafe(16))


def check_password(user: User | None, password: str) -> bool:
    from argon2 import PasswordHasher
    from argon2.exceptions import InvalidHashError, VerificationError

    digest = user.password if user is not None and user.password else _nobody()
    try:
        return PasswordHasher().verify(digest, password) and user is not None \
            and user.password is not None
    except (VerificationError, InvalidHashError):
        return False


def user_of_token(users: dict[str, User], token: str) -> User | None:
    digest = token_hash(token)
    found = None
    for user in users.values():  # compare with every one: the time says nothing
        if user.token_sha256 is not None and hmac.compare_digest(user.token_sha256, digest):
            found = user
    return found
