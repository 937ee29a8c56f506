from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jobfiles import FILE, error, load, one_job

from dblockrun.config.load import JOB_KEYS, load_jobs, load_jobs_text
from dblockrun.errors import ConfigError
from dblockrun.jobs import Job, JobsFile, OnFailure

# --- a good file ---------------------------------------------------------------------


def test_the_design_example() -> None:
    jobs = load(
        """\
        database: postgresql://scheduler@db.internal/ops
        defaults:
          lock-at-most: 30m
          timezone: Europe/Amsterdam
        jobs:
          scrape-website:
            cron: "*/5 * * * *"
            command: ./scrape.sh
            lock-at-most: 10m
            lock-at-least: 1m
          move-to-cold:
            rate: 6h
            command: [./move-to-cold, --batch, "500"]
            on-failure: {disable-for: 3h}
        """
    )
    assert jobs == JobsFile(
        path=FILE,
        database="postgresql://scheduler@db.internal/ops",
        jobs=(
            Job(
                name="scrape-website",
                command="./scrape.sh",
                cron="*/5 * * * *",
                lock_at_most=600.0,
                lock_at_least=60.0,
                timezone="Europe/Amsterdam",
                line=6,
            ),
            Job(
                name="move-to-cold",
                command=("./move-to-cold", "--batch", "500"),
                rate=21_600.0,
                lock_at_most=1_800.0,
                timezone="Europe/Amsterdam",
                on_failure=OnFailure(disable_for=10_800.0),
                line=11,
            ),
        ),
    )


def test_every_key() -> None:
    jobs = load(
        """\
        jobs:
          all.keys_1:
            cron: "0 */10 * * * *"
            rate: 20h
            command: [./run, 500, 1.5]
            lock-at-most: 2h
            lock-at-least: 90
            timezone: America/New_York
            env: {B: 2, A: "x"}
            workdir: /srv
            shell: /bin/bash
            starting-deadline: 5m
            retries: 3
            retry-delay: 250ms
            on-failure: {disable-for: 1d, command: notify-ops}
            jitter: 30s
            description: Everything at once
            enabled: false
            items-command: [list-shards]
            parallel: 4
            batch: 10
            history-limit: 50
        """
    )
    assert jobs.jobs == (
        Job(
            name="all.keys_1",
            command=("./run", "500", "1.5"),
            cron="0 */10 * * * *",
            rate=72_000.0,
            lock_at_most=7_200.0,
            lock_at_least=90.0,
            timezone="America/New_York",
            env=(("A", "x"), ("B", "2")),
            workdir="/srv",
            shell="/bin/bash",
            starting_deadline=300.0,
            retries=3,
            retry_delay=0.25,
            on_failure=OnFailure(disable_for=86_400.0, command="notify-ops"),
            jitter=30.0,
            description="Everything at once",
            enabled=False,
            items_command=("list-shards",),
            parallel=4,
            batch=10,
            history_limit=50,
            line=2,
        ),
    )
    assert {field for field, _parse in JOB_KEYS.values()} == set(Job.__dataclass_fields__) - {
        "name",
        "line",
        "_schedule",  # made from cron, timezone and the name
    }


def test_what_a_loaded_job_holds_has_no_dict_of_its_own() -> None:
    """Issue 33 item 4: a daemon keeps every job of its file, and each object
    a job holds, for its life: slotted, they are a quarter of the size (a
    Job's dict was 1.5 KB; bench/idle.py measures the whole)."""
    (job,) = load(one_job(cron="'*/5 * * * *'", notify="{urls: ['json://localhost/x']}",
                          ping="http://localhost/ping", after="other",
                          limits="{nice: 10}") + "  other:\n    rate: 1h\n    command: 'true'\n"
                  ).jobs[:1]
    held = [job, job.on_failure, job.limits, job.schedule, job.after, job.ping, job.notify,
            *(job.notify.urls if job.notify else ())]
    assert all(part is not None for part in held)
    assert [type(part).__name__ for part in held if hasattr(part, "__dict__")] == []


