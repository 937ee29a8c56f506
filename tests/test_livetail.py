"""A running run's live output, readable from any host (issue 22, item 1):
its holder writes the newest 64 KiB of the command's output to the run's
record with its lease renewal, when it grew; `history --output` shows it
marked live, `dblockrun tail` follows it until the run ends and exits with
its status; the result then replaces it with the stored output as before."""

from __future__ import annotations

import signal
import subprocess
import time
from contextlib import AbstractContextManager
from pathlib import Path

from harness import Fleet, Process, track
from helpers import REPO, Ran, TestDb, clean_env, dblockrun_cmd, invoke, sigint_default, wait_for

from dblockrun.ops.follow import grown
from dblockrun.running.runner import OUTPUT_TAIL, LiveOutput, Tail
from dblockrun.store import Store
from dblockrun.store import models as m

HEARTBEAT = 1.0
#: The longest a line may take from the command's write to its record, on
#: a machine shared by parallel test runs: a heartbeat, and the margin.
VISIBLE_WITHIN = HEARTBEAT + 2.0


def cli_args(db: TestDb, *args: str) -> list[str]:
    return [*dblockrun_cmd(), "--db", db.url, "--table-prefix", db.prefix, *args]


def run_cli(db: TestDb, *args: str) -> Ran:
    """`dblockrun ARGS` as an operator on another host types it (in-process:
    a `tail` that follows, alongside the run, is a real process below)."""
    return invoke("--db", db.url, "--table-prefix", db.prefix, *args)


def daemon(fleet: Fleet, jobs: Path) -> AbstractContextManager[Process]:
    # A long lease: a machine loaded by parallel test runs must not fence
    # the run before the test has read it.
    return fleet.running(jobs, heartbeat=f"{HEARTBEAT:g}s", lease=f"{10 * HEARTBEAT:g}s",
                         grace=None, name="daemon", cwd=REPO, env=clean_env())


def jobs_file(tmp_path: Path, command: str) -> Path:
    """A job ``talker`` running ``command`` in ``tmp_path``, due at once."""
    path = tmp_path / "jobs.yaml"
    path.write_text("jobs:\n  talker:\n    rate: 1h\n    lock-at-most: 2m\n"
                    f"    workdir: {str(tmp_path)!r}\n    command: {command!r}\n")
    return path


#: A 100 KiB line (more than the tail holds), then hostile and plain lines;
#: each step waits for the test (a file), so nothing races.
SCRIPT = (
    "printf 'first\\n'; head -c 102400 /dev/zero | tr '\\0' x; printf '\\n'; "
    "printf 'caf\\303\\251 \\033]0;pwned\\007 <script>\\n'; "
    "printf 'mark-1\\n'; touch marked-1; "
    "while [ ! -e go-2 ]; do sleep 0.05; done; printf 'mark-2\\n'; touch marked-2; "
    "while [ ! -e go-end ]; do sleep 0.05; done; printf 'done\\n'; exit 4"
)
HOSTILE = "caf\u00e9 \x1b]0;pwned\x07 <script>\n"


def running(store: Store) -> m.RunRecord | None:
    return next((r for r in store.history("talker", 5) if r.result == m.RUNNING), None)


def live_output(store: Store, run_id: int, mark: str) -> str | None:
    """The run's output once it shows ``mark``, while it still runs."""
    run = store.run(run_id)
    assert run is not None
    assert run.live, f"run ended {run.result} before its output showed {mark!r}"
    return run.output if run.output and mark in run.output else None


