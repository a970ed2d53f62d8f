"""Durable turns (`unit-mcp[durable]`): a step-loop turn is a DBOS workflow, so it survives the death of its worker.

Each model request and tool call is a DBOS step (tools must be replay-safe) and an approval is a durable receive;
a recovered turn takes the items it finds in the session store instead of writing them again: every item once.
OpenCode turns re-attach to their node session (one on its dead worker's own node ends `interrupted`, as Codex
turns do). Workers, takeover and what a durable turn leaves out: docs/durable.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import anyio
import sqlalchemy as sa

try:
    from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions, SetWorkflowID, WorkflowHandleAsync
except ImportError as exc:  # pragma: no cover - the test extra installs it
    raise ImportError("durable turns need DBOS: pip install 'unit-mcp[durable]'") from exc

from .. import tracing
from ._context import TurnContext
from ._inbox import Inbox
from ._loop import LoopAgent
from ._mcpsource import REPLAYING
from ._recorder import TurnRecorder
from ._registry import AgentRegistry
from ._turnapprovals import TurnApprovals
from ._undo import checkpoint_turn
from .approvals import AgentApprovals, ApprovalDecision, ApprovalRequest
from .codex import CodexAgent
from .errors import AgentError, SessionLocked, StepLimitReached, WorkerRunning
from .hooks import ModelResponse
from .items import EventItem, Item, MessageItem, Session, ToolCallItem, ToolResultItem
from .opencode import OpenCodeAgent
from .opencode._client import Sent
from .opencode._permissions import NodeAsk, activate_preset, answer_permission, permission_risk
from .opencode._transcript import Reply
from .paused import DECIDED, DURABLE, REQUESTED
from .presets import ACTIVATE
from .sessions import STALE_SECONDS, SessionStore
from .status import WorkerBeat
from .toolsurface import AgentToolSurface, ToolOutput
from .turns import Turn, TurnHandle, TurnStatus, describe

log = logging.getLogger("unit_mcp.agent.durable")

T = TypeVar("T")

APP = "unit-mcp"  # the DBOS application workers and clients share
WORKFLOW = "unit_mcp.durable_turn"
TURNS = "unit_mcp_turns"  # the queue `DurableClient.submit` puts turns on; every worker takes from it
QUEUE_POLL = 0.5  # seconds between a worker's looks at the queue
WAIT_POLL = 0.1  # seconds between looks at whether a turn ended (DBOS's default is a second)
APPROVAL_TIMEOUT = 7 * 24 * 3600.0  # seconds a durable turn waits for an approval before it counts as denied
BEAT_SECONDS = 0.25  # how often a worker records that it lives
DEAD_AFTER = 5.0  # seconds without a beat after which a worker on another host counts as dead
CODEX_BEGUN = "codex-begun"  # the event a durable Codex turn records before Codex runs on its prompt

_worker: DurableWorker | None = None


def system_database(data_dir: str | Path, url: str | None = None) -> str:
    """The system database workers and clients share: `url`, else SQLite in the data folder."""
    return url or f"sqlite:///{Path(data_dir).resolve() / 'dbos.sqlite'}"


def sqlite_engine(url: str) -> sa.Engine:
    """A SQLite system database as DBOS opens one (its pool; IMMEDIATE writes, busy timeout, foreign keys), in WAL
    with `synchronous=NORMAL`: a step's commit writes the log without syncing it, and a killed worker loses nothing
    committed (a power loss may lose the last commits). `test_dbos_contract.py` pins the settings DBOS's own has."""
    engine = sa.create_engine(url, pool_size=20, max_overflow=0, pool_timeout=30, pool_pre_ping=True)

    @sa.event.listens_for(engine, "connect")
    def configure(dbapi_conn: Any, _: object) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        if dbapi_conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
            raise AgentError(f"{url}: the system database needs SQLite's WAL mode, which this file system refuses")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def system_engine(url: str) -> sa.Engine:
    """An engine on the system database: `sqlite_engine`'s for SQLite, else psycopg 3's (DBOS's driver)."""
    if url.startswith("sqlite"):
        return sqlite_engine(url)
    return sa.create_engine("postgresql+psycopg://" + url.removeprefix("postgresql://"))


