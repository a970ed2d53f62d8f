"""EventRecorder: Codex's JSONL events turned into session items the moment each one completes.

An MCP tool call is recorded when Codex starts it (so a turn cancelled mid-tool has the call on disk, and
the turn closes it with a synthetic result) and its result when Codex completes it; an assistant message
when Codex completes it; a non-fatal `error` item, a top-level `error`, a reasoning item or an event this
version does not know as an `event` item, so nothing Codex reported is lost. The outcome of the run (its
usage, the message of `turn.failed`, the errors) is kept for the agent, which ends the turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._recorder import TurnRecorder
from ..items import EventItem, MessageItem
from ..toolsurface import ToolOutput
from ._output import CodexEvent, CodexUsage, McpToolCall

if TYPE_CHECKING:
    from .._context import TurnContext

PROVIDER = "codex"
_LINE_WIDTH = 2000


class EventRecorder:
    def __init__(self, ctx: TurnContext, *, model: str) -> None:
        self.ctx = ctx
        self.model = model
        self.thread_id: str | None = None
        self.usage: CodexUsage | None = None
        self.failure: str | None = None
        self.errors: list[str] = []
        self.message: MessageItem | None = None
        self.recorder = TurnRecorder(ctx.turn, ctx.tools, provider=PROVIDER)

    async def record(self, event: CodexEvent | str) -> None:
        if isinstance(event, str):
            await self._event("codex-output", {"line": event[:_LINE_WIDTH]})
            return
        kind = event.type
        if kind == "thread.started":
            self.thread_id = str(event.data.get("thread_id") or "") or None
            await self._event("codex-thread-started", {"thread_id": self.thread_id})
        elif kind in ("turn.started", "item.updated"):
            return
        elif kind == "item.started":
            if event.item_type == "mcp_tool_call":
                await self._open(McpToolCall.model_validate(event.item))
        elif kind == "item.completed":
            await self._completed(event)
        elif kind == "turn.completed":
            self.usage = CodexUsage.model_validate(event.data.get("usage") or {})
        elif kind == "turn.failed":
            self.failure = event.message or "turn.failed without a message"
        elif kind == "error":
            self.errors.append(event.message or "an error without a message")
            await self._event("codex-error", {"message": self.errors[-1]})
        else:
            await self._event("codex-event", event.data)

    async def _completed(self, event: CodexEvent) -> None:
        item = event.item
        kind = event.item_type
        if kind == "mcp_tool_call":
            call = McpToolCall.model_validate(item)
            await self._open(call)
            structured = call.result.structured_content if call.result is not None else None
            output = ToolOutput(text=call.output_text(), is_error=call.failed, structured=structured)
            await self.recorder.close_call(self._call_id(call), output)
        elif kind == "agent_message":
            text = item.get("text")
            content = text if isinstance(text, str) else ""
            message = MessageItem(role="assistant", content=content, provider=PROVIDER, model=self.model)
            stored = await self.recorder.put_message(message, None)
            assert isinstance(stored, MessageItem)
            self.message = stored
        elif kind == "error":
            await self._event("codex-warning", {"message": item.get("message")})
        else:
            await self._event(f"codex-{kind or 'item'}", item)

    async def _open(self, call: McpToolCall) -> None:
        await self.recorder.open_call(self._call_id(call), call.tool, call.arguments_json(), source=call.server or None)

    def _call_id(self, call: McpToolCall) -> str:
        return f"{self.ctx.turn.id}-{call.id}"

    async def _event(self, kind: str, data: dict[str, Any]) -> None:
        await self.ctx.turn.append_item(EventItem(kind=kind, data=data))
