"""`unit-mcp serve` (or `python -m unit_mcp.server`): serve a units root to MCP clients on loopback until SIGINT
or SIGTERM.

A thin wrapper over `Host`, `UnitService`, `UnitTools` and `Bridge` that prints the lines clients need once
listening; a failure a person can fix ends with one line on stderr (`--debug` for the traceback). What only
HTTP serving needs (the bridge, the page, the app, the client configs) is imported when serving HTTP: a client
that launches `--stdio` waits for every import before its `initialize` is answered.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import anyio

from . import paths, tracing
from .applog import StderrHandler
from .changelog import Retention
from .commandline import CommandParser, print_error
from .confirm import DEFAULT_TIMEOUT, Confirmations
from .githistory import GIT_MODES
from .host import Host
from .loader import SQLITE_PREFIX, member_addresses, stores_address
from .localaccess import LocalAccess
from .pgconnect import held_passwords, is_postgres
from .proctree import keep_memory_private
from .service import UnitService
from .sqliteloader import units_database_problem
from .stdio import serve_until_stopped, stdio_streams
from .testrun import WARM, passed_env_name
from .tools import UnitTools, check_prefix
from .units import POSTGRES_PREFIXES, UnusableStore, postgres_problem, shown_address
from .wire import RISKS

EXAMPLE_UNITS = Path(__file__).resolve().parent / "examples" / "units"
UNITS_PAGE = "/units"
"""Where the bridge serves the unit server's page (`UNITS_UI_URL`)."""
LOGIN_LINK_FILE = "units-ui-url"
"""The data dir's file (0600) holding the newest unspent `UNITS_UI_URL` (`UNITS_UI_URL_FILE`): a script whose link
was spent reads the fresh one there."""


_OPENCODE_CONFIG = "opencode-config"
_DATA_FOLDERS = ("logs", "bytecode", "clients", _OPENCODE_CONFIG, "example-units")
"""The data dir's folders the server reads or runs from: each must be ours alone, like the data dir."""


class StartError(Exception):
    """A start-up failure the person running the server can fix; the message says what happened and what to do."""


PROG = "unit-mcp serve"