def test_jobs_that_set_no_limits_nor_on_failure_share_one_of_each() -> None:
    """Issue 33 item 4: frozen, the defaults are one object for every job
    (1,000 jobs held a copy each, 136 KB); a job that sets them has its own."""
    first, second, third = load(
        one_job() + "  second:\n    rate: 1h\n    command: 'true'\n"
        "  third:\n    rate: 1h\n    command: 'true'\n    limits: {nice: 10}\n"
        "    on-failure: {disable-for: 1h}\n").jobs
    assert first.limits is second.limits and first.on_failure is second.on_failure
    assert not first.limits.any and not first.on_failure.wanted
    assert third.limits.nice == 10 and third.on_failure.disable_for == 3600


def test_items() -> None:
    (job,) = load(one_job(items="[a, 2, b]")).jobs
    assert job.items == ("a", "2", "b")


def test_defaults_merge_under_jobs_and_env_merges_by_variable() -> None:
    jobs = load(
        """\
        defaults:
          cron: "@hourly"
          retries: 2
          env: {A: "1", B: "1"}
        jobs:
          a:
            command: x
            retries: 0
            env: {B: "2"}
          b:
            command: y
            cron: null
            rate: 1h
        """
    )
    a, b = jobs.jobs
    assert (a.cron, a.retries, a.env) == ("@hourly", 0, (("A", "1"), ("B", "2")))
    assert (b.cron, b.rate, b.retries) == (None, 3600.0, 2)


def test_empty_jobs_mapping() -> None:
    assert load("jobs:\n").jobs == ()
    assert load("jobs: {}\n").jobs == ()


def test_merge_keys_are_not_duplicates() -> None:
    jobs = load(
        """\
        jobs:
          a: &base
            cron: "@daily"
            command: x
          b:
            <<: *base
            command: y
        """
    )
    assert [(job.name, job.command, job.cron) for job in jobs.jobs] == [
        ("a", "x", "@daily"),
        ("b", "y", "@daily"),
    ]


def test_load_jobs_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(one_job())
    assert load_jobs(str(path)).jobs[0].name == "j"


# --- the file as a whole -------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError) as info:
        load_jobs(path)
    assert info.value.render() == f"{path}: cannot read: No such file or directory"


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_jobs(str(tmp_path))
    assert info.value.render() == f"{tmp_path}: not a regular file (a directory)"


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_bytes(b"jobs: \xff\n")
    with pytest.raises(ConfigError) as info:
        load_jobs(str(path))
    assert info.value.render() == f"{path}: cannot read: not UTF-8 text (invalid start byte)"


NEEDS_JOBS = "a jobs file needs a jobs: mapping of job names to jobs (see dblockrun-jobs(5))"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", f"jobs.yaml: the file is empty: {NEEDS_JOBS}"),
        ("# nothing\n", f"jobs.yaml: the file is empty: {NEEDS_JOBS}"),
        ("database: x\n", f"jobs.yaml:1: no jobs: key: {NEEDS_JOBS}"),
        ("- a\n", "jobs.yaml:1: the file must be a mapping with a jobs: key, got a list"),
        ("jobs: [a]\n", "jobs.yaml:1: jobs: must be a mapping of job names to jobs, got a list"),
        (
            "jobs: {}\njbos: {}\n",
            "jobs.yaml:2: jbos: unknown key (did you mean 'jobs'?)",
        ),
        (
            "jobs: {}\nzzz: 1\n",
            "jobs.yaml:2: zzz: unknown key "
            "(known: database, database-file, defaults, jobs, groups, calendars, notify-storm)",
        ),
        ("database: 5\njobs: {}\n", "jobs.yaml:1: database: must be a string, got a number (5)"),
        ("database: ''\njobs: {}\n", "jobs.yaml:1: database: must not be empty"),
        (
            "defaults: [a]\njobs: {}\n",
            "jobs.yaml:1: defaults: must be a mapping of job keys, got a list",
        ),
        ("jobs: {}\njobs: {}\n", "jobs.yaml:2: duplicate key 'jobs'"),
    ],
)
def test_file_errors(text: str, message: str) -> None:
    assert error(text) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "jobs:\n  a:\n    cron: '@daily\n",
            "jobs.yaml:4: invalid YAML: while scanning a quoted scalar, "
            "found unexpected end of stream",
        ),
        (
            "jobs:\n  a: [\n",
            "jobs.yaml:3: invalid YAML: while parsing a flow node, expected the node content, "
            "but found '<stream end>'",
        ),
        (
            "jobs:\n  a: b: c\n",
            "jobs.yaml:2: invalid YAML: mapping values are not allowed here",
        ),
        (
            "jobs: {}\n---\njobs: {}\n",
            "jobs.yaml:2: invalid YAML: expected a single document in the stream, "
            "but found another document",
        ),
        (
            "jobs:\n  [a]: 1\n",
            "jobs.yaml:2: invalid YAML: while constructing a mapping, found unhashable key",
        ),
        (
            "jobs: !!python/object/apply:os.system [true]\n",
            "jobs.yaml:1: invalid YAML: could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system'",
        ),
        (
            "jobs:\n  a:\n    description: 2026-02-30\n",
            "jobs.yaml:3: invalid YAML: cannot read '2026-02-30': day is out of range for month",
        ),
        (
            "jobs:\n  a: \x00\n",
            "jobs.yaml:2: invalid YAML: special characters are not allowed (character #x0000)",
        ),
    ],
)
def test_yaml_errors(text: str, message: str) -> None:
    assert error(text) == message


