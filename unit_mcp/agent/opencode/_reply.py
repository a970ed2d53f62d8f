"""ReplyRecorder: what a OpenCodeAgent turn records of OpenCode's reply, through the shared `TurnRecorder`.

While the node works it follows the event stream: assistant text is streamed into partial messages and each
tool call is recorded as it starts and its result as it ends. When the reply is complete the read-back,
which is authoritative, is recorded: every step's text takes the read-back's content in its partial item,
and any call the stream missed is recorded then. Each item is recorded at most once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from .._recorder import TurnRecorder
from ..items import MessageItem
from ..toolsurface import ToolOutput
from ._client import Sent
from ._event_stream import NodeEvent
from ._transcript import Reply, ToolPart, tool_part

if TYPE_CHECKING:
    from .._context import TurnContext

log = logging.getLogger("unit_mcp.agent.opencode.reply")

PROVIDER = "opencode"


@dataclass
class ReplyRecorder:
    """One turn's OpenCode side: its node session and sent prompt (shared with the cancel hook and the permission
    answerer), and what has been recorded of the reply."""

    ctx: TurnContext
    tool_name: Callable[[str], str]
    """OpenCode's tool name → the surface's."""
    node_session_id: str | None = None
    """The OpenCode session the prompt went to (not the runner's session)."""
    sent: Sent | None = None
    recorder: TurnRecorder = field(init=False)
    texts: set[str] = field(default_factory=set)
    """OpenCode message ids whose step text is recorded."""
    streamed: dict[str, dict[str, str]] = field(default_factory=dict)
    """OpenCode message id → its text parts (part id → text so far), in the order they appeared."""
    assistant: set[str] = field(default_factory=set)
    """The assistant messages of this reply (their parent is the turn's user message)."""
    followed: int = 0
    """The seq of the last node event the follower has handled."""
    following: bool = True
    """False once the follower has stopped (its stream closed, or it failed)."""

    def __post_init__(self) -> None:
        self.recorder = TurnRecorder(self.ctx.turn, self.ctx.tools, provider=PROVIDER)

    async def record(self, reply: Reply) -> None:
        """Every step's text and tool calls with their results, in order, each at most once. The last step's
        text is the final message, which the agent records."""
        for index, step in enumerate(reply.steps):
            last = index == len(reply.steps) - 1
            if step.text and not last and step.message_id not in self.texts:
                self.texts.add(step.message_id)
                message = MessageItem(
                    role="assistant", content=step.text, kind="step", provider=PROVIDER, model=reply.model
                )
                await self.recorder.put_message(message, step.message_id)
            for part in step.tools:
                await self._tool(part)

    async def _tool(self, part: ToolPart) -> None:
        """The call once it is known, its result once it has ended."""
        await self.recorder.open_call(part.call_id, self.tool_name(part.tool), part.arguments, source=PROVIDER)
        if part.finished:
            output = part.output if part.output is not None else part.error or ""
            await self.recorder.close_call(part.call_id, ToolOutput(text=output, is_error=part.status == "error"))

    async def follow(self, events: Any) -> None:
        """Stream this reply's assistant text into partial messages and record tool calls as they happen.

        Best effort (the read-back at the end is authoritative): events of other sessions and of earlier
        turns are skipped, and a failure here is logged, never fatal to the turn."""
        try:
            async for event in events:
                if isinstance(event, NodeEvent) and self.sent is not None and event.session_id == self.node_session_id:
                    # (nothing of this reply can be told apart before the prompt was sent)
                    with anyio.CancelScope(shield=True):  # an item is recorded whole, with its bookkeeping
                        await self._follow_event(event)
                if isinstance(event, NodeEvent):
                    self.followed = event.seq
        except Exception:
            log.warning("following OpenCode's events failed; the reply is recorded when it is complete", exc_info=True)
        finally:
            self.following = False

    async def _follow_event(self, event: NodeEvent) -> None:
        props = event.properties
        assert self.sent is not None
        if event.type == "message.updated":
            info = props.get("info")
            if isinstance(info, dict) and info.get("role") == "assistant":
                parent = str(info.get("parentID") or "")
                if self.sent.after_message_id is None or parent > self.sent.after_message_id:
                    self.assistant.add(str(info.get("id")))
        elif event.type == "message.part.delta":
            message_id, part_id = str(props.get("messageID")), str(props.get("partID"))
            parts = self.streamed.get(message_id)
            if parts is not None and part_id in parts and props.get("field") == "text":
                parts[part_id] += str(props.get("delta") or "")
                await self._stream(message_id)
        elif event.type == "message.part.updated":
            part = props.get("part")
            if not isinstance(part, dict) or str(part.get("messageID")) not in self.assistant:
                return
            if part.get("type") == "text":
                message_id = str(part.get("messageID"))
                self.streamed.setdefault(message_id, {})[str(part.get("id"))] = str(part.get("text") or "")
                await self._stream(message_id)
            elif part.get("type") == "tool":
                tool = tool_part(part)
                if tool.status != "pending":  # a pending call has no arguments yet
                    await self._tool(tool)

    async def _stream(self, message_id: str) -> None:
        text = "".join(self.streamed[message_id].values())
        if text:
            await self.recorder.stream(message_id, text)
