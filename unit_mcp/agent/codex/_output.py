"""The JSONL events `codex exec --json` prints, read loosely: a type and its data, typed where it matters.

The CLI prints one JSON object a line: `thread.started`, `turn.started`, `item.started`/`item.updated`/
`item.completed` (items such as `mcp_tool_call`, `agent_message`, `error`, `reasoning`), `turn.completed`
with the usage, `turn.failed` with the error, and a top-level `error`. Only what the agent records is
typed (tool calls and usage); anything else is kept as plain data, so an event a newer CLI adds is
recorded, not dropped or fatal.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class CodexEvent:
    type: str
    data: dict[str, Any]

    @property
    def item(self) -> dict[str, Any]:
        item = self.data.get("item")
        return item if isinstance(item, dict) else {}

    @property
    def item_type(self) -> str | None:
        value = self.item.get("type")
        return value if isinstance(value, str) else None

    @property
    def message(self) -> str:
        """The error message of a `turn.failed` or `error` event (empty for others)."""
        error = self.data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        message = self.data.get("message")
        return message if isinstance(message, str) else ""


def parse_line(line: str) -> CodexEvent | None:
    """One stdout line as an event; None for a line that is not a JSON object with a string `type`."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        return None
    return CodexEvent(data["type"], data)


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class McpResult(_Loose):
    content: list[dict[str, Any]] = Field(default_factory=list)
    structured_content: dict[str, Any] | None = None


class McpError(_Loose):
    message: str = ""


class McpToolCall(_Loose):
    """An `mcp_tool_call` item: `status` is `in_progress`, `completed` or `failed`."""

    id: str
    server: str = ""
    tool: str = ""
    arguments: Any = None
    result: McpResult | None = None
    error: McpError | None = None
    status: str = "in_progress"

    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments if self.arguments is not None else {}, ensure_ascii=False)

    def output_text(self) -> str:
        """What the tool gave back, as the session keeps it: the text blocks (others named by type), else
        the structured content as JSON, else the error message."""
        if self.result is not None:
            parts = [
                block["text"]
                if block.get("type") == "text" and isinstance(block.get("text"), str)
                else f"[{block.get('type', 'unknown')} content]"
                for block in self.result.content
            ]
            if parts:
                return "\n".join(parts)
            if self.result.structured_content is not None:
                return json.dumps(self.result.structured_content, ensure_ascii=False)
        if self.error is not None:
            return self.error.message
        return ""

    @property
    def failed(self) -> bool:
        return self.status == "failed" or self.error is not None


class CodexUsage(_Loose):
    """`turn.completed` usage, summed over the turn's model requests."""

    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    reasoning_output_tokens: int = 0
