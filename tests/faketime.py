"""Running a dblockrun daemon under libfaketime, its wall clock shifted
(tests/test_skew.py, the fault soak in tests/faultsoak/)."""

from __future__ import annotations

import shutil
import subprocess

FAKETIME_PACKAGE = "libfaketime"
FAKETIME_LIB = "libfaketime.so.1"

# libfaketime 0.9.10 (Debian 12) and Python 3.11 do not mix as they are:
# - with the monotonic clock faked too (the default), libfaketime reports
#   CLOCK_MONOTONIC on the wall-clock scale, but does not intercept
#   sem_clockwait(), which Python 3.11 uses for every timed lock wait
#   (threading.Event.wait...): those waits hang (wolfcw/libfaketime#390);
# - with FAKETIME_DONT_FAKE_MONOTONIC=1 (the realistic setting: a skewed wall
#   clock says nothing about the monotonic one), its clock_nanosleep() wrapper
#   still shifts the absolute CLOCK_MONOTONIC deadline that Python 3.11's
#   time.sleep() passes, so every time.sleep() fails with EINVAL
#   (wolfcw/libfaketime#426).
# So the daemons run with the monotonic clock real and this prelude, which puts
# back the select()-based time.sleep() of Python 3.10 and earlier; dblockrun
# itself is imported and run unchanged.
DAEMON_PRELUDE = """\
import runpy, select, time
def _sleep(secs, _mono=time.monotonic, _select=select.select):
    deadline = _mono() + secs
    while (left := deadline - _mono()) > 0:
        _select([], [], [], left)
time.sleep = _sleep
"""
DAEMON_MAIN = DAEMON_PRELUDE + "runpy.run_module('dblockrun', run_name='__main__')\n"


def find_faketime() -> str | None:
    """The path of libfaketime.so.1 (from `dpkg -L libfaketime`), None: not installed."""
    if shutil.which("dpkg") is None:
        return None
    listing = subprocess.run(["dpkg", "-L", FAKETIME_PACKAGE], capture_output=True, text=True)
    paths = [p for p in listing.stdout.splitlines() if p.endswith("/" + FAKETIME_LIB)]
    return paths[0] if listing.returncode == 0 and paths else None
