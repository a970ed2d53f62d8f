"""Reading one reply out of an OpenCode session's messages, without losing anything the agent must record.

`GET /session/:id/message` gives `{info, parts}` per message, oldest first, ids ascending. The reply to a
prompt is the first user message after the mark taken before sending, plus every assistant message whose
`parentID` is that user message (one per model step). Tool parts carry the tool, the call id, the input
and the state (`pending`, `running`, `completed` with output, `error`); the assistant `info` carries the
provider, the model, the tokens, the finish reason and any error (e.g. `MessageAbortedError`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field


class ToolPart(BaseModel):
    call_id: str
    tool: str
    status: str
    input: dict[str, Any] = Field(default_factory=dict)
    output: str | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "error")

    @property
    def arguments(self) -> str:
        return json.dumps(self.input, ensure_ascii=False)


class ReplyStep(BaseModel):
    """One assistant message: what the model said and which tools it ran in that step."""

    message_id: str
    text: str = ""
    tools: list[ToolPart] = Field(default_factory=list)
    finish: str | None = None
    completed: bool = False
    error: str | None = None


class Reply(BaseModel):
    user_message_id: str | None = None
    steps: list[ReplyStep] = Field(default_factory=list)
    provider_id: str | None = None
    model_id: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def started(self) -> bool:
        return self.user_message_id is not None

    @property
    def done(self) -> bool:
        """The last step is complete and the model did not ask for another one (or it failed)."""
        if not self.steps:
            return False
        last = self.steps[-1]
        return last.error is not None or (last.completed and last.finish != "tool-calls")

    @property
    def text(self) -> str:
        return self.steps[-1].text if self.steps else ""

    @property
    def error(self) -> str | None:
        return next((step.error for step in reversed(self.steps) if step.error), None)

    @property
    def model(self) -> str | None:
        return f"{self.provider_id}/{self.model_id}" if self.provider_id and self.model_id else None

    def tool_parts(self) -> list[ToolPart]:
        return [tool for step in self.steps for tool in step.tools]


def _error_text(error: Any) -> str | None:
    if not isinstance(error, dict):
        return None if error is None else str(error)
    message = _mapping(error.get("data")).get("message")
    name = error.get("name") or "Error"
    return f"{name}: {message}" if message else str(name)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def tool_part(part: dict[str, Any]) -> ToolPart:
    """A tool part as the node sends it (in a message, or in a `message.part.updated` event)."""
    state = _mapping(part.get("state"))
    raw_input = state.get("input")
    output = state.get("output")
    return ToolPart(
        call_id=str(part.get("callID") or part.get("id") or ""),
        tool=str(part.get("tool") or ""),
        status=str(state.get("status") or "pending"),
        input=raw_input if isinstance(raw_input, dict) else {},
        output=output if isinstance(output, str) else None if output is None else json.dumps(output),
        error=state.get("error") if isinstance(state.get("error"), str) else None,
    )


def read_reply(messages: Iterable[dict[str, Any]], *, after_message_id: str | None) -> Reply:
    """The reply to the first user message whose id sorts after `after_message_id` (None: the first)."""
    messages = [m for m in messages if isinstance(m, dict) and isinstance(m.get("info"), dict)]
    user = next(
        (
            m["info"]
            for m in messages
            if m["info"].get("role") == "user" and (after_message_id is None or str(m["info"]["id"]) > after_message_id)
        ),
        None,
    )
    if user is None:
        return Reply()
    reply = Reply(user_message_id=str(user["id"]))
    for message in messages:
        info = message["info"]
        if info.get("role") != "assistant" or info.get("parentID") != reply.user_message_id:
            continue
        parts = [p for p in message.get("parts") or [] if isinstance(p, dict)]
        time_info = _mapping(info.get("time"))
        reply.steps.append(
            ReplyStep(
                message_id=str(info.get("id")),
                text="".join(str(p.get("text") or "") for p in parts if p.get("type") == "text"),
                tools=[tool_part(p) for p in parts if p.get("type") == "tool"],
                finish=info.get("finish"),
                completed=bool(time_info.get("completed")),
                error=_error_text(info.get("error")),
            )
        )
        reply.provider_id = info.get("providerID") or reply.provider_id
        reply.model_id = info.get("modelID") or reply.model_id
        tokens = _mapping(info.get("tokens"))
        reply.input_tokens += int(tokens.get("input") or 0)
        reply.output_tokens += int(tokens.get("output") or 0)
    return reply
