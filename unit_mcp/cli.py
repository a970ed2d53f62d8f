"""`unit-mcp`: one command for the unit server, the agent runner, the fleet and the units stores.

Each subcommand is its module's own parser and `main` (the `python -m` forms run the same code), loaded only
when named, so a command whose extra is not installed says which one in a line instead of failing to import.
`command_parser(name)` is a subcommand's parser, for what reads its options (the docs' checks, completions).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ._version import __version__
from .commandline import CommandParser
from .extras import require_extra


class CommandModule(Protocol):
    """What each subcommand's module has: its parser and its `main` (the `python -m` forms run the same)."""

    def command_parser(self, prog: str = ...) -> argparse.ArgumentParser: ...

    def main(self, argv: Sequence[str] | None = None, prog: str = ...) -> int: ...


def _serve() -> CommandModule:
    from . import server

    return server


def _agent() -> CommandModule:
    from .agent import _cli

    return _cli


def _fleet() -> CommandModule:
    from .fleet import _cli

    return _cli


def _units() -> CommandModule:
    from . import units

    return units


@dataclass(frozen=True)
class Command:
    load: Callable[[], CommandModule]
    help: str
    extra: str | None = None


COMMANDS = {
    "serve": Command(_serve, "serve a units root to MCP clients on loopback (default: the built-in example units)"),
    "agent": Command(_agent, "run an agent turn, browse its sessions, answer approvals, serve its page", "agent"),
    "fleet": Command(_fleet, "serve fleet_* tools that let a master agent drive several OpenCode nodes", "agent"),
    "units": Command(_units, "copy units between a folder, sqlite:PATH and postgresql://…"),
}


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of `unit-mcp NAME` (a key of `COMMANDS`), as its `--help` shows it: every option, its default."""
    return COMMANDS[name].load().command_parser(f"unit-mcp {name}")


def parser() -> argparse.ArgumentParser:
    listing = "\n".join(
        f"  {name:<7} {command.help}" + (f" [needs unit-mcp[{command.extra}]]" if command.extra else "")
        for name, command in COMMANDS.items()
    )
    top = CommandParser(
        prog="unit-mcp",
        description="Develop a running Python application's hot-reloadable units through risk-labelled MCP tools.",
        epilog=f"commands:\n{listing}\n\n`unit-mcp COMMAND --help` shows a command's options and their defaults.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    top.add_argument("command", choices=COMMANDS, metavar="COMMAND", help=", ".join(COMMANDS))
    return top


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser().parse_args(argv[:1])  # --help, --version, or one line naming the commands
    name, rest = argv[0], argv[1:]
    command = COMMANDS[name]
    prog = f"unit-mcp {name}"
    if command.extra is not None:
        require_extra(command.extra, prog)
    return command.load().main(rest, prog)


if __name__ == "__main__":
    sys.exit(main())
