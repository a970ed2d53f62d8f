"""The argument parser every `unit-mcp` command uses: a wrong option ends in one line that says what to do."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class CommandParser(argparse.ArgumentParser):
    """`{prog}: error: {message}` on one line, without argparse's usage lines before it (`--help` shows them)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def add_serving_options(self, *, server_name: str, stdio_help: str) -> None:
        """--host, --port, --server-name and --stdio, alike in every command that serves MCP."""
        self.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default: 127.0.0.1)")
        self.add_argument("--port", type=int, help="port to bind (default: a free port)")
        self.add_argument(
            "--server-name", default=server_name, help="its name in the OpenCode config (default: %(default)s)"
        )
        self.add_argument("--stdio", action="store_true", help=stdio_help)

    def check_serving_options(self, args: argparse.Namespace) -> None:
        """Refuse, in one line, a host that is not loopback, a port out of range or one given with --stdio."""
        from .loopback import is_loopback  # only once the arguments are read: it imports the HTTP stack

        if not is_loopback(args.host):
            self.error(f"--host {args.host} is not a loopback address; {self.prog} serves on loopback only")
        if args.stdio and args.port is not None:
            self.error("--stdio speaks on stdin/stdout and listens on no port; leave out --port")
        if args.port is None:
            args.port = 0
        if not 0 <= args.port <= 65535:
            self.error(f"--port {args.port} is not a port number")


def print_error(prog: str, message: str) -> None:
    """A failure after the arguments were read, in the parser's one-line form."""
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
