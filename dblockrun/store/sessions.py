"""SQL of ``dblockrun web``'s signed-in sessions (SQLAlchemy Core, cold):
one row per session, keyed by a digest of the id its cookie holds
(dblockrun/web/sessions.py makes both), with whose it is and when it ends
on the database clock. Every web server on the database reads the same
rows, so a session signed out on one is gone on all, and its end is
absolute: no request moves it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from dblockrun.store.cold import ColdPath


class SessionStore:
    def __init__(self, store: ColdPath) -> None:
        self.s = store

    def start(self, key: str, username: str, lifetime: float) -> None:
        """A new session ``key`` of ``username``, ending ``lifetime`` seconds
        from now; the sessions that have ended are deleted with it."""
        sessions, now = self.s.t.sessions, self.s.now

        def go(conn: Connection) -> None:
            conn.execute(sessions.delete().where(sessions.c.ends <= now))
            conn.execute(sessions.insert().values(id=key, username=username, started=now,
                                                  ends=now + lifetime))

        self.s._run(go)

    def user(self, key: str) -> str | None:
        """Whose session ``key`` is, while it lasts; None: no such session,
        or it has ended or been signed out (one statement)."""
        sessions = self.s.t.sessions
        stmt = sa.select(sessions.c.username).where(sessions.c.id == key,
                                                    sessions.c.ends > self.s.now)
        return self.s._run(lambda c: c.execute(stmt).scalar())

    def end(self, key: str) -> bool:
        """Sign session ``key`` out; whether it was there."""
        sessions = self.s.t.sessions
        stmt = sessions.delete().where(sessions.c.id == key)
        return self.s._run(lambda c: c.execute(stmt).rowcount > 0)

    def end_user(self, username: str) -> int:
        """Sign ``username`` out everywhere; how many sessions ended."""
        sessions = self.s.t.sessions
        stmt = sessions.delete().where(sessions.c.username == username)
        return self.s._run(lambda c: int(c.execute(stmt).rowcount))
