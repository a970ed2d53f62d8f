"""`unit-mcp agent ARGS` run in the test's own process, through the public `unit-mcp` entry point."""

from __future__ import annotations

from collections.abc import Sequence

from unit_mcp.cli import main as unit_mcp


def main(argv: Sequence[str]) -> int:
    """The agent command's exit status (`unit-mcp agent` plus `argv`), as the installed command would end."""
    return unit_mcp(["agent", *argv])
