"""`dblockrun import-crontab`: a crontab in, a jobs file and a list of skipped lines out.

Every translation made here is also loaded with ``load_jobs_text``: the output
must always be a valid jobs file.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import dblockrun.config.crontab
from dblockrun.cli import cli
from dblockrun.config.crontab import (
    Translation,
    host_timezone,
    is_system_path,
    translate_crontab,
)
from dblockrun.config.load import load_jobs_text
from dblockrun.jobs import Job, JobsFile

PATH = "crontab"
HEADER = (
    "# Translated from crontab by `dblockrun import-crontab`.\n"
    "# cron read schedules in the host's local time; dblockrun reads them in UTC\n"
    "# unless a job sets timezone:. Commands get the daemon's environment plus env:.\n"
)


def translate(text: str, *, system: bool | None = None, path: str = PATH) -> Translation:
    """Translate ``text`` (dedented) and check the jobs file loads."""
    result = translate_crontab(textwrap.dedent(text), path, system=system)
    loaded = load_jobs_text(result.text, "out.yaml")
    assert len(loaded.jobs) == result.jobs
    return result


def body(result: Translation) -> str:
    """The jobs file without its three comment lines of header."""
    assert result.text.startswith(HEADER.replace("crontab", result.path, 1))
    return "jobs:" + result.text.split("\njobs:", 1)[1]


def loaded(result: Translation) -> JobsFile:
    return load_jobs_text(result.text, "out.yaml")


def only_job(result: Translation) -> Job:
    jobs = loaded(result).jobs
    assert len(jobs) == 1
    return jobs[0]


def messages(text: str, *, system: bool | None = None) -> list[str]:
    return translate(text, system=system).messages


# --- the shape of the output -------------------------------------------------------


def test_an_empty_crontab_gives_an_empty_jobs_file() -> None:
    result = translate("")
    assert result.text == HEADER + "jobs: {}\n"
    assert result.jobs == 0
    assert result.problems == ()
    assert loaded(result).jobs == ()


def test_one_job() -> None:
    result = translate("*/5 * * * * /usr/local/bin/scrape.sh --all\n")
    assert result.text == HEADER + textwrap.dedent(
        """\
        jobs:
          scrape.sh:
            cron: '*/5 * * * *'
            command: /usr/local/bin/scrape.sh --all
        """
    )
    job = only_job(result)
    assert (job.name, job.cron, job.command) == (
        "scrape.sh",
        "*/5 * * * *",
        "/usr/local/bin/scrape.sh --all",
    )
    assert result.problems == ()


def test_keys_come_in_a_stable_order() -> None:
    result = translate(
        """\
        MAILTO=""
        FOO=bar
        CRON_TZ=Europe/Amsterdam
        SHELL=/bin/bash
        # Say hello
        0 6 * * 1-5 echo hello
        """
    )
    assert body(result) == textwrap.dedent(
        """\
        jobs:
          echo:
            description: Say hello
            cron: 0 6 * * 1-5
            timezone: Europe/Amsterdam
            shell: /bin/bash
            env:
              FOO: bar
            command: echo hello
        """
    )


def test_the_header_names_the_source_file_and_escapes_odd_characters() -> None:
    result = translate("", path="/tmp/my\ncron\x01tab")
    assert result.text.splitlines()[0] == (
        "# Translated from '/tmp/my\\ncron\\x01tab' by `dblockrun import-crontab`."
    )


# --- comments, blank lines, descriptions -------------------------------------------


def test_comments_and_blank_lines_are_skipped() -> None:
    result = translate(
        """\

        # a comment about nothing

           # indented comment

        0 * * * * a
        \t
        """
    )
    assert body(result) == "jobs:\n  a:\n    cron: 0 * * * *\n    command: a\n"
    assert result.problems == ()


def test_the_comment_directly_above_a_job_is_its_description() -> None:
    result = translate(
        """\
        # Back up the database: nightly, #1
        30 2 * * * backup
        # not directly above

        0 3 * * * b
        """
    )
    first, second = loaded(result).jobs
    assert first.description == "Back up the database: nightly, #1"
    assert second.description == ""
    assert "    description: 'Back up the database: nightly, #1'\n" in result.text


def test_consecutive_comment_lines_are_joined() -> None:
    result = translate(
        """\
        # unrelated
        #
        ## Rotate the logs,
        #   then compress them
        0 0 * * * rotate
        """
    )
    assert only_job(result).description == "Rotate the logs, then compress them"


def test_headers_and_commented_out_jobs_are_not_descriptions() -> None:
    result = translate(
        """\
        # Edit this file to introduce tasks to be run by cron.
        # m h  dom mon dow   command
        0 0 * * * a
        # The old one:
        #0 4 * * * old-job
        0 1 * * * b
        # @daily old
        0 2 * * * c
        """
    )
    assert [job.description for job in loaded(result).jobs] == ["", "", ""]


def test_debians_etc_crontab_header_is_not_a_description() -> None:
    result = translate(
        """\
        # Example of job definition:
        # .---------------- minute (0 - 59)
        # |  .------------- hour (0 - 23)
        # |  |  |  |  |
        # *  *  *  *  * user-name command to be executed
        17 *\t* * *\troot    cd / && run-parts --report /etc/cron.hourly
        """,
        system=True,
    )
    assert only_job(result).description == ""


@pytest.mark.parametrize(
    "header",
    [
        "# m h dom mon dow cmd",
        "# m h  dom mon dow   command",
        "#min hour day month weekday command",
        "# minute hour day-of-month month day-of-week user command",
        "# m  h  dom mon dow user  command",
    ],
)
def test_a_column_header_is_never_a_description(header: str) -> None:
    assert only_job(translate(f"{header}\n0 0 * * * /opt/x\n")).description == ""


def test_a_comment_above_a_skipped_line_is_dropped() -> None:
    result = translate(
        """\
        # start the thing
        @reboot start
        0 0 * * * other
        """
    )
    assert only_job(result).description == ""


# --- environment lines -------------------------------------------------------------


def test_variables_apply_to_the_jobs_that_follow() -> None:
    result = translate(
        """\
        0 0 * * * first
        PATH=/usr/local/bin:/usr/bin
        GREETING = "hello world"
        SINGLE='a # b'
        TRAILING=x  \t
        NUMBER=1
        EMPTY=
        0 1 * * * second
        PATH = /opt/bin
        0 2 * * * third
        """
    )
    first, second, third = loaded(result).jobs
    assert first.env == ()
    assert dict(second.env) == {
        "PATH": "/usr/local/bin:/usr/bin",
        "GREETING": "hello world",
        "SINGLE": "a # b",
        "TRAILING": "x",
        "NUMBER": "1",
        "EMPTY": "",
    }
    assert dict(third.env)["PATH"] == "/opt/bin"
    assert dict(third.env)["GREETING"] == "hello world"
    assert (
        "  second:\n"
        "    cron: 0 1 * * *\n"
        "    env:\n"
        "      PATH: /usr/local/bin:/usr/bin\n"
        "      GREETING: hello world\n"
        "      SINGLE: 'a # b'\n"
        "      TRAILING: x\n"
        "      NUMBER: '1'\n"
        "      EMPTY: ''\n"
        "    command: second\n"
    ) in result.text
    assert result.problems == ()


def test_a_quoted_variable_name_loses_its_quotes() -> None:
    result = translate('"FOO"=bar\n0 0 * * * x\n')
    assert only_job(result).env == (("FOO", "bar"),)


def test_a_variable_without_a_name_is_reported() -> None:
    assert messages('""=bar\n') == ["crontab:1: cannot translate: a variable without a name"]


def test_an_equals_sign_in_a_command_is_not_a_variable() -> None:
    result = translate("0 0 * * * FOO=1 run\n@daily X=2 run\n")
    assert [job.command for job in loaded(result).jobs] == ["FOO=1 run", "X=2 run"]
    assert [job.env for job in loaded(result).jobs] == [(), ()]


def test_shell_sets_the_shell() -> None:
    result = translate(
        """\
        0 0 * * * a
        SHELL=/bin/bash
        0 1 * * * b
        SHELL=
        0 2 * * * c
        """
    )
    assert [job.shell for job in loaded(result).jobs] == ["/bin/sh", "/bin/bash", "/bin/bash"]
    assert "env" not in result.text.split("jobs:")[1]
    assert result.messages == [
        "crontab:4: cannot translate: SHELL= is empty; the jobs below use the default /bin/sh"
    ]


def test_cron_tz_sets_the_timezone() -> None:
    result = translate(
        """\
        0 0 * * * a
        CRON_TZ=America/New_York
        0 1 * * * b
        CRON_TZ=""
        0 2 * * * c
        """
    )
    assert [job.timezone for job in loaded(result).jobs] == ["UTC", "America/New_York", "UTC"]
    assert [job.env for job in loaded(result).jobs] == [(), (), ()]
    assert "    timezone: America/New_York\n" in result.text


def test_tz_sets_the_timezone_and_stays_in_the_environment() -> None:
    result = translate("TZ=:Asia/Tokyo\n0 9 * * * report\n")
    job = only_job(result)
    assert job.timezone == "Asia/Tokyo"
    assert job.env == (("TZ", ":Asia/Tokyo"),)


def test_an_unknown_timezone_is_reported_and_the_last_one_kept() -> None:
    result = translate(
        """\
        TZ=Mars/Olympus
        CRON_TZ=Europe/Paris
        CRON_TZ=Europe/Pariss
        0 0 * * * a
        """
    )
    assert result.messages == [
        "crontab:1: cannot translate: TZ=Mars/Olympus: unknown time zone 'Mars/Olympus' "
        "(use e.g. UTC, Europe/Amsterdam); the jobs below keep UTC",
        "crontab:3: cannot translate: CRON_TZ=Europe/Pariss: unknown time zone "
        "'Europe/Pariss' (did you mean 'Europe/Paris'?); the jobs below keep Europe/Paris",
    ]
    job = only_job(result)
    assert job.timezone == "Europe/Paris"
    assert job.env == (("TZ", "Mars/Olympus"),)


def test_mailto_becomes_a_mail_notification_on_failure() -> None:
    result = translate(
        """\
        MAILTO=ops@example.com, root
        0 0 * * * a
        MAILFROM=cron@example.com
        0 1 * * * b
        MAILTO=""
        0 2 * * * c
        """
    )
    assert result.messages == [
        "crontab:1: warning: MAILTO=ops@example.com, root: the jobs below mail it through "
        "localhost on failure and timeout (notify: mailto://...); cron mailed any output, "
        "`dblockrun history` keeps it",
    ]
    assert result.problems == ()
    jobs = loaded(result).jobs
    assert [job.name for job in jobs] == ["a", "b", "c"]
    assert [job.env for job in jobs] == [(), (), ()]
    a, b, c = (job.notify for job in jobs)
    assert a is not None and b is not None and c is None
    assert a.on == b.on == ("failure", "timeout")
    assert [u.value for u in a.urls] == [
        "mailto://localhost/ops@example.com/root@localhost"]
    assert [u.value for u in b.urls] == [
        "mailto://localhost/ops@example.com/root@localhost?from=cron@example.com"]
    # apprise reads it as mail to both, from MAILFROM, through localhost:25.
    import apprise

    service = apprise.Apprise.instantiate(b.urls[0].value)
    assert service is not None
    rendered = service.url(privacy=True)  # type: ignore[no-untyped-call]
    assert rendered.startswith("mailto://localhost/ops%40example.com/root%40localhost?")
    assert "from=cron%40example.com" in rendered


def test_an_empty_mailto_is_what_dblockrun_does_anyway() -> None:
    assert messages("MAILTO=\nMAILTO=''\n0 0 * * * a\n") == []


# --- schedules ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "macro", ["@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"]
)
def test_macros_are_kept(macro: str) -> None:
    result = translate(f"{macro}\t  run --it\n")
    assert body(result) == f"jobs:\n  run:\n    cron: '{macro}'\n    command: run --it\n"
    assert only_job(result).cron == macro


def test_reboot_is_reported() -> None:
    result = translate("@reboot /usr/bin/start-thing\n0 0 * * * a\n")
    assert result.messages == [
        "crontab:1: cannot translate: @reboot: a fleet has no single boot "
        "(use a cron expression or rate)"
    ]
    assert [job.name for job in loaded(result).jobs] == ["a"]


def test_an_unknown_macro_is_reported() -> None:
    assert messages("@fortnightly x\n@DAILY y\n") == [
        "crontab:1: cannot translate: unknown macro '@fortnightly' (known: @yearly @annually "
        "@monthly @weekly @daily @midnight @hourly; @reboot is not)",
        "crontab:2: cannot translate: unknown macro '@DAILY' (macros are lower case, as in "
        "cron: @daily)",
    ]


def test_schedules_in_names_and_lists_are_kept_as_written() -> None:
    result = translate("0,30 8-18/2 1 jan-mar mon-fri x\n")
    assert only_job(result).cron == "0,30 8-18/2 1 jan-mar mon-fri"
    assert "    cron: 0,30 8-18/2 1 jan-mar mon-fri\n" in result.text


def test_tabs_and_runs_of_blanks_between_fields_become_one_space() -> None:
    result = translate("0\t\t2  *  *\t*   backup  --now\n")
    job = only_job(result)
    assert job.cron == "0 2 * * *"
    assert job.command == "backup  --now"


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("60 * * * * x", "schedule '60 * * * *': bad minute field '60' (allowed: 0-59)"),
        ("0 24 * * * x", "schedule '0 24 * * *': bad hour field '24' (allowed: 0-23)"),
        ("0 0 31 2 * x", "'0 0 31 2 *' never matches a date"),
        (
            "0 22-2 * * * x",
            "schedule '0 22-2 * * *': bad hour field '22-2': 22-2 runs backwards; cron "
            "accepts it and never runs it (write 22-23,0-2)",
        ),
        (
            "0 0 * * MON-SUN x",
            "schedule '0 0 * * MON-SUN': bad day-of-week field 'MON-SUN': MON-SUN runs "
            "backwards; cron accepts it and never runs it (write 1-6,0)",
        ),
        (
            "5/10 * * * * x",
            "schedule '5/10 * * * *': bad minute field '5/10': a step follows * or a range "
            "(write 5-59/10)",
        ),
        (
            "H * * * * x",
            "schedule 'H * * * *': minute field 'H': hashed (H) and random (R) values are "
            "not supported; every host must compute the same slots",
        ),
        ("* * * *", "not a job or a variable: expected 5 schedule fields and a command"),
        ("hello", "not a job or a variable: expected 5 schedule fields and a command"),
        ("* * * * *", "no command: expected 5 schedule fields and a command"),
        ("* * * * *   \t", "no command: expected 5 schedule fields and a command"),
        ("@daily", "no command: expected a macro and a command"),
    ],
)
def test_bad_lines_are_reported(line: str, why: str) -> None:
    result = translate(f"0 0 * * * before\n{line}\n0 0 * * * after\n")
    assert result.messages == [f"crontab:2: cannot translate: {why}"]
    assert [job.name for job in loaded(result).jobs] == ["before", "after"]


def test_a_nul_character_is_reported() -> None:
    assert messages("0 0 * * * a\0b\nX=\0\n# fine\0\n") == [
        "crontab:1: cannot translate: the line contains a NUL character",
        "crontab:2: cannot translate: the line contains a NUL character",
    ]


def test_windows_line_ends_are_ignored() -> None:
    result = translate("FOO=bar\r\n# Hi\r\n0 0 * * * a\r\n")
    job = only_job(result)
    assert (job.description, job.env, job.command) == ("Hi", (("FOO", "bar"),), "a")


# --- system crontabs ---------------------------------------------------------------


def test_the_user_field_becomes_user_or_a_comment_for_root() -> None:
    result = translate(
        """\
        SHELL=/bin/sh
        # Hourly scripts
        17 *\t* * *\troot    cd / && run-parts --report /etc/cron.hourly
        @daily nobody /srv/app/cleanup
        """,
        system=True,
    )
    assert result.text.split("\n", 3)[3] == textwrap.dedent(  # a key of both: in defaults
        """\
        defaults:
          shell: /bin/sh
        jobs:
          run-parts-cron.hourly:
            # cron ran this as user root; dblockrun runs it as the daemon's user
            description: Hourly scripts
            cron: 17 * * * *
            command: cd / && run-parts --report /etc/cron.hourly
          cleanup:
            cron: '@daily'
            user: nobody
            command: /srv/app/cleanup
        """
    )
    assert [job.shell for job in loaded(result).jobs] == ["/bin/sh", "/bin/sh"]
    assert [job.user for job in loaded(result).jobs] == [None, "nobody"]
    assert result.problems == ()
    assert result.warnings == ()


def test_a_user_this_host_does_not_know_disables_the_job() -> None:
    result = translate("0 0 * * * no-such-user-x run --it\n", system=True)
    assert body(result) == textwrap.dedent(
        """\
        jobs:
          run:
            # cron ran this as user no-such-user-x, unknown on this host
            cron: 0 0 * * *
            enabled: false
            command: run --it
        """
    )
    assert result.messages == [
        "crontab:1: warning: user no-such-user-x does not exist on this host: job 'run' is "
        "written with enabled: false (add user: where the user exists)"
    ]
    assert result.problems == ()
    assert only_job(result).enabled is False


def test_a_system_line_needs_a_user_and_a_command() -> None:
    assert messages("0 0 * * * root\n@hourly root\n", system=True) == [
        "crontab:1: cannot translate: no command: expected 5 schedule fields, a user and a "
        "command",
        "crontab:2: cannot translate: no command: expected a macro, a user and a command",
    ]


CRON_D = """\
# /etc/cron.d/certbot: crontab entries for the certbot package
SHELL=/bin/sh
PATH=/usr/local/sbin:/usr/local/bin:/sbin:/bin:/usr/sbin:/usr/bin