def default_executor_id() -> str:
    """A worker's identity when none is given: stable on one host, so a restarted worker resumes its turns."""
    return f"worker@{socket.gethostname()}"


def new_turn_id() -> str:
    return f"turn-{secrets.token_hex(6)}"


def _asked_in_workflow(request: ApprovalRequest) -> ApprovalDecision:
    """A worker's approver when it has none: its turns ask through their workflow (`DBOS.recv`), so tools that ask
    are offered; a question put to this approver itself is refused."""
    why = "a durable turn asks only through its workflow"
    return ApprovalDecision(request_id=request.id, risk=request.risk, approved=False, decided_by="policy", reason=why)


class _ReplayedTurn(Turn):
    """A turn that takes, in order, the items it wrote before its worker died instead of writing them again."""

    def __init__(self, *, replay: list[Item], **options: Any) -> None:
        super().__init__(**options)
        self._replay = replay

    @property
    def replaying(self) -> bool:
        return bool(self._replay)

    async def append(self, item: Item, *, closing: bool = False, status: Any = None, grant: str | None = None) -> Item:
        if not self._replay:  # a replayed decision's grant was written with it
            return await super().append(item, closing=closing, status=status, grant=grant)
        stored = self._replay[0]
        if type(stored) is not type(item):
            raise AgentError(f"turn {self.id} replayed differently from what it recorded (at item {stored.id})")
        return self._take()

    def adopt(self) -> EventItem | None:
        """Take every item left to replay as written (a resumed Codex turn's); the turn's end among them, if any."""
        ended = None
        while self._replay:
            stored = self._take()
            if isinstance(stored, EventItem) and stored.kind.startswith("turn-") and stored.kind != "turn-started":
                ended = stored
        return ended

    def _take(self) -> Item:
        stored = self._replay.pop(0)
        if isinstance(stored, ToolCallItem):
            self._open_calls[stored.call_id] = stored
        elif isinstance(stored, ToolResultItem):
            self._open_calls.pop(stored.call_id, None)
        self._last_item_id = stored.id
        return stored


async def _no_delegation(*_: object) -> TurnHandle:
    raise AgentError("a durable turn cannot delegate yet")


_CREATE_LOCK = 0x756E69745F6D6370  # the advisory lock workers take turns on to create their table ("unit_mcp")


