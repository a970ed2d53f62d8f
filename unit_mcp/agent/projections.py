"""Views derived from the item stream: OpenAI-style chat messages for a model, and messages for display.

The stream is canonical; these functions never change it. Tool results are looked up by call id, so a
result recorded late (a parallel call, a repair on load) still lands right after its call, which is the
order chat-completion APIs require.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .items import ErrorItem, EventItem, Item, MessageItem, ToolCallItem, ToolResultItem
from .toolnames import openai_tool_name

MISSING_RESULT = "[missing] No result was recorded for this tool call."


def _call(call: ToolCallItem) -> dict[str, Any]:
    return {
        "id": call.call_id,
        "type": "function",
        "function": {"name": openai_tool_name(call.name), "arguments": call.arguments},
    }


def chat_messages(items: Sequence[Item], system: str | None = None) -> list[dict[str, Any]]:
    """The session as chat-completion messages: each assistant message with its tool calls, then their results."""
    results = {item.call_id: item for item in items if isinstance(item, ToolResultItem)}
    assistant_ids = {item.id for item in items if isinstance(item, MessageItem) and item.role == "assistant"}
    calls_of: dict[str, list[ToolCallItem]] = {}
    for item in items:
        if isinstance(item, ToolCallItem) and item.parent_id in assistant_ids:
            calls_of.setdefault(item.parent_id or "", []).append(item)

    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    loose: list[ToolCallItem] = []

    def emit(content: str | None, calls: list[ToolCallItem]) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [_call(call) for call in calls]
        messages.append(message)
        for call in calls:
            result = results.get(call.call_id)
            messages.append(
                {"role": "tool", "tool_call_id": call.call_id, "content": result.output if result else MISSING_RESULT}
            )

    for item in items:
        if isinstance(item, ToolCallItem) and item.parent_id not in assistant_ids:
            loose.append(item)  # calls recorded without an assistant message (e.g. audited from a provider)
            continue
        if loose:
            emit(None, loose)
            loose = []
        if isinstance(item, MessageItem):
            if item.role == "assistant":
                calls = calls_of.get(item.id, [])
                if item.content or calls:
                    emit(item.content, calls)
            else:
                messages.append({"role": item.role, "content": item.content})
    if loose:
        emit(None, loose)
    return messages


class DisplayMessage(BaseModel):
    item_id: str
    role: str
    content: str
    partial: bool = False
    tool_calls: list[str] = []


def display_messages(items: Sequence[Item]) -> list[DisplayMessage]:
    """User and assistant messages with text, each assistant message listing the tools it called."""
    calls_of: dict[str, list[str]] = {}
    for item in items:
        if isinstance(item, ToolCallItem) and item.parent_id:
            calls_of.setdefault(item.parent_id, []).append(item.name)
    return [
        DisplayMessage(
            item_id=item.id,
            role=item.role,
            content=item.content,
            partial=item.partial,
            tool_calls=calls_of.get(item.id, []),
        )
        for item in items
        if isinstance(item, MessageItem) and (item.content or calls_of.get(item.id))
    ]


def transcript_line(item: Item, width: int = 200) -> str:
    """One line per item for terminals and logs."""

    def clip(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= width else text[: width - 1] + "…"

    if isinstance(item, MessageItem):
        tag = f"{item.role}" + (f" ({item.kind})" if item.kind else "")
        return f"{tag}: {clip(item.content)}"
    if isinstance(item, ToolCallItem):
        return f"→ {item.name} {clip(item.arguments)}"
    if isinstance(item, ToolResultItem):
        return f"{'✗' if item.is_error else '←'} {item.name}: {clip(item.output)}"
    if isinstance(item, ErrorItem):
        return f"! {clip(item.message)}"
    if isinstance(item, EventItem):
        return f"· {item.kind} {clip(json.dumps(item.data, ensure_ascii=False))}"
    return str(item)
