"""The argument parser every `unit-mcp` command uses: a wrong option ends in one line that says what to do."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """`{prog}: error: {message}` on one line, without argparse's usage lines before it (`--help` shows them)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def print_error(prog: str, message: str) -> None:
    """A failure after the arguments were read, in the parser's one-line form."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