WORKERS = sa.Table(
    "unit_mcp_workers",
    sa.MetaData(),
    sa.Column("executor_id", sa.Text, primary_key=True),
    sa.Column("host", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("beat", sa.Float, nullable=False),
)


def worker_beats(url: str) -> list[WorkerBeat]:
    """Every worker that beat in the system database at `url`, with its last beat and whether it lives (read
    only: a database no worker used yet has none, and a missing SQLite file is not created)."""
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return []
    engine = system_engine(url)
    host, now = socket.gethostname(), time.time()
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(WORKERS.name):
                return []
            rows = conn.execute(sa.select(WORKERS).order_by(WORKERS.c.executor_id)).all()
    finally:
        engine.dispose()
    return [
        WorkerBeat(
            executor_id=row.executor_id,
            host=row.host,
            pid=row.pid,
            beat=row.beat,
            alive=_alive(row.host, row.pid, now - row.beat, host),
        )
        for row in rows
    ]


class _Beats:
    """Which workers live, in a table of the system database: each worker beats every `BEAT_SECONDS`. One on this
    host is dead once its process is gone (or it stopped beating for `STALE_SECONDS`, its pid reused), one on another
    host once it stopped beating for `DEAD_AFTER` seconds."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.table = WORKERS
        self._create()

    def _create(self) -> None:
        """Create the table unless it exists, safe when several workers start at once on a fresh system database:
        SQLite checks `IF NOT EXISTS` under its write lock; PostgreSQL's concurrent creations can still collide in
        its catalog, so they take turns on a transaction-scoped advisory lock."""
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CREATE_LOCK})
            conn.execute(sa.schema.CreateTable(self.table, if_not_exists=True))

    def beat(self, executor_id: str) -> None:
        row = {"host": socket.gethostname(), "pid": os.getpid(), "beat": time.time()}
        with self.engine.begin() as conn:
            if not conn.execute(self.table.update().where(self.table.c.executor_id == executor_id), row).rowcount:
                conn.execute(self.table.insert(), {"executor_id": executor_id, **row})

    def claim(self, executor_id: str) -> None:
        """Beat as `executor_id` for the first time, refused (`WorkerRunning`) while a worker that is alive and
        beating holds it: a second worker with one identity would take over the first one's turns, and its tool
        calls would run twice. One transaction (the row locked): of two workers starting at once, one waits for the
        other and sees it; two first inserts collide, and the loser looks again."""
        host, now = socket.gethostname(), time.time()
        try:
            with self.engine.begin() as conn:
                held = sa.select(self.table).where(self.table.c.executor_id == executor_id).with_for_update()
                row = conn.execute(held).first()
                if row is not None and row.pid != os.getpid() and _alive(row.host, row.pid, now - row.beat, host):
                    raise WorkerRunning(
                        f"worker {executor_id} is already running (pid {row.pid} on {row.host}): stop it first, or "
                        "give this one another --executor-id"
                    )
                beat = {"host": host, "pid": os.getpid(), "beat": now}
                if row is None:
                    conn.execute(self.table.insert(), {"executor_id": executor_id, **beat})
                else:
                    conn.execute(self.table.update().where(self.table.c.executor_id == executor_id), beat)
        except sa.exc.IntegrityError:
            self.claim(executor_id)

    def dead(self, own: str) -> list[str]:
        """The executor ids of dead workers other than `own`."""
        host, now = socket.gethostname(), time.time()
        with self.engine.begin() as conn:
            rows = conn.execute(sa.select(self.table).where(self.table.c.executor_id != own)).all()
        return [row.executor_id for row in rows if not _alive(row.host, row.pid, now - row.beat, host)]

    def forget(self, executor_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.table.delete().where(self.table.c.executor_id == executor_id))

    def close(self) -> None:
        self.engine.dispose()


def _alive(host: str, pid: int, silent: float, this_host: str) -> bool:
    """Whether a worker that last beat `silent` seconds ago lives: on this host while its process exists (and beat
    within `STALE_SECONDS`: its pid may be reused), on another while it beat within `DEAD_AFTER`."""
    if host == this_host:
        return not _gone(pid) and silent <= STALE_SECONDS
    return silent <= DEAD_AFTER


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class DurableClient:
    """Submits turns to the workers sharing a system database and answers their approvals, from any process (the
    CLI, the page): `async with DurableClient(url) as client:`."""

    def __init__(self, system_database_url: str) -> None:
        self.system_database_url = system_database_url
        self._client: DBOSClient | None = None

    async def __aenter__(self) -> DurableClient:
        url = self.system_database_url
        self._client = DBOSClient(system_database_url=url, application_name=APP, lazy=True)  # a worker makes the tables
        return self

    async def __aexit__(self, *exc: object) -> None:
        client, self._client = self._client, None
        if client is not None:
            await anyio.to_thread.run_sync(client.destroy)

    @property
    def client(self) -> DBOSClient:
        if self._client is None:
            raise AgentError("the durable client is not open: use `async with DurableClient(url) as client`")
        return self._client

    async def submit(self, store: SessionStore, session_id: str, input: str) -> str:
        """Queue a durable turn of the session's agent on `input` for a worker; its id (also its workflow id). The
        store lets go of the session, so the worker may write it."""
        await anyio.to_thread.run_sync(store.require, session_id)
        await anyio.to_thread.run_sync(store.invalidate, session_id)
        turn_id = new_turn_id()
        options: EnqueueOptions = {"queue_name": TURNS, "workflow_name": WORKFLOW, "workflow_id": turn_id}
        try:
            await self.client.enqueue_async(options, session_id, turn_id, input)
        except sa.exc.DBAPIError as exc:
            reason = str(exc.orig).splitlines()[0] if exc.orig else type(exc).__name__
            raise AgentError(
                f"cannot queue the turn on {self.system_database_url} ({reason}): start a worker on that system "
                "database first (python -m unit_mcp.agent worker), which sets it up"
            ) from None
        return turn_id

    async def wait(self, turn_id: str) -> str | None:
        """The turn's final answer once it ends on its worker (None if it failed: the session says why)."""
        handle: WorkflowHandleAsync[str | None] = await self.client.retrieve_workflow_async(turn_id)
        result: str | None = await handle.get_result(polling_interval_sec=WAIT_POLL)
        return result

    async def answer(self, request: ApprovalRequest, decision: ApprovalDecision) -> None:
        """Send an answer to the durable turn waiting for it (a second answer to the same request is dropped)."""
        assert request.turn_id is not None
        message = decision.model_dump(mode="json")
        await self.client.send_async(request.turn_id, message, request.id, idempotency_key=request.id)


class DurableWorker:
    """A process that runs step-loop turns as DBOS workflows: `async with DurableWorker(...) as worker:`.

    Workers sharing `system_database_url` (default: SQLite in `data_dir`) share turns: each takes queued ones; one
    started with the `executor_id` of a dead one resumes its turns at launch, and one with `takeover` resumes the
    turns of any worker that died. One worker per process (DBOS is process-global)."""

    def __init__(
        self,
        *,
        store: SessionStore,
        registry: AgentRegistry,
        tools: AgentToolSurface,
        data_dir: str | Path,
        approvals: AgentApprovals | None = None,
        executor_id: str = "local",
        system_database_url: str | None = None,
        takeover: bool = False,
        approval_timeout: float = APPROVAL_TIMEOUT,
        log_level: str = "WARNING",
    ) -> None:
        self.store = store
        self.registry = registry
        self.tools = tools
        self.approvals = approvals or tools.approvals
        self.executor_id = executor_id
        self.system_database_url = system_database(data_dir, system_database_url)
        self.takeover = takeover
        self.approval_timeout = approval_timeout
        self.log_level = log_level  # DBOS's own (a line per schema migration, a console link at INFO)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._beats: _Beats | None = None
        self._watch: asyncio.Task[None] | None = None
        self._started: dict[str, WorkflowHandleAsync[str | None]] = {}  # turns submitted here, until waited for
        self.run_id = secrets.token_hex(8)  # this process's: an OpenCode node session opened elsewhere died there
        self._attached = False

    async def __aenter__(self) -> DurableWorker:
        global _worker
        if _worker is not None:
            raise AgentError("a durable worker runs in this process already: one per process")
        self._loop = asyncio.get_running_loop()
        _worker = self
        if self.approvals.approver is None:
            self.approvals.attach(_asked_in_workflow)
            self._attached = True
        config: DBOSConfig = {
            "name": APP,
            "system_database_url": self.system_database_url,
            "executor_id": self.executor_id,
            "log_level": self.log_level,
        }
        try:
            engine = system_engine(self.system_database_url)
            if engine.dialect.name == "sqlite":
                config["system_database_engine"] = engine  # DBOS's own syncs every step's commit: see sqlite_engine
            self._beats = await anyio.to_thread.run_sync(_Beats, engine)
            await anyio.to_thread.run_sync(self._beats.claim, self.executor_id)
            DBOS(config=config)
            await anyio.to_thread.run_sync(DBOS.launch)
            await DBOS.register_queue_async(TURNS, polling_interval_sec=QUEUE_POLL)
        except BaseException:
            await self._close_beats()
            self._detach()
            _worker = None
            raise
        self._watch = asyncio.create_task(self._watch_workers())
        return self

    async def __aexit__(self, *exc: object) -> None:
        global _worker
        try:
            if self._watch is not None:
                self._watch.cancel()
                with anyio.CancelScope(shield=True):
                    await asyncio.gather(self._watch, return_exceptions=True)
            await anyio.to_thread.run_sync(lambda: DBOS.destroy(workflow_completion_timeout_sec=0))
        finally:
            # DBOS made its executor the loop's default one and has shut it down: asyncio.to_thread needs another
            assert self._loop is not None
            self._loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())
            await self._close_beats()
            self._detach()
            _worker = None

    def _detach(self) -> None:
        if self._attached:
            self.approvals.attach(None)
            self._attached = False

    async def _close_beats(self) -> None:
        beats, self._beats = self._beats, None
        if beats is not None:
            await anyio.to_thread.run_sync(beats.close)

    async def _watch_workers(self) -> None:
        """Beat; with `takeover`, resume the turns of workers that died (each is forgotten once taken over)."""
        beats = self._beats
        assert beats is not None
        while True:
            try:
                await anyio.to_thread.run_sync(beats.beat, self.executor_id)
                for dead in await anyio.to_thread.run_sync(beats.dead, self.executor_id) if self.takeover else []:
                    resumed = await anyio.to_thread.run_sync(recover, dead)
                    # one line an operator sees (a worker logs at WARNING unless --debug): who took whose turns
                    log.warning("worker %s resumed %d turn(s) of dead worker %s", self.executor_id, resumed, dead)
                    await anyio.to_thread.run_sync(beats.forget, dead)
            except Exception:
                log.exception("worker %s: beating or taking over dead workers failed; trying again", self.executor_id)
            await anyio.sleep(BEAT_SECONDS)

    async def submit(self, session_id: str, input: str) -> str:
        """Start a durable turn of the session's agent on `input` on this worker; its id (also its workflow id)."""
        session = await anyio.to_thread.run_sync(self.store.require, session_id)
        self._agent(session.agent_id)
        turn_id = new_turn_id()
        with SetWorkflowID(turn_id):
            self._started[turn_id] = await DBOS.start_workflow_async(_durable_turn, session_id, turn_id, input)
        return turn_id

    async def wait(self, turn_id: str) -> str | None:
        """The turn's final answer once it ends (None if it failed: the session says why); one this worker started
        is awaited where it runs, any other polled for in the system database."""
        handle = self._started.pop(turn_id, None)
        if handle is None:
            handle = await DBOS.retrieve_workflow_async(turn_id)
        result: str | None = await handle.get_result(polling_interval_sec=WAIT_POLL)
        return result

    def _agent(self, agent_id: str) -> LoopAgent | OpenCodeAgent | CodexAgent:
        agent = self.registry.require(agent_id)
        if isinstance(agent, CodexAgent):
            return agent
        if isinstance(agent, OpenCodeAgent):
            return agent
        if not isinstance(agent, LoopAgent):
            raise AgentError(f"agent {agent_id} is no step-loop, OpenCode or Codex agent: it runs no durable turns")
        if getattr(agent, "stream", False) or agent.compact_at is not None:
            raise AgentError(f"agent {agent_id} streams or compacts: give it stream=False, compact_at=None")
        return agent

    async def _drive(self, session_id: str, turn_id: str, input: str) -> str | None:
        session = await self._claim(session_id)
        agent = self._agent(session.agent_id)
        replay = [item for item in session.items if item.turn_id == turn_id]
        turn = _ReplayedTurn(replay=replay, turn_id=turn_id, session_id=session_id, agent_id=agent.id, store=self.store)
        ctx = TurnContext(
            session_id=session_id,
            turn=turn.controller,
            tools=self.tools,
            approvals=TurnApprovals(self.approvals, self.store, session_id, turn.controller),
            inbox=Inbox(),
            store=self.store,
            delegate=_no_delegation,
            agents=self.registry,
        )
        try:
            with _turn_span(replay, agent.id, session_id, turn_id) as carrier:
                started = {"turn_id": turn_id, "agent_id": agent.id, DURABLE: True, **carrier}
                await turn.append(EventItem(kind="turn-started", data=started), status="running")
                await turn.append(MessageItem(role="user", content=input))
                # The turn can be undone in one step: a checkpoint on each unit server, taken once (a step: a worker
                # that resumes the turn takes the recorded one, never a new one after the turn's edits).
                marked = await DBOS.run_step_async(
                    {"name": "turn checkpoint"}, self._on_main, checkpoint_turn, self.tools, session_id, turn_id
                )
                if marked is not None:
                    await turn.append(marked)
                if isinstance(agent, OpenCodeAgent):
                    return await self._opencode(agent, session, turn, ctx, input)
                if isinstance(agent, CodexAgent):
                    return await self._codex(agent, session, turn, ctx, input)
                return await self._steps(agent, turn, ctx)
        except Exception as exc:
            await turn.end(TurnStatus.FAILED, error=describe(exc), code=type(exc).__name__)
            return None
        finally:
            await anyio.to_thread.run_sync(self.store.invalidate, session_id)  # others may write it now

    async def _steps(self, agent: LoopAgent, turn: Turn, ctx: TurnContext) -> str | None:
        async with self._scope(agent, ctx) as scope:
            recorder = TurnRecorder(turn.controller, self.tools)
            for step in range(1, agent.max_steps + 1):
                response = await DBOS.run_step_async(
                    {"name": "model"}, self._on_main, _request, agent, ctx, step, context=scope
                )
                message = await turn.append(
                    MessageItem(
                        role="assistant",
                        content=response.content,
                        usage=response.usage,
                        model=response.model,
                        provider=response.provider,
                    )
                )
                for call in response.tool_calls:
                    item = await recorder.open_call(call.id, call.name, call.arguments, parent_id=message.id)
                    if item is None:
                        continue
                    await self._approval(turn, ctx, item)
                    output: ToolOutput = await DBOS.run_step_async(
                        {"name": f"tool {call.name}"}, self._on_main, _replayable, agent._execute, ctx, item
                    )
                    await recorder.close_call(call.id, output)
                if not response.tool_calls:
                    await turn.end(TurnStatus.COMPLETED, result=response.content)
                    return response.content
            raise StepLimitReached(f"no final answer after {agent.max_steps} model requests (max_steps)")

    async def _opencode(
        self, agent: OpenCodeAgent, session: Session, turn: _ReplayedTurn, ctx: TurnContext, input: str
    ) -> str | None:
        """An OpenCode turn: the node session (its id and newest message id checkpointed), the prompt sent once,
        then the reply read back from the node once it is idle (bounded), recorded and settled. A worker that
        resumes the turn re-attaches to that node session and never sends the prompt again. An agent with an
        endpoint has a node of its worker's own, which asks before risky calls: each question is asked and answered
        like a step-loop call's (`_node_asks`); a worker that resumes such a turn cannot reach the node of the worker
        that opened it (nor that node its endpoint) and ends the turn `interrupted`, as a Codex turn."""
        opened: tuple[str | None, Sent, str] = await DBOS.run_step_async(
            {"name": "opencode session"}, self._on_main, self._open_session, agent, session
        )
        stored, sent, opener = opened
        if agent.endpoint is not None and opener != self.run_id:
            error = "the worker running this turn died; its own OpenCode node is out of reach (what it did is kept)"
            return await self._orphaned(turn, error)
        await agent.note_session(ctx, stored, sent)
        await DBOS.run_step_async({"name": "opencode prompt"}, self._on_main, agent.prompt_once, ctx, sent, input)
        answered: list[str] = []
        while True:
            got: Reply | NodeAsk = await DBOS.run_step_async(
                {"name": "opencode reply"}, self._on_main, agent.read_back_or_ask, sent, tuple(answered)
            )
            if isinstance(got, Reply):
                return await agent.conclude(ctx, got)
            answered.append(got.id)
            await self._node_asks(agent, turn, ctx, got)

    async def _open_session(self, agent: OpenCodeAgent, session: Session) -> tuple[str | None, Sent, str]:
        return (*await agent.open_session(session), self.run_id)

    async def _node_asks(self, agent: OpenCodeAgent, turn: Turn, ctx: TurnContext, asked: NodeAsk) -> None:
        """Answer the node's question before a tool call as `Permissions` does, the approval asked as `_approval`
        asks: the policy (or a grant) first, else the durable wait; then a step tells the node."""
        name = agent.tool_name(asked.permission)
        known = self.tools.get(name)
        if known is not None and known.name == ACTIVATE:
            await DBOS.run_step_async(
                {"name": "opencode activate"}, self._on_main, activate_preset, agent.client, ctx, asked.id,
                asked.arguments,
            )  # fmt: skip
            return
        request = ApprovalRequest(
            risk=permission_risk(self.tools, known, asked.arguments),
            tool=name,
            arguments=asked.arguments,
            reason=f"OpenCode asks to use {asked.permission}",
            session_id=turn.session_id,
            turn_id=turn.id,
        )
        decision = await DBOS.run_step_async({"name": "asks"}, self._on_main, self._policy, ctx, request)
        if decision is None:
            decision = await self._wait_answer(turn, ctx, request)
        elif not decision.approved:
            record = {"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}
            await turn.append(EventItem(kind=DECIDED, data=record))
        await DBOS.run_step_async(
            {"name": "opencode answer"}, self._on_main, answer_permission, agent.client, agent.endpoint, asked.id,
            known, name, decision,
        )  # fmt: skip

    async def _codex(
        self, agent: CodexAgent, session: Session, turn: _ReplayedTurn, ctx: TurnContext, input: str
    ) -> str | None:
        """A Codex turn runs whole on the worker that began it: Codex keeps nothing to resume (`--ephemeral`; its home
        and endpoint die with the worker), so a worker that resumes it keeps the items recorded before and ends it
        `interrupted`, never running Codex on the prompt again."""
        resumed = turn.replaying  # (a worker recorded CODEX_BEGUN: it had begun Codex on the prompt)
        await turn.append(EventItem(kind=CODEX_BEGUN, data={"turn_id": turn.id}))
        if not resumed:
            await agent.run(input, session, ctx)
            return turn.result if turn.status is TurnStatus.COMPLETED else None
        error = "the worker running Codex on this turn died, and Codex keeps nothing to resume (what it did is kept)"
        return await self._orphaned(turn, error)

    async def _orphaned(self, turn: _ReplayedTurn, error: str) -> str | None:
        """A resumed turn whose agent died with its worker: the items recorded before kept as written, the turn ended
        `interrupted` (unless it had ended before the worker died)."""
        ended = turn.adopt()
        if ended is not None:  # its worker died after the turn had ended
            return ended.data.get("result") if ended.kind == f"turn-{TurnStatus.COMPLETED}" else None
        await turn.controller.interrupted(error)
        return None

    @contextlib.asynccontextmanager
    async def _scope(self, agent: LoopAgent, ctx: TurnContext) -> AsyncIterator[contextvars.Context | None]:
        """The agent's turn scope (its model client) held for the whole turn on the worker's own loop, where the
        steps run: in this task when the turn runs there (None); a recovered turn runs on DBOS's loop, so a task on
        the worker's holds it and the steps run in that task's context (yielded)."""
        assert self._loop is not None
        if asyncio.get_running_loop() is self._loop:
            async with agent.turn_scope(ctx):
                yield None
            return
        entered: concurrent.futures.Future[contextvars.Context] = concurrent.futures.Future()
        release = asyncio.Event()  # set on the worker's loop

        async def hold() -> None:
            async with agent.turn_scope(ctx):
                entered.set_result(contextvars.copy_context())
                await release.wait()

        def ended(holder: concurrent.futures.Future[None]) -> None:
            if not entered.done():
                failed = None if holder.cancelled() else holder.exception()
                entered.set_exception(failed or AgentError(f"agent {agent.id}'s turn scope ended before it opened"))

        holder = asyncio.run_coroutine_threadsafe(hold(), self._loop)
        holder.add_done_callback(ended)
        try:
            context: contextvars.Context = await asyncio.wrap_future(entered)
            yield context
        finally:
            self._loop.call_soon_threadsafe(release.set)
            with anyio.CancelScope(shield=True):
                await asyncio.wrap_future(holder)

    async def _claim(self, session_id: str) -> Session:
        """The session, held for writing: a dead worker's claim on it may still look alive (an unreaped process,
        another host) until it goes stale, so a resumed turn waits that long for it."""
        with anyio.fail_after(STALE_SECONDS + 5):
            while True:
                try:
                    return await anyio.to_thread.run_sync(self.store.require, session_id)
                except SessionLocked:
                    await anyio.sleep(0.2)

    async def _approval(self, turn: Turn, ctx: TurnContext, call: ToolCallItem) -> None:
        """A call that needs approval waits for it here, in the workflow (`_wait_answer`); the tool step then takes
        that answer. Whether it asks is a step, so a grant given meanwhile does not change a replay."""
        tool = self.tools.get(call.name)
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError:
            return
        if tool is None or not isinstance(arguments, dict):
            return  # the tool step answers it
        risk = self.tools.call_risk(tool, arguments)
        if self.approvals.check_risk(risk) != "needs-approval":
            return
        request = ApprovalRequest(
            risk=risk,
            tool=tool.name,
            arguments=arguments,
            session_id=turn.session_id,
            turn_id=turn.id,
            call_id=call.call_id,
        )
        if await DBOS.run_step_async({"name": "asks"}, self._on_main, self._policy, ctx, request) is not None:
            return
        ctx.approvals.answered[call.call_id] = await self._wait_answer(turn, ctx, request)

    async def _wait_answer(self, turn: Turn, ctx: TurnContext, request: ApprovalRequest) -> ApprovalDecision:
        """Record the request and wait for its answer in the workflow (`DBOS.recv`: through any number of dead
        workers, until `DurableClient.answer`, else denied after `approval_timeout`); the decision recorded."""
        asked = await turn.append(EventItem(kind=REQUESTED, data=request.model_dump(mode="json")))
        assert isinstance(asked, EventItem)
        request = ApprovalRequest.model_validate(asked.data)  # a replay takes the one it recorded
        answer = await DBOS.recv_async(request.id, timeout_seconds=self.approval_timeout)
        decision = (
            ApprovalDecision.model_validate(answer)
            if answer is not None
            else ApprovalDecision(
                request_id=request.id,
                risk=request.risk,
                approved=False,
                reason=f"no answer within {self.approval_timeout:g} s",
            )
        )
        record = {"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}
        grant = request.risk if decision.approved and decision.remember else None
        await turn.append(EventItem(kind=DECIDED, data=record), grant=grant)  # one write: decision and grant
        return decision

    async def _policy(self, ctx: TurnContext, request: ApprovalRequest) -> ApprovalDecision | None:
        """The policy's or a grant's decision on a request; None when it needs the user's."""
        grants = ctx.approvals.grants()
        if self.approvals.check_risk(request.risk, grants) == "needs-approval":
            return None
        return await self.approvals.request_risk(request, grants)

    async def _on_main(
        self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, context: contextvars.Context | None = None
    ) -> T:
        """Run a step on the worker's own event loop (a recovered workflow runs on DBOS's): its clients live there;
        in `context` there when given (a recovered turn's scope, `_scope`)."""
        assert self._loop is not None
        if asyncio.get_running_loop() is self._loop:
            return await fn(*args)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_in_context(context, fn(*args)), self._loop))