def test_deep_nesting() -> None:
    assert error("[" * 1000) == "jobs.yaml: invalid YAML: nested too deeply"


# --- duplicates ----------------------------------------------------------------------


def test_duplicate_job() -> None:
    text = """\
        jobs:
          a:
            cron: "@daily"
            command: x
          a:
            cron: "@daily"
            command: y
        """
    assert error(text) == "jobs.yaml:5: duplicate job 'a'"


def test_duplicate_key_in_job() -> None:
    text = """\
        jobs:
          a:
            cron: "@daily"
            command: x
            command: y
        """
    assert error(text) == "jobs.yaml:5: job 'a': duplicate key 'command'"


def test_duplicate_nested_key() -> None:
    text = """\
        jobs:
          a:
            cron: "@daily"
            command: x
            env:
              A: "1"
              A: "2"
        """
    assert error(text) == "jobs.yaml:7: job 'a': env: duplicate key 'A'"


def test_duplicate_key_in_defaults() -> None:
    text = """\
        defaults:
          retries: 1
          retries: 2
        jobs: {}
        """
    assert error(text) == "jobs.yaml:3: defaults: duplicate key 'retries'"


# --- jobs ----------------------------------------------------------------------------

KNOWN = (
    "cron, rate, command, lock-at-most, lock-at-least, timezone, env, env-inherit, workdir, "
    "shell, "
    "starting-deadline, retries, retry-delay, backoff, max-delay, on-failure, jitter, description, "
    "enabled, "
    "items, items-command, parallel, batch, history-limit, user, run-on, on, notify, ping, "
    "catch-up, catch-up-limit, group, overlap, limits, after, expect, exclude, blackout, active"
)
DURATION = "(use e.g. 250ms, 90s, 5m, 1h30m, 2d)"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # names
        (
            "jobs:\n  'a b':\n    command: x\n",
            "jobs.yaml:2: job 'a b': bad job name: use letters, digits, '.', '_' and '-'",
        ),
        (
            "jobs:\n  12:\n    command: x\n",
            "jobs.yaml:2: job names must be strings, got a number (12) (quote it)",
        ),
        (
            f"jobs:\n  {'x' * 201}:\n    command: x\n",
            f"jobs.yaml:2: job '{'x' * 40}...': job name is 201 characters long (at most 200)",
        ),
        ("jobs:\n  a:\n", "jobs.yaml:2: job 'a': must be a mapping of job keys, got null"),
        # missing keys: reported on the job's line
        (
            "jobs:\n  a:\n    cron: '@daily'\n",
            "jobs.yaml:2: job 'a': command: missing (every job needs a command)",
        ),
        (
            "jobs:\n  a:\n    command: x\n",
            "jobs.yaml:2: job 'a': cron: missing (a job needs cron, rate, after or several of "
            "them)",
        ),
        # unknown keys
        (
            one_job(lock_at_most="5m"),
            "jobs.yaml:5: job 'j': lock_at_most: unknown key (did you mean 'lock-at-most'?)",
        ),
        (one_job(colour="red"), f"jobs.yaml:5: job 'j': colour: unknown key (known: {KNOWN})"),
        (
            one_job(**{"on-failure": "{disable_for: 1h}"}),
            "jobs.yaml:5: job 'j': on-failure.disable_for: unknown key "
            "(did you mean 'disable-for'?)",
        ),
        (
            "defaults:\n  lok-at-most: 5m\njobs: {}\n",
            "jobs.yaml:2: defaults.lok-at-most: unknown key (did you mean 'lock-at-most'?)",
        ),
    ],
)
def test_job_errors(text: str, message: str) -> None:
    assert error(text) == message


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cron", "'61 * * * *'", "bad minute field '61' (allowed: 0-59)"),
        (
            "cron",
            "'@reboot'",
            "@reboot is not supported: a fleet has no single boot (use a cron expression or rate)",
        ),
        ("cron", "5", "must be a string, got a number (5)"),
        ("rate", "0s", "must be more than zero, got 0s"),
        ("rate", "0", "must be more than zero, got 0"),
        ("rate", "5x", f"'5x' is not a duration {DURATION}"),
        ("rate", "-5m", f"'-5m' is negative {DURATION}"),
        ("rate", "[1]", "must be a duration like 90s, 5m or 1h30m, got a list"),
        ("command", "''", "must not be empty"),
        ("command", "{}", "must be a string or a list of arguments, got a mapping"),
        ("command", "[]", "must not be an empty list"),
        ("command", "['']", "the program (first item) must not be empty"),
        (
            "command",
            "[rm, yes]",
            "each argument must be a string or number, got a boolean (true) (quote it)",
        ),
        ("command", "[a, [b]]", "each argument must be a string or number, got a list (quote it)"),
        ("command", "~", "needs a value"),
        ("lock-at-most", "0s", "must be more than zero, got 0s"),
        ("lock-at-most", "soon", f"'soon' is not a duration {DURATION}"),
        ("lock-at-least", "2h", "2h is longer than lock-at-most 1h"),
        ("lock-at-least", "-1", f"-1 is negative {DURATION}"),
        (
            "timezone",
            "Europe/Amsterdm",
            "unknown time zone 'Europe/Amsterdm' (did you mean 'Europe/Amsterdam'?)",
        ),
        ("timezone", "~", "needs a value"),
        ("env", "[A]", "must be a mapping, got a list"),
        (
            "env",
            "{'A=B': x}",
            "variable names must be non-empty strings without '=', got a string ('A=B')",
        ),
        ("workdir", "''", "must not be empty"),
        ("shell", "[sh]", "must be a string, got a list"),
        ("starting-deadline", "0", "must be more than zero, got 0"),
        ("retries", "x", "must be a whole number, got a string ('x')"),
        ("retries", "-1", "must be at least 0, got -1"),
        ("retries", "1.5", "must be a whole number, got a number (1.5)"),
        ("retries", "true", "must be a whole number, got a boolean (true)"),
        ("retries", "9999999999", "must be at most 2147483647, got 9999999999"),
        (
            "retry-delay",
            "1h1h",
            f"'1h1h' is not a duration: units go from largest to smallest, each once {DURATION}",
        ),
        ("on-failure", "3h", "must be a mapping, got a string ('3h')"),
        ("jitter", "true", "must be a duration like 90s, 5m or 1h30m, got a boolean (true)"),
        ("description", "5", "must be a string, got a number (5)"),
        ("enabled", "'yes'", "must be true or false, got a string ('yes')"),
        ("enabled", "1", "must be true or false, got a number (1)"),
        ("items", "a", "must be a list, got a string ('a')"),
        ("items", "[a, a]", "item 'a' is listed twice"),
        ("items", "[a, {b: c}]", "each item must be a string or number, got a mapping (quote it)"),
        ("items-command", "[]", "must not be an empty list"),
        ("parallel", "0", "must be at least 1, got 0"),
        ("batch", "0", "must be at least 1, got 0"),
        ("history-limit", "0", "must be at least 1, got 0"),
    ],
)
def test_bad_value(key: str, value: str, message: str) -> None:
    # The key is written last, on line 5 (cron and command are lines 3 and 4) ...
    if key in ("cron", "command"):
        text = one_job(**{key: value})
        line = 3 if key == "cron" else 4
    else:
        text = one_job(**{key: value})
        line = 5
    assert error(text) == f"jobs.yaml:{line}: job 'j': {key}: {message}"