def command_parser(prog: str = PROG) -> CommandParser:
    parser = CommandParser(
        prog=prog,
        description="Serve the units of a units root to MCP clients (OpenCode, the MCP Inspector, ...) on loopback.",
    )
    parser.add_argument(
        "--units",
        action="append",
        help="units folder, sqlite:PATH for a units database (created if missing) or postgresql://USER@HOST:PORT/DB "
        "(password from PGPASSWORD or PGPASSFILE) to serve; give it more than once to serve several stores side by "
        "side, each unit from the store that holds it (a unit id in two stores is refused) "
        "(default: a private copy of the built-in example units)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="keep the app log, the OpenCode config (and the example copy) here instead of a temporary folder "
        "removed at exit",
    )
    parser.add_argument("--tool-prefix", default="", help="prefix for every tool name, e.g. space_ → space_unit_list")
    parser.add_serving_options(
        server_name="unit-dev",
        stdio_help="speak MCP on stdin/stdout instead of HTTP (for clients that launch the server); prints nothing "
        "else",
    )
    parser.add_argument(
        "--env-file",
        type=Path,
        help="also write the printed KEY=VALUE lines to this file (atomically, mode 0600), e.g. for `set -a; . FILE`",
    )
    parser.add_argument(
        "--git-history",
        choices=GIT_MODES,
        default="ref",
        help="units folder in a git work tree: record each accepted write on refs/unit-mcp/history (ref, the "
        "default; the branch, index and work tree stay untouched), as a commit on the current branch, or not at all",
    )
    parser.add_argument(
        "--change-retention",
        type=float,
        default=Retention().days,
        metavar="DAYS",
        help=f"keep the change log's records this many days (default: %(default)g; at most {Retention().records} "
        "records)",
    )
    parser.add_argument("--no-watch", action="store_true", help="do not reload units when their files change on disk")
    parser.add_argument(
        "--max-call-s",
        type=_positive_seconds,
        default=240.0,
        help="seconds a unit_run_tests call waits before it answers 'running' with a run_id (default %(default)g; "
        "clients kill longer calls)",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="serve without the bearer token, for clients that cannot send headers (loopback is still enforced)",
    )
    parser.add_argument(
        "--test-env",
        action="append",
        default=[],
        type=passed_env_name,
        metavar="NAME",
        help="pass this variable of the server's environment to unit tests too (repeatable; see docs/units.md: Tests)",
    )
    parser.add_argument(
        "--confirm",
        action="append",
        choices=[*RISKS, "none"],
        metavar="RISK",
        help="a call of this risk waits for a person's yes, asked through the client (MCP elicitation) or on the "
        f"page at UNITS_UI_URL (repeatable; one of {', '.join(RISKS)}; default destructive; none: never ask)",
    )
    parser.add_argument(
        "--confirm-timeout",
        type=_positive_seconds,
        default=DEFAULT_TIMEOUT,
        help="seconds a call waits for that yes before it is refused [confirmation_timeout] (default %(default)g)",
    )
    parser.add_argument(
        "--allow-local-access",
        action="store_true",
        help="offer unit_request_local_access: once a person says yes on the page, an OpenCode started from "
        "OPENCODE_CMD may use its own read and edit tools in that unit's folder for a while (docs/local-access.md; "
        "off by default)",
    )
    parser.add_argument(
        "--app-port",
        type=int,
        metavar="PORT",
        help="also serve the units' web routes (unit_mcp.asgi) on this loopback port (0: a free one); prints APP_URL",
    )
    parser.add_argument(
        "--reload-timeout",
        type=_positive_seconds,
        default=30.0,
        help="seconds a unit's import, init, snapshot, restore or drop may run in a reload before it is given up on "
        "and the old version serves on (default %(default)g)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=_positive_seconds,
        default=10.0,
        help="seconds a reload waits for the application's uses of the unit in flight before it is refused "
        "(default %(default)g)",
    )
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure and debug logging")
    return parser


def parse_args(argv: Sequence[str] | None = None, prog: str = PROG) -> argparse.Namespace:
    """The options, checked together (what one option alone cannot say is refused in one line)."""
    parser = command_parser(prog)
    args = parser.parse_args(argv)
    args.confirm = args.confirm or ["destructive"]
    if "none" in args.confirm and len(args.confirm) > 1:
        parser.error("--confirm none turns the questions off; leave out the other --confirm options")
    args.confirm = [risk for risk in args.confirm if risk != "none"]
    parser.check_serving_options(args)
    if args.stdio and args.allow_local_access:
        parser.error("--allow-local-access works with the OpenCode config of the HTTP server; leave out --stdio")
    if args.app_port is not None and not 0 <= args.app_port <= 65535:
        parser.error(f"--app-port {args.app_port} is not a port number (0 for a free one)")
    if args.stdio and args.app_port is not None:
        parser.error("--app-port serves beside the HTTP server; leave out --stdio")
    if args.stdio and args.env_file is not None:
        parser.error("--stdio speaks on stdin/stdout and listens on no port; leave out --env-file")
    if not args.change_retention > 0:
        parser.error(f"--change-retention {args.change_retention:g} must be a number of days above 0")
    try:
        check_prefix(args.tool_prefix)
    except ValueError as exc:
        parser.error(str(exc))
    for units in args.units or ():
        problem = units_problem(units)
        if problem:
            parser.error(f"--units {shown_address(units)} {problem}")
    if args.units is not None:
        args.units = args.units[0] if len(args.units) == 1 else stores_address(args.units)
    return args


