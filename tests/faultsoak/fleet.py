"""The soak's hosts: real `dblockrun daemon` processes (tests/harness.py),
each behind a TCP proxy of its own (to cut its database) and under
libfaketime with a clock file of its own (to shift its clock while it runs)."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from faketime import DAEMON_MAIN
from harness import Fleet, Process
from proxy import Proxy

from faultsoak.workload import GRACE, HEARTBEAT, LEASE


def server_port(url: str) -> int:
    return 5432 if url.startswith("postgresql") else 3306


@dataclass
class Host:
    """One host of the fleet: its name (the `hostname` label), proxy, clock
    file, log, and its current process (None while the nemesis has it down)."""

    name: str
    proxy: Proxy
    clock: Path
    log: Path
    process: Process | None = None
    starts: int = 0
    #: Exit statuses of processes that ended other than by the nemesis's kill -9.
    exits: list[int] = field(default_factory=list)

    def signal(self, sig: signal.Signals) -> None:
        if self.process is not None:
            self.process.send(sig)

    def ready(self) -> bool:
        """Its process is up and handles signals (it logged that it starts)."""
        if self.process is None or not self.process.alive():
            return False
        text = self.log.read_text(errors="replace")
        return " starting: " in text[text.rfind(f"--- soak: start {self.starts} of "):]

    def shift_clock(self, seconds: float) -> None:
        """libfaketime reads the file again within FAKETIME_CACHE_DURATION."""
        self.clock.write_text(f"{seconds:+g}s\n")


class Hosts:
    """The soak's hosts, their daemons started on a harness Fleet."""

    def __init__(self, url: str, prefix: str, workdir: Path, size: int, jobs: Path,
                 command_log: Path, faketime: str) -> None:
        self.url = url
        self.workdir = workdir
        self.jobs = jobs
        self.command_log = command_log
        self.faketime = faketime
        self.fleet = Fleet(None, workdir, url=url, prefix=prefix, heartbeat=f"{HEARTBEAT:g}s",
                           lease=f"{LEASE:g}s", grace=f"{GRACE:g}s")
        self.hosts = [
            Host(f"d{i + 1}", Proxy(server_port(url)), workdir / f"d{i + 1}.clock",
                 workdir / f"d{i + 1}.log")
            for i in range(size)
        ]
        for h in self.hosts:
            h.shift_clock(0)

    def start(self, h: Host) -> None:
        assert h.process is None or not h.process.alive()
        env = {
            **{k: v for k, v in os.environ.items()
               if not k.startswith(("DBLOCKRUN_", "FAKETIME"))},
            "LD_PRELOAD": self.faketime,
            "FAKETIME_TIMESTAMP_FILE": str(h.clock),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONUNBUFFERED": "1",
            "SOAK_HOST": h.name,
            "SOAK_LOG": str(self.command_log),
            "SOAK_DIR": str(self.workdir),
        }
        h.starts += 1
        with h.log.open("ab") as err:
            err.write(f"--- soak: start {h.starts} of {h.name}\n".encode())
        h.process = self.fleet.start(
            self.jobs, "--label", f"hostname={h.name}", url=h.proxy.url_for(self.url),
            log=h.log, append=True, program=[sys.executable, "-c", DAEMON_MAIN], env=env,
            cwd=Path(__file__).resolve().parents[2])

    def kill(self, h: Host) -> None:
        """kill -9, and reap it."""
        if h.process is not None:
            if not h.process.alive():
                h.exits.append(h.process.kill())
            else:
                h.process.kill()
            h.process = None

    def reload(self) -> None:
        """SIGHUP to each daemon that handles it yet (one still starting reads
        the new file anyway)."""
        for h in self.hosts:
            if h.ready():
                h.signal(signal.SIGHUP)

    def heal(self) -> None:
        """Every daemon up, running, connected, on the real clock."""
        for h in self.hosts:
            h.proxy.restore()
            h.shift_clock(0)
            h.signal(signal.SIGCONT)
            if h.process is None or not h.process.alive():
                if h.process is not None:
                    h.exits.append(h.process.kill())
                h.process = None
                self.start(h)

    def stop(self, timeout: float = 30) -> dict[str, int | None]:
        """SIGTERM every daemon; their exit statuses (None: killed after ``timeout``)."""
        for h in self.hosts:
            h.signal(signal.SIGCONT)
            h.signal(signal.SIGTERM)
        return {h.name: h.process.stop(timeout, signalled=True) for h in self.hosts
                if h.process is not None}

    def close(self) -> None:
        self.fleet.close()
        for h in self.hosts:
            h.proxy.close()
