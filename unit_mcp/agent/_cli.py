"""`unit-mcp agent` (or `python -m unit_mcp.agent`): run one turn against a unit server, browse stored sessions,
and answer an approval that a turn was waiting for when its process ended.

Secrets come from the environment or `--mcp-token-file`/`--api-key-file`, never the command line; a failure a
person can fix ends with one line (`--debug` for the traceback). Usage and defaults: docs/agent.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from .. import tracing
from ..commandline import CommandParser, print_error
from ..paths import UnsafeSecret, UntrustedFolder, private_dir
from ..proctree import keep_memory_private
from ..secret_options import add_secret_option, secret_value
from .approvals import RISKS, AgentApprovals, ApprovalDecision, ApprovalRequest
from .items import ErrorItem, Item, MessageItem, ToolCallItem, ToolResultItem
from .paused import RESUMED_OUTPUT
from .projections import transcript_line
from .sessions import SessionStore

if TYPE_CHECKING:
    from ._mcpsource import McpToolSource
    from ._runner import AgentRunner
    from .turns import TurnCallbacks, TurnHandle

PROG = "unit-mcp agent"
AGENT_ID = "unit-agent"
MCP_TOKEN_ENV = ("MCP_TOKEN", "UNIT_MCP_TOKEN")
API_KEY_ENV = ("OPENAI_API_KEY",)
Store = str | Path  # a session store's folder, or its postgresql:// address


class CliError(Exception):
    """A failure the person at the terminal can fix: one line saying what happened and what to do, exit 1."""


def _env(*names: str) -> str | None:
    """The first of these environment variables that is set and not empty."""
    return next((os.environ[name] for name in names if os.environ.get(name)), None)


def default_data_dir() -> Path:
    if os.environ.get("UNIT_MCP_AGENT_DATA"):
        return Path(os.environ["UNIT_MCP_AGENT_DATA"])
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "unit-mcp" / "agent-sessions"


def _trust_store(data_dir: Path) -> None:
    """The session store is ours alone (its approvals resume turns); a missing one is made 0700 by the store."""
    if os.path.lexists(data_dir):
        try:
            private_dir(data_dir)
        except UntrustedFolder as exc:
            raise CliError(f"refusing the session store: {exc}") from exc


def preset_file(path: str) -> list[Any]:
    from .presets import PresetError, load_presets

    try:
        return load_presets(path)
    except PresetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def agents_file(path: str) -> list[Any]:
    from .agentfile import AgentFileError, load_agents

    try:
        return load_agents(path)
    except AgentFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def system_db(url: str) -> str:
    """A system database address without a password (one on the command line is readable by other users)."""
    from urllib.parse import urlsplit

    if not url.startswith(("postgresql://", "sqlite:///")):
        raise argparse.ArgumentTypeError("give postgresql://USER@HOST:PORT/DB or sqlite:///PATH")
    if urlsplit(url).password is not None:
        raise argparse.ArgumentTypeError("no password on the command line: put it in PGPASSFILE (~/.pgpass)")
    return url


def command_parser(prog: str = PROG) -> CommandParser:
    top = CommandParser(prog=prog, description=__doc__.split("\n\n")[0])
    top.add_argument(
        "--data-dir",
        type=Path,
        default=default_data_dir(),
        help="the agent's data folder, its session store unless --sessions (default: $UNIT_MCP_AGENT_DATA or "
        "%(default)s)",
    )
    top.add_argument(
        "--sessions",
        default=_env("UNIT_MCP_AGENT_SESSIONS"),
        metavar="STORE",
        help="session store: a folder, or postgresql://USER@HOST:PORT/DB shared by several machines (password from "
        "PGPASSWORD or PGPASSFILE; default: $UNIT_MCP_AGENT_SESSIONS or the data folder)",
    )
    top.add_argument(
        "--debug", action="store_true", help="show the traceback of a failure (a worker: DBOS's own start-up log too)"
    )
    commands = top.add_subparsers(dest="command", required=True)

    turns = CommandParser(add_help=False)
    turns.add_argument("--model", help="model name at the OpenAI-compatible endpoint (the unit-agent agent)")
    turns.add_argument(
        "--agents", type=agents_file, help="agents file (TOML or JSON: id, provider, model, ...), all built at start"
    )
    turns.add_argument("--agent", help="the agent a new session runs (default: unit-agent, else the file's first)")
    turns.add_argument(
        "--base-url", default=_env("OPENAI_BASE_URL"), help="OpenAI-compatible base URL (default: $OPENAI_BASE_URL)"
    )
    add_secret_option(turns, "--api-key", env=API_KEY_ENV, what="API key (not needed locally)")
    turns.add_argument(
        "--mcp-url",
        default=_env("MCP_URL", "UNIT_MCP_URL"),
        help="the MCP_URL the unit server printed (default: $MCP_URL; without it the turn has no unit tools)",
    )
    add_secret_option(turns, "--mcp-token", env=MCP_TOKEN_ENV, what="MCP_TOKEN the unit server printed")
    turns.add_argument("--allow", action="append", default=[], choices=RISKS, help="allow a risk without asking")
    turns.add_argument("--deny", action="append", default=[], choices=RISKS, help="refuse a risk without asking")
    turns.add_argument("--max-steps", type=int, default=20, help="model requests per turn (default %(default)s)")
    turns.add_argument("--no-stream", action="store_true", help="ask for whole answers instead of deltas")
    turns.add_argument(
        "--presets", type=preset_file, help="capability presets (TOML or JSON); the agent is offered their tools only"
    )
    turns.add_argument(
        "--workers",
        action="store_true",
        help="durable turns: `run` submits to the workers, `answer`/`ui` answer their approvals (unit-mcp[durable])",
    )
    turns.add_argument(
        "--system-db",
        type=system_db,
        help="the workers' system database: postgresql://USER@HOST/DB (password in PGPASSFILE) or sqlite:///PATH "
        "(default: dbos.sqlite in the data dir); implies --workers",
    )

    run = commands.add_parser("run", parents=[turns], help="run one turn and stream it to the terminal")
    run.add_argument("prompt", nargs="+", help="what to do")
    run.add_argument("--session", help="continue this session (created with this id if missing)")

    answer = commands.add_parser(
        "answer",
        parents=[turns],
        help="answer an approval a turn waited for when its process ended, or a durable turn waits for",
    )
    answer.add_argument("session_id")
    answer.add_argument("request_id", help="as `sessions pending` lists it")
    answer.add_argument("decision", choices=("approve", "deny"))
    answer.add_argument("--remember", action="store_true", help="with approve: grant the risk for the session")

    ui = commands.add_parser(
        "ui", parents=[turns], help="serve the approval and audit page of the store on loopback (resumes turns here)"
    )
    ui.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")

    worker = commands.add_parser(
        "worker", parents=[turns], help="run durable turns submitted with `run --workers` until stopped"
    )
    worker.add_argument(
        "--executor-id", help="this worker's identity; a restarted worker resumes its turns (default: worker@HOST)"
    )
    worker.add_argument("--takeover", action="store_true", help="also resume the turns of workers that died")

    status = commands.add_parser(
        "status", help="who is doing what: running turns by agent and worker, their current step, the workers"
    )
    status.add_argument("--json", action="store_true", help="print JSON")
    status.add_argument(
        "--system-db",
        type=system_db,
        help="the durable workers' system database (default: dbos.sqlite in the data dir, when workers used it)",
    )

    sessions = commands.add_parser(
        "sessions", help="list, show, delete or archive stored sessions, or list their pending approvals"
    )
    which = sessions.add_subparsers(dest="action", required=True)
    listing = which.add_parser("list", help="the sessions, newest first, a page at a time")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.add_argument("--limit", type=int, default=100, help="sessions per page (default %(default)s)")
    listing.add_argument("--after", metavar="CURSOR", help="the page after the one that printed this cursor")
    listing.add_argument("--archived", action="store_true", help="the archived sessions instead")
    show = which.add_parser("show", help="one session's items")
    show.add_argument("session_id")
    show.add_argument("--json", action="store_true", help="print the session as one JSON document")
    pending = which.add_parser("pending", help="approvals a turn waited for when its process ended")
    pending.add_argument("session_id")
    pending.add_argument("--json", action="store_true", help="print JSON")
    retiring: list[CommandParser] = []
    for action, text in (("delete", "delete a session for good"), ("archive", "move a session into the archive")):
        retire = which.add_parser(action, help=f"{text} (refused while a turn runs in it; recorded in the audit)")
        retire.add_argument("session_id")
        retiring.append(retire)
    audit = which.add_parser("audit", help="the sessions deleted or archived: when, from where, what they were")
    audit.add_argument("--json", action="store_true", help="print JSON")
    imports = which.add_parser("import", help="bring in the sessions of the old file store (one journal file each)")
    imports.add_argument("folder", type=Path, help="the folder holding them")
    undo = which.add_parser(
        "undo", help="put the units back as they were when a turn started (its diffs first, then your yes)"
    )
    undo.add_argument("session_id")
    undo.add_argument("turn_id", nargs="?", help="the turn (default: the session's newest turn with a checkpoint)")
    undo.add_argument("--mcp-url", default=_env("MCP_URL", "UNIT_MCP_URL"), help="the MCP_URL the unit server printed")
    add_secret_option(undo, "--mcp-token", env=MCP_TOKEN_ENV, what="MCP_TOKEN the unit server printed")
    undo.add_argument("--yes", action="store_true", help="do not ask: undo after showing the diffs")
    undo.add_argument("--force", action="store_true", help="also put back sources someone changed after the turn")
    for command in (run, answer, ui, status, listing, show, pending, audit, imports, undo, *retiring):
        # also after the subcommand, as every other unit-mcp command takes it (SUPPRESS keeps the top's value)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return top


class Terminal:
    """Streams a turn to the terminal: reply text to stdout, tool traffic and approvals to stderr."""

    def __init__(self) -> None:
        self.printed: dict[str, int] = {}
        self.error_code: str | None = None

    def item(self, item: Item) -> None:
        if isinstance(item, ErrorItem):
            self.error_code = item.code
        elif isinstance(item, MessageItem) and item.role == "assistant":
            self.text(item)
        elif isinstance(item, ToolCallItem | ToolResultItem):
            self.err(transcript_line(item))

    def text(self, item: Item) -> None:
        if isinstance(item, ToolResultItem):  # a resumed turn puts the approved call's result in place
            if item.output != RESUMED_OUTPUT:  # (its claim on the call before running it is not news)
                self.item(item)
        elif isinstance(item, MessageItem) and item.role == "assistant":
            done = self.printed.get(item.id, 0)
            sys.stdout.write(item.content[done:])
            sys.stdout.flush()
            self.printed[item.id] = len(item.content)

    def err(self, line: str) -> None:
        if any(self.printed.values()):
            sys.stdout.write("\n")
            self.printed = dict.fromkeys(self.printed, 10**9)
        print(line, file=sys.stderr, flush=True)

    async def approve(self, request: ApprovalRequest) -> ApprovalDecision:
        arguments = json.dumps(request.arguments or {}, ensure_ascii=False)
        question = f"Allow {request.tool} ({request.risk}) with {arguments}? [y]es / [N]o / [a]lways this session: "

        def ask() -> str:
            sys.stderr.write(question)
            sys.stderr.flush()
            return sys.stdin.readline().strip().lower()

        answer = await anyio.to_thread.run_sync(ask, abandon_on_cancel=True)
        return ApprovalDecision(
            request_id=request.id,
            risk=request.risk,
            approved=answer in ("y", "yes", "a", "always"),
            remember=answer in ("a", "always"),
            reason=f"answered {answer or 'no'!r} on the terminal",
        )


@contextlib.asynccontextmanager
async def turn_runtime(
    args: argparse.Namespace, store: Store, terminal: Terminal
) -> AsyncIterator[tuple[AgentRunner, TurnCallbacks]]:
    """The runner `run` and `answer` use (the OpenAI-compatible agent, the unit server's tools, the terminal as
    approver) and the callbacks that stream a turn to the terminal."""
    # the MCP and OpenAI SDKs load only here: browsing sessions stays quick
    from ._mcpsource import McpToolSource
    from ._openai_agent import OpenAIAgent
    from ._registry import AgentRegistry
    from ._runner import AgentRunner
    from .prompts import PERSONA
    from .toolsurface import AgentToolSurface
    from .turns import TurnCallbacks

    approvals = AgentApprovals(
        {**dict.fromkeys(args.allow, "auto"), **dict.fromkeys(args.deny, "deny")},
        approver=terminal.approve if sys.stdin.isatty() else None,
    )
    from .presets import PresetManager

    presets = PresetManager(args.presets, state_path=args.data_dir / "active-presets.json") if args.presets else None
    surface = AgentToolSurface(approvals, presets=presets)
    registry = AgentRegistry()
    if args.model:
        registry.register(
            AGENT_ID,
            lambda deps: OpenAIAgent(
                id=AGENT_ID,
                model=args.model,
                base_url=args.base_url,
                api_key=args.api_key,
                stream=not args.no_stream,
                instructions=PERSONA,
                max_steps=args.max_steps,
            ),
        )
    async with contextlib.AsyncExitStack() as stack:
        if args.mcp_url:
            source = McpToolSource(args.mcp_url, token=args.mcp_token)
            try:
                await stack.enter_async_context(source)
            except Exception as exc:
                error = _unit_server_error(args.mcp_url, source, exc)
                if error is None:
                    raise
                raise error from exc
            surface.add_source(source)
        if args.agents:
            from .agentfile import AgentFileError, start_agents

            options = {"base_url": args.base_url, "api_key": args.api_key, "stream": not args.no_stream}
            try:
                await start_agents(stack, registry, args.agents, surface=surface, **options)
            except AgentFileError as exc:
                raise CliError(f"{exc} (--agents)") from exc
        durable = (
            await stack.enter_async_context(_durable_client(args, args.data_dir))
            if _durable(args, args.data_dir)
            else None
        )
        with _store_error(store):
            runner = await stack.enter_async_context(
                AgentRunner(store=store, registry=registry, tools=surface, durable=durable)
            )
        yield runner, TurnCallbacks(on_item=terminal.item, on_partial=terminal.text)


def _durable(args: argparse.Namespace, data_dir: Path) -> bool:
    """Whether durable turns are in play: asked for, or workers used this data dir (their approvals are answered)."""
    if args.command == "worker":
        return False
    return bool(args.workers or args.system_db or (data_dir / "dbos.sqlite").exists())


def _durable_client(args: argparse.Namespace, data_dir: Path) -> Any:
    try:
        from ._durable import DurableClient, system_database
    except ImportError as exc:
        raise CliError(f"{exc} (needed by --workers, --system-db and the worker command)") from None
    return DurableClient(system_database(data_dir, args.system_db))


def _unit_server_error(url: str, source: McpToolSource, exc: Exception) -> CliError | None:
    """What went wrong connecting to the unit server, when a person can fix it (else None: a bug)."""
    import httpx2

    from ._mcpsource import McpRefused

    if isinstance(exc, McpRefused) and source.refused == 401:
        return CliError(
            f"the unit server at {url} refused the token (401 Unauthorized); pass the MCP_TOKEN it printed "
            "(MCP_TOKEN or --mcp-token-file)"
        )
    if isinstance(exc, McpRefused):
        return CliError(f"{exc}; check --mcp-url (or MCP_URL) against what the unit server printed")
    if _caused_by(exc, httpx2.TransportError):
        return CliError(
            f"cannot reach the unit server at {url} ({_root_cause(exc)}); start it (scripts/serve) and pass the "
            "MCP_URL it printed (--mcp-url or MCP_URL)"
        )
    return None


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    return isinstance(_root_cause(exc, kind), kind)


def _root_cause(exc: BaseException, kind: type[BaseException] | None = None) -> BaseException:
    """The innermost exception (of `kind`, if given) behind exception groups, causes and contexts."""
    seen: set[int] = set()
    todo = [exc]
    last = exc
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if kind is not None and isinstance(current, kind):
            return current
        last = current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return last


def _shown(store: Store) -> str:
    from ..pgconnect import is_postgres, shown_address

    return shown_address(str(store)) if is_postgres(store) else str(store)


@contextlib.contextmanager
def _store_error(store: Store) -> Iterator[None]:
    from .errors import AgentError

    try:
        yield
    except OSError as exc:
        raise CliError(
            f"cannot use the session store {_shown(store)}: {exc.strerror or exc}; give a folder you can write "
            "(--data-dir or UNIT_MCP_AGENT_DATA)"
        ) from exc
    except AgentError as exc:
        raise CliError(str(exc)) from exc


def _unknown_session(session_id: str, store: Store) -> CliError:
    return CliError(
        f"no session {session_id} in {_shown(store)}; `unit-mcp agent sessions list` shows the sessions "
        "there (--sessions or --data-dir picks another store)"
    )


async def run_command(args: argparse.Namespace, store: Store) -> int:
    terminal = Terminal()
    async with turn_runtime(args, store, terminal) as (runner, callbacks):
        session = await runner.get_session(args.session) if args.session else None
        if session is None:
            agent_id = args.agent or (AGENT_ID if args.model else args.agents[0].id)
            if runner.registry.get(agent_id) is None:
                known = ", ".join(info.id for info in runner.registry.list())
                raise CliError(f"no agent {agent_id!r} (these are registered: {known}); pick one with --agent")
            session = await runner.create_session(agent_id, session_id=args.session, title=" ".join(args.prompt)[:80])
            for spec in args.agents or []:
                if spec.id == agent_id:  # the presets its file says a new session of it starts with
                    for name in spec.presets:
                        await runner.set_preset(session.id, name, active=True)
        if runner.durable is not None and (args.workers or args.system_db):
            return await submit_command(args, runner, session.id)
        handle = await runner.run_turn(session.id, " ".join(args.prompt), callbacks)
        return await follow(handle, terminal, args)


async def submit_command(args: argparse.Namespace, runner: AgentRunner, session_id: str) -> int:
    """`run --workers`: queue the turn for the workers and wait for its answer (a worker that dies meanwhile is
    replaced by a restarted or another worker; Ctrl-C stops waiting, not the turn)."""
    from ._durable import DurableClient
    from .errors import AgentError

    durable = runner.durable
    assert isinstance(durable, DurableClient)
    try:
        turn_id = await durable.submit(runner.store, session_id, " ".join(args.prompt))
    except AgentError as exc:
        raise CliError(str(exc)) from exc
    print(f"turn {turn_id} of session {session_id} queued for the workers", file=sys.stderr, flush=True)
    answer = await durable.wait(turn_id)
    print(f"session: {session_id}", file=sys.stderr)
    if answer is None:
        print(
            f"turn {turn_id} ended without an answer (failed or interrupted): `sessions show {session_id}` says how",
            file=sys.stderr,
        )
        return 1
    print(answer)
    return 0


async def worker_command(args: argparse.Namespace, store: Store) -> int:
    """Run durable turns until stopped (SIGINT/SIGTERM); approvals are answered with `answer`/`ui --workers`."""
    from ._durable import DurableWorker, default_executor_id, system_database
    from .errors import WorkerRunning

    args.no_stream = True  # a durable turn's model requests are whole steps
    async with turn_runtime(args, store, Terminal()) as (runner, _):
        runner.approvals.attach(None)  # a durable turn waits for `answer`/`ui`, never for this terminal
        worker = DurableWorker(
            store=runner.store,
            registry=runner.registry,
            tools=runner.tools,
            data_dir=args.data_dir,
            executor_id=args.executor_id or default_executor_id(),
            system_database_url=system_database(args.data_dir, args.system_db),
            takeover=args.takeover,
            log_level="INFO" if args.debug else "WARNING",
        )
        try:
            async with worker:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:  # before the ready line
                    print(
                        f"worker {worker.executor_id} runs durable turns from {worker.system_database_url}",
                        file=sys.stderr,
                    )
                    async for _ in signals:
                        break
        except WorkerRunning as exc:
            raise CliError(str(exc)) from None
    return 0


async def answer_command(args: argparse.Namespace, store: Store) -> int:
    from .errors import AgentError, SessionNotFound

    terminal = Terminal()
    async with turn_runtime(args, store, terminal) as (runner, callbacks):
        try:
            answered = await runner.answer_approval(
                args.session_id,
                args.request_id,
                approved=args.decision == "approve",
                remember=args.remember,
                callbacks=callbacks,
            )
        except SessionNotFound:
            raise _unknown_session(args.session_id, store) from None
        except AgentError as exc:
            raise CliError(f"{exc}; `sessions pending {args.session_id}` lists what can be answered") from exc
        if answered.how == "sent_to_worker":
            print(f"sent to durable turn {answered.turn_id}; its worker goes on", file=sys.stderr)
            return 0
        if answered.handle is None:
            waiting = ", ".join(answered.still_waiting)
            print(f"recorded; the turn resumes once its other requests are answered: {waiting}", file=sys.stderr)
            return 0
        handle = answered.handle
        return await follow(handle, terminal, args)


async def ui_command(args: argparse.Namespace, store: Store) -> int:
    """Serve the page; approvals answered there resume their turns in this process, and what those turns ask
    waits for the page too."""
    from .approvals import PendingApprovals
    from .errors import AgentError
    from .ui import serve

    async with turn_runtime(args, store, Terminal()) as (runner, _):
        runner.approvals.attach(PendingApprovals())
        system_db = None
        if _durable(args, args.data_dir):
            from ._durable import system_database

            system_db = system_database(args.data_dir, args.system_db)
        try:
            await serve(runner, port=args.port, system_db=system_db)
        except AgentError as exc:
            raise CliError(str(exc)) from exc
    return 0


# How a failed turn's error code (the exception class) reads to the person at the terminal, with the remedy.
_MODEL_FAILURES = {
    "APIConnectionError": "cannot reach the model endpoint {url} ({error}); check --base-url (or OPENAI_BASE_URL) "
    "and that the endpoint runs",
    "APITimeoutError": "the model endpoint {url} did not answer in time ({error}); check that it runs",
    "AuthenticationError": "the model endpoint {url} refused the API key ({error}); pass a valid key "
    "(OPENAI_API_KEY or --api-key-file)",
    "PermissionDeniedError": "the model endpoint {url} refused the API key ({error}); pass a key allowed to use "
    "that model (OPENAI_API_KEY or --api-key-file)",
    "NotFoundError": "the model endpoint {url} answered 404 ({error}); check --model and --base-url",
}


async def follow(handle: TurnHandle, terminal: Terminal, args: argparse.Namespace) -> int:
    """Wait for the turn (Ctrl-C or SIGTERM cancels it) and say how it ended; the exit status."""
    from .turns import TurnStatus

    async with anyio.create_task_group() as tg:

        async def interrupt() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    await handle.cancel("interrupted from the terminal")
                    return

        tg.start_soon(interrupt)
        await handle.wait()
        tg.cancel_scope.cancel()
    sys.stdout.write("\n")
    print(f"session: {handle.session_id}", file=sys.stderr)
    explained = _MODEL_FAILURES.get(terminal.error_code or "") if handle.status is TurnStatus.FAILED else None
    if explained is not None:
        error = (handle.error or "").removeprefix(f"{terminal.error_code}: ")
        raise CliError(explained.format(url=args.base_url, error=error))
    if handle.status is not TurnStatus.COMPLETED:
        print(f"turn {handle.status}: {handle.error or ''}".rstrip(": "), file=sys.stderr)
    return {TurnStatus.COMPLETED: 0, TurnStatus.CANCELLED: 130}.get(handle.status, 1)


async def undo_command(args: argparse.Namespace, address: Store) -> int:
    """`sessions undo`: the rollback's dry run (diffs, conflicts), a person's yes, then the rollback itself."""
    from ._mcpsource import McpToolSource
    from ._undo import undo_turn
    from .errors import AgentError
    from .toolsurface import AgentToolSurface

    if not args.mcp_url:
        raise CliError("give --mcp-url (or MCP_URL): the undo is a rollback on the unit server the turn worked on")
    with _store_error(address):
        store = SessionStore(address)
    try:
        session = store.load(args.session_id)
        if session is None:
            raise _unknown_session(args.session_id, address)
        surface = AgentToolSurface(AgentApprovals({}))
        source = McpToolSource(args.mcp_url, token=args.mcp_token)
        try:
            await source.__aenter__()
        except Exception as exc:
            raise (_unit_server_error(args.mcp_url, source, exc) or exc) from exc
        try:
            surface.add_source(source)
            try:
                dry = await undo_turn(surface, session, args.turn_id, dry_run=True, force=args.force)
            except AgentError as exc:
                raise CliError(str(exc)) from exc
            for change in dry.sources:
                print(change.get("diff") or f"{change['action']} {change['unit_id']}/{change['source_id']}")
            for conflict in dry.conflicts:
                print(f"conflict: {conflict['unit_id']}/{conflict['source_id']}: {conflict['reason']}", file=sys.stderr)
            if not dry.sources:
                print(f"turn {dry.turn_id}: nothing to put back", file=sys.stderr)
                return 1 if dry.conflicts else 0
            question = f"Undo turn {dry.turn_id}: put back {len(dry.sources)} source(s)? [y/N] "
            if not args.yes:
                if not sys.stdin.isatty():
                    raise CliError("not undone: give --yes to undo without a question (stdin is not a terminal)")
                if input(question).strip().lower() not in ("y", "yes"):
                    print("not undone", file=sys.stderr)
                    return 1
            done = await undo_turn(surface, session, dry.turn_id, dry_run=False, force=args.force)
            store.append_item(session.id, done.event(args.force))
        finally:
            await source.__aexit__(None, None, None)
    finally:
        store.close()
    print(f"turn {done.turn_id} undone: {len(done.sources)} source(s) put back", file=sys.stderr)
    if done.conflicts:
        left = ", ".join(f"{c['unit_id']}/{c['source_id']}" for c in done.conflicts)
        print(f"left alone (changed after the turn by someone else): {left}; --force puts them back", file=sys.stderr)
        return 1
    return 0


def status_command(args: argparse.Namespace, address: Store) -> int:
    """`status`: the running turns of the store, by agent and worker, with their step and for how long; the durable
    workers with their last beat."""
    from .errors import AgentError
    from .status import read_status, status_lines

    workers = []
    if args.system_db or (args.data_dir / "dbos.sqlite").exists():
        try:
            from ._durable import system_database, worker_beats
        except ImportError as exc:
            raise CliError(f"{exc} (needed to read the durable workers)") from None
        workers = worker_beats(system_database(args.data_dir, args.system_db))
    with _store_error(address):
        store = SessionStore(address, read_only=True)
    try:
        status = read_status(store, workers)
    except AgentError as exc:
        raise CliError(str(exc)) from exc
    finally:
        store.close()
    if args.json:
        print(status.model_dump_json(indent=2))
    else:
        print("\n".join(status_lines(status)))
    return 0


def sessions_command(args: argparse.Namespace, address: Store) -> int:
    from .errors import AgentError

    if args.action in ("delete", "archive"):
        return retire_command(args, address)
    read_only = args.action in ("list", "show")  # browsing a missing store shows it empty, and creates nothing
    with _store_error(address):
        store = SessionStore(address, read_only=read_only, archive=args.action == "list" and args.archived)
    try:
        if args.action == "audit":
            records = store.audit()
            if args.json:
                print(json.dumps(records, indent=2))
            for record in [] if args.json else records:
                when = datetime.fromtimestamp(record["at"]).strftime("%Y-%m-%d %H:%M:%S")
                session, via = record["session"], f"via {record['via']}"
                print(f"{when}  {record['action']:<7} {session['id']}  {via:<8} {session['title'] or ''}")
            return 0
        if args.action == "list":
            listed = store.page(args.limit, args.after)
            metas = listed.sessions
            if listed.next is not None:
                print(f"more: sessions list --after {listed.next}", file=sys.stderr)
            if args.json:
                print(json.dumps([meta.model_dump(mode="json") for meta in metas], indent=2))
            for meta in [] if args.json else metas:
                when = datetime.fromtimestamp(meta.updated_at).strftime("%Y-%m-%d %H:%M")
                counts = f"{meta.status:<7} {meta.item_count:>5} items"
                print(f"{meta.id}  {meta.agent_id:<14} {counts}  {when}  {meta.title or ''}")
            return 0
        if args.action == "import":
            from ._import import import_journals

            imported = import_journals(store, args.folder)
            print(f"imported {len(imported)} session(s) from {args.folder} into {store.name}", file=sys.stderr)
            return 0
        if args.action == "pending":
            return pending_command(args, store, address)
        session = store.load(args.session_id)
        if session is None:
            raise _unknown_session(args.session_id, address)
        if args.json:
            print(session.model_dump_json(indent=2))
        else:
            print(f"{session.id}  agent={session.agent_id}  status={session.status}  items={len(session.items)}")
            for item in session.items:
                print(f"  {item.id:>8}  {transcript_line(item)}")
        return 0
    except AgentError as exc:
        raise CliError(str(exc)) from exc
    finally:
        store.close()


def retire_command(args: argparse.Namespace, address: Store) -> int:
    """Delete or archive a session: the store refuses one a turn runs in, and records what it did."""
    from .errors import AgentError, SessionNotFound

    with _store_error(address):
        store = SessionStore(address)
    try:
        meta = store.retire(args.session_id, args.action, via="cli")
    except SessionNotFound:
        raise _unknown_session(args.session_id, address) from None
    except AgentError as exc:
        raise CliError(str(exc)) from exc
    finally:
        store.close()
    print(f"{args.action}d session {meta.id} ({meta.item_count} items)", file=sys.stderr)
    return 0


def pending_command(args: argparse.Namespace, store: SessionStore, address: Store) -> int:
    """The approvals nobody answered, by the store's one rule (a session a live process holds included: that
    process asks its own questions)."""
    if store.meta(args.session_id) is None:
        raise _unknown_session(args.session_id, address)
    pending = [entry.request for entry in store.pending(args.session_id)]
    if args.json:
        print(json.dumps([request.model_dump(mode="json") for request in pending], indent=2))
    for request in [] if args.json else pending:
        arguments = json.dumps(request.arguments or {}, ensure_ascii=False)
        print(f"{request.id}  {request.tool} ({request.risk}) with {arguments}")
    if not pending and not args.json:
        print(f"no approval is pending in session {args.session_id}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    args = command_parser(prog).parse_args(argv)
    data_dir: Path = args.data_dir
    store: Store = args.sessions or data_dir
    try:
        if str(data_dir).startswith(("postgresql:", "postgres:")):  # a Path has already folded its "//"
            raise CliError("--data-dir takes a folder; give a PostgreSQL session store with --sessions postgresql://…")
        _trust_store(data_dir)
        if isinstance(store, str) and not store.startswith(("postgresql://", "postgres://")):
            _trust_store(Path(store))
        if args.command in ("run", "answer", "ui", "worker"):
            args.mcp_token = secret_value(args.mcp_token_file, "--mcp-token", MCP_TOKEN_ENV)
            args.api_key = secret_value(args.api_key_file, "--api-key", API_KEY_ENV)
        if args.command == "sessions" and args.action == "undo":
            args.mcp_token = secret_value(args.mcp_token_file, "--mcp-token", MCP_TOKEN_ENV)
    except (CliError, UnsafeSecret) as exc:
        print_error(prog, str(exc))
        return 2
    try:
        if args.command in ("run", "answer", "ui", "worker"):
            if not args.model and not args.agents:
                print_error(prog, "give --model, or --agents FILE")
                return 2
            if not args.base_url and (args.model or not all(spec.base_url for spec in args.agents)):
                print_error(prog, "give --base-url or set OPENAI_BASE_URL")
                return 2
            commands = {"run": run_command, "answer": answer_command, "ui": ui_command, "worker": worker_command}
            command = commands[args.command]
            keep_memory_private()  # the API key and the MCP token
            tracing.configure("unit-mcp-agent", prog)
            outcome: Any = anyio.run(command, args, store)
            return int(outcome)
        if args.command == "status":
            return status_command(args, store)
        if args.action == "undo":
            keep_memory_private()  # the MCP token
            return int(anyio.run(undo_command, args, store))
        return sessions_command(args, store)
    except BaseException as exc:
        expected = exc
        while isinstance(expected, BaseExceptionGroup) and len(expected.exceptions) == 1:  # task groups wrap it
            expected = expected.exceptions[0]
        if not isinstance(expected, CliError) or args.debug:
            raise
        print_error(prog, str(expected))
        return 1
