"""The web server's jobs file (``-f``), read again on SIGHUP and when it
changes, by the daemon's own reload (dblockrun/daemon/reload.py): the same
validation, the same log lines, and the same rule: a file with an error is
logged and the one read before stays shown. The Job page then shows the
definitions the daemons reloaded, and compares their hashes with them.

The watch is the daemon's ``--watch-file`` (a ``stat`` once a second:
ConfigMap symlink swaps, renames and edits in place); SIGHUP's handler only
starts the read in a thread of its own, so that the server's event loop
never waits for a file."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dblockrun.daemon.reload import FileWatch, reloaded, reread
from dblockrun.jobs import JobsFile

log = logging.getLogger("dblockrun")


class JobsReload:
    """Keeps the server's jobs file (``get``) the file as it is now: ``put``
    replaces it whole, so a page reads one file or the other, never half."""

    def __init__(self, get: Callable[[], JobsFile | None], put: Callable[[JobsFile], None],
                 read: Callable[[str], JobsFile] | None = None, every: float | None = None
                 ) -> None:
        from dblockrun.config.load import load_jobs
        from dblockrun.daemon.reload import WATCH_EVERY

        self._get, self._put = get, put
        self._read = read or load_jobs
        self._lock = threading.Lock()
        jobs = get()
        self._watch = None if jobs is None else FileWatch(
            lambda: jobs.path, self.reload, every=every or WATCH_EVERY)

    def start(self) -> None:
        if self._watch is not None:
            self._watch.start()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def reload(self) -> None:
        """Read the file again (one reload at a time); keep the old on error."""
        with self._lock:
            before = self._get()
            if before is None:
                return
            after = reread(before, self._read)
            if after is not None:
                self._put(after)
                reloaded(before, after)

    def on_sighup(self, _signum: int) -> None:
        """SIGHUP's handler: the reload, in a thread (never in the event loop)."""
        if self._get() is None:
            log.info("SIGHUP: no jobs file to read again (start with -f FILE)")
            return
        threading.Thread(target=self.reload, name="reload", daemon=True).start()
