"""Hook points of the step loop and the shapes they see.

Each point is a list run in order, where a hook may replace the value: before a request, on a step's result,
after a step, before and around each tool call, whether to continue, and compaction. A hook that raises ends
the turn with a `HookError` naming the point and the hook; the runner itself is never affected.
"""

from __future__ import annotations

import inspect
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .errors import HookError
from .items import Usage
from .toolsurface import ToolOutput
from .turns import describe

if TYPE_CHECKING:
    from ._context import TurnContext


def new_call_id() -> str:
    return f"call_{secrets.token_hex(8)}"


class ToolCall(BaseModel):
    """A tool call as the model wrote it; `arguments` is JSON text."""

    id: str = Field(default_factory=new_call_id)
    name: str
    arguments: str = "{}"


class ModelRequest(BaseModel):
    """What one model request is built from: chat messages and OpenAI-style function tools."""

    step: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = Field(default_factory=list)


class ModelResponse(BaseModel):
    """One model answer. `message_id` is set when the provider already recorded the message while streaming."""

    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage | None = None
    model: str | None = None
    provider: str | None = None
    message_id: str | None = None

    @classmethod
    def calling(cls, *calls: tuple[str, dict[str, Any]], content: str = "") -> ModelResponse:
        """A response that calls tools: `ModelResponse.calling(("unit_list", {}), ("unit_inspect", {...}))`."""
        return cls(
            content=content,
            tool_calls=[ToolCall(name=name, arguments=json.dumps(args)) for name, args in calls],
        )


class Refusal(BaseModel):
    """Returned by a before-tool-call hook to stop a call; the model sees the reason as the tool's error."""

    reason: str


class StepResult(BaseModel):
    step: int
    message_id: str
    content: str
    tool_calls: list[ToolCall]
    outputs: dict[str, ToolOutput] = Field(default_factory=dict)


@dataclass
class ToolExecution:
    """What running a tool came to: its output, or the exception it raised, and how long it took (seconds)."""

    call: ToolCall
    output: ToolOutput | None
    error: Exception | None
    duration: float


Proceed = Callable[[], Awaitable[ToolExecution]]
Messages = list[dict[str, Any]]

BeforeRequest = Callable[["TurnContext", ModelRequest], "ModelRequest | Awaitable[ModelRequest | None] | None"]
AfterStep = Callable[["TurnContext", StepResult], "Awaitable[None] | None"]
BeforeToolCall = Callable[["TurnContext", ToolCall], "ToolCall | Refusal | Awaitable[ToolCall | Refusal | None] | None"]
ShouldContinue = Callable[["TurnContext", StepResult, bool], "bool | Awaitable[bool | None] | None"]
StepResultHook = Callable[["TurnContext", ModelResponse], "ModelResponse | Awaitable[ModelResponse | None] | None"]
ExecuteTool = Callable[
    ["TurnContext", ToolCall, Proceed], "Awaitable[ToolOutput | ToolExecution | None] | ToolOutput | None"
]
Compactor = Callable[["TurnContext", Messages], "Messages | Awaitable[Messages | None] | None"]

COMPACTED = "[compacted]"


def summarise_tool_results(messages: Messages, *, keep_recent: int = 2, width: int = 120) -> Messages:
    """The default compaction: every tool result but the newest `keep_recent` becomes one line naming the
    tool, the start of its output and its size. Everything else is kept as it was."""
    names = {
        call.get("id"): call.get("function", {}).get("name", "tool")
        for message in messages
        for call in message.get("tool_calls") or []
    }
    results = [i for i, message in enumerate(messages) if message.get("role") == "tool"]
    old = set(results[: max(len(results) - keep_recent, 0)])
    compacted: Messages = []
    for index, message in enumerate(messages):
        content = message.get("content")
        if index in old and isinstance(content, str) and not content.startswith(COMPACTED):
            first = " ".join(content.split())
            first = first if len(first) <= width else first[: width - 1] + "…"
            name = names.get(message.get("tool_call_id"), "tool")
            message = {**message, "content": f"{COMPACTED} {name} returned {len(content)} chars: {first}"}
        compacted.append(message)
    return compacted


def history_size(messages: Messages) -> int:
    """The size `compact_at` is measured in: characters of the history as JSON."""
    return len(json.dumps(messages, ensure_ascii=False))