@contextlib.contextmanager
def _turn_span(replay: list[Item], agent_id: str, session_id: str, turn_id: str) -> Iterator[dict[str, str]]:
    """The turn's `invoke_agent` span; yields the trace context the turn records (in `turn-started`). A resumed turn
    continues the trace its first worker recorded: its span is a child of that worker's (never ended, so never
    exported), and only the steps that run again make spans (a replayed step returns its recorded output)."""
    first = replay[0] if replay else None
    recorded = first.data if isinstance(first, EventItem) and first.kind == "turn-started" else {}
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.id": agent_id,
        "gen_ai.conversation.id": session_id,
        "unit_mcp.turn.id": turn_id,
        "unit_mcp.turn.durable": True,
        "unit_mcp.turn.resumed": bool(replay) or None,
    }
    with tracing.span(f"invoke_agent {agent_id}", attributes, context=tracing.extract_meta(recorded)):
        yield tracing.inject_meta({})


async def _replayable(call: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
    """A tool step, which runs again if its worker died in it: its unit-server calls say they may be repeats."""
    token = REPLAYING.set(True)
    try:
        return await call(*args)
    finally:
        REPLAYING.reset(token)


async def _in_context(context: contextvars.Context | None, step: Coroutine[Any, Any, T]) -> T:
    if context is None:
        return await step
    return await asyncio.get_running_loop().create_task(step, context=tracing.carried(context))


async def _request(agent: LoopAgent, ctx: TurnContext, step: int) -> ModelResponse:
    system = await agent.system_prompt(ctx)
    return await agent._chat(await agent._prepare(ctx, system, step), ctx)  # its `chat` span is the step's


def recover(executor_id: str) -> int:
    """Resume the pending turns of a dead worker here; how many. DBOS 3 keeps this private (the admin server that
    offered it is gone): `tests/durable/test_dbos_contract.py` pins it."""
    return len(DBOS._recover_pending_workflows([executor_id]))


@DBOS.workflow(name=WORKFLOW)
async def _durable_turn(session_id: str, turn_id: str, input: str) -> str | None:
    if _worker is None:
        raise AgentError("a durable turn needs a DurableWorker running in this process")
    return await _worker._drive(session_id, turn_id, input)
