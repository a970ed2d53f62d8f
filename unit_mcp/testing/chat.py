"""The chat-completions face of the scripted model (`POST /v1/chat/completions`): a JSON completion, or SSE
chunks (text in deltas, tool calls by index, a finish reason, a usage chunk when asked for, then `[DONE]`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .script import Mark, Reply


@dataclass
class CompletionAnswer(Reply):
    """One scripted answer in chat-completions terms."""

    completion_id: str
    created: int
    stream_usage: bool
    """Whether a stream ends with a usage chunk (`stream_options.include_usage`)."""

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else "stop"

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.text or None}
        if self.calls:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in self.calls
            ]
        return {
            **self._head("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
            "usage": self.usage,
        }

    def stream(self, chunk_size: int) -> Iterator[str | Mark]:
        """The role, text pieces, per tool call its head and argument pieces, the finish, the usage, `[DONE]`."""
        yield self._chunk({"role": "assistant", "content": ""})
        for start in range(0, len(self.text), chunk_size):
            yield Mark.PAUSE
            yield self._chunk({"content": self.text[start : start + chunk_size]})
        for position, call in enumerate(self.calls):
            head = {"index": position, "id": call["id"], "type": "function"}
            yield self._chunk({"tool_calls": [{**head, "function": {"name": call["name"], "arguments": ""}}]})
            arguments = call["arguments"]
            for start in range(0, len(arguments), chunk_size * 4):
                yield Mark.PAUSE
                piece = {"arguments": arguments[start : start + chunk_size * 4]}
                yield self._chunk({"tool_calls": [{"index": position, "function": piece}]})
        yield Mark.CUT
        yield self._chunk({}, self.finish_reason)
        if self.stream_usage:
            yield _sse({**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage})
        yield "data: [DONE]\n\n"

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.completion_id, "object": kind, "created": self.created, "model": self.model}

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return _sse({**self._head("chat.completion.chunk"), "choices": [choice]})


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"
