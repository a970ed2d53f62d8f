"""The Anthropic Messages face of the scripted model (`POST /v1/messages`, what Claude Code speaks).

A request is read as a chat-completions body (`chat_view`), so one script, its matches and templates answer
Claude Code too; the answer goes out as a Messages object or its SSE events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .script import Mark, Reply


def _text(content: Any) -> str:
    """The text of a Messages content value: a string, or the text of its `text` blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            block["text"] for block in content if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    return ""


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`system` plus `messages` as chat-completion messages."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role", "user"))
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": _text(content)}]
        text = "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")
        if role == "assistant":
            calls = [
                {
                    "id": str(block.get("id", "")),
                    "type": "function",
                    "function": {"name": str(block.get("name", "")), "arguments": json.dumps(block.get("input") or {})},
                }
                for block in blocks
                if isinstance(block, dict) and block.get("type") == "tool_use"
            ]
            messages.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            continue
        results = [b for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"]
        if text or not results:
            messages.append({"role": role, "content": text})
        for block in results:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(block.get("tool_use_id", "")),
                    "content": _text(block.get("content")),
                    "is_error": bool(block.get("is_error")),
                }
            )
    return messages


def offered(body: Mapping[str, Any]) -> list[str]:
    return [str(tool["name"]) for tool in body.get("tools") or [] if isinstance(tool, dict) and "name" in tool]


@dataclass
class MessageAnswer(Reply):
    """One scripted answer in Messages terms."""

    message_id: str

    @property
    def stop_reason(self) -> str:
        return "tool_use" if self.calls else "end_turn"

    def blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": self.text}] if self.text else []
        for call in self.calls:
            blocks.append(
                {"type": "tool_use", "id": call["id"], "name": call["name"], "input": json.loads(call["arguments"])}
            )
        return blocks

    def _usage(self) -> dict[str, int]:
        return {"input_tokens": self.usage["prompt_tokens"], "output_tokens": self.usage["completion_tokens"]}

    def body(self) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.blocks(),
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": self._usage(),
        }

    def stream(self, chunk_size: int) -> Iterator[str | Mark]:
        """`message_start`, per block its start, deltas and stop, then `message_delta` and `message_stop`."""
        started = {**self.body(), "content": [], "stop_reason": None}
        started["usage"] = {"input_tokens": self.usage["prompt_tokens"], "output_tokens": 1}
        yield sse({"type": "message_start", "message": started})
        for index, block in enumerate(self.blocks()):
            if block["type"] == "text":
                yield sse(
                    {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
                )
                text = block["text"]
                for start in range(0, len(text), chunk_size):
                    yield Mark.PAUSE
                    delta = {"type": "text_delta", "text": text[start : start + chunk_size]}
                    yield sse({"type": "content_block_delta", "index": index, "delta": delta})
            else:
                yield sse({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
                arguments = json.dumps(block["input"])
                for start in range(0, len(arguments), chunk_size * 4):
                    yield Mark.PAUSE
                    delta = {"type": "input_json_delta", "partial_json": arguments[start : start + chunk_size * 4]}
                    yield sse({"type": "content_block_delta", "index": index, "delta": delta})
            yield Mark.CUT
            yield sse({"type": "content_block_stop", "index": index})
        delta = {"stop_reason": self.stop_reason, "stop_sequence": None}
        usage = {"output_tokens": self.usage["completion_tokens"]}
        yield sse({"type": "message_delta", "delta": delta, "usage": usage})
        yield sse({"type": "message_stop"})


def sse(event: Mapping[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def error(message: str, kind: str) -> dict[str, Any]:
    """An error body in Messages terms."""
    return {"type": "error", "error": {"type": kind, "message": message}}
