"""The documentation site (``docs/``, ``mkdocs.yml``): it builds with
``mkdocs build --strict`` (broken links and anchors fail), every YAML block in
it and every example jobs file passes ``dblockrun validate``, the jobs file
reference names every key the loader accepts, the commands page every command
and option of the CLI, and the README stays short and links to every page.

``pytest -m docs`` picks this module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from clitree import commands, option_names
from helpers import LOW_PRIORITY, REPO, clean_env, invoke

from dblockrun.cli import cli
from dblockrun.config.load import (
    AFTER_KEYS,
    EXPECT_KEYS,
    JOB_KEYS,
    NOTIFY_KEYS,
    ON_FAILURE_KEYS,
    TOP_LEVEL_KEYS,
)
from dblockrun.store.schema import build_tables

#: The site's build with the other builds, on one xdist worker.
pytestmark = [pytest.mark.docs, pytest.mark.xdist_group("builds")]

DOCS = REPO / "docs"
README = REPO / "README.md"
EXAMPLES = REPO / "examples"
PAGES = sorted(DOCS.rglob("*.md"))

#: A YAML block: ```yaml ... ``` at the start of a line.
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)
#: ``{env: NAME}`` in a jobs file (``ping:`` first): validate needs the variable set.
ENV_SECRET = re.compile(r"(ping: *)?\{env: *([A-Za-z_][A-Za-z0-9_]*)\}")
#: ``{file: PATH}`` with a relative path: validate reads the file.
FILE_SECRET = re.compile(r"\{file: *([\w.-]+)\}")


def nav_pages(nav: list[Any]) -> list[str]:
    """Every page ``mkdocs.yml``'s nav names, in order."""
    found: list[str] = []
    for entry in nav:
        values = entry.values() if isinstance(entry, dict) else [entry]
        for value in values:
            found.extend(nav_pages(value) if isinstance(value, list) else [value])
    return found


def mkdocs_config() -> dict[str, Any]:
    # mkdocs.yml holds no tags that need mkdocs's own loader.
    config: dict[str, Any] = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    return config


def validate(text: str, where: str, tmp_path: Path) -> None:
    """``dblockrun validate`` on ``text`` as a jobs file; fails naming ``where``."""
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    # The secrets a block names, made up: a ping URL is http(s), a
    # notification URL one of apprise's.
    env = clean_env(**{name: "https://hc-ping.com/x" if ping else "json://localhost/hook"
                       for ping, name in ENV_SECRET.findall(text)})
    for name in FILE_SECRET.findall(text):
        (tmp_path / name).write_text("json://localhost/hook\n")
    # In-process (helpers.invoke): ~200 blocks, a process's imports each.
    proc = invoke("validate", str(path), env=env, cwd=tmp_path)
    assert proc.returncode == 0, f"{where}: {proc.stderr}"


def yaml_blocks() -> list[tuple[str, str]]:
    """(``page:line``, text) of every YAML block in the docs and the README."""
    blocks: list[tuple[str, str]] = []
    for page in [*PAGES, README]:
        text = page.read_text()
        for match in YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{page.relative_to(REPO)}:{line}", match.group(1)))
    return blocks


# --- the site ---------------------------------------------------------------------------


