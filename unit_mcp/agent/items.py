"""The canonical shapes of an agent session: a persisted stream of items, never lossy chat text.

Items mirror what providers exchange (messages, tool calls, tool results) plus what the runner wants kept
(events, errors). Chat-style views are projections of the stream (see `projections.py`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

Role = Literal["user", "assistant", "system"]
SessionStatus = Literal["idle", "running"]
SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


class Usage(BaseModel):
    """Token counts as the provider reported them."""

    input_tokens: int = 0
    output_tokens: int = 0


class _ItemBase(BaseModel):
    """Fields every item has; `id` and `created_at` are assigned by the store when the item is appended."""

    model_config = ConfigDict(extra="ignore")

    id: str = ""
    parent_id: str | None = None
    turn_id: str | None = None
    created_at: float = 0.0


class MessageItem(_ItemBase):
    """A chat message. `partial` is true while a provider is still streaming it; `kind` marks e.g. steering."""

    type: Literal["message"] = "message"
    role: Role
    content: str = ""
    kind: str | None = None
    partial: bool = False
    provider: str | None = None
    model: str | None = None
    usage: Usage | None = None


class ToolCallItem(_ItemBase):
    """A tool call the model made; `arguments` is the JSON text exactly as the model wrote it."""

    type: Literal["tool-call"] = "tool-call"
    name: str
    arguments: str = "{}"
    call_id: str
    risk: str | None = None
    source: str | None = None
    provider: str | None = None


class ToolResultItem(_ItemBase):
    """The result that closes a tool call. `synthetic` marks results the runner wrote for a call that never returned."""

    type: Literal["tool-result"] = "tool-result"
    name: str
    output: str = ""
    call_id: str
    is_error: bool = False
    structured: dict[str, Any] | None = None
    synthetic: bool = False


class EventItem(_ItemBase):
    """A structured provider or workflow event worth keeping: turn lifecycle, approvals, delegation."""

    type: Literal["event"] = "event"
    kind: str
    data: dict[str, Any] = Field(default_factory=dict)


class ErrorItem(_ItemBase):
    """Why a turn failed, in words a user can act on; `code` is the error class for programs."""

    type: Literal["error"] = "error"
    message: str
    code: str | None = None


Item = Annotated[MessageItem | ToolCallItem | ToolResultItem | EventItem | ErrorItem, Field(discriminator="type")]
ITEM = TypeAdapter[Item](Item)


class _SessionHead(BaseModel):
    id: str
    agent_id: str
    title: str | None = None
    status: SessionStatus = "idle"
    parent_id: str | None = None
    created_at: float
    updated_at: float


class SessionMeta(_SessionHead):
    """What `SessionStore.list()` returns: enough to show a session browser without reading any history."""

    item_count: int = 0


class Session(_SessionHead):
    """One session as a single JSON document: metadata, agent-owned `data` and the item stream."""

    data: dict[str, Any] = Field(default_factory=dict)
    items: list[Item] = Field(default_factory=list)

    def meta(self) -> SessionMeta:
        head = {name: getattr(self, name) for name in _SessionHead.model_fields}
        return SessionMeta(**head, item_count=len(self.items))

    def item(self, item_id: str) -> Item | None:
        """The item with that id (a linear scan: the store keeps its own index for O(1) updates)."""
        return next((item for item in self.items if item.id == item_id), None)

    def open_tool_calls(self) -> list[ToolCallItem]:
        """Tool calls without a result: what a dead turn leaves behind."""
        closed = {item.call_id for item in self.items if isinstance(item, ToolResultItem)}
        return [item for item in self.items if isinstance(item, ToolCallItem) and item.call_id not in closed]