async def _invoke(point: str, hook: Callable[..., Any], *args: Any) -> Any:
    try:
        value = hook(*args)
        return await value if inspect.isawaitable(value) else value
    except Exception as exc:
        raise HookError(f"{point} hook {_name(hook)} failed: {describe(exc)}") from exc


@dataclass
class Hooks:
    before_request: list[BeforeRequest] = field(default_factory=list)
    after_step: list[AfterStep] = field(default_factory=list)
    before_tool_call: list[BeforeToolCall] = field(default_factory=list)
    should_continue: list[ShouldContinue] = field(default_factory=list)
    step_result: list[StepResultHook] = field(default_factory=list)
    execute_tool: list[ExecuteTool] = field(default_factory=list)
    compact: list[Compactor] = field(default_factory=list)

    async def run_before_request(self, ctx: TurnContext, request: ModelRequest) -> ModelRequest:
        for hook in self.before_request:
            request = await _invoke("before_request", hook, ctx, request) or request
        return request

    async def run_after_step(self, ctx: TurnContext, result: StepResult) -> None:
        for hook in self.after_step:
            await _invoke("after_step", hook, ctx, result)

    async def run_before_tool_call(self, ctx: TurnContext, call: ToolCall) -> ToolCall | Refusal:
        for hook in self.before_tool_call:
            outcome = await _invoke("before_tool_call", hook, ctx, call)
            if isinstance(outcome, Refusal):
                return outcome
            call = outcome or call
        return call

    async def run_should_continue(self, ctx: TurnContext, result: StepResult, default: bool) -> bool:
        decision = default
        for hook in self.should_continue:
            outcome = await _invoke("should_continue", hook, ctx, result, decision)
            decision = decision if outcome is None else bool(outcome)
        return decision

    async def run_step_result(self, ctx: TurnContext, response: ModelResponse) -> ModelResponse:
        for hook in self.step_result:
            outcome = await _invoke("step_result", hook, ctx, response)
            if outcome is not None and not isinstance(outcome, ModelResponse):
                raise HookError(f"step_result hook {_name(hook)} returned {type(outcome).__name__}, not ModelResponse")
            response = outcome or response
        return response

    async def run_execute_tool(
        self, ctx: TurnContext, call: ToolCall, execute: Callable[[], Awaitable[ToolOutput]]
    ) -> ToolOutput:
        """Run `execute` inside the `execute_tool` hooks (the first hook is the outermost). Without hooks the
        tool runs as it is; with them, an error the hooks leave in place is raised again."""
        if not self.execute_tool:
            return await execute()

        async def innermost() -> ToolExecution:
            started = time.monotonic()
            try:
                output = await execute()
            except Exception as exc:
                return ToolExecution(call, None, exc, time.monotonic() - started)
            return ToolExecution(call, output, None, time.monotonic() - started)

        chain: Proceed = innermost
        for hook in reversed(self.execute_tool):
            chain = _wrap(hook, ctx, call, chain)
        execution = await chain()
        if execution.error is not None:
            raise execution.error
        if execution.output is None:
            raise HookError(f"the execute_tool hooks left {call.name} with neither an output nor an error")
        return execution.output

    async def run_compact(self, ctx: TurnContext, messages: Messages) -> Messages:
        """The compaction hooks in order (the default summary of old tool results when there are none)."""
        if not self.compact:
            return summarise_tool_results(messages)
        for hook in self.compact:
            outcome = await _invoke("compact", hook, ctx, messages)
            messages = outcome if outcome is not None else messages
        return messages


def _name(hook: Callable[..., Any]) -> str:
    return getattr(hook, "__qualname__", repr(hook))


def _wrap(hook: ExecuteTool, ctx: TurnContext, call: ToolCall, inner: Proceed) -> Proceed:
    async def run() -> ToolExecution:
        done: list[ToolExecution] = []

        async def proceed() -> ToolExecution:
            if not done:
                done.append(await inner())
            return done[0]

        started = time.monotonic()
        outcome = await _invoke("execute_tool", hook, ctx, call, proceed)
        if isinstance(outcome, ToolExecution):
            return outcome
        if isinstance(outcome, ToolOutput):
            duration = done[0].duration if done else time.monotonic() - started
            return ToolExecution(call, outcome, None, duration)
        if outcome is None:
            return await proceed()
        raise HookError(f"execute_tool hook {_name(hook)} returned {type(outcome).__name__}, not ToolOutput")

    return run
