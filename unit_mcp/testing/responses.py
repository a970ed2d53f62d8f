"""The Responses API face of the scripted model (`POST /v1/responses`, what Codex speaks).

A request is read as a chat-completions body (`chat_view`; tools in a `namespace` by their bare names), so one
script answers Codex too; the answer goes out as a Responses object or its SSE events.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .script import Mark, Reply, ScriptedToolCall

_CODEX_FRAMING = re.compile(r"\AWall time: [0-9.]+ seconds\nOutput:\n?")


def _text(content: Any) -> str:
    """The text of a Responses content value: a string, or a list of `input_text`/`output_text` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _output_text(output: Any) -> str:
    """A function call's output as the tool gave it: a string, or the text of its content parts, without
    the `Wall time: … Output:` line Codex puts before an MCP tool's result (so `{{last}}` and
    `{{tool:NAME}}` see the same text whichever client ran the tool)."""
    return _CODEX_FRAMING.sub("", output if isinstance(output, str) else _text(output), count=1)


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`instructions` plus `input` as chat-completion messages (consecutive function calls form one message)."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": str(item.get("role", "user")), "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": str(item.get("call_id", "")),
                "type": "function",
                "function": {"name": str(item.get("name", "")), "arguments": str(item.get("arguments") or "{}")},
            }
            last = messages[-1] if messages else None
            if last is not None and last.get("role") == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _output_text(item.get("output"))
            messages.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": output})
    return messages


def offered(body: Mapping[str, Any]) -> dict[str, str | None]:
    """Every function tool offered, by bare name, with the namespace it was offered in (None at the top level)."""
    found: dict[str, str | None] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found.setdefault(inner["name"], str(tool.get("name", "")))
        elif tool.get("type") == "function" and isinstance(tool.get("name"), str):
            found.setdefault(tool["name"], None)
    return found


def namespace_of(call: ScriptedToolCall, body: Mapping[str, Any]) -> str | None:
    """The namespace a scripted call goes out in: the step's own, else the one the tool was offered in, else
    none (a tool the client never offered stays un-namespaced, as a model that invents a name would send it)."""
    if call.namespace is not None:
        return call.namespace
    return offered(body).get(call.name)


@dataclass
class ResponseAnswer(Reply):
    """One scripted answer in Responses terms."""

    response_id: str
    created_at: int

    def items(self) -> list[dict[str, Any]]:
        """The output items, complete: the message first (if any text), then the function calls in order."""
        items: list[dict[str, Any]] = []
        if self.text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{self.response_id}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": self.text, "annotations": []}],
                }
            )
        for position, call in enumerate(self.calls):
            item = {
                "type": "function_call",
                "id": f"fc_{self.response_id}_{position}",
                "status": "completed",
                "call_id": call["id"],
                "name": call["name"],
                "arguments": call["arguments"],
            }
            if call.get("namespace"):
                item["namespace"] = call["namespace"]
            items.append(item)
        return items

    def body(self, status: str = "completed") -> dict[str, Any]:
        done = status == "completed"
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.items() if done else [],
            "usage": self.responses_usage() if done else None,
        }

    def stream(self, chunk_size: int) -> Iterator[str | Mark]:
        """`created`, per output item `added`, its deltas and `done`, then `completed`."""
        yield sse({"type": "response.created", "response": self.body("in_progress")})
        for index, item in enumerate(self.items()):
            started = {**item, "status": "in_progress"}
            if item["type"] == "message":
                started["content"] = []
            else:
                started["arguments"] = ""
            yield sse({"type": "response.output_item.added", "output_index": index, "item": started})
            if item["type"] == "message":
                text = item["content"][0]["text"]
                part = {"item_id": item["id"], "output_index": index, "content_index": 0}
                yield sse({**part, "type": "response.content_part.added", "part": {"type": "output_text", "text": ""}})
                for start in range(0, len(text), chunk_size):
                    yield Mark.PAUSE
                    yield sse({**part, "type": "response.output_text.delta", "delta": text[start : start + chunk_size]})
                yield sse({**part, "type": "response.output_text.done", "text": text})
            else:
                arguments = item["arguments"]
                head = {"item_id": item["id"], "output_index": index}
                for start in range(0, len(arguments), chunk_size * 4):
                    yield Mark.PAUSE
                    delta = arguments[start : start + chunk_size * 4]
                    yield sse({**head, "type": "response.function_call_arguments.delta", "delta": delta})
                yield sse({**head, "type": "response.function_call_arguments.done", "arguments": arguments})
            yield Mark.CUT
            yield sse({"type": "response.output_item.done", "output_index": index, "item": item})
        yield sse({"type": "response.completed", "response": self.body()})

    def responses_usage(self) -> dict[str, Any]:
        prompt, completion = self.usage["prompt_tokens"], self.usage["completion_tokens"]
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }


def sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