def test_live_output_readable_from_another_process(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    jobs = jobs_file(tmp_path, SCRIPT)
    with daemon(fleet, jobs):
        wait_for(lambda: (tmp_path / "marked-1").exists(), 60, what="mark-1 written")
        run = wait_for(lambda: running(store), 10, what="the running run")
        # Within a heartbeat of the write, another process reads it (this
        # one reads the database only).
        written = time.monotonic()
        text = wait_for(lambda: live_output(store, run.id, "mark-1\n"), 30, interval=0.02,
                        what="mark-1 in the live output")
        assert time.monotonic() - written < VISIBLE_WITHIN
        # Bounded: the newest 64 KiB only (the 100 KiB line's end), whole lines kept.
        assert len(text.encode()) <= OUTPUT_TAIL
        assert "first" not in text
        assert text.endswith("x\n" + HOSTILE + "mark-1\n")
        # history --output shows it, marked live, hostile bytes escaped.
        shown = run_cli(db, "history", "--output", str(run.id))
        assert shown.returncode == 0, shown.stderr
        assert f"run {run.id} of talker is running on " in shown.stderr, (
            shown.stderr, store.run(run.id))
        assert shown.stdout.endswith("caf\u00e9 \\x1b]0;pwned\\x07 <script>\nmark-1\n")
        assert "\x1b" not in shown.stdout

        # The next line is written with a later renewal: only when it grew.
        (tmp_path / "go-2").touch()
        wait_for(lambda: (tmp_path / "marked-2").exists(), 30, what="mark-2 written")
        written = time.monotonic()
        wait_for(lambda: live_output(store, run.id, "mark-2\n"), 30, interval=0.02,
                 what="mark-2 in the live output")
        assert time.monotonic() - written < VISIBLE_WITHIN

        (tmp_path / "go-end").touch()
        ended = wait_for(lambda: (r := store.run(run.id)) and not r.live and r, 60,
                         what="the run's end")
    # After the end: the stored output, as before live output existed.
    assert ended.result == m.FAILED and ended.exit_code == 4
    assert ended.output is not None
    assert ended.output.endswith(HOSTILE + "mark-1\nmark-2\ndone\n")
    assert len(ended.output.encode()) <= OUTPUT_TAIL


def test_tail_follows_until_the_end_and_exits_with_its_status(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    jobs = jobs_file(tmp_path, SCRIPT)
    with daemon(fleet, jobs):
        wait_for(lambda: (tmp_path / "marked-1").exists(), 60, what="mark-1 written")
        follower = track(subprocess.Popen(cli_args(db, "tail", "talker"), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=clean_env(), cwd=REPO))
        try:
            assert follower.stdout is not None
            # What it printed so far: the tail, up to mark-1 (the read blocks
            # until the line comes: the deadline is the test's timeout).
            seen = b""
            while b"mark-1\n" not in seen:
                line = follower.stdout.readline()
                assert line, f"tail ended early: {follower.communicate()}"
                seen += line
            (tmp_path / "go-2").touch()
            assert follower.stdout.readline() == b"mark-2\n"
            (tmp_path / "go-end").touch()
            rest, err = follower.communicate(timeout=60)
        finally:
            if follower.poll() is None:
                follower.kill()
                follower.wait()
    assert rest == b"done\n"
    assert follower.returncode == 4
    assert b"caf\xc3\xa9 \\x1b]0;pwned\\x07 <script>\nmark-1\n" in seen
    assert b"\x1b" not in seen
    assert b"talker: run " in err and b" ended failed (exit 4)" in err


def test_tail_ctrl_c_exits_130_quietly(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    jobs = jobs_file(tmp_path, SCRIPT)
    with daemon(fleet, jobs):
        wait_for(lambda: (tmp_path / "marked-1").exists(), 60, what="mark-1 written")
        follower = track(subprocess.Popen(cli_args(db, "tail", "talker"), stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, env=clean_env(), cwd=REPO,
                                          preexec_fn=sigint_default))
        assert follower.stdout is not None
        while b"mark-1\n" not in follower.stdout.readline():
            pass
        follower.send_signal(signal.SIGINT)
        _out, err = follower.communicate(timeout=30)
        (tmp_path / "go-2").touch()
        (tmp_path / "go-end").touch()
    assert follower.returncode == 130
    assert err == b""


def test_tail_with_no_running_run(db: TestDb, store: Store, tmp_path: Path) -> None:
    store.ensure_jobs(["talker"])
    done = run_cli(db, "tail", "talker")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == "dblockrun: no run of talker is running\n"
    unknown = run_cli(db, "tail", "nosuch")
    assert unknown.returncode == 2 and "no such job" in unknown.stderr
    both = run_cli(db, "tail", "talker", "--run", "3")
    assert (both.returncode, both.stderr) == (2, "dblockrun: give JOB or --run ID\n")


# -- the store: the write rides with the renewal -------------------------------------------


def output_of(store: Store, run_id: int) -> str | None:
    run = store.run(run_id)
    assert run is not None
    return run.output


def test_renewal_writes_the_output_of_running_runs_only(store: Store) -> None:
    store.ensure_jobs(["j", "k"])
    claimed = store.claim_and_record("j", "h1", 30.0)
    other = store.claim_and_record("k", "h1", 30.0)
    assert claimed is not None and claimed.run_id is not None
    assert other is not None and other.run_id is not None
    statements = store.statements
    renewed = store.renew_many("h1", [("j", claimed.token), ("k", other.token)], 30.0,
                               [(claimed.run_id, "one\n"), (other.run_id, "two\n")])
    assert set(renewed) == {"j", "k"}
    if store.dialect.name != "sqlite":  # embedded: a second statement, no round trip
        assert store.statements - statements == 1
    assert [output_of(store, i) for i in (claimed.run_id, other.run_id)] == ["one\n", "two\n"]
    # A result written meanwhile is never overwritten by a late tail.
    store.finish_run(claimed.run_id, "j", claimed.token, m.OK, 0, "one\nall\n")
    store.renew_many("h1", [("j", claimed.token)], 30.0, [(claimed.run_id, "one\n")])
    run = store.run(claimed.run_id)
    assert run is not None and (run.result, run.output, run.live) == (m.OK, "one\nall\n", False)


# -- the tail, cut and copied ---------------------------------------------------------------


def test_tail_cut_never_splits_a_character() -> None:
    tail = Tail(limit=8)
    tail.add("\u00e9\u00e9\u00e9\u00e9\u00e9\n".encode())  # 11 bytes: the cut splits an é
    total, data = tail.read()
    assert total == 11
    assert data.decode() == "\u00e9\u00e9\u00e9\n"  # strict decode: no broken character
    assert tail.value() == data


def test_a_single_64k_line_is_bounded() -> None:
    tail = Tail()
    for _ in range(5):
        tail.add(b"y" * OUTPUT_TAIL)  # the reactor hands a long line over in 64 KiB pieces
    assert tail.value() == b"y" * OUTPUT_TAIL
    assert tail.total == 5 * OUTPUT_TAIL


def test_live_output_is_copied_only_when_it_grew() -> None:
    tail = Tail()
    live = LiveOutput([7], tail)
    assert live.fresh() is None
    tail.add(b"a\x00\xff\n")
    total, text = live.fresh() or (0, "")
    assert (total, text) == (4, "a\ufffd\ufffd\n")  # as the runs table keeps it
    assert live.fresh() is not None  # not written yet: offered again
    live.written(total)
    assert live.fresh() is None
    tail.add(b"b\n")
    assert live.fresh() == (6, "a\ufffd\ufffd\nb\n")


def test_grown_prints_what_a_later_tail_adds() -> None:
    assert grown("", "a\n") == "a\n"
    assert grown("a\n", "a\nb\n") == "b\n"
    assert grown("a\nb\n", "a\nb\n") == ""
    # The window slid on: it starts inside the earlier tail.
    assert grown("1\n2\n3\n", "2\n3\n4\n5\n") == "4\n5\n"
    assert grown("1\n2\n", "9\n") == "9\n"  # nothing in common: all of it
    assert grown("x\n", "x\nx\n") == "x\n"


def test_a_fan_out_batch_shows_its_output_on_each_item(
        db: TestDb, store: Store, tmp_path: Path, fleet: Fleet) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(f"""\
jobs:
  spread:
    rate: 1h
    items: [a, b]
    batch: 2
    workdir: {str(tmp_path)!r}
    command: |
      echo "working on $(echo $DBLOCKRUN_ITEMS)"; touch marked
      while [ ! -e go-end ]; do sleep 0.05; done; echo finished
""")
    said = {"working on a b\n", "working on b a\n"}  # in the batch's order
    with daemon(fleet, jobs):
        try:
            wait_for(lambda: (tmp_path / "marked").exists(), 60, what="the batch's command")

            def both_live() -> list[m.RunRecord] | None:
                runs = [r for r in store.history("spread", 5) if r.item is not None]
                shown = [r for r in runs if r.live and r.output in said]
                return shown if len(shown) == 2 else None

            runs = wait_for(both_live, 30, interval=0.05, what="both items' live output")
        finally:
            (tmp_path / "go-end").touch()
        assert {r.item for r in runs} == {"a", "b"}
        wait_for(lambda: all(not (r := store.run(run.id)) or not r.live for run in runs), 60,
                 what="the batch's end")
    for run in runs:
        ended = store.run(run.id)
        assert ended is not None and ended.result == m.OK
        assert ended.output == f"{run.output}finished\n"


def test_a_heartbeat_writes_a_bounded_share_those_waiting_first() -> None:
    from dblockrun.running.heartbeat import Renewer
    from dblockrun.running.runner import LeaseWatch

    tails = [Tail() for _ in range(3)]
    watches = []
    for i, tail in enumerate(tails):
        watch = LeaseWatch(f"j{i}", "h", 1, 30.0)
        watch.output = LiveOutput([i], tail)
        tail.add(b"x" * 9 + b"\n")
        watches.append(watch)
    first = Renewer._fresh(watches, budget=15)  # two tails of 10 reach it
    assert [out.run_ids for out, _total, _text in first] == [(0,), (1,)]
    for out, total, _text in first:
        out.written(total)
    for tail in tails:
        tail.add(b"y\n")
    second = Renewer._fresh(watches, budget=15)
    assert [out.run_ids for out, _total, _text in second][0] == (2,)  # left out: first now


def test_an_output_that_fails_its_renewal_never_costs_the_lease() -> None:
    """A write of the live output that the database refuses (MariaDB's
    max_allowed_packet set low, say) fails the renewal it rides in: the next
    renewal goes without it and gets through, and that output is written no
    more."""
    from typing import Any, cast

    from dblockrun.errors import DatabaseError
    from dblockrun.running.heartbeat import Renewer
    from dblockrun.running.runner import LeaseWatch
    from dblockrun.store.outage import Outage

    class Refusing:
        """Renews leases, refusing any renewal that carries output."""

        def __init__(self) -> None:
            self.sent: list[list[tuple[int, str]]] = []

        def renew_many(self, holder: str, held: list[tuple[str, int]], lease: float,
                       outputs: list[tuple[int, str]]) -> dict[str, str | None]:
            self.sent.append(list(outputs))
            if outputs:
                raise DatabaseError("packet too big")
            return {name: None for name, _token in held}

    store = Refusing()
    renewer = Renewer(cast(Any, store), 10.0, Outage())
    watch = LeaseWatch("j", "h", 1, 30.0, last_ok=0.0)
    tail = Tail()
    watch.output = LiveOutput([5], tail)
    renewer.add(watch)
    tail.add(b"big\n")
    try:
        renewer.renew_all()
        raise AssertionError("the renewal with the output should have failed")
    except DatabaseError:
        pass
    assert watch.last_ok == 0.0
    assert renewer.renew_all()  # without it: renewed
    assert watch.last_ok > 0.0 and not watch.lost
    tail.add(b"more\n")
    assert renewer.renew_all()
    assert store.sent == [[(5, "big\n")], [], []]
