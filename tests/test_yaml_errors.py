"""The YAML mistakes users make most, as `dblockrun validate` reports them:
what to do, in one line, instead of the YAML scanner's words."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import REPO

from dblockrun.cli import cli

NEEDS_JOBS = "a jobs file needs a jobs: mapping of job names to jobs (see dblockrun-jobs(5))"


def validate(tmp_path: Path, text: str) -> tuple[int, str, str]:
    """`dblockrun validate FILE`: (exit status, stdout, stderr), the path shown as FILE."""
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["validate", str(path)], prog_name="dblockrun")
    return (result.exit_code, result.stdout.replace(str(path), "FILE"),
            result.stderr.replace(str(path), "FILE"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "jobs:\n  scrape:\n    cron: */5 * * * *\n    command: ./scrape.sh\n",
            'FILE:3: invalid YAML: a value starting with * must be quoted (* starts a YAML '
            'alias): write cron: "*/5 * * * *"',
            id="unquoted-cron",
        ),
        pytest.param(
            "jobs:\n  scrape:\n    command: ./scrape.sh\n    cron: * * * * *\n",
            'FILE:4: invalid YAML: a value starting with * must be quoted (* starts a YAML '
            'alias): write cron: "* * * * *"',
            id="unquoted-cron-every-minute",
        ),
        pytest.param(
            "jobs:\n  scrape: {cron: */5 * * * *, command: ./scrape.sh}\n",
            'FILE:2: invalid YAML: a value starting with * must be quoted (* starts a YAML '
            'alias); quote cron expressions: cron: "*/5 * * * *"',
            id="unquoted-cron-in-braces",
        ),
        pytest.param(
            "jobs:\n  report:\n    cron: @hourly\n    command: ./report.sh\n",
            'FILE:3: invalid YAML: a value starting with @ must be quoted: write cron: "@hourly"',
            id="unquoted-macro",
        ),
        pytest.param(
            "jobs:\n  scrape:\n\tcron: '*/5 * * * *'\n    command: ./scrape.sh\n",
            "FILE:3: invalid YAML: a tab in the indentation (column 1): indent with spaces, "
            "not tabs",
            id="tab-indent",
        ),
        pytest.param(
            "jobs:\n  scrape:\n    cron: '*/5 * * * *'\n    command:\t./scrape.sh\n",
            "FILE:4: invalid YAML: a tab (column 13): YAML wants spaces there, not tabs",
            id="tab-after-key",
        ),
        pytest.param(
            "jobs:\n  sweep:\n    rate: 0s\n    command: ./sweep.sh\n",
            "FILE:3: job 'sweep': rate: must be more than zero, got 0s",
            id="rate-0s",
        ),
        pytest.param("", f"FILE: the file is empty: {NEEDS_JOBS}", id="empty-file"),
        pytest.param("database: sqlite:///x.db\n", f"FILE:1: no jobs: key: {NEEDS_JOBS}",
                     id="no-jobs-key"),
    ],
)
def test_validate_explains_common_yaml_mistakes(tmp_path: Path, text: str,
                                                message: str) -> None:
    assert validate(tmp_path, text) == (2, "", f"dblockrun: {message}\n")


def test_quoted_cron_is_fine(tmp_path: Path) -> None:
    code, out, err = validate(tmp_path, 'jobs:\n  s:\n    cron: "*/5 * * * *"\n    command: x\n')
    assert (code, out, err) == (0, "FILE: ok, 1 job(s)\n", "")


def test_libyaml_and_pyyaml_read_a_jobs_file_alike() -> None:
    """A file without a tab is read by libyaml (a sixth of the CPU, issue 21):
    the same values, lines and repeated keys as PyYAML's own loader gives."""
    from dblockrun.config import load

    text = (REPO / "examples" / "jobs.yaml").read_text() + (
        "  again:\n    rate: 1h\n    command: [a, 'b c', 3]\n    on: [x]\n"
        "    env: &e {A: '1', B: 2}\n  merged:\n    <<: {rate: 2h}\n    rate: 3h\n"
        "    env: *e\n    command: true\n  again:\n    rate: 2h\n")
    assert "\t" not in text
    fast = load._LibyamlLoader(text).get_single_data()
    slow = load._Loader(text).get_single_data()

    def shown(value: object) -> object:
        if isinstance(value, load._Mapping):
            return (value.line, value.lines, value.duplicates,
                    {k: shown(v) for k, v in value.items()})
        if isinstance(value, list):
            return [shown(v) for v in value]
        return value

    assert shown(fast) == shown(slow)
    assert fast["jobs"].duplicates == [("again", text.count("\n") - 1)]
