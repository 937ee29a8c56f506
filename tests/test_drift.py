"""Config drift: two daemons on one database whose jobs files disagree.

Both files define `drifted` (with different commands) and `same` (identical).
Each daemon publishes its jobs' definition hashes with its heartbeat; within a
few heartbeats each one logs a warning naming `drifted` and the other host, and
`dblockrun status` shows the drift: `"drift": true` with two `"definitions"` in
`--json`, and `warning: job drifted is defined differently` for people. `same`
is never reported. When one daemon stops, the drift is gone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness import Fleet
from helpers import TestDb, invoke, wait_for

from dblockrun.store import Store

HEARTBEAT = 1.0
#: "Within a few heartbeats" of both daemons being registered.
WARN_WITHIN = 5 * HEARTBEAT

# Both jobs fire once a year: nothing runs during the test.
JOBS = """\
jobs:
  drifted:
    cron: "0 0 1 1 *"
    command: echo {version}
  same:
    cron: "0 0 1 1 *"
    command: echo same everywhere
"""
DRIFT_WARNING = "job drifted: defined differently on "


def status(db: TestDb, *args: str) -> str:
    """`dblockrun status ARGS`, in-process (the daemons are the processes)."""
    res = invoke("--db", db.url, "--table-prefix", db.prefix, "status", *args)
    assert res.returncode == 0, f"status {args} exited {res.returncode}: {res.stderr}"
    return res.stdout


def jobs_by_name(db: TestDb) -> dict[str, dict[str, Any]]:
    doc = json.loads(status(db, "--json"))
    return {job["name"]: job for job in doc["jobs"]}


def drift_warnings(log: Path) -> list[str]:
    return [line for line in log.read_text().splitlines() if "defined differently" in line]


@pytest.mark.slow
def test_daemons_warn_about_and_status_shows_config_drift(
        db: TestDb, tmp_path: Path, fleet: Fleet) -> None:
    files = []
    for version in ("version-a", "version-b"):
        path = tmp_path / f"jobs-{version}.yaml"
        path.write_text(JOBS.format(version=version))
        files.append(path)
    procs = [fleet.start(f, name=f"daemon-{v}", heartbeat=f"{HEARTBEAT:g}s",
                         lease=f"{3 * HEARTBEAT:g}s") for f, v in zip(files, "ab", strict=True)]
    logs = [d.log for d in procs]
    try:
        with Store(db.url, db.prefix) as store:
            wait_for(lambda: len(store.hosts(seen_within=30)) == 2
                     or any(not p.alive() for p in procs),
                     30, what="2 daemons registered")
        assert all(p.alive() for p in procs), "a daemon died during startup"

        # Each daemon warns about `drifted`, naming the other daemon.
        for log, other in ((logs[0], procs[1]), (logs[1], procs[0])):

            def warned(log: Path = log) -> str | None:
                return next((w for w in drift_warnings(log) if DRIFT_WARNING in w), None)

            line = wait_for(warned, WARN_WITHIN, interval=0.1,
                            what=f"a drift warning in {log.name}")
            assert " WARNING " in line, line
            assert f":{other.pid}:" in line, f"the warning does not name pid {other.pid}: {line}"
            # ... and the key that differs (the commands; the cron is the same).
            assert "(command differs; definition " in line, line

        jobs = jobs_by_name(db)
        drifted, same = jobs["drifted"], jobs["same"]
        assert drifted["drift"] is True, drifted
        assert drifted["drift_keys"] == ["command"], drifted
        assert len(drifted["definitions"]) == 2, drifted["definitions"]
        holders = sorted(h for hosts in drifted["definitions"].values() for h in hosts)
        assert [sorted(hosts) for hosts in drifted["definitions"].values()] == [
            [h] for h in holders
        ], f"each definition of `drifted` should be on one host: {drifted['definitions']}"
        assert sorted(int(h.split(":")[1]) for h in holders) == sorted(p.pid for p in procs)
        assert same["drift"] is False, same
        assert same["drift_keys"] == [], same
        assert len(same["definitions"]) == 1, same["definitions"]
        assert sorted(next(iter(same["definitions"].values()))) == holders

        human = status(db).splitlines()
        warnings = [line for line in human if line.startswith("warning: job ")]
        assert any(w.startswith("warning: job drifted is defined differently (command differs): ")
                   for w in warnings), "\n".join(human)
        assert not any("job same " in w for w in warnings), "\n".join(warnings)

        # One version left: no drift any more (a stopping daemon removes its host row).
        assert procs[1].stop() == 0
        assert jobs_by_name(db)["drifted"]["drift"] is False
        assert not any(line.startswith("warning:") for line in status(db).splitlines())
    finally:
        codes = fleet.stop()
    assert codes == [0, 0]
    for log in logs:
        assert not any("job same:" in w for w in drift_warnings(log)), log.read_text()
        assert len([w for w in drift_warnings(log) if DRIFT_WARNING in w]) == 1, (
            f"{log.name}: the drift should be reported once:\n{log.read_text()}"
        )


def test_field_digests_name_the_keys_two_definitions_differ_in() -> None:
    from dblockrun.config.load import differing_keys, load_jobs_text

    def job(body: str) -> dict[str, str]:
        return load_jobs_text(f"jobs:\n  tick:\n{body}", "jobs.yaml").jobs[0].field_digests()

    ours = job('    cron: "* * * * *"\n    command: ./tick\n    lock-at-most: 5m\n')
    theirs = job('    cron: "* * * * *"\n    command: ./their-tick\n    env: {A: "1"}\n')
    # A different command, an env only they set, lock-at-most only we set.
    assert differing_keys(ours, theirs) == ["command", "env", "lock-at-most"]
    assert differing_keys(ours, ours) == []
    assert differing_keys(ours, None) == []  # an older daemon: not known
    # The values are not stored, only their digests.
    assert "./tick" not in str(ours) and all(len(d) == 8 for d in ours.values())
