"""EventRecorder: Codex's JSONL events turned into session items the moment each one completes.

An MCP tool call is recorded when Codex starts it (so a turn cancelled mid-tool has the call on disk, and
the turn closes it with a synthetic result) and its result when Codex completes it; an assistant message
when Codex completes it; a non-fatal `error` item, a top-level `error`, a reasoning item or an event this
version does not know as an `event` item, so nothing Codex reported is lost. The outcome of the run (its
usage, the message of `turn.failed`, the errors) is kept for the agent, which ends the turn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..items import EventItem, MessageItem, ToolCallItem, ToolResultItem
from .events import CodexEvent, CodexUsage, McpToolCall

if TYPE_CHECKING:
    from ..context import TurnContext

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
        self._calls: dict[str, str] = {}  # Codex item id -> the session's call id
        self._closed: set[str] = set()

    @property
    def completed(self) -> bool:
        return self.usage is not None and self.failure is None

    @property
    def open_calls(self) -> list[str]:
        return [call_id for item_id, call_id in self._calls.items() if item_id not in self._closed]

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
            await self._close(call)
        elif kind == "agent_message":
            text = item.get("text")
            stored = await self.ctx.turn.append_item(
                MessageItem(
                    role="assistant", content=text if isinstance(text, str) else "", provider=PROVIDER, model=self.model
                )
            )
            assert isinstance(stored, MessageItem)
            self.message = stored
        elif kind == "error":
            await self._event("codex-warning", {"message": item.get("message")})
        else:
            await self._event(f"codex-{kind or 'item'}", item)

    async def _open(self, call: McpToolCall) -> None:
        if call.id in self._calls:
            return
        call_id = f"{self.ctx.turn.id}-{call.id}"
        self._calls[call.id] = call_id
        known = self.ctx.tools.get(call.tool)
        await self.ctx.turn.append_item(
            ToolCallItem(
                name=call.tool,
                arguments=call.arguments_json(),
                call_id=call_id,
                risk=known.risk if known is not None else None,
                source=call.server or None,
                provider=PROVIDER,
            )
        )

    async def _close(self, call: McpToolCall) -> None:
        if call.id in self._closed:
            return
        self._closed.add(call.id)
        structured = call.result.structured_content if call.result is not None else None
        await self.ctx.turn.append_item(
            ToolResultItem(
                name=call.tool,
                call_id=self._calls[call.id],
                output=call.output_text(),
                is_error=call.failed,
                structured=structured,
            )
        )

    async def _event(self, kind: str, data: dict[str, Any]) -> None:
        await self.ctx.turn.append_item(EventItem(kind=kind, data=data))
