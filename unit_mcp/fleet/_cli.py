"""`unit-mcp fleet` (or `python -m unit_mcp.fleet`): serve the fleet tools over stdio, or on the loopback bridge
until SIGINT/SIGTERM.

Over HTTP it prints the same lines as the unit server plus the isolated master OpenCode's launcher (docs/fleet.md).
Node passwords come from the environment or a 0600 file, never from the command line.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from .. import tracing
from ..bridge import Bridge, BridgeError
from ..commandline import CommandParser, print_error
from ..opencode_isolation import write_launcher
from ..paths import UnsafeSecret
from ..proctree import keep_memory_private
from ..secret_options import add_secret_option, secret_value
from ..stdio import serve_until_stopped, stdio_streams
from .nodes import Fleet, FleetError, NodeSpec, node_specs
from .server import FleetTools

PROG = "unit-mcp fleet"


def command_parser(prog: str = PROG) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description="Serve fleet_* MCP tools that let a master agent drive several OpenCode nodes.",
    )
    parser.add_argument(
        "--node",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a node (repeat for each): NAME=http://[user@]host:port; its password comes from "
        "$FLEET_PASSWORD_<NAME> (upper case, '-' and '.' as '_'), else the shared one",
    )
    parser.add_argument("--username", help="basic-auth user of the nodes (default: $FLEET_USERNAME or opencode)")
    add_secret_option(parser, "--password", env=("FLEET_PASSWORD",), what="shared basic-auth password of the nodes")
    parser.add_serving_options(server_name="opencode-fleet", stdio_help="speak MCP on stdin/stdout instead of HTTP")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds for each request to a node (default: %(default)g)"
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure and debug logging")
    return parser


def parse_args(argv: Sequence[str] | None = None, prog: str = PROG) -> tuple[argparse.Namespace, list[NodeSpec]]:
    parser = command_parser(prog)
    args = parser.parse_args(argv)
    parser.check_serving_options(args)
    try:
        password = secret_value(args.password_file, "--password", ("FLEET_PASSWORD",))
        specs = node_specs(args.node, username=args.username, password=password)
    except (FleetError, UnsafeSecret) as exc:
        parser.error(str(exc))
    return args, specs


async def serve(args: argparse.Namespace, specs: list[NodeSpec]) -> None:
    async with AsyncExitStack() as stack:
        streams = await stack.enter_async_context(stdio_streams()) if args.stdio else None
        fleet = await stack.enter_async_context(Fleet(specs, timeout=args.timeout))
        for line in fleet.blocking():  # the fleet wants nodes that never ask (nobody answers them)
            print(f"{PROG}: warning: {line}", file=sys.stderr, flush=True)
        server = FleetTools(fleet).server(args.server_name)

        async def serve_http() -> None:
            bridge = await stack.enter_async_context(
                Bridge(server, host=args.host, port=args.port, server_name=args.server_name)
            )
            status = bridge.status()
            assert status.config_root is not None
            home = Path(status.config_root)  # a temporary folder, removed with the launcher in it at stop
            launcher = write_launcher(home / "bin" / "opencode", home)
            print(f"MCP_URL={status.url}\nMCP_SSE_URL={status.sse_url}\nMCP_TOKEN={bridge.token}", flush=True)
            print(f"OPENCODE_XDG_CONFIG_HOME={home}\nOPENCODE_CMD={launcher}", flush=True)
            print(f"XDG_CONFIG_HOME={shlex.quote(str(home))} opencode", flush=True)
            await anyio.sleep_forever()

        await serve_until_stopped(server, streams, serve_http)


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args, specs = parse_args(argv, prog)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.DEBUG if args.debug else logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{prog}: %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    if args.debug:
        logging.getLogger("unit_mcp").setLevel(logging.DEBUG)
    keep_memory_private()  # the nodes' passwords and the MCP token
    tracing.configure("unit-mcp-fleet", prog)
    try:
        anyio.run(serve, args, specs, backend="asyncio")
    except BridgeError as exc:
        if args.debug:
            raise
        print_error(prog, str(exc))
        return 1
    return 0
