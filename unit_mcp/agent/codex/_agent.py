"""CodexAgent: an agent whose model and tool loop run inside the real Codex CLI (`codex exec --json`).

Each turn is one Codex run in a fresh `CodexHome` whose only MCP server is the approval-filtered endpoint;
Codex's JSONL events become session items as they arrive. The turn ends as Codex reports it; a cancel or a
timeout interrupts Codex, records what it still completed and closes any open call with a synthetic result.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import mcp_types as types

from ... import tracing
from .._endpoint import ApprovedEndpoint
from .._recorder import drive
from ..items import EventItem, Session, Usage
from ..prompts import PERSONA, system_prompt
from ..toolsurface import ToolOutput
from ._config import CodexModel, McpServer
from ._history import codex_prompt
from ._home import CodexHome
from ._output_items import EventRecorder
from ._process import CodexProcess, find_codex

if TYPE_CHECKING:
    from .._context import TurnContext
    from .._registry import AgentRegistry

EXEC_ARGS = ("exec", "--json", "--skip-git-repo-check", "--ephemeral")
SERVER_NAME = "unit-agent"


@dataclass
class TurnView:
    """One turn's tools: a call of an askable one waits for the approver through the turn (items, grants)."""

    ctx: TurnContext

    def tool_defs(self) -> list[types.Tool]:
        return self.ctx.tools.mcp_tool_defs(self.ctx.approvals.grants(), interactive=True)

    async def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        return await self.ctx.tools.call(name, arguments, self.ctx)


