"""The Gemini face of the scripted model (`:streamGenerateContent` and `:generateContent`, what Gemini CLI speaks;
`:countTokens` is answered with an estimate).

A request is read as a chat-completions body (`chat_view`), calls without an id matched to their responses by
name, so one script answers Gemini CLI too; the answer goes out as `GenerateContentResponse` objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .script import Mark, Reply

_UNTRUSTED = re.compile(r"\A<untrusted_context>\n?(.*?)\n?</untrusted_context>\Z", re.DOTALL)


def _result_text(response: Any) -> tuple[str, bool]:
    """A function response's text as the tool gave it: without the `<untrusted_context>` wrapper Gemini CLI
    puts around an MCP tool's output (so `{{tool:NAME}}` sees the same text whichever client ran the tool)."""
    if isinstance(response, dict):
        for key, is_error in (("output", False), ("error", True), ("content", False)):
            value = response.get(key)
            if isinstance(value, str):
                match = _UNTRUSTED.match(value)
                return (match.group(1) if match else value), is_error
            if value is not None:
                return json.dumps(value), is_error
    return json.dumps(response), False


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    system = body.get("systemInstruction") or body.get("system_instruction")
    if isinstance(system, dict):
        text = "".join(str(p.get("text", "")) for p in system.get("parts") or [] if isinstance(p, dict))
        if text:
            messages.append({"role": "system", "content": text})
    elif isinstance(system, str) and system:
        messages.append({"role": "system", "content": system})
    for content in body.get("contents") or []:
        if not isinstance(content, dict):
            continue
        parts = [p for p in content.get("parts") or [] if isinstance(p, dict)]
        text = "".join(str(p["text"]) for p in parts if isinstance(p.get("text"), str) and not p.get("thought"))
        if content.get("role") == "model":
            calls = [
                {
                    "id": str(p["functionCall"].get("id") or p["functionCall"].get("name", "")),
                    "type": "function",
                    "function": {
                        "name": str(p["functionCall"].get("name", "")),
                        "arguments": json.dumps(p["functionCall"].get("args") or {}),
                    },
                }
                for p in parts
                if isinstance(p.get("functionCall"), dict)
            ]
            messages.append({"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})})
            continue
        responses = [p["functionResponse"] for p in parts if isinstance(p.get("functionResponse"), dict)]
        if text or not responses:
            messages.append({"role": "user", "content": text})
        for response in responses:
            result, is_error = _result_text(response.get("response"))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": str(response.get("id") or response.get("name", "")),
                    "name": str(response.get("name", "")),
                    "content": result,
                    "is_error": is_error,
                }
            )
    return messages


def offered(body: Mapping[str, Any]) -> list[str]:
    names: list[str] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            declarations = tool.get("functionDeclarations") or tool.get("function_declarations") or []
            names += [str(d["name"]) for d in declarations if isinstance(d, dict) and "name" in d]
    return names


def model_of(path: str) -> str:
    """`/v1beta/models/gemini-2.5-flash:streamGenerateContent` → `gemini-2.5-flash`."""
    return path.rsplit("/", 1)[-1].split(":", 1)[0]


@dataclass
class ContentAnswer(Reply):
    """One scripted answer in Gemini terms."""

    def _usage(self) -> dict[str, int]:
        prompt, completion = self.usage["prompt_tokens"], self.usage["completion_tokens"]
        return {"promptTokenCount": prompt, "candidatesTokenCount": completion, "totalTokenCount": prompt + completion}

    def _chunk(self, parts: list[dict[str, Any]], *, last: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        chunk: dict[str, Any] = {"candidates": [candidate], "modelVersion": self.model}
        if last:
            candidate["finishReason"] = "STOP"
            chunk["usageMetadata"] = self._usage()
        return chunk

    def _call_parts(self) -> list[dict[str, Any]]:
        return [
            {"functionCall": {"id": call["id"], "name": call["name"], "args": json.loads(call["arguments"])}}
            for call in self.calls
        ]

    def body(self) -> dict[str, Any]:
        parts = ([{"text": self.text}] if self.text else []) + self._call_parts()
        return self._chunk(parts or [{"text": ""}], last=True)

    def stream(self, chunk_size: int) -> Iterator[str | Mark]:
        """Text pieces, then the calls and the finish (the last chunk carries both)."""
        pieces = [self.text[i : i + chunk_size] for i in range(0, len(self.text), chunk_size)]
        final = pieces.pop() if pieces and not self.calls else None
        for piece in pieces:
            yield Mark.PAUSE
            yield sse(self._chunk([{"text": piece}], last=False))
        if final is not None:
            yield Mark.PAUSE
        parts = [{"text": final}] if final is not None else self._call_parts() or [{"text": ""}]
        yield Mark.CUT
        yield sse(self._chunk(parts, last=True))


def sse(chunk: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def error(message: str, status: int, kind: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": kind.upper()}}