def test_the_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([*LOW_PRIORITY, sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    # The pages ARCHITECTURE.md and CHANGELOG.md are included into, not copied to.
    architecture = (tmp_path / "site" / "architecture" / "index.html").read_text()
    assert "The path of a slot" in architecture
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "Unreleased" in changelog


def test_every_page_is_in_the_nav() -> None:
    nav = nav_pages(mkdocs_config()["nav"])
    assert sorted(nav) == sorted(str(page.relative_to(DOCS)) for page in PAGES)


def test_nothing_fetches_from_the_network() -> None:
    config = mkdocs_config()
    assert config["theme"].get("font") is False  # else Google Fonts are linked
    assert [p if isinstance(p, str) else next(iter(p)) for p in config["plugins"]] == ["search"]


@pytest.mark.parametrize("where,text", yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_every_yaml_block_validates(where: str, text: str, tmp_path: Path) -> None:
    validate(text, where, tmp_path)


def example_jobs_files() -> list[tuple[str, str]]:
    """(name, text) of every jobs file in ``examples/``: the YAML files
    themselves, and the jobs files a Kubernetes ConfigMap or compose config
    carries inside."""
    found: list[tuple[str, str]] = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict) and "jobs" in doc:
                found.append((path.name, path.read_text()))
            elif isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
                found.extend((f"{path.name}: ConfigMap {key}", value)
                             for key, value in doc["data"].items() if key.endswith(".yaml"))
            elif isinstance(doc, dict) and "configs" in doc:  # compose
                found.extend((f"{path.name}: config {key}", value["content"])
                             for key, value in doc["configs"].items() if "content" in value)
    return found


def test_there_are_example_jobs_files() -> None:
    names = {name.split(":")[0] for name, _ in example_jobs_files()}
    assert {"jobs.yaml", "k8s-deployment.yaml", "compose.yaml"} <= names


@pytest.mark.parametrize("where,text", example_jobs_files(),
                         ids=[w for w, _ in example_jobs_files()])
def test_every_example_validates(where: str, text: str, tmp_path: Path) -> None:
    for calendar in EXAMPLES.glob("*.ics"):  # the calendar files an example names
        (tmp_path / calendar.name).write_bytes(calendar.read_bytes())
    validate(text, f"examples/{where}", tmp_path)


# --- the jobs file reference -----------------------------------------------------------


def reference_rows() -> dict[str, tuple[str, str]]:
    """The reference tables of ``docs/jobs-file.md``: key -> (default, example)."""
    rows: dict[str, tuple[str, str]] = {}
    for line in (DOCS / "jobs-file.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        if len(cells) != 4 or not cells[0].startswith("`") or not cells[2].startswith("`"):
            continue
        keys = re.findall(r"`([^`]+)`", cells[0])
        example = cells[2].strip("`")
        for key in keys:
            assert key not in rows, f"{key} has two rows"
            rows[key] = (cells[1], example)
    return rows


def sets(example: str, key: str) -> bool:
    """Whether the one-line YAML ``example`` (``key: value`` or a flow
    mapping) sets ``key`` at its top. Read as text: PyYAML reads ``on`` as
    true, where dblockrun's loader keeps it a key."""
    inner = example[1:-1] if example.startswith("{") else example
    return re.search(rf"(^|, ){re.escape(key)}:", inner) is not None


def test_the_reference_names_every_key_and_no_other() -> None:
    rows = reference_rows()
    assert sorted(rows) == sorted([*JOB_KEYS, *TOP_LEVEL_KEYS])
    for key, (default, example) in rows.items():
        assert default, f"{key}: no default"
        assert sets(example, key), f"{key}: its example does not set it"


def test_the_reference_describes_the_nested_keys() -> None:
    rows = {line.split(" | ")[0].strip("| `"): line
            for line in (DOCS / "jobs-file.md").read_text().splitlines()
            if line.startswith("| `")}
    for key, nested in (("on-failure", ON_FAILURE_KEYS), ("notify", NOTIFY_KEYS),
                        ("after", AFTER_KEYS), ("expect", EXPECT_KEYS)):
        missing = [name for name in nested
                   if not re.search(rf"[`{{]{re.escape(name)}[`:]", rows[key])]
        assert not missing, f"{key}: {missing} not described"


def test_every_reference_example_validates(tmp_path: Path) -> None:
    for key, (_, example) in reference_rows().items():
        inner = example[1:-1] if example.startswith("{") else example
        if key in TOP_LEVEL_KEYS:
            # A whole file: the example's top-level key with a job beside it.
            lines = [inner]
            if key != "jobs":
                lines.append('jobs: {report: {cron: "30 2 * * *", command: "true"}}')
            if key == "database-file":
                (tmp_path / "db-url").write_text("postgresql://scheduler@db.internal/ops\n")
        else:
            job = [] if sets(example, "cron") else ['cron: "30 2 * * *"']
            job += ['command: "true"'] if not sets(example, "command") else []
            lines = ["jobs:", f"  report: {{{', '.join([*job, inner])}}}"]
            if key == "group":
                lines.append("groups: {backups: 1}")
            if key == "exclude":  # the calendar it names
                lines.append("calendars: {nl-holidays: {dates: [2026-12-25]}}")
            if key == "after":  # the job it runs after
                lines.insert(1, '  extract: {rate: 1h, command: "true"}')
        validate("\n".join(lines) + "\n", f"docs/jobs-file.md: {key}: {example}", tmp_path)


# --- the commands page ------------------------------------------------------------------


def command_rows() -> dict[str, str]:
    """The commands table of ``docs/commands.md``: command -> its row."""
    rows: dict[str, str] = {}
    for line in (DOCS / "commands.md").read_text().splitlines():
        if line.startswith("| `dblockrun "):
            words = []  # the command, and a group's subcommand (`web hash-password`)
            for word in line.split()[2:]:
                word = word.rstrip("`,")
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break
                words.append(word)
                if line.split()[2 + len(words) - 1].endswith(("`", ",")):
                    break
            name = " ".join(words)
            assert name not in rows, f"{name} has two rows"
            rows[name] = line
    return rows


def test_the_commands_page_names_every_command_and_no_other() -> None:
    assert sorted(command_rows()) == sorted(name for name, _ in commands())


@pytest.mark.parametrize("name", [name for name, _ in commands()])
def test_every_option_is_on_the_commands_page(name: str) -> None:
    row = command_rows()[name]
    command = dict(commands())[name]
    missing = [opt for opt in option_names(command)
               if opt.startswith("--") and opt != "--help"
               and not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", row)]
    assert not missing, f"{name}: {missing} not on docs/commands.md"
    known = set(option_names(command)) | set(option_names(cli))
    stale = [opt for opt in re.findall(r"(?<![\w-])--[a-z][a-z-]*", row) if opt not in known]
    assert not stale, f"{name}: docs/commands.md names {stale}, which it does not take"


# --- the README -------------------------------------------------------------------------


def test_the_readme_is_short_and_links_to_every_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    links = set(re.findall(r"\]\((docs/[^)#]+)", text))
    assert links == {f"docs/{page.relative_to(DOCS)}" for page in PAGES}
    for target in re.findall(r"\]\(([^)#:]+)", text):
        assert (REPO / target).exists(), target


def test_the_readme_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert "    ./scripts/quickstart " in text and "    ./scripts/test " in text


def test_getting_started_names_every_table() -> None:
    tables = build_tables("dblockrun_")
    text = (DOCS / "getting-started.md").read_text()
    sentence = re.search(r"The schema \(([^)]*)\)", text)
    assert sentence is not None
    named = re.findall(r"`(?:dblockrun)?(_[a-z]+)`", sentence.group(1))
    assert sorted(named) == sorted(t.name.removeprefix("dblockrun") for t in
                                   tables.metadata.sorted_tables)


# -- issue 36 items 10 and 11: what the docs say of what exists --------------------------

#: Words that say a thing is not there yet.
NOT_YET = re.compile(r"\bcoming\b|when it lands|\bare waiting\b|\bupcoming\b|\bnot (?:yet )?"
                     r"(?:shipped|available|implemented) yet\b|\bsoon\b", re.I)
#: Every text a reader meets: the README, the site, the man pages.
READ = [README, *PAGES, REPO / "man" / "dblockrun.1", REPO / "man" / "dblockrun-jobs.5"]


def _paragraphs(path: Path) -> list[str]:
    """A page's paragraphs, list items and table rows, each on one line."""
    text = path.read_text()
    parts: list[str] = []
    for block in re.split(r"\n\s*\n|\n(?=\s*[-*] |\|)|\n(?=\.[A-Z]{1,2}\b)", text):
        parts.append(" ".join(block.split()))
    return parts


def test_no_page_calls_a_shipped_command_coming() -> None:
    """The README and install.md called ``dblockrun web`` and ``tail``
    "coming" and "when it lands" long after both shipped: a paragraph that
    names a command of the CLI may not say it is still to come."""
    shipped = sorted(cli.commands, key=len, reverse=True)
    named = re.compile(r"dblockrun[ -](" + "|".join(map(re.escape, shipped)) + r")\b"
                       r"|operations/(web|tail)\.md")
    stale = [f"{path.relative_to(REPO)}: {found[0]!r} in {part[:160]}"
             for path in READ for part in _paragraphs(path)
             if named.search(part) and (found := NOT_YET.search(part))]
    assert stale == []


#: dblockrun is not on the Python Package Index: an install from it fails
#: (``No matching distribution found``). Set True with the first release
#: published there, and the docs may name it.
ON_PYPI = False
FROM_INDEX = re.compile(r"\bpipx? install (?:--\S+ )*['\"]?dblockrun\b")


def _commands(path: Path) -> list[tuple[int, str]]:
    """The lines of ``path`` a reader runs: indented or fenced code, every
    line of a man page; (line number, line)."""
    out, fenced = [], False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif fenced or line.startswith("    ") or path.suffix in (".1", ".5"):
            out.append((n, line))
    return out


def test_the_docs_install_from_a_checkout_not_from_an_index_without_dblockrun() -> None:
    """The first install command of the README and getting-started,
    ``pipx install dblockrun``, failed on a fresh machine: every install the
    docs give works from a checkout of this repository (``pipx install .``,
    a wheel built from it), and they say that it is not on PyPI."""
    if ON_PYPI:
        pytest.skip("released on PyPI: installing by name works")
    said = [f"{path.relative_to(REPO)}:{n}: {line.strip()}"
            for path in READ for n, line in _commands(path) if FROM_INDEX.search(line)]
    assert said == []
    for path in (README, DOCS / "install.md", DOCS / "getting-started.md"):
        text = " ".join(path.read_text().split())
        assert "pipx install ." in text, path
        assert re.search(r"not (?:published )?on the Python Package Index|not on PyPI", text), path


def test_the_docs_list_the_packages_the_test_command_installs() -> None:
    """The README said ``scripts/test`` installs tini (it does not) and not
    chromium (which it does): every package it installs is named where the
    docs describe it, and no other package is said to be."""
    script = (REPO / "scripts" / "test").read_text()
    installed = {word for group in re.findall(r"missing\+=\(([^)]*)\)", script)
                 for word in group.split()}
    assert {"postgresql", "mariadb-server", "chromium", "faketime"} <= installed
    for path in (README, DOCS / "development.md"):
        said = " ".join(path.read_text().split())
        listed = re.search(r"installs what it needs when it is missing \(as root, with apt: "
                           r"((?:[^()]|\([^)]*\))*)\)", said)
        assert listed is not None, path
        text = listed[1]
        named = {"postgresql" if "PostgreSQL" in text else "",
                 "mariadb-server" if "MariaDB" in text else ""}
        named |= {p for p in installed if re.search(rf"\b{re.escape(p)}\b", text)}
        assert installed <= named, (path, sorted(installed - named))
        assert "tini" not in text, path