def test_bad_env_value_names_the_variable() -> None:
    assert error(one_job(env="{A: ~}")) == (
        "jobs.yaml:5: job 'j': env.A: the value must be a string or number, got null (quote it)"
    )


def test_bad_nested_value_names_the_nested_line() -> None:
    text = """\
        jobs:
          j:
            cron: "@daily"
            command: x
            on-failure:
              command: notify
              disable-for: 0s
        """
    assert error(text) == (
        "jobs.yaml:7: job 'j': on-failure.disable-for: must be more than zero, got 0s"
    )


def test_items_and_items_command_together() -> None:
    text = one_job(items="[a]", **{"items-command": "list"})
    assert error(text) == (
        "jobs.yaml:6: job 'j': items-command: cannot be used together with items (use one)"
    )


def test_bad_default_is_reported_at_the_defaults() -> None:
    text = """\
        defaults:
          timezone: Mars/Base
        jobs: {}
        """
    assert error(text) == (
        "jobs.yaml:2: defaults.timezone: unknown time zone 'Mars/Base' "
        "(use e.g. UTC, Europe/Amsterdam)"
    )


def test_lock_at_least_over_a_default_lock_at_most() -> None:
    text = """\
        defaults:
          lock-at-most: 10m
        jobs:
          j:
            cron: "@daily"
            command: x
            lock-at-least: 20m
        """
    assert error(text) == "jobs.yaml:7: job 'j': lock-at-least: 20m is longer than lock-at-most 10m"


