"""`unit-mcp`: one command for the unit server, the agent runner, the fleet and the units stores.

Each subcommand is its module's own parser and `main` (the `python -m` forms run the same code), loaded only
when named, so a command whose extra is not installed says which one in a line instead of failing to import.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ._version import __version__
from .commandline import CommandParser
from .extras import require_extra


def _serve(argv: Sequence[str], prog: str) -> int:
    from .server import main

    return main(argv, prog)


def _agent(argv: Sequence[str], prog: str) -> int:
    from .agent._cli import main

    return main(argv, prog)


def _fleet(argv: Sequence[str], prog: str) -> int:
    from .fleet._cli import main

    return main(argv, prog)


def _units(argv: Sequence[str], prog: str) -> int:
    from .units import main

    return main(argv, prog)


@dataclass(frozen=True)
class Command:
    run: Callable[[Sequence[str], str], int]
    help: str
    extra: str | None = None


COMMANDS = {
    "serve": Command(_serve, "serve a units root to MCP clients on loopback (default: the built-in example units)"),
    "agent": Command(_agent, "run an agent turn, browse its sessions, answer approvals, serve its page", "agent"),
    "fleet": Command(_fleet, "serve fleet_* tools that let a master agent drive several OpenCode nodes", "agent"),
    "units": Command(_units, "copy units between a folder, sqlite:PATH and postgresql://…"),
}


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
    return command.run(rest, prog)


if __name__ == "__main__":
    sys.exit(main())
