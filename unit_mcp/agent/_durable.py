"""Durable turns (`unit-mcp[durable]`): a step-loop turn is a DBOS workflow, so it survives the death of its worker.

Each model request and each tool call is a DBOS step: a completed step never runs again, one its worker died in
runs again (tools must be replay-safe). The workflow writes the turn's items in a deterministic order, so a
recovered turn takes the items it finds in the session store in that order instead of writing them again: every
item once. The session store stays the journal; DBOS's system database (SQLite in the data folder by default)
holds execution state. A worker recovers, at launch, the pending turns of its executor id.

A durable turn runs its tools one at a time, without streaming, steering, compaction or the step hooks (the
request and tool hooks run); an approval wait is not durable yet.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import anyio

try:
    from dbos import DBOS, DBOSConfig, SetWorkflowID, WorkflowHandleAsync
except ImportError as exc:  # pragma: no cover - the test extra installs it
    raise ImportError("durable turns need DBOS: pip install 'unit-mcp[durable]'") from exc

from ._context import TurnContext
from ._inbox import Inbox
from ._loop import LoopAgent
from ._paused import DURABLE
from ._recorder import TurnRecorder
from ._registry import AgentRegistry
from ._turnapprovals import TurnApprovals
from .approvals import AgentApprovals
from .errors import AgentError, StepLimitReached
from .hooks import ModelResponse
from .items import EventItem, Item, MessageItem, ToolCallItem, ToolResultItem
from .sessions import SessionStore
from .toolsurface import AgentToolSurface, ToolOutput
from .turns import Turn, TurnHandle, TurnStatus, describe

T = TypeVar("T")

_worker: DurableWorker | None = None


class _ReplayedTurn(Turn):
    """A turn that takes, in order, the items it wrote before its worker died instead of writing them again."""

    def __init__(self, *, replay: list[Item], **options: Any) -> None:
        super().__init__(**options)
        self._replay = replay

    async def append(self, item: Item, *, closing: bool = False, status: Any = None) -> Item:
        if not self._replay:
            return await super().append(item, closing=closing, status=status)
        stored = self._replay.pop(0)
        if type(stored) is not type(item):
            raise AgentError(f"turn {self.id} replayed differently from what it recorded (at item {stored.id})")
        if isinstance(stored, ToolCallItem):
            self._open_calls[stored.call_id] = stored
        elif isinstance(stored, ToolResultItem):
            self._open_calls.pop(stored.call_id, None)
        self._last_item_id = stored.id
        return stored


async def _no_delegation(*_: object) -> TurnHandle:
    raise AgentError("a durable turn cannot delegate yet")


class DurableWorker:
    """A process that runs step-loop turns as DBOS workflows: `async with DurableWorker(...) as worker:`.

    Workers sharing `system_database_url` (default: SQLite in `data_dir`) share turns; one started with the
    `executor_id` of a dead one resumes its turns at launch. One worker per process (DBOS is process-global)."""

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
    ) -> None:
        self.store = store
        self.registry = registry
        self.tools = tools
        self.approvals = approvals or tools.approvals
        self.executor_id = executor_id
        self.system_database_url = system_database_url or f"sqlite:///{Path(data_dir).resolve() / 'dbos.sqlite'}"
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> DurableWorker:
        global _worker
        if _worker is not None:
            raise AgentError("a durable worker runs in this process already: one per process")
        self._loop = asyncio.get_running_loop()
        _worker = self
        config: DBOSConfig = {
            "name": "unit-mcp",
            "system_database_url": self.system_database_url,
            "executor_id": self.executor_id,
        }
        try:
            DBOS(config=config)
            await anyio.to_thread.run_sync(DBOS.launch)
        except BaseException:
            _worker = None
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        global _worker
        try:
            await anyio.to_thread.run_sync(lambda: DBOS.destroy(workflow_completion_timeout_sec=0))
        finally:
            _worker = None

    async def submit(self, session_id: str, input: str) -> str:
        """Start a durable turn of the session's agent on `input`; its id (also its workflow id)."""
        session = await anyio.to_thread.run_sync(self.store.require, session_id)
        self._agent(session.agent_id)
        turn_id = f"turn-{secrets.token_hex(6)}"
        with SetWorkflowID(turn_id):
            await DBOS.start_workflow_async(_durable_turn, session_id, turn_id, input)
        return turn_id

    async def wait(self, turn_id: str) -> str | None:
        """The turn's final answer once it ends (None if it failed: the session says why)."""
        handle: WorkflowHandleAsync[str | None] = await DBOS.retrieve_workflow_async(turn_id)
        result: str | None = await handle.get_result()
        return result

    def _agent(self, agent_id: str) -> LoopAgent:
        agent = self.registry.require(agent_id)
        if not isinstance(agent, LoopAgent):
            raise AgentError(f"agent {agent_id} is not a step-loop agent: only those run durable turns")
        if getattr(agent, "stream", False) or agent.compact_at is not None:
            raise AgentError(f"agent {agent_id} streams or compacts: give it stream=False, compact_at=None")
        return agent

    async def _drive(self, session_id: str, turn_id: str, input: str) -> str | None:
        session = await anyio.to_thread.run_sync(self.store.require, session_id)
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
            started = {"turn_id": turn_id, "agent_id": agent.id, DURABLE: True}
            await turn.append(EventItem(kind="turn-started", data=started), status="running")
            await turn.append(MessageItem(role="user", content=input))
            recorder = TurnRecorder(turn.controller, self.tools)
            for step in range(1, agent.max_steps + 1):
                response = await DBOS.run_step_async({"name": "model"}, self._on_main, _request, agent, ctx, step)
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
                    output: ToolOutput = await DBOS.run_step_async(
                        {"name": f"tool {call.name}"}, self._on_main, agent._execute, ctx, item
                    )
                    await recorder.close_call(call.id, output)
                if not response.tool_calls:
                    await turn.end(TurnStatus.COMPLETED, result=response.content)
                    return response.content
            raise StepLimitReached(f"no final answer after {agent.max_steps} model requests (max_steps)")
        except Exception as exc:
            await turn.end(TurnStatus.FAILED, error=describe(exc), code=type(exc).__name__)
            return None

    async def _on_main(self, fn: Callable[..., Coroutine[Any, Any, T]], *args: Any) -> T:
        """Run a step on the worker's own event loop (a recovered workflow runs on DBOS's): its clients live there."""
        assert self._loop is not None
        if asyncio.get_running_loop() is self._loop:
            return await fn(*args)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), self._loop))


async def _request(agent: LoopAgent, ctx: TurnContext, step: int) -> ModelResponse:
    async with agent.turn_scope(ctx):
        system = await agent.system_prompt(ctx)
        return await agent.request(await agent._prepare(ctx, system, step), ctx)


@DBOS.workflow(name="unit_mcp.durable_turn")
async def _durable_turn(session_id: str, turn_id: str, input: str) -> str | None:
    if _worker is None:
        raise AgentError("a durable turn needs a DurableWorker running in this process")
    return await _worker._drive(session_id, turn_id, input)