# --- any input gives a JobsFile or a ConfigError -------------------------------------


def _loads_or_config_error(text: str) -> None:
    try:
        result = load_jobs_text(text, FILE)
    except ConfigError as exc:
        assert exc.render().startswith(FILE)
    else:
        assert isinstance(result, JobsFile)


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_any_text(text: str) -> None:
    _loads_or_config_error(text)


@given(st.text(alphabet="jobs:cron{}[]-&*!<>|'\"\n #@,?%0123456789", max_size=200))
@settings(max_examples=300, deadline=None)
def test_any_yamlish_text(text: str) -> None:
    _loads_or_config_error(text)


_KEYS = st.sampled_from([*JOB_KEYS, "disable-for", "command", "x"]) | st.text(max_size=8)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["@daily", "*/5 * * * *", "5m", "0s", "UTC", "Mars/Base", "x", ""])
    | st.text(max_size=12)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
)
_NAMES = st.sampled_from(["a", "b-1.x"]) | st.text(max_size=8) | st.integers()
_JOB = st.dictionaries(_KEYS, _VALUES, max_size=6)
_FILES = st.fixed_dictionaries(
    {"jobs": st.dictionaries(_NAMES, _JOB | _VALUES, max_size=3)},
    optional={"defaults": _JOB | _VALUES, "database": _VALUES, "extra": _VALUES},
)


@given(_FILES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_yaml_document(document: dict[str, Any]) -> None:
    _loads_or_config_error(yaml.safe_dump(document))


# --- several schedules, H, retry backoff ------------------------------------------------


def test_several_schedules_and_hashed_values() -> None:
    jobs = load("""
        jobs:
          j:
            cron: ["H 9 * * 1-5", "0 12 * * 6"]
            command: x
          k:
            cron: ["0 0 * * *"]
            command: x
    """)
    j, k = jobs.jobs
    assert j.cron == ("H 9 * * 1-5", "0 12 * * 6")
    assert j.schedule.hash_id == "j"
    # A list of one is the plain expression: the same definition as before lists.
    assert k.cron == "0 0 * * *" and k.schedule.hash_id == ""
    assert k.definition_hash() == Job("k", "x", cron="0 0 * * *", line=9).definition_hash()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cron", "[]", "must not be an empty list"),
        ("cron", "['0 9 * * *', '0 9 * * *']", "[1]: '0 9 * * *' is listed twice"),
        ("cron", "['0 9 * * *', '61 * * * *']", "[1]: bad minute field '61' (allowed: 0-59)"),
        ("cron", "'H(9-9) * * * *'", "bad minute field 'H(9-9)': in H(9-9) the range must "
                                     "run upwards"),
        ("backoff", "0.5", "must be from 1 to 100, got 0.5"),
        ("backoff", "fast", "must be a number like 2 (each retry waits that many times "
                            "longer), got a string ('fast')"),
        ("max-delay", "0", "must be more than zero, got 0"),
    ],
)
def test_bad_schedule_and_backoff_values(key: str, value: str, message: str) -> None:
    line = 3 if key == "cron" else 5
    assert error(one_job(**{key: value})) == f"jobs.yaml:{line}: job 'j': {key}: {message}"


