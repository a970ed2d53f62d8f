"""Hook points of the step loop and the shapes they see.

Four points, each a list run in order (a waterfall where a hook may replace the value): before each model
request, after each step, before each tool call (may rewrite the arguments or refuse the call), and the
decision whether the turn continues. A hook that raises ends the turn with a `HookError` naming the point
and the hook; the runner itself is never affected.
"""

from __future__ import annotations

import inspect
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from .errors import HookError
from .items import Usage
from .toolsurface import ToolOutput
from .turns import describe

if TYPE_CHECKING:
    from .context import TurnContext


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


BeforeRequest = Callable[["TurnContext", ModelRequest], "ModelRequest | Awaitable[ModelRequest | None] | None"]
AfterStep = Callable[["TurnContext", StepResult], "Awaitable[None] | None"]
BeforeToolCall = Callable[["TurnContext", ToolCall], "ToolCall | Refusal | Awaitable[ToolCall | Refusal | None] | None"]
ShouldContinue = Callable[["TurnContext", StepResult, bool], "bool | Awaitable[bool | None] | None"]


async def _invoke(point: str, hook: Callable[..., Any], *args: Any) -> Any:
    try:
        value = hook(*args)
        return await value if inspect.isawaitable(value) else value
    except Exception as exc:
        name = getattr(hook, "__qualname__", repr(hook))
        raise HookError(f"{point} hook {name} failed: {describe(exc)}") from exc


@dataclass
class Hooks:
    before_request: list[BeforeRequest] = field(default_factory=list)
    after_step: list[AfterStep] = field(default_factory=list)
    before_tool_call: list[BeforeToolCall] = field(default_factory=list)
    should_continue: list[ShouldContinue] = field(default_factory=list)

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