0 */12 * * * root test -x /usr/bin/certbot -a \\! -d /run/systemd/system && perl -e \
'sleep int(rand(43200))' && certbot -q renew --no-random-sleep-on-renew
09,39 *     * * *     nobody   [ -x /usr/lib/php/sessionclean ] && \
if [ ! -d /run/systemd/system ]; then /usr/lib/php/sessionclean; fi
"""


def test_a_cron_d_file_elsewhere_is_read_with_its_user_field() -> None:
    result = translate_crontab(CRON_D, "crontab")
    assert [(job.name, job.user) for job in loaded(result).jobs] == [
        ("certbot-renew", None),
        ("sessionclean", "nobody"),
    ]
    assert [str(job.command).split()[0] for job in loaded(result).jobs] == ["test", "["]
    assert result.messages == [
        "crontab:5: warning: a user name follows the schedule on 2 of 2 jobs (root, nobody): "
        "read as a system crontab, with a user field"
    ]
    assert result.problems == ()


@pytest.mark.parametrize(
    "text",
    [
        "0 2 * * * backup --now\n",  # a user's name, then an option: a command
        "0 2 * * * mail -s hi root < /dev/null\n",
        "0 2 * * * root-cleanup /tmp\n",
        "0 0 * * * root a\n0 1 * * * b c\n0 2 * * * d e\n",  # one job in three
        "0 0 * * * root\n",  # no command after it
    ],
)
def test_a_user_crontab_is_not_mistaken_for_a_system_one(text: str) -> None:
    result = translate(text)
    assert result.warnings == ()
    assert loaded(result).jobs[0].command == text.split("\n")[0].split(maxsplit=5)[5]


def test_a_user_crontab_has_no_user_field() -> None:
    result = translate("0 0 * * * root run\n", system=False, path="/etc/cron.d/x")
    assert only_job(result).command == "root run"


def test_files_under_etc_are_system_crontabs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert is_system_path("/etc/crontab")
    assert is_system_path("/etc/cron.d/backup")
    assert not is_system_path("/var/spool/cron/crontabs/alice")
    assert not is_system_path("crontab")
    assert not is_system_path("-")
    monkeypatch.chdir("/etc")
    assert is_system_path("crontab")
    result = translate_crontab("0 0 * * * root run\n", "/etc/cron.d/x")
    assert "# cron ran this as user root;" in result.text
    assert only_job(result).command == "run"


# --- % in commands -----------------------------------------------------------------


PERCENT = (
    "unescaped % in the command: cron ends the command there and feeds the rest to its "
    "stdin (write \\% for a literal %)"
)


@pytest.mark.parametrize(
    "command", ["date +%Y", "mail -s hi root%body%more", "x %", "a \\\\%b", "%"]
)
def test_an_unescaped_percent_is_reported(command: str) -> None:
    assert messages(f"0 0 * * * {command}\n") == [f"crontab:1: cannot translate: {PERCENT}"]


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("date +\\%Y-\\%m-\\%d", "date +%Y-%m-%d"),
        ("echo \\%", "echo %"),
        ("echo a\\b \\n \\\\x", "echo a\\b \\n \\\\x"),
        ("echo \\\\\\%", "echo \\\\%"),
        ("echo trailing\\", "echo trailing\\"),
    ],
)
def test_an_escaped_percent_becomes_a_percent(command: str, expected: str) -> None:
    result = translate(f"0 0 * * * {command}\n")
    assert only_job(result).command == expected
    assert result.problems == ()


# --- job names ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "name"),
    [
        ("/usr/local/bin/backup.sh --all", "backup.sh"),
        ("./run_it", "run_it"),
        ("python3 -m app", "app"),
        ("python3 /srv/app/manage.py clearsessions", "manage.py-clearsessions"),
        ("/usr/bin/php -d memory_limit=1G /srv/artisan schedule:run >/dev/null 2>&1",
         "artisan-schedule-run"),
        ("php /var/www/cron.php", "cron.php"),
        ("bin/weird$name(1)", "weird-name"),
        ("héllo wörld", "h-llo"),
        ("[ -x /usr/bin/foo ] && foo", "foo"),
        ("/usr/bin/ x", "job"),
        (". /etc/profile; run", "run"),
        ("source ~/.profile && ./sync.sh", "sync.sh"),
        ("cd /srv/app && bin/console cache:clear", "console-cache-clear"),
        ("if [ -f /tmp/go ]; then /opt/go; fi", "go"),
        ("bash -lc 'cd /srv && ./run.sh'", "run.sh"),
        ("bash /opt/nightly.sh", "nightly.sh"),
        ("$SLAPOS_REPORT_COMMAND --now", "slapos-report-command"),
        ("FOO=1 nice -n 19 timeout 1h flock -n /tmp/l /opt/bin/rotate", "rotate"),
        ("sudo -u www-data /usr/bin/env python3 /opt/x.py", "x.py"),
        ("sleep 30; curl -s https://example.com/ping", "curl"),
        ("apt-get update -q", "apt-get-update"),
        ("dblockrun exec --name report -- /usr/local/bin/report", "report"),
        (
            "test -x /usr/bin/certbot -a \\! -d /run/systemd/system && perl -e "
            "'sleep int(rand(43200))' && certbot -q renew --no-random-sleep-on-renew",
            "certbot-renew",
        ),
        (
            "[ -x /usr/lib/php/sessionclean ] && if [ ! -d /run/systemd/system ]; then "
            "/usr/lib/php/sessionclean; fi",
            "sessionclean",
        ),
        ("test -x /usr/sbin/anacron || { cd / && run-parts --report /etc/cron.daily; }",
         "run-parts-cron.daily"),
        ("cd /tmp", "cd"),
        ("--flag", "flag"),
        ("123", "123"),
        ("true", "true"),
        ("a" * 300, "a" * 100),
    ],
)
def test_names_come_from_the_program_that_runs(command: str, name: str) -> None:
    result = translate(f"0 0 * * * {command}\n")
    assert only_job(result).name == name


def test_names_are_made_unique() -> None:
    result = translate(
        """\
        0 0 * * * backup -a
        0 1 * * * /opt/backup -b
        0 2 * * * backup-2
        0 3 * * * backup -c
        0 4 * * * backup -d
        """
    )
    assert [job.name for job in loaded(result).jobs] == [
        "backup",
        "backup-2",
        "backup-2-2",
        "backup-3",
        "backup-4",
    ]


def test_names_that_look_like_other_yaml_types_stay_strings() -> None:
    result = translate("0 0 * * * true\n0 0 * * * 1.5\n0 0 * * * null\n0 0 * * * 0x10\n")
    assert [job.name for job in loaded(result).jobs] == ["true", "1.5", "null", "0x10"]


# --- YAML quoting ------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        "echo a: b",
        "echo a #b",
        "# not a comment",
        "*glob",
        "&anchor",
        "!tag",
        "- dash",
        "? what",
        "'single' and \"double\"",
        "{a: b}",
        "[1, 2]",
        "|pipe",
        ">greater",
        "@at",
        "`tick`",
        "yes",
        "null",
        "~",
        "0o17",
        "echo trailing space  ",
        "echo\ttab",
        "echo \x01\x7f\x85\u2028\ufeff",
        "echo ünïcödé ✓ 😀",
        "x" * 500 + " y",
    ],
)
def test_commands_survive_yaml(command: str) -> None:
    result = translate(f"0 0 * * * {command}\n")
    assert only_job(result).command == command


@pytest.mark.parametrize(
    "value", ["a: b", "#x", "1", "true", "'", "\\", "a\x85b", " lead", "*"]
)
def test_variables_and_descriptions_survive_yaml(value: str) -> None:
    result = translate(f"V={value}\n# {value}: about\n0 0 * * * x\n")
    job = only_job(result)
    assert job.env == (("V", value.strip(" \t")),)  # cron drops blanks around =
    assert job.description == f"{value.strip()}: about"


def test_odd_users_stay_in_their_comment() -> None:
    result = translate("0 0 * * * r\x85o\u2028o\x01t run\n", system=True)
    assert "    # cron ran this as user 'r\\x85o\\u2028o\\x01t', unknown on this host\n" in (
        result.text
    )
    assert only_job(result).command == "run"


_LINE = st.one_of(
    st.text(max_size=40),
    st.text(alphabet="*/-,0123456789 \t%\\#=@\"'abc:\x85", max_size=40),
    st.sampled_from(
        [
            "",
            "# a comment",
            "FOO=bar",
            'X = "q"',
            "SHELL=/bin/bash",
            "SHELL=",
            "CRON_TZ=Europe/Berlin",
            "TZ=nowhere",
            "MAILTO=root",
            "@daily x",
            "@reboot y",
            "*/5 * * * * a: b",
            "0 0 * * * root z",
            "0 0 * * * date +%s",
        ]
    ),
    st.tuples(
        st.sampled_from(["* * * * *", "@hourly", "0 0 1 1 *", "61 * * * *"]),
        st.text(max_size=30),
    ).map(" ".join),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(_LINE, max_size=12), system=st.booleans())
def test_any_crontab_gives_a_loadable_jobs_file(lines: list[str], system: bool) -> None:
    text = "\n".join(lines)
    result = translate_crontab(text, "any", system=system)
    jobs = load_jobs_text(result.text, "out.yaml")
    assert len(jobs.jobs) == result.jobs
    assert len({job.name for job in jobs.jobs}) == result.jobs
    line_count = len(text.split("\n"))
    assert all(1 <= problem.line <= line_count for problem in result.problems)
    assert sorted({problem.line for problem in result.problems}) == [
        problem.line for problem in result.problems
    ]


_TEXT = st.text(
    st.characters(codec="utf-8", exclude_characters="\n\r%\0\\"), min_size=1
)


@settings(max_examples=300, deadline=None)
@given(command=_TEXT, value=_TEXT, comment=_TEXT)
def test_any_command_variable_and_comment_survive_yaml(
    command: str, value: str, comment: str
) -> None:
    command, value, comment = command.lstrip(" \t"), value.strip(" \t"), comment.strip()
    assume(command.strip() and value and comment and not comment.startswith("#"))
    text = f"V='{value}'\n# {comment}\n0 0 * * * {command}\n"
    result = translate_crontab(text, "any", system=False)
    assert result.problems == ()
    (job,) = load_jobs_text(result.text, "out.yaml").jobs
    assert job.command == command
    assert job.env == (("V", value),)
    assert job.description in ("", comment)  # "" if the comment looks like a crontab line


def test_odd_variable_names_survive_yaml() -> None:
    result = translate("A\x85B=1\n\u2028=2\nyes=3\n0 0 * * * x\n")
    assert only_job(result).env == (("A\x85B", "1"), ("yes", "3"), ("\u2028", "2"))


# --- the command -------------------------------------------------------------------


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["import-crontab", *args], input=stdin, prog_name="dblockrun")


def test_cli_prints_the_jobs_file_and_exits_0(tmp_path: Path) -> None:
    crontab = tmp_path / "crontab"
    crontab.write_text("# Nightly\n0 2 * * * backup\n")
    result = invoke(str(crontab))
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert result.stdout == translate_crontab(crontab.read_text(), str(crontab),
                                              host_zone=host_timezone()).text
    assert load_jobs_text(result.stdout, "x").jobs[0].description == "Nightly"


def left_out(jobs: int, lines: int, out: Path | None = None) -> str:
    """The last line of ``import-crontab`` when ``lines`` were not translated."""
    where = "written" if out is None else f"written to {out}"
    return (f"dblockrun: {jobs} job(s) {where}; {lines} line(s) not translated, left out as "
            "comments at the end of the jobs file (exit status 1)\n")


def test_cli_reports_skipped_lines_and_exits_1(tmp_path: Path) -> None:
    crontab = tmp_path / "crontab"
    crontab.write_text("MAILTO=me\n@reboot start\n0 2 * * * backup\n")
    result = invoke(str(crontab))
    assert result.exit_code == 1
    assert result.stderr == (
        f"{crontab}:1: warning: MAILTO=me: the jobs below mail it through localhost on "
        "failure and timeout (notify: mailto://...); cron mailed any output, `dblockrun "
        "history` keeps it\n"
        f"{crontab}:2: cannot translate: @reboot: a fleet has no single boot "
        "(use a cron expression or rate)\n" + left_out(1, 1)
    )
    assert [job.name for job in load_jobs_text(result.stdout, "x").jobs] == ["backup"]


def test_cli_a_mailto_line_is_a_warning_and_exits_0(tmp_path: Path) -> None:
    crontab = tmp_path / "crontab"
    crontab.write_text("MAILTO=ops@example.com\n0 2 * * * /usr/local/bin/backup --all\n")
    result = invoke(str(crontab))
    assert result.exit_code == 0
    assert result.stderr == (
        f"{crontab}:1: warning: MAILTO=ops@example.com: the jobs below mail it through "
        "localhost on failure and timeout (notify: mailto://...); cron mailed any output, "
        "`dblockrun history` keeps it\n"
    )
    assert [job.name for job in load_jobs_text(result.stdout, "x").jobs] == ["backup"]


def test_cli_reads_a_docker_crontab_with_a_user_field(tmp_path: Path) -> None:
    crontab = tmp_path / "crontab"
    crontab.write_text(
        "* * * * * root /app/bin/ping >> /proc/1/fd/1 2>&1\n"
        "*/5 * * * * nobody php /app/artisan schedule:run\n"
    )
    result = invoke(str(crontab))
    assert result.exit_code == 0
    assert result.stderr == (
        f"{crontab}:1: warning: a user name follows the schedule on 2 of 2 jobs "
        "(root, nobody): read as a system crontab, with a user field\n"
    )
    assert "jobs:" + result.stdout.split("\njobs:", 1)[1] == textwrap.dedent(
        """\
        jobs:
          ping:
            # cron ran this as user root; dblockrun runs it as the daemon's user
            cron: '* * * * *'
            command: /app/bin/ping >> /proc/1/fd/1 2>&1
          artisan-schedule-run:
            cron: '*/5 * * * *'
            user: nobody
            command: php /app/artisan schedule:run
        """
    )
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(result.stdout)
    validated = CliRunner().invoke(cli, ["validate", str(jobs)])
    assert validated.exit_code == 0, validated.output


def test_cli_reports_a_schedule_cron_would_never_run(tmp_path: Path) -> None:
    crontab = tmp_path / "crontab"
    crontab.write_text("0 22-2 * * * /opt/night\n0 22 */2 * 1-5 /opt/odd-weekdays\n")
    result = invoke(str(crontab))
    assert result.exit_code == 1
    assert result.stderr == (
        f"{crontab}:1: cannot translate: schedule '0 22-2 * * *': bad hour field '22-2': "
        "22-2 runs backwards; cron accepts it and never runs it (write 22-23,0-2)\n"
        + left_out(1, 1)
    )
    (job,) = load_jobs_text(result.stdout, "x").jobs
    assert (job.name, job.cron) == ("odd-weekdays", "0 22 */2 * 1-5")


def test_cli_writes_to_output(tmp_path: Path) -> None:
    crontab = tmp_path / "crontab"
    crontab.write_text("0 2 * * * backup\n0 3 * * * date +%F\n")
    out = tmp_path / "jobs.yaml"
    result = invoke(str(crontab), "-o", str(out))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"{crontab}:2: cannot translate: {PERCENT}\n" + left_out(
        1, 1, out)
    assert [job.name for job in load_jobs_text(out.read_text(), "x").jobs] == ["backup"]


def test_cli_reads_stdin() -> None:
    result = invoke("-", "--system", stdin="0 2 * * * root backup\n")
    assert result.exit_code == 0, result.output
    assert "# Translated from stdin by" in result.stdout
    assert "    # cron ran this as user root;" in result.stdout


def test_cli_detects_system_crontabs_by_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dblockrun.config.crontab, "SYSTEM_PREFIX", f"{tmp_path}/")
    crontab = tmp_path / "cron.d" / "app"
    crontab.parent.mkdir()
    crontab.write_text("0 2 * * * www-data backup\n")
    result = invoke(str(crontab))
    assert result.exit_code == 0, result.output
    assert load_jobs_text(result.stdout, "x").jobs[0].command == "backup"
    result = invoke(str(tmp_path / "cron.d" / ".." / "cron.d" / "app"))
    assert load_jobs_text(result.stdout, "x").jobs[0].command == "backup"


def test_cli_cannot_read_or_write(tmp_path: Path) -> None:
    result = invoke(str(tmp_path / "missing"))
    assert result.exit_code == 2
    assert result.stderr == (
        f"dblockrun: {tmp_path / 'missing'}: cannot read: No such file or directory\n"
    )
    binary = tmp_path / "binary"
    binary.write_bytes(b"0 0 * * * \xff\n")
    result = invoke(str(binary))
    assert result.exit_code == 2
    assert result.stderr == (
        f"dblockrun: {binary}: cannot read: not UTF-8 text (invalid start byte)\n"
    )
    crontab = tmp_path / "crontab"
    crontab.write_text("0 2 * * * backup\n")
    result = invoke(str(crontab), "-o", str(tmp_path / "no" / "jobs.yaml"))
    assert result.exit_code == 2
    assert result.stderr == (
        f"dblockrun: {tmp_path / 'no' / 'jobs.yaml'}: cannot write: No such file or directory\n"
    )


def test_cli_help_documents_the_exit_status() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "FILE:LINE: cannot translate: why" in text
    assert ("Exit status 0 if every line translated; 1 if some could not be (the jobs file "
            "is still written, without them)") in text


# --- issue 23, item 9: the host's time zone, defaults:, stdin, --help ---------------


def test_cli_writes_the_hosts_time_zone_under_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under TZ=Europe/Berlin, cron ran `0 3 * * *` at 03:00 Berlin time: the
    jobs file says so, or the job would move by an hour or two."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    crontab = tmp_path / "crontab"
    crontab.write_text("FOO=1\n0 3 * * * /usr/bin/backup\n30 4 * * * report\n"
                       "CRON_TZ=Asia/Tokyo\n0 9 * * * tokyo\nCRON_TZ=\n0 5 * * * late\n")
    result = invoke(str(crontab))
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout == textwrap.dedent(
        f"""\
        # Translated from {crontab} by `dblockrun import-crontab`.
        # cron read schedules in this host's time zone (Europe/Berlin): written as timezone:.
        # Commands get the daemon's environment plus env:.
        defaults:
          env:
            FOO: '1'
        jobs:
          backup:
            cron: 0 3 * * *
            timezone: Europe/Berlin
            command: /usr/bin/backup
          report:
            cron: 30 4 * * *
            timezone: Europe/Berlin
            command: report
          tokyo:
            cron: 0 9 * * *
            timezone: Asia/Tokyo
            command: tokyo
          late:
            cron: 0 5 * * *
            timezone: Europe/Berlin
            command: late
        """
    )
    jobs = load_jobs_text(result.stdout, "x").jobs
    assert [job.timezone for job in jobs] == ["Europe/Berlin"] * 2 + ["Asia/Tokyo", "Europe/Berlin"]
    assert {dict(job.env)["FOO"] for job in jobs} == {"1"}
    # Every job in the host's zone: the zone goes under defaults too.
    crontab.write_text("0 3 * * * /usr/bin/backup\n30 4 * * * report\n")
    result = invoke(str(crontab))
    assert result.stdout.split("\n", 3)[3].startswith(
        "defaults:\n  timezone: Europe/Berlin\njobs:\n  backup:\n    cron: 0 3 * * *\n"
        "    command: /usr/bin/backup\n")


@pytest.mark.parametrize(("tz", "zone"), [
    (":Europe/Berlin", "Europe/Berlin"), ("/usr/share/zoneinfo/America/New_York",
                                          "America/New_York"),
    ("UTC", None), ("Etc/UTC", None),
])
def test_the_hosts_time_zone_comes_from_tz(monkeypatch: pytest.MonkeyPatch, tz: str,
                                           zone: str | None) -> None:
    monkeypatch.setenv("TZ", tz)
    assert host_timezone() == zone


def test_cli_warns_when_local_time_has_no_zone_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    monkeypatch.setenv("TZ", "XYZ-3")  # POSIX: 3 hours east of UTC, no zone name
    time.tzset()
    try:
        crontab = tmp_path / "crontab"
        crontab.write_text("0 3 * * * backup\n")
        result = invoke(str(crontab))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert result.exit_code == 0
    assert result.stderr == (
        f"{crontab}: warning: this host's local time is not UTC and TZ, /etc/timezone and "
        "/etc/localtime name no zone: cron read these schedules in local time, dblockrun "
        "reads them in UTC: add timezone: (under defaults:)\n")


def test_cli_calls_standard_input_stdin() -> None:
    result = invoke("-", stdin="0 2 * * * backup\n@reboot start\n")
    assert result.exit_code == 1
    assert result.stdout.startswith("# Translated from stdin by `dblockrun import-crontab`.\n")
    assert result.stderr == ("stdin:2: cannot translate: @reboot: a fleet has no single boot "
                             "(use a cron expression or rate)\n" + left_out(1, 1))


def test_cli_help_says_mailto_is_translated() -> None:
    text = " ".join(invoke("--help").stdout.split())
    assert "MAILTO= becomes a mail notification on failure and timeout" in text
    assert "(@reboot, an unescaped %" in text and "MAILTO=, an" not in text
    assert "FILE (- for stdin)" in text


# -- issue 36 item 5 ----------------------------------------------------------------------


def test_lines_not_translated_are_written_into_the_jobs_file_with_why(tmp_path: Path) -> None:
    """With -o the file was written and exit 1 came with the reasons on
    stderr only: the file now says which lines it lacks and why, and the
    last line on stderr what exit status 1 means."""
    crontab = tmp_path / "crontab"
    crontab.write_text("0 2 * * * backup\n@reboot /usr/local/bin/start\n"
                       "0 3 * * * date +%F > /tmp/d\n")
    out = tmp_path / "jobs.yaml"
    result = invoke(str(crontab), "-o", str(out))
    assert result.exit_code == 1
    assert result.stderr.endswith(left_out(1, 2, out))
    text = out.read_text()
    assert text.splitlines()[3] == "# 2 line(s) could not be translated: see the end of this file."
    assert text.endswith(
        "\n# Not translated (`dblockrun import-crontab` exits with status 1 when a line is "
        "here):\n"
        "# line 2: @reboot: a fleet has no single boot (use a cron expression or rate)\n"
        "#   @reboot /usr/local/bin/start\n"
        f"# line 3: {PERCENT}\n"
        "#   0 3 * * * date +%F > /tmp/d\n")
    assert [job.name for job in load_jobs_text(text, "x").jobs] == ["backup"]


@pytest.mark.parametrize(("line", "command"), [
    ("flock -n /var/lock/report.lock /usr/local/bin/report --all > /tmp/r.log 2>&1",
     "/usr/local/bin/report --all > /tmp/r.log 2>&1"),
    ("/usr/bin/flock -xn /var/lock/report.lock -c 'cd /srv && ./report.sh'",
     "cd /srv && ./report.sh"),
    ("flock --nonblock /var/lock/report.lock report", "report"),
])
def test_a_flock_n_wrapper_is_removed_with_a_comment(line: str, command: str) -> None:
    result = translate(f"30 2 * * * {line}\n")
    assert result.problems == ()
    (job,) = load_jobs_text(result.text, "x").jobs
    assert job.command == command and job.group is None
    assert ("    # was run by `flock -n /var/lock/report.lock`: the job's lock replaces it\n"
            "    # (a run still going makes the next slot skip)\n") in result.text


@pytest.mark.parametrize("line", [
    "flock /var/lock/r.lock report",  # waits for the lock: a queue, not a skip
    "flock -n /var/lock/r.lock report; cleanup",  # cleanup ran outside the lock
    "flock -n /var/lock/r.lock report && mail",
    "flock -w 10 -n /var/lock/r.lock report",
    "flock -n '/var/lock/a b.lock' report",
])
def test_a_flock_that_the_jobs_lock_would_not_replace_is_kept(line: str) -> None:
    (job,) = load_jobs_text(translate(f"30 2 * * * {line}\n").text, "x").jobs
    assert job.command == line


def test_jobs_that_shared_a_flock_lock_file_share_a_group_of_one_seat() -> None:
    result = translate("*/5 * * * * flock -n /run/lock/db.lock /opt/sync\n"
                       "0 * * * * flock -n /run/lock/db.lock /opt/vacuum\n"
                       "0 3 * * * flock -n /run/lock/other.lock /opt/alone\n")
    jobs = load_jobs_text(result.text, "x")
    assert jobs.groups == (("db", 1),)
    assert [(j.name, j.group, j.command) for j in jobs.jobs] == [
        ("sync", "db", "/opt/sync"), ("vacuum", "db", "/opt/vacuum"),
        ("alone", None, "/opt/alone")]
    assert "    # group db: one at a time with the other jobs of that lock file\n" in result.text
