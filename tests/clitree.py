"""The command line's tree as click has it: every visible command and its
options (the man pages and the docs site are checked against it)."""

from __future__ import annotations

from collections.abc import Iterator

import click

from dblockrun.cli import cli


def commands(
    group: click.Group = cli, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Command]]:
    """Every visible (sub)command: ``("daemon", cmd)``, ``("group sub", cmd)``."""
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        path = (*prefix, name)
        yield " ".join(path), command
        if isinstance(command, click.Group):
            yield from commands(command, path)


def option_names(command: click.Command) -> list[str]:
    names: list[str] = []
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            names.extend(param.opts)
            names.extend(param.secondary_opts)
    return names
