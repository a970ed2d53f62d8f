"""The script a scripted model answers from: ordered steps, each optionally matching the request.

Each request takes the first unused step whose `match` holds; a `repeat` step is never used up. Text and
arguments may use templates from the request (`{{last}}`, `{{user}}`, `{{tool:NAME}}`, dotted JSON paths); one
that cannot be filled is an error the client sees, never a silent blank.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_TEMPLATE = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")


class Mark(enum.Enum):
    """Places in a streamed answer (between its events, in any API) where a step's timing applies."""

    PAUSE = "pause"
    """Before a piece of text or arguments: a step's `chunk_delay` is waited here."""
    CUT = "cut"
    """Before the first final event: a step that breaks off ends the stream at the first of these."""


@dataclass
class Reply:
    """A step rendered for one request, before any API's shape: the model answering, its text, tool calls, usage."""

    model: str
    text: str
    calls: list[dict[str, Any]]
    usage: Mapping[str, int]


class ScriptError(Exception):
    """The request could not be answered from the script (no step matches, or a template cannot be filled)."""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def offered_tools(body: Mapping[str, Any]) -> list[str]:
    return [tool.get("function", {}).get("name", "") for tool in body.get("tools") or [] if isinstance(tool, dict)]


class Match(BaseModel):
    """Conditions on a request; every condition given must hold."""

    model_config = ConfigDict(extra="forbid")

    last_role: Literal["system", "user", "assistant", "tool"] | None = None
    last_contains: str | None = None
    user_contains: str | None = None
    system_contains: str | None = None
    any_contains: str | None = None
    tools_offered: list[str] | None = None
    has_tools: bool | None = None
    model: str | None = None

    def matches(self, body: Mapping[str, Any]) -> bool:
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        last = messages[-1] if messages else {}
        users = [m for m in messages if m.get("role") == "user"]
        systems = [message_text(m) for m in messages if m.get("role") in ("system", "developer")]
        offered = offered_tools(body)
        checks = [
            self.last_role is None or last.get("role") == self.last_role,
            self.last_contains is None or self.last_contains in message_text(last),
            self.user_contains is None or bool(users and self.user_contains in message_text(users[-1])),
            self.system_contains is None or any(self.system_contains in text for text in systems),
            self.any_contains is None or any(self.any_contains in message_text(m) for m in messages),
            self.tools_offered is None or set(self.tools_offered) <= set(offered),
            self.has_tools is None or bool(offered) == self.has_tools,
            self.model is None or body.get("model") == self.model,
        ]
        return all(checks)


class ScriptedToolCall(BaseModel):
    """A tool call to answer with. `namespace` is for Responses clients (Codex groups an MCP server's tools
    in one); left out, the call goes out in the namespace the request offered that tool in."""

    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)
    id: str | None = None
    namespace: str | None = None


class ScriptedError(BaseModel):
    """An HTTP error answer, to test how agents handle a failing provider (4xx is not retried by SDKs)."""

    model_config = ConfigDict(extra="forbid")

    status: int = 400
    message: str = "scripted error"
    type: str = "scripted_error"


class ScriptedUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class Step(BaseModel):
    """One answer: text and/or tool calls (or an error), with optional timing to test streaming and cancels.

    `break_off` makes a streamed answer stop mid-way, as a dropped connection would: its deltas are sent,
    its final events (the finish chunk and `[DONE]`; `output_item.done` and `response.completed`) are not.
    `after` holds the answer until some request has been answered by the step labelled so (at most
    `after_timeout` seconds, then the client gets an error saying so): two clients that must overlap wait
    for each other instead of for a guessed delay.
    """

    model_config = ConfigDict(extra="forbid")

    label: str | None = None
    match: Match | None = None
    text: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    error: ScriptedError | None = None
    delay: float = 0.0
    after: str | None = None
    after_timeout: float = Field(default=30.0, gt=0)
    chunk_delay: float = 0.0
    chunk_size: int = Field(default=8, ge=1)
    usage: ScriptedUsage | None = None
    repeat: bool = False
    break_off: bool = False

    def applies(self, body: Mapping[str, Any]) -> bool:
        return self.match is None or self.match.matches(body)


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")

    steps: list[Step] = Field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> Script:
        """JSON holding either `{"steps": [...]}` or the list of steps itself."""
        data = json.loads(text)
        return cls.model_validate({"steps": data} if isinstance(data, list) else data)

    @classmethod
    def load(cls, path: str | Path) -> Script:
        return cls.parse(Path(path).read_text(encoding="utf-8"))


def say(text: str, *, when: Match | None = None, **options: Any) -> Step:
    """A step answering with text: `say("done:{{tool:get_nonce.nonce}}", when=Match(last_role="tool"))`."""
    return Step(text=text, match=when, **options)


def tool_call(
    name: str, arguments: dict[str, Any] | str | None = None, *, id: str | None = None, namespace: str | None = None
) -> ScriptedToolCall:
    return ScriptedToolCall(name=name, arguments=arguments if arguments is not None else {}, id=id, namespace=namespace)


def call(*calls: ScriptedToolCall | str, when: Match | None = None, text: str | None = None, **options: Any) -> Step:
    """A step answering with tool calls (several means parallel calls); a bare name calls with no arguments."""
    resolved = [tool_call(c) if isinstance(c, str) else c for c in calls]
    return Step(tool_calls=resolved, match=when, text=text, **options)


def _lookup(text: str, path: list[str], expression: str) -> str:
    if not path:
        return text
    try:
        value: Any = json.loads(text)
        for key in path:
            value = value[int(key)] if isinstance(value, list) else value[key]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ScriptError(f"template {{{{{expression}}}}}: no {'.'.join(path)} in {text[:200]!r}") from None
    return value if isinstance(value, str) else json.dumps(value)


def _tool_results(messages: list[dict[str, Any]]) -> dict[str, str]:
    """The latest result text of each tool, by tool name (tool messages only carry the call id)."""
    names: dict[str, str] = {}
    results: dict[str, str] = {}
    for message in messages:
        for call_ in message.get("tool_calls") or []:
            names[call_.get("id", "")] = call_.get("function", {}).get("name", "")
        if message.get("role") == "tool":
            name = names.get(message.get("tool_call_id", ""), "")
            results[name] = message_text(message)
    return results


def render(template: str, body: Mapping[str, Any]) -> str:
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]

    def fill(match: re.Match[str]) -> str:
        expression = match.group(1)
        head, *path = expression.split(".")
        if head == "last":
            return _lookup(message_text(messages[-1]) if messages else "", path, expression)
        if head == "user":
            users = [m for m in messages if m.get("role") == "user"]
            return _lookup(message_text(users[-1]) if users else "", path, expression)
        if head.startswith("tool:"):
            results = _tool_results(messages)
            name = head.removeprefix("tool:")
            if name not in results:
                raise ScriptError(f"template {{{{{expression}}}}}: no result of tool {name!r} in the request")
            return _lookup(results[name], path, expression)
        raise ScriptError(f"template {{{{{expression}}}}}: unknown name {head!r} (last, user, tool:NAME)")

    return _TEMPLATE.sub(fill, template)


def render_value(value: Any, body: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        return render(value, body)
    if isinstance(value, dict):
        return {key: render_value(item, body) for key, item in value.items()}
    if isinstance(value, list):
        return [render_value(item, body) for item in value]
    return value