def test_max_delay_needs_a_growing_delay_not_shorter_than_retry_delay() -> None:
    base = "jobs:\n  j:\n    cron: '@daily'\n    command: x\n    retry-delay: 1m\n"
    assert error(base + "    max-delay: 5m\n") == (
        "jobs.yaml:6: job 'j': max-delay: only with backoff above 1 (without it every retry "
        "waits retry-delay)")
    assert error(base + "    backoff: 2\n    max-delay: 30s\n") == (
        "jobs.yaml:7: job 'j': max-delay: 30s is shorter than retry-delay 1m")
    job = load(base + "    backoff: 2\n    max-delay: 5m\n").jobs[0]
    assert (job.backoff, job.max_delay) == (2.0, 300.0)


# -- issue 36 item 4: every problem of a file -----------------------------------------------


def test_every_problem_of_a_file_is_reported_in_the_files_order() -> None:
    text = """\
        groups:
          backups: 0
        defaults:
          lock-at-most: 10m
        jobs:
          a:
            cron: "* * * * *"
            comand: echo hi
            lock-at-mots: 5m
          b:
            cron: "61 * * * *"
            command: echo
          ok:
            rate: 1h
            command: x
          c:
            rate: 1h
            command: x
            lock-at-least: 1h
            lock-at-most: 5m
            group: backups
        bogus: 1
        """
    with pytest.raises(ConfigError) as info:
        load(text)
    assert info.value.lines() == [
        "jobs.yaml:2: groups.backups: must be at least 1, got 0",
        "jobs.yaml:8: job 'a': comand: unknown key (did you mean 'command'?)",
        "jobs.yaml:9: job 'a': lock-at-mots: unknown key (did you mean 'lock-at-most'?)",
        "jobs.yaml:11: job 'b': cron: bad minute field '61' (allowed: 0-59)",
        "jobs.yaml:19: job 'c': lock-at-least: 1h is longer than lock-at-most 5m",
        "jobs.yaml:22: bogus: unknown key (known: database, database-file, defaults, jobs, "
        "groups, calendars, notify-storm)",
    ]
    # The first is the error's own; its message holds them all, for a log line.
    assert info.value.render() == info.value.lines()[0]
    assert info.value.message == "; ".join(info.value.lines())


def test_a_bad_default_is_reported_once_not_in_every_job() -> None:
    text = """\
        defaults:
          comand: x
        jobs:
          a: {cron: "@daily", command: x}
          b: {cron: "@daily", command: x, retries: many}
        """
    with pytest.raises(ConfigError) as info:
        load(text)
    assert info.value.lines() == [
        "jobs.yaml:2: defaults.comand: unknown key (did you mean 'command'?)",
        "jobs.yaml:5: job 'b': retries: must be a whole number, got a string ('many')",
    ]


def test_an_item_longer_than_a_runs_record_holds_is_refused_at_load() -> None:
    """Item 15: ``validate`` accepted a 1,500-character item that no run
    record could hold (its daemons then retried for ever)."""
    ok = "x" * 1000
    assert load(one_job(items=f"['{ok}']")).jobs[0].items == (ok,)
    assert error(one_job(items=f"[a, '{'x' * 1001}']")) == (
        f"jobs.yaml:5: job 'j': items: item {'x' * 40!r}... is 1,001 characters long: at most "
        "1,000 (a run's record holds its item)")
