"""The soak's fleet: real `dblockrun daemon` processes, each behind a TCP
proxy of its own (to cut its database) and under libfaketime with a clock
file of its own (to shift its clock while it runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from faketime import DAEMON_MAIN
from proxy import Proxy

from faultsoak.workload import GRACE, HEARTBEAT, LEASE


def server_port(url: str) -> int:
    return 5432 if url.startswith("postgresql") else 3306


@dataclass
class Daemon:
    """One host of the fleet: its name (the `hostname` label), proxy, clock
    file, log, and its current process (None while the nemesis has it down)."""

    name: str
    proxy: Proxy
    clock: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: Exit statuses of processes that ended other than by the nemesis's kill -9.
    exits: list[int] = field(default_factory=list)

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def ready(self) -> bool:
        """Its process is up and handles signals (it logged that it starts)."""
        if self.proc is None or self.proc.poll() is not None:
            return False
        text = self.log.read_text(errors="replace")
        return " starting: " in text[text.rfind(f"--- soak: start {self.starts} of "):]

    def shift_clock(self, seconds: float) -> None:
        """libfaketime reads the file again within FAKETIME_CACHE_DURATION."""
        self.clock.write_text(f"{seconds:+g}s\n")


class Fleet:
    def __init__(self, url: str, prefix: str, workdir: Path, size: int, jobs: Path,
                 command_log: Path, faketime: str) -> None:
        self.url = url
        self.prefix = prefix
        self.workdir = workdir
        self.jobs = jobs
        self.command_log = command_log
        self.faketime = faketime
        self.daemons = [
            Daemon(f"d{i + 1}", Proxy(server_port(url)), workdir / f"d{i + 1}.clock",
                   workdir / f"d{i + 1}.log")
            for i in range(size)
        ]
        for d in self.daemons:
            d.shift_clock(0)

    def start(self, d: Daemon) -> None:
        assert d.proc is None or d.proc.poll() is not None
        cmd = [sys.executable, "-c", DAEMON_MAIN, "--db", d.proxy.url_for(self.url),
               "--table-prefix", self.prefix, "daemon", str(self.jobs),
               "--heartbeat", f"{HEARTBEAT:g}s", "--lease", f"{LEASE:g}s",
               "--grace", f"{GRACE:g}s", "--label", f"hostname={d.name}"]
        env = {
            **{k: v for k, v in os.environ.items()
               if not k.startswith(("DBLOCKRUN_", "FAKETIME"))},
            "LD_PRELOAD": self.faketime,
            "FAKETIME_TIMESTAMP_FILE": str(d.clock),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "PYTHONUNBUFFERED": "1",
            "SOAK_HOST": d.name,
            "SOAK_LOG": str(self.command_log),
            "SOAK_DIR": str(self.workdir),
        }
        d.starts += 1
        with d.log.open("ab") as err:
            err.write(f"--- soak: start {d.starts} of {d.name}\n".encode())
            err.flush()
            d.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                      cwd=Path(__file__).resolve().parents[2])

    def kill(self, d: Daemon) -> None:
        """kill -9, and reap it."""
        if d.proc is not None:
            if d.proc.poll() is not None:
                d.exits.append(d.proc.returncode)
            d.proc.kill()
            d.proc.wait()
            d.proc = None

    def reload(self) -> None:
        """SIGHUP to each daemon that handles it yet (one still starting reads
        the new file anyway)."""
        for d in self.daemons:
            if d.ready():
                d.signal(signal.SIGHUP)

    def heal(self) -> None:
        """Every daemon up, running, connected, on the real clock."""
        for d in self.daemons:
            d.proxy.restore()
            d.shift_clock(0)
            d.signal(signal.SIGCONT)
            if d.proc is None or d.proc.poll() is not None:
                if d.proc is not None:
                    d.exits.append(d.proc.returncode)
                d.proc = None
                self.start(d)

    def stop(self, timeout: float = 30) -> dict[str, int | None]:
        """SIGTERM every daemon; their exit statuses (None: killed after ``timeout``)."""
        for d in self.daemons:
            d.signal(signal.SIGCONT)
            d.signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for d in self.daemons:
            if d.proc is None:
                continue
            try:
                codes[d.name] = d.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
                codes[d.name] = None
        return codes

    def close(self) -> None:
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.send_signal(signal.SIGCONT)
                d.proc.kill()
                d.proc.wait()
            d.proxy.close()