def units_problem(units: str) -> str | None:
    """Why `--units` cannot be served, or None: a folder, sqlite:PATH naming a database or nothing yet, or a
    postgresql:// address (checked again when connecting)."""
    if units.startswith(POSTGRES_PREFIXES):
        return postgres_problem(units)
    if not units.startswith(SQLITE_PREFIX):
        return None if Path(units).is_dir() else "is not a folder (a units database is given as sqlite:PATH)"
    path = Path(units[len(SQLITE_PREFIX) :]).expanduser()
    if path.is_dir():
        return "is a folder, not a database file"
    return units_database_problem(path)


def _say(line: str) -> None:
    print(line, flush=True)


async def serve(args: argparse.Namespace) -> None:
    """Run until SIGINT/SIGTERM (or, with --stdio, until stdin closes), then drop the units and clean up."""
    async with AsyncExitStack() as stack:
        # Claim stdin/stdout before the units start, so that nothing they print at import reaches the wire.
        streams = await stack.enter_async_context(stdio_streams()) if args.stdio else None
        tools, data_dir = _tools(args, stack)
        # What start-up made (modules, the units loaded, the tools' models) lives as long as the process: out of
        # the collector's full passes, each of which stopped every thread, the application's requests too, for
        # 100-400 ms (about 100,000 objects). A unit's version loaded here stays in memory after its reload.
        gc.freeze()
        await serve_until_stopped(tools.server(), streams, lambda: _serve_http(args, tools, data_dir, stack))


def _tools(args: argparse.Namespace, stack: AsyncExitStack) -> tuple[UnitTools, Path]:
    """The data dir (temporary unless given), the units (a private example copy unless given), the host."""
    if args.data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="unit-mcp-"))
        stack.callback(shutil.rmtree, data_dir, True)
    else:
        data_dir = args.data_dir
    units: str | Path | None = args.units
    with (
        _cannot_write("--data-dir", data_dir, "give a folder you can write, or leave --data-dir out"),
        _untrusted(data_dir),
    ):
        data_dir = paths.private_dir(data_dir)
        for folder in _DATA_FOLDERS if units is None else _DATA_FOLDERS[:-1]:
            paths.private_dir(data_dir, folder)
        if units is None:
            units = data_dir / _DATA_FOLDERS[-1]
            if not any(units.iterdir()):
                _copy_private(EXAMPLE_UNITS, units)
        try:
            host = Host(
                units,
                data_dir,
                git_history=args.git_history,
                change_retention=Retention(days=args.change_retention),
                reload_timeout=args.reload_timeout,
                drain_timeout=args.drain_timeout,
            )
        except UnusableStore as exc:
            raise StartError(f"cannot serve --units {exc}") from None
        host.start()
    stack.callback(host.close)
    if any(is_postgres(member) for member in member_addresses(str(units))):
        for password in held_passwords():
            host.redact.hide(password, "<password>")
    if not host.unit_kinds():
        empty = f"--units {units} holds no units yet (add <unit_id>.py or <unit_id>/__init__.py)"
        print(f"unit-mcp: warning: {empty}", file=sys.stderr, flush=True)
    if not args.no_watch:
        host.start_watching()
    WARM.start(args.test_env)  # the first unit_run_tests finds its test host ready
    stack.callback(WARM.stop)
    asks = args.confirm or args.allow_local_access  # a local-access request always asks, whatever --confirm says
    confirmations = Confirmations(args.confirm, timeout=args.confirm_timeout, on_page=not args.stdio) if asks else None
    local_access = None
    if args.allow_local_access:
        local_access = LocalAccess(paths.private_dir(data_dir, _OPENCODE_CONFIG), host)
        stack.callback(local_access.close)
    service = UnitService(host, max_call_s=args.max_call_s, local_access=local_access)
    return UnitTools(service, prefix=args.tool_prefix, confirmations=confirmations), data_dir


