"""The procrastinate side of bench/peer.py: one worker process.

    python bench/peer_app.py CONNINFO TASKS CRON OUT NAME [CONCURRENCY]

Registers one task, ``tick``, as TASKS periodic schedules of CRON
(procrastinate's cron: 5 fields, or 6 with SECONDS LAST; periodic ids
``p0``..``p<TASKS-1>``), then runs a worker named NAME until SIGTERM. The
task's first instruction reads the wall clock; it then appends one line
``<time> p-<n> <timestamp> <NAME>`` to OUT with a single O_APPEND write
(``timestamp`` is the scheduled instant procrastinate passes to periodic
tasks).
"""

from __future__ import annotations

import os
import sys
import time

import procrastinate


def build(conninfo: str, tasks: int, cron: str, out: str, name: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @app.task(name="tick")
    async def tick(timestamp: int, n: int) -> None:
        t = time.time()
        os.write(fd, f"{t:.6f} p-{n} {timestamp} {name}\n".encode())

    for i in range(tasks):
        app.periodic(cron=cron, periodic_id=f"p{i}", task_kwargs={"n": i})(tick)
    return app


def main() -> None:
    conninfo, tasks, cron, out, name = sys.argv[1:6]
    concurrency = int(sys.argv[6]) if len(sys.argv) > 6 else 1
    app = build(conninfo, int(tasks), cron, out, name)
    app.run_worker(name=name, concurrency=concurrency)


if __name__ == "__main__":
    main()
