"""`notify:` and `ping:` in the jobs file: each validator with a bad value,
the secret forms ({env: VAR}, {file: PATH}) read by `validate` and the
daemon, never echoed; the ping URLs and the hidden rendering of URLs."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest
from helpers import Ran, clean_env, dblockrun_cmd, invoke, wait_for

from dblockrun.config.load import load_jobs_text
from dblockrun.config.secreturl import resolve_secrets, scrub, shown
from dblockrun.errors import ConfigError
from dblockrun.jobs import ENV, FILE, LITERAL, NOTIFY_EVENTS, Job, Notify
from dblockrun.notify.pings import FAIL, START, SUCCESS, ping_url, run_uuid
from dblockrun.prometheus import Prometheus

SECRET = "xoxb-s3cr3t-T0KEN"


def load(text: str, path: str = "jobs.yaml") -> object:
    return load_jobs_text(textwrap.dedent(text), path)


def error(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value.render()


def job_with(keys: str) -> str:
    """A file whose job 'j' (line 2) has ``keys`` (YAML lines) from line 5 on."""
    return "jobs:\n  j:\n    cron: '@daily'\n    command: x\n" + textwrap.indent(
        textwrap.dedent(keys), "    ")


def test_notify_and_ping_forms() -> None:
    jobs = load_jobs_text(
        "defaults:\n"
        "  notify:\n"
        "    urls: ['json://hooks.example.com/x', {env: SLACK_URL}, {file: secret/url}]\n"
        "jobs:\n"
        "  a:\n    rate: 1h\n    command: x\n    ping: https://hc-ping.com/abc\n"
        "  b:\n    rate: 1h\n    command: x\n    notify: {urls: [{env: X}], on: [recovery]}\n"
        "    ping: {env: PING}\n"
        "  c:\n    rate: 1h\n    command: x\n    notify: null\n", "jobs.yaml")
    a, b, c = jobs.jobs
    assert a.notify is not None and a.notify.on == NOTIFY_EVENTS  # default: every event
    assert [(u.source, u.ref, u.value) for u in a.notify.urls] == [
        (LITERAL, "", "json://hooks.example.com/x"), (ENV, "SLACK_URL", ""),
        (FILE, "secret/url", "")]
    assert a.ping is not None and a.ping.value == "https://hc-ping.com/abc"
    assert b.notify is not None and b.notify.on == ("recovery",)
    assert b.ping is not None and (b.ping.source, b.ping.ref) == (ENV, "PING")
    assert c.notify is None  # null unsets what defaults set
    # A job's repr (a traceback, a debugger) never holds a value.
    assert "hooks.example.com" not in repr(a) and "hc-ping.com" not in repr(a)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("notify: json://h.example.com/x\n",
         "jobs.yaml:5: job 'j': notify: must be a mapping, got a string "
         "('json://h.example.com/x')"),
        ("notify: {on: [failure]}\n",
         "jobs.yaml:5: job 'j': notify: needs urls: a list of apprise URLs"),
        ("notify: {urls: []}\n",
         "jobs.yaml:5: job 'j': notify.urls: must be a non-empty list, got an empty list"),
        ("notify: {urls: json://h.example.com/x}\n",
         "jobs.yaml:5: job 'j': notify.urls: must be a non-empty list, got a string "
         "('json://h.example.com/x')"),
        ("notify:\n  urls: [json://h.example.com/x]\n  when: [failure]\n",
         "jobs.yaml:7: job 'j': notify.when: unknown key (known: urls, on, after)"),
        ("notify:\n  urls: [json://h.example.com/x]\n  on: [failure, sucess]\n",
         "jobs.yaml:7: job 'j': notify.on: unknown event a string ('sucess') "
         "(known: failure, recovery, timeout, missed, late, slow, fast, change)"),
        ("notify:\n  urls: [json://h.example.com/x]\n  on: chnage\n",
         "jobs.yaml:7: job 'j': notify.on: unknown event a string ('chnage') "
         "(known: failure, recovery, timeout, missed, late, slow, fast, change)"),
        ("notify:\n  urls: [json://h.example.com/x]\n  on: 5\n",
         "jobs.yaml:7: job 'j': notify.on: must be a non-empty list, got a number (5)"),
        ("notify:\n  urls: [{env: A, file: b}]\n",
         "jobs.yaml:6: job 'j': notify.urls[0]: must be a URL, {env: VARIABLE} or "
         "{file: PATH}"),
        ("notify:\n  urls: [{vault: a}]\n",
         "jobs.yaml:6: job 'j': notify.urls[0]: must be a URL, {env: VARIABLE} or "
         "{file: PATH}"),
        ("notify:\n  urls: [{env: ''}]\n",
         "jobs.yaml:6: job 'j': notify.urls[0]: env: must not be empty"),
        ("notify:\n  urls: [42]\n",
         "jobs.yaml:6: job 'j': notify.urls[0]: must be a URL, {env: VARIABLE} or "
         "{file: PATH}, got a number (42)"),
        ("ping: 12\n",
         "jobs.yaml:5: job 'j': ping: must be a URL, {env: VARIABLE} or {file: PATH}, "
         "got a number (12)"),
        ("ping: ftp://h.example.com/x\n",
         "jobs.yaml:5: job 'j': ping: must be an http:// or https:// URL"),
    ],
)
def test_bad_values_are_rejected_with_file_line_job_and_key(keys: str, message: str) -> None:
    assert error(job_with(keys)) == message


@pytest.mark.parametrize("keys", [
    f"notify: {{urls: ['{SECRET}']}}\n",
    f"notify: {{urls: ['hooks/{SECRET} x']}}\n",
    f"ping: '{SECRET}'\n",
])
def test_a_malformed_url_is_rejected_without_showing_it(keys: str) -> None:
    message = error(job_with(keys))
    assert "is not a URL (scheme://...)" in message
    assert SECRET not in message


def test_notify_under_defaults_names_its_key() -> None:
    text = "defaults:\n  notify: {urls: []}\njobs: {}\n"
    assert error(text) == ("jobs.yaml:2: defaults.notify.urls: must be a non-empty list, "
                           "got an empty list")


# -- reading the secrets ---------------------------------------------------------------


def validate(folder: Path, text: str, **env: str) -> Ran:
    """``dblockrun validate`` from ``/``, in-process (helpers.invoke)."""
    (folder / "jobs.yaml").write_text(text)
    return invoke("validate", str(folder / "jobs.yaml"), env=clean_env(**env), cwd="/")


def validate_in_a_process(folder: Path, text: str,
                          **env: str) -> subprocess.CompletedProcess[str]:
    """The same in a real process."""
    (folder / "jobs.yaml").write_text(text)
    return subprocess.run([*dblockrun_cmd(), "validate", str(folder / "jobs.yaml")],
                          capture_output=True, text=True, env=clean_env(**env), cwd="/",
                          timeout=60)


def test_validate_reads_variables_and_files_and_names_what_is_missing(tmp_path: Path) -> None:
    text = ("jobs:\n  j:\n    rate: 1h\n    command: x\n"
            "    notify:\n      urls: [{env: HOOK}, {file: hook-url}]\n"
            "    ping: {env: PING}\n")
    result = validate(tmp_path, text)
    assert result.returncode == 2
    assert result.stderr == (f"dblockrun: {tmp_path}/jobs.yaml:6: job 'j': notify.urls[0]: "
                             "environment variable HOOK is not set\n")
    env = {"HOOK": f"json://hooks.example.com/{SECRET}", "PING": "https://hc.example.com/p"}
    result = validate(tmp_path, text, **env)
    assert result.returncode == 2
    assert result.stderr.startswith(f"dblockrun: {tmp_path}/jobs.yaml:6: job 'j': "
                                    f"notify.urls[1]: cannot read file {tmp_path}/hook-url: ")
    # The file is relative to the jobs file, wherever validate runs.
    (tmp_path / "hook-url").write_text(f"slakc://{SECRET}\n")
    result = validate(tmp_path, text, **env)
    assert result.returncode == 2
    assert result.stderr == (f"dblockrun: {tmp_path}/jobs.yaml:6: job 'j': notify.urls[1]: "
                             "the URL (file hook-url): apprise does not support it (scheme "
                             "'slakc', or a malformed URL)\n")
    (tmp_path / "hook-url").write_text(f"slack://{SECRET}/B1/C1\n")
    # A real process: the secret never on a real stderr.
    real = validate_in_a_process(tmp_path, text,
                                 **{**env, "PING": f"ftp://h.example.com/{SECRET}"})
    assert real.returncode == 2
    assert real.stderr == (f"dblockrun: {tmp_path}/jobs.yaml:7: job 'j': ping: the URL "
                           "(env PING) must be http:// or https://\n")
    assert SECRET not in real.stderr
    result = validate(tmp_path, text, **env)
    assert (result.returncode, result.stdout) == (0, f"{tmp_path}/jobs.yaml: ok, 1 job(s)\n")
    assert SECRET not in result.stdout + result.stderr


def test_resolving_keeps_the_definition_hash() -> None:
    """Hosts whose variables hold different values run the same definition."""
    jobs = load_jobs_text("jobs:\n  j:\n    rate: 1h\n    command: x\n"
                          "    notify: {urls: [{env: HOOK_TEST_URL}]}\n", "jobs.yaml")
    import os

    os.environ["HOOK_TEST_URL"] = "json://one.example.com/a"
    try:
        one = resolve_secrets(jobs).jobs[0]
        os.environ["HOOK_TEST_URL"] = "json://two.example.com/b"
        two = resolve_secrets(jobs).jobs[0]
    finally:
        del os.environ["HOOK_TEST_URL"]
    assert one.notify != two.notify
    assert one.definition_hash() == two.definition_hash() == jobs.jobs[0].definition_hash()


# -- URLs ------------------------------------------------------------------------------


def test_ping_urls_follow_the_healthchecks_convention() -> None:
    rid = run_uuid("backup", 17)
    assert rid == run_uuid("backup", 17) != run_uuid("backup", 18)
    assert len(rid) == 36 and rid[14] == "5"  # a version 5 UUID
    base = "https://hc-ping.com/5f0c0b2e-aaaa"
    assert ping_url(base, START, rid) == f"{base}/start?rid={rid}"
    assert ping_url(base + "/", SUCCESS, rid) == f"{base}?rid={rid}"
    assert ping_url(base, FAIL, rid) == f"{base}/fail?rid={rid}"
    assert ping_url("http://h.example.com/p?k=1", FAIL, rid) == (
        f"http://h.example.com/p/fail?k=1&rid={rid}")


@pytest.mark.parametrize(("url", "rendered"), [
    (f"json://user:{SECRET}@hooks.example.com:8080/x/{SECRET}?t={SECRET}",
     "json://hooks.example.com/…"),
    (f"https://hc-ping.com/{SECRET}", "https://hc-ping.com/…"),
    (f"slack://{SECRET}/B1/C1", "slack://…"),
    (f"tgram://123456:{SECRET}/4567", "tgram://…"),
    ("mailto://localhost/ops@example.com", "mailto://localhost/…"),
    (SECRET, "(not a URL)"),
])
def test_urls_are_shown_without_their_secrets(url: str, rendered: str) -> None:
    assert shown(url) == rendered


def test_library_messages_are_scrubbed_of_the_url() -> None:
    url = f"json://user:{SECRET}@hooks.example.com/path/{SECRET}"
    message = f"Failed to send to https://hooks.example.com/path/{SECRET}: error=500"
    assert SECRET not in scrub(message, url)
    assert scrub(message, url).endswith("error=500")


# -- the sender's queue ------------------------------------------------------------------


def test_a_full_queue_drops_the_event_and_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    """The run lifecycle never waits for the sender: with its queue full, an
    event is dropped, logged and counted, and the rest is still sent."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from dblockrun.jobs import Job, SecretUrl
    from dblockrun.notify.notifier import Notifier

    release, paths = threading.Event(), []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            paths.append(self.path)
            release.wait(10)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/p"
        job = Job(name="j", command="x", rate=60.0, ping=SecretUrl(LITERAL, value=url))
        metrics = Prometheus()
        notifier = Notifier(None, "h:1:x", metrics, queue_size=1)
        notifier.run_started(job, 1)  # taken by the sender, which waits for the server
        wait_for(lambda: len(paths) == 1, 10, what="the first ping at the server")
        notifier.run_started(job, 2)  # waits in the queue
        notifier.run_started(job, 3)  # the queue is full: dropped
        assert pings_counted(metrics, "dropped") == 1
        assert "job j: ping start dropped: 1 notifications and pings are waiting" in caplog.text
        release.set()
        notifier.close(10)
        assert [p.split("rid=")[1] for p in paths] == [run_uuid("j", 1), run_uuid("j", 2)]
        assert pings_counted(metrics, "sent") == 2
    finally:
        release.set()
        server.shutdown()