def _copy_private(source: Path, target: Path) -> None:
    """Copy the example units into the data dir, folders 0700 and files 0600 like everything else in it."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"), dirs_exist_ok=True)
    for folder, _, files in os.walk(target):
        os.chmod(folder, 0o700)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o600)


@contextlib.contextmanager
def _untrusted(data_dir: Path) -> Iterator[None]:
    """A data dir another user could have planted things in becomes one StartError line (nothing is used)."""
    try:
        yield
    except paths.UntrustedFolder as exc:
        raise StartError(f"refusing --data-dir: {exc}") from exc
    except paths.UnsafePath as exc:
        raise StartError(f"refusing --data-dir {data_dir}: {exc} in it; remove it") from exc


@contextlib.contextmanager
def _cannot_write(option: str, path: Path, remedy: str) -> Iterator[None]:
    """An OSError while preparing `path` becomes one StartError line naming the option, the cause and the remedy."""
    try:
        yield
    except OSError as exc:
        raise StartError(f"cannot use {option} {path}: {exc.strerror or exc}; {remedy}") from exc


async def _serve_http(args: argparse.Namespace, tools: UnitTools, data_dir: Path, stack: AsyncExitStack) -> None:
    from .bridge import Bridge, BridgeError
    from .clients import Endpoint, write_client_configs
    from .unitpage import UnitsUI

    page = UnitsUI(
        tools.service,
        confirmations=tools.confirmations,
        local_access=tools.service.local_access,
        link_file="UNITS_UI_URL_FILE",
    )
    bridge = Bridge(
        tools.server(),
        host=args.host,
        port=args.port,
        server_name=args.server_name,
        config_root=data_dir / _OPENCODE_CONFIG,
        auth=not args.no_auth,
        pages={UNITS_PAGE: page.app},
    )
    try:
        await stack.enter_async_context(bridge)
    except BridgeError as exc:
        if isinstance(exc.__cause__, OSError):  # the socket could not be bound
            raise StartError(f"{exc}; choose another --port, or leave --port out for a free one") from exc
        raise
    tools.service.host.redact.hide(bridge.token, "<token>")  # a unit's test can read it from the client configs
    status = bridge.status()
    lines = [f"MCP_URL={status.url}", f"MCP_SSE_URL={status.sse_url}"]
    if bridge.token is not None:
        lines.append(f"MCP_TOKEN={bridge.token}")
    lines.append(f"OPENCODE_XDG_CONFIG_HOME={status.config_root}")
    assert status.url is not None and status.sse_url is not None and status.config_root is not None
    endpoint = Endpoint(url=status.url, sse_url=status.sse_url, token=bridge.token, name=args.server_name)
    for key, value in write_client_configs(
        data_dir / "clients", endpoint, opencode_config_home=Path(status.config_root)
    ):
        lines.append(f"{key}={value}")
    app_url = None
    if args.app_port is not None:
        app_url = await _serve_app(args.app_port, tools.service.host, stack)
        lines.append(f"APP_URL={app_url}")
    link_file = data_dir / LOGIN_LINK_FILE
    lines.append(f"UNITS_UI_URL_FILE={link_file}")
    opencode_line = f"XDG_CONFIG_HOME={shlex.quote(str(status.config_root))} opencode"

    def fresh_link() -> str:  # each link works once: a new one after each login, in the file and the env file
        link = page.login_url(f"{bridge.base_url}{UNITS_PAGE}")
        tools.service.host.redact.hide(link.rpartition("token=")[2], "<login>", slot="login")
        with _cannot_write("--data-dir", data_dir, "give a folder you can write, or leave --data-dir out"):
            paths.write_file(data_dir, LOGIN_LINK_FILE, f"{link}\n".encode(), mode=0o600, durable=False)
        if args.env_file is not None:
            write_env_file(args.env_file, [*lines, f"UNITS_UI_URL={link}"], commands=[opencode_line])
        return link

    first = fresh_link()
    for line in lines:
        _say(line)
    _say(opencode_line)
    _say(f"UNITS_UI_URL={first}")

    def announce() -> None:
        try:
            _say(f"UNITS_UI_URL={fresh_link()}")
        except StartError as exc:  # after start a file that cannot be written is worth a warning, not the server
            print(f"unit-mcp: warning: the fresh UNITS_UI_URL was not saved: {exc}", file=sys.stderr, flush=True)

    page.on_login = announce
    stack.callback(page.close_streams)
    page_url = f"{bridge.base_url}{UNITS_PAGE}/"
    print(ready_line(args, tools.service.host, data_dir, status.url, page_url, app_url), file=sys.stderr, flush=True)
    await anyio.sleep_forever()


def ready_line(
    args: argparse.Namespace, host: Host, data_dir: Path, mcp_url: str, page_url: str, app_url: str | None
) -> str:
    """The one line for a person after the KEY=VALUE block: what is served from where, the page's and the app's
    URLs, how to stop."""
    count = len(host.unit_kinds())
    if args.units is None:
        where = f"a private copy of the built-in example units in {data_dir / _DATA_FOLDERS[-1]}"
    else:
        where = " and ".join(shown_address(member) for member in member_addresses(args.units))
    app = f"the app at {app_url}" if app_url else "no app (--app-port 0 serves the units' web routes too)"
    return (
        f"{PROG}: serving {count} unit{'s' * (count != 1)} from {where} to MCP clients at {mcp_url}; the page at "
        f"{page_url} (log in with UNITS_UI_URL: each link works once, the fresh one is in UNITS_UI_URL_FILE); "
        f"{app}; Ctrl-C stops it"
    )


async def _serve_app(port: int, host: Host, stack: AsyncExitStack) -> str:
    """The units' web routes on loopback (Host and Origin checked, no token: it is the application), from an event
    loop of their own so that requests do not wait for the MCP calls; its URL."""
    from .asgi import units_app
    from .loopback import Guard, LoopbackServer, security_settings

    server = LoopbackServer(port=port, error=StartError)
    bound = server.bind()
    await server.start_on_own_loop(
        Guard(units_app(host), security=security_settings(server.host, bound), token=None), name="unit-mcp app"
    )
    stack.push_async_callback(server.stop)
    return f"{server.base_url}/"


def write_env_file(path: Path, lines: Sequence[str], *, commands: Sequence[str] = ()) -> None:
    """The KEY=VALUE lines, shell-quoted, and the printed command lines as comments (sourcing the file must not run
    them), replacing `path` atomically with mode 0600 (it holds the token)."""
    text = "".join(f"{key}={shlex.quote(value)}\n" for key, _, value in (line.partition("=") for line in lines))
    text += "".join(f"# {command}\n" for command in commands)
    target = path.absolute()
    with _cannot_write("--env-file", path, "give a file in a folder you can write"):
        paths.write_file(target.parent, target.name, text.encode(), mode=0o600)


def _positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0, e.g. 240")
    return value


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = parse_args(argv, prog)
    handler = StderrHandler(sys.stderr.fileno())
    handler.setLevel(logging.DEBUG if args.debug else logging.WARNING)
    handler.setFormatter(logging.Formatter(f"{prog}: %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)
    if args.debug:
        logging.getLogger("unit_mcp").setLevel(logging.DEBUG)
    keep_memory_private()
    tracing.configure("unit-mcp-server", prog)  # before the tools' server is built (it keeps the SDK's spans then)
    try:
        anyio.run(serve, args, backend="asyncio")
    except BaseException as exc:
        expected = _expected(exc)
        if expected is None or args.debug:
            raise
        handler.flush()  # the warnings before it, then the error
        print_error(prog, str(expected))
        return 1
    return 0


def _expected(exc: BaseException) -> BaseException | None:
    """The StartError or BridgeError behind `exc` (task groups wrap it in exception groups), else None."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    bridge = sys.modules.get("unit_mcp.bridge")  # imported only by HTTP serving, the one source of BridgeError
    return exc if isinstance(exc, StartError) or (bridge and isinstance(exc, bridge.BridgeError)) else None


if __name__ == "__main__":
    sys.exit(main())