class CodexAgent:
    def __init__(
        self,
        *,
        model: CodexModel,
        binary: str | os.PathLike[str] | None = None,
        endpoint: ApprovedEndpoint[Any] | None = None,
        id: str = "codex",
        name: str = "Codex agent",
        instructions: str = PERSONA,
        server_name: str = SERVER_NAME,
        workspace: str | os.PathLike[str] | None = None,
        turn_timeout: float = 300.0,
        interrupt_timeout: float = 5.0,
        tool_timeout: float = 300.0,
        history_limit: int = 20_000,
        strict_config: bool = True,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`model` is this agent's own choice, never the runner's. Without an `endpoint` each turn serves
        its own, over the runner's tool surface with the session's grants; `workspace` is where each run's
        private home is made (and removed). `strict_config` makes Codex refuse a config key it does not
        know, so a Codex other than the pinned one fails loudly instead of ignoring a safety setting."""
        self.model = model
        self.binary = find_codex(binary)
        self.endpoint = endpoint
        self.id = id
        self.name = name
        self.instructions = instructions
        self.server_name = endpoint.server_name if endpoint is not None else server_name
        self.workspace = Path(workspace) if workspace is not None else None
        self.turn_timeout = turn_timeout
        self.interrupt_timeout = interrupt_timeout
        self.tool_timeout = tool_timeout
        self.history_limit = history_limit
        self.args = [*EXEC_ARGS, *(["--strict-config"] if strict_config else []), *extra_args, "-"]
        self.extra_env = dict(env or {})

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
        home = await anyio.to_thread.run_sync(lambda: CodexHome(parent=self.workspace))
        try:
            async with self._endpoint(ctx, home) as endpoint:
                assert endpoint.url is not None
                server = McpServer(
                    name=self.server_name, url=endpoint.url, token=endpoint.token, tool_timeout=self.tool_timeout
                )
                instructions = await system_prompt(ctx, self.instructions)
                await anyio.to_thread.run_sync(lambda: home.write(self.model, server, instructions=instructions))
                process = CodexProcess(
                    self.binary,
                    self.args,
                    prompt=codex_prompt(session.items, ctx.turn.id, input, limit=self.history_limit),
                    env=home.env(self.model, server, self.extra_env),
                    cwd=home.workdir,
                    interrupt_timeout=self.interrupt_timeout,
                )
                recorder = EventRecorder(ctx, model=self.model.name)
                timed_out = await self._drive(process, recorder, ctx)
        finally:
            await anyio.to_thread.run_sync(home.cleanup)
        await self._end(process, recorder, ctx, timed_out=timed_out)

    async def _drive(self, process: CodexProcess, recorder: EventRecorder, ctx: TurnContext) -> bool:
        """Run Codex to its end, recording as it goes; True if it was stopped for taking too long."""

        async def follow() -> int:
            async for event in process.events():
                await recorder.record(event)
            return await process.wait()

        async def settle() -> None:
            """After an interrupt: stop the process (bounded) and record what it still printed."""
            await process.stop()
            with anyio.move_on_after(self.interrupt_timeout):
                async for event in process.events():
                    await recorder.record(event)

        async with process:
            code = await drive(
                recorder.recorder, follow, cancel=process.interrupt, settle=settle, timeout=self.turn_timeout
            )
        return code is None

    async def _end(self, process: CodexProcess, recorder: EventRecorder, ctx: TurnContext, *, timed_out: bool) -> None:
        code = process.returncode
        if timed_out:
            await ctx.turn.fail(
                f"Codex did not finish the turn within {self.turn_timeout:g} s and was stopped", code="codex_timeout"
            )
            return
        if recorder.failure is not None:
            await ctx.turn.fail(f"Codex failed the turn: {recorder.failure}", code="codex_turn_failed")
            return
        if code != 0:
            reason = recorder.errors[-1] if recorder.errors else self._stderr(process)
            await ctx.turn.fail(f"Codex exited with status {code}: {reason}", code="codex_exit")
            return
        if recorder.usage is None:
            reason = recorder.errors[-1] if recorder.errors else "no turn.completed event"
            await ctx.turn.fail(f"Codex exited without completing the turn: {reason}", code="codex_incomplete")
            return
        usage = recorder.usage
        tracing.set_attributes(tracing.current(), unit_mcp__codex__thread_id=recorder.thread_id)
        await ctx.turn.append_item(
            EventItem(kind="codex-turn-completed", data={"thread_id": recorder.thread_id, "usage": usage.model_dump()})
        )
        message = recorder.message
        if message is not None:
            totals = Usage(input_tokens=usage.input_tokens, output_tokens=usage.output_tokens)
            await ctx.turn.update_item(message.id, usage=totals)
        await ctx.turn.finish(message.content if message is not None else "")

    @staticmethod
    def _stderr(process: CodexProcess) -> str:
        """Codex's own last `Error:` line when it printed one (why it gave up), else its last lines."""
        lines = process.stderr_tail().splitlines()
        errors = [line for line in lines if line.startswith("Error:")]
        text = errors[-1] if errors else "\n".join(lines[-5:])
        return text[:2000] or "nothing on stderr"

    @asynccontextmanager
    async def _endpoint(self, ctx: TurnContext, home: CodexHome) -> AsyncIterator[ApprovedEndpoint[Any]]:
        """The agent's endpoint, or one for this turn: the runner's tools as the policy, the session's grants
        and the approver allow them."""
        if self.endpoint is not None:
            yield self.endpoint
            return
        root = home.root / "endpoint"
        endpoint = ApprovedEndpoint(ctx.tools, view=TurnView(ctx), server_name=self.server_name, config_root=root)
        over = anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                try:
                    await tg.start(self._serve, endpoint, over)
                    yield endpoint
                finally:
                    over.set()
        finally:
            endpoint.close()

    async def _serve(
        self, endpoint: ApprovedEndpoint[Any], over: anyio.Event, *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        """Serve the turn's endpoint shielded from the turn's cancellation: while Codex is being interrupted
        it cancels its tool call through this endpoint, which must still be there to pass the cancel on."""
        with anyio.CancelScope(shield=True):
            async with endpoint:
                task_status.started()
                await over.wait()


def register(
    registry: AgentRegistry, *, model: CodexModel, id: str = "codex", name: str = "Codex agent", **options: Any
) -> None:
    """Register a Codex-backed agent under `id`, built on first use with its own `model` and `options`."""
    registry.register(id, lambda deps: CodexAgent(model=model, id=id, name=name, **options), name=name)