def pings_counted(metrics: Prometheus, outcome: str) -> float | None:
    labels = {"job": "j", "signal": "start", "outcome": outcome}
    return metrics.registry.get_sample_value("dblockrun_pings_total", labels)


def test_on_change_sends_a_run_end_only_when_the_result_changed() -> None:
    from dblockrun.jobs import SecretUrl
    from dblockrun.notify.notifier import Notifier, RunEnd
    from dblockrun.store import models as m

    history = [m.FAILED, m.FAILED, m.TIMEOUT, m.OK, m.OK]  # runs 1-5

    class Runs:
        def previous_result(self, job: str, before_id: int) -> str | None:
            return history[before_id - 2] if before_id > 1 else None

    url = SecretUrl("literal", value="json://127.0.0.1:9/x")
    job = Job("j", "x", cron="@daily", notify=Notify((url,), on=("change",)))
    notifier = Notifier(Runs(), "osname:1", hostname="web-1")  # type: ignore[arg-type]
    sent: list[tuple[str, str]] = []
    notifier._notify = (  # type: ignore[method-assign]
        lambda job, event, title, body, kind: sent.append((event, title)))
    for run_id, result in enumerate(history, 1):
        notifier.run_ended(RunEnd(job, "osname:1", run_id, run_id, None, result, 1, 0.1, ""))
    notifier.close(10)
    assert sent == [("failure", "dblockrun: job j failed on web-1"),
                    ("timeout", "dblockrun: job j timed out on web-1"),
                    ("recovery", "dblockrun: job j recovered on web-1")]
