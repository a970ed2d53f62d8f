"""`python -m unit_mcp.server`: serve a units root to MCP clients on loopback until SIGINT or SIGTERM.

A thin wrapper over `Host`, `UnitService`, `UnitTools` and `Bridge`. Without --units it serves a private
copy of the built-in example units, so a newcomer can connect at once. Once listening it prints, one per
line, the URLs, the token and the XDG_CONFIG_HOME an OpenCode session needs.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from .bridge import Bridge, BridgeError
from .host import Host
from .loader import SQLITE_PREFIX
from .loopback import is_loopback
from .service import UnitService
from .stdio import Streams, stdio_streams
from .tools import UnitTools, check_prefix

EXAMPLE_UNITS = Path(__file__).resolve().parent / "examples" / "units"

log = logging.getLogger("unit_mcp.server")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m unit_mcp.server",
        description="Serve the units of a units root to MCP clients (OpenCode, the MCP Inspector, ...) on loopback.",
    )
    parser.add_argument(
        "--units",
        help="units folder, or sqlite:PATH for a units database (created if missing), to serve "
        "(default: a private copy of the built-in example units)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep the app log, the OpenCode config (and the example copy) here instead of a temporary folder "
        "removed at exit",
    )
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port to bind (default: 0, a free port)")
    parser.add_argument("--tool-prefix", default="", help="prefix for every tool name, e.g. space_ → space_unit_list")
    parser.add_argument(
        "--server-name", default="unit-dev", help="name of this server in the OpenCode config (default: unit-dev)"
    )
    parser.add_argument(
        "--stdio",
        action="store_true",
        help="speak MCP on stdin/stdout instead of HTTP (for clients that launch the server); prints nothing else",
    )
    parser.add_argument("--no-watch", action="store_true", help="do not reload units when their files change on disk")
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without the bearer token, for clients that cannot send headers (loopback is still enforced)",
    )
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address; unit-mcp serves on loopback only")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port} is not a port number")
    try:
        check_prefix(args.tool_prefix)
    except ValueError as exc:
        parser.error(str(exc))
    if args.units is not None:
        problem = units_problem(args.units)
        if problem:
            parser.error(f"--units {args.units} {problem}")
    return args


def units_problem(units: str) -> str | None:
    """Why `--units` cannot be served, or None: a folder, or sqlite:PATH naming a database or nothing yet."""
    if not units.startswith(SQLITE_PREFIX):
        return None if Path(units).is_dir() else "is not a folder (a units database is given as sqlite:PATH)"
    path = Path(units[len(SQLITE_PREFIX) :]).expanduser()
    if path.is_dir():
        return "is a folder, not a database file"
    if path.is_file() and path.stat().st_size:
        with path.open("rb") as handle:
            if handle.read(16) != b"SQLite format 3\x00":
                return "is not a SQLite database"
    return None


def _say(line: str) -> None:
    print(line, flush=True)


async def serve(args: argparse.Namespace) -> None:
    """Run until SIGINT/SIGTERM (or, with --stdio, until stdin closes), then drop the units and clean up."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with AsyncExitStack() as stack:
            # Claim stdin/stdout before the units start, so that nothing they print at import reaches the wire.
            streams = await stack.enter_async_context(stdio_streams()) if args.stdio else None
            tools, data_dir = _tools(args, stack)
            async with anyio.create_task_group() as group:

                async def stop_on_signal() -> None:
                    async for signum in signals:
                        log.info("stopping on %s", signal.Signals(signum).name)
                        break
                    group.cancel_scope.cancel()

                group.start_soon(stop_on_signal)
                if streams is not None:
                    await _serve_stdio(tools, streams)
                    group.cancel_scope.cancel()
                else:
                    await _serve_http(args, tools, data_dir, stack)


def _tools(args: argparse.Namespace, stack: AsyncExitStack) -> tuple[UnitTools, Path]:
    """The data dir (temporary unless given), the units (a private example copy unless given), the host."""
    if args.data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="unit-mcp-"))
        stack.callback(shutil.rmtree, data_dir, True)
    else:
        data_dir = args.data_dir.resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
    units: str | Path | None = args.units
    if units is None:
        units = data_dir / "example-units"
        if not units.exists():
            shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    host = Host(units, data_dir)
    host.start()
    stack.callback(host.close)
    if not args.no_watch:
        host.start_watching()
    return UnitTools(UnitService(host), prefix=args.tool_prefix), data_dir


async def _serve_stdio(tools: UnitTools, streams: Streams) -> None:
    """MCP over this process's stdin/stdout, for clients that launch the server themselves."""
    server = tools.server()
    read_stream, write_stream = streams
    await server.run(read_stream, write_stream, server.create_initialization_options())


async def _serve_http(args: argparse.Namespace, tools: UnitTools, data_dir: Path, stack: AsyncExitStack) -> None:
    bridge = Bridge(
        tools.server(),
        host=args.host,
        port=args.port,
        server_name=args.server_name,
        config_root=data_dir / "opencode-config",
        auth=not args.no_auth,
    )
    await stack.enter_async_context(bridge)
    status = bridge.status()
    _say(f"MCP_URL={status.url}")
    _say(f"MCP_SSE_URL={status.sse_url}")
    if bridge.token is not None:
        _say(f"MCP_TOKEN={bridge.token}")
    _say(f"OPENCODE_XDG_CONFIG_HOME={status.config_root}")
    _say(f"XDG_CONFIG_HOME={shlex.quote(str(status.config_root))} opencode")
    await anyio.sleep_forever()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("unit-mcp: %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    try:
        anyio.run(serve, args, backend="asyncio")
    except BridgeError as exc:
        print(f"unit-mcp: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
