"""LoopAgent: the client-side step loop shared by agents whose model cannot run tools itself.

A concrete agent supplies only `request` (ask the model); the loop owns steering, hooks, tool calls and
compaction, so every such agent behaves the same (user-facing detail: docs/agent.md, "Hooks").
"""

from __future__ import annotations

import contextlib
import inspect
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import anyio

from .. import tracing
from ._recorder import TurnRecorder
from .errors import AgentError, StepLimitReached
from .hooks import Hooks, Messages, ModelRequest, ModelResponse, Refusal, StepResult, ToolCall, history_size
from .items import EventItem, Item, MessageItem, Session, ToolCallItem
from .paused import RESUMED_OUTPUT, paused_calls
from .projections import chat_messages
from .prompts import system_prompt
from .toolsurface import ToolOutput

if TYPE_CHECKING:
    from ._context import TurnContext

SystemPrompt = str | Callable[["TurnContext"], "str | Awaitable[str]"]
COMPACTION = "compaction"


def history(items: list[Item]) -> Messages:
    """The chat history a request is built from: the newest compaction's messages, then what came after it."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, EventItem) and item.kind == COMPACTION:
            return list(item.data["messages"]) + chat_messages(items[index + 1 :])
    return chat_messages(items)


class LoopAgent(ABC):
    def __init__(
        self,
        *,
        id: str,
        name: str | None = None,
        instructions: str | None = None,
        system: SystemPrompt | None = None,
        hooks: Hooks | None = None,
        max_steps: int = 20,
        parallel_tools: bool = True,
        compact_at: int | None = None,
    ) -> None:
        """`system` is the system prompt (text or `fn(ctx)`); with only `instructions` it is assembled by
        `prompts.system_prompt` (instructions, enriched context, capabilities, tool guidance). `compact_at` is
        the history size (characters of JSON) past which the `compact` hooks shorten it."""
        self.id = id
        self.name = name or id
        self.instructions = instructions
        self.system = system
        self.hooks = hooks or Hooks()
        self.max_steps = max_steps
        self.parallel_tools = parallel_tools
        if compact_at is not None and compact_at < 1:
            raise AgentError("compact_at is a size in characters: give a positive number, or None")
        self.compact_at = compact_at

    @abstractmethod
    async def request(self, request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        """Ask the model once. A streaming provider may record the assistant message itself (partials) and
        return its id as `message_id`; otherwise the loop records it."""

    def turn_scope(self, ctx: TurnContext) -> AbstractAsyncContextManager[object]:
        """What the agent holds for the length of a turn (a provider's client, say); `run` and `resume` both
        run inside it. Nothing by default."""
        return contextlib.nullcontext()

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
        async with self.turn_scope(ctx):
            await self._steps(ctx)

    async def resume(self, turn_id: str, ctx: TurnContext) -> None:
        """Go on with turn `turn_id`, which ended with the process while calls waited for approval and whose
        requests have all been answered since: each call runs now (a denied one gets the denial), its result
        replaces the synthetic `[interrupted]` one in place, and the model continues from there."""
        paused = paused_calls(ctx.session, turn_id)
        if not paused or any(p.decision is None for p in paused):
            raise AgentError(f"turn {turn_id} has no answered approval to resume in session {ctx.session_id}")
        async with self.turn_scope(ctx):
            for call in paused:
                assert call.decision is not None
                ctx.approvals.answered[call.call.call_id] = call.decision
                # Claimed before it runs: if this turn ends too, the call is never run a second time.
                await ctx.turn.update_item(call.result.id, output=RESUMED_OUTPUT)
                output = await self._execute(ctx, call.call)
                await ctx.turn.update_item(
                    call.result.id,
                    output=output.text,
                    is_error=output.is_error,
                    structured=output.structured,
                    synthetic=False,
                )
            await self._steps(ctx)

    async def _steps(self, ctx: TurnContext) -> None:
        system = await self.system_prompt(ctx)
        step = 0
        while True:
            step += 1
            if step > self.max_steps:
                raise StepLimitReached(f"no final answer after {self.max_steps} model requests (max_steps)")
            request = await self._prepare(ctx, system, step)
            response = await self._chat(request, ctx)
            response = await self.hooks.run_step_result(ctx, response)
            result = await self._record(ctx, step, response)
            await self.hooks.run_after_step(ctx, result)
            carry_on = bool(response.tool_calls) or ctx.inbox.has_steering
            if not await self.hooks.run_should_continue(ctx, result, carry_on):
                await ctx.turn.finish(response.content)
                return

    async def _chat(self, request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        """One model request, in a `chat` span (model, provider, usage, finish reason; messages only by opt-in)."""
        model = getattr(self, "model", None)
        provider = getattr(self, "provider", None)
        attributes = {"gen_ai.operation.name": "chat", "gen_ai.request.model": model, "gen_ai.provider.name": provider}
        with tracing.span(f"chat {model}" if model else "chat", attributes) as span:
            tracing.set_content(span, "gen_ai.input.messages", request.messages)
            response = await self.request(request, ctx)
            usage = response.usage
            tracing.set_attributes(
                span,
                gen_ai__response__model=response.model,
                gen_ai__provider__name=response.provider,
                gen_ai__usage__input_tokens=usage.input_tokens if usage else None,
                gen_ai__usage__output_tokens=usage.output_tokens if usage else None,
                gen_ai__response__finish_reasons=["tool_calls" if response.tool_calls else "stop"],
            )
            tracing.set_content(span, "gen_ai.output.messages", response.content)
            return response

    async def system_prompt(self, ctx: TurnContext) -> str | None:
        if self.system is None:
            return await system_prompt(ctx, self.instructions) if self.instructions else None
        if isinstance(self.system, str):
            return self.system
        value = self.system(ctx)
        return await value if inspect.isawaitable(value) else value

    async def _prepare(self, ctx: TurnContext, system: str | None, step: int) -> ModelRequest:
        """Deliver steering, build the request, run the hooks; repeat if steering arrived meanwhile."""
        while True:
            await self._deliver_steering(ctx)
            messages = await self._history(ctx)
            request = ModelRequest(
                step=step,
                messages=([{"role": "system", "content": system}] if system else []) + messages,
                tools=ctx.tools.openai_tools(ctx.approvals.grants()),
            )
            request = await self.hooks.run_before_request(ctx, request)
            if not ctx.inbox.has_steering:
                return request

    async def _history(self, ctx: TurnContext) -> Messages:
        """The session's history for the next request, compacted (and the compaction recorded) when it is too big."""
        items = ctx.session.items
        messages = history(items)
        if self.compact_at is None or (before := history_size(messages)) <= self.compact_at:
            return messages
        compacted = await self.hooks.run_compact(ctx, messages)
        after = history_size(compacted)
        if after >= before:
            return messages
        await ctx.turn.append_item(
            EventItem(
                kind=COMPACTION,
                data={
                    "messages": compacted,
                    "size_before": before,
                    "size_after": after,
                    "through": items[-1].id if items else None,
                },
            )
        )
        return compacted

    @staticmethod
    async def _deliver_steering(ctx: TurnContext) -> None:
        pending = ctx.inbox.drain_steering()
        for position, message in enumerate(pending):
            try:
                await ctx.turn.append_item(MessageItem(role="user", content=message.text, kind="steering"))
            except BaseException:
                ctx.inbox.restore_steering(pending[position:])
                raise

    async def _record(self, ctx: TurnContext, step: int, response: ModelResponse) -> StepResult:
        fields: dict[str, Any] = {
            "content": response.content,
            "usage": response.usage,
            "model": response.model,
            "provider": response.provider,
        }
        if response.message_id is not None:
            message = await ctx.turn.update_item(response.message_id, partial=False, **fields)
        else:
            message = await ctx.turn.append_item(MessageItem(role="assistant", **fields))
        recorder = TurnRecorder(ctx.turn, ctx.tools)
        runnable: list[ToolCallItem] = []
        for call in response.tool_calls:
            item = await self._open_call(ctx, recorder, call, message.id)
            if item is not None:
                runnable.append(item)
        outputs = await self._run_tools(ctx, recorder, runnable)
        return StepResult(
            step=step, message_id=message.id, content=response.content, tool_calls=response.tool_calls, outputs=outputs
        )

    async def _open_call(
        self, ctx: TurnContext, recorder: TurnRecorder, call: ToolCall, message_id: str
    ) -> ToolCallItem | None:
        """Record the call (after the hooks may have rewritten it); a refused call is closed at once."""
        outcome = await self.hooks.run_before_tool_call(ctx, call)
        chosen = outcome if isinstance(outcome, ToolCall) else call
        item = await recorder.open_call(call.id, chosen.name, chosen.arguments, parent_id=message_id)
        if item is None:
            return None  # the model repeated a call id: the call is recorded (and run) once
        if isinstance(outcome, ToolCall) and outcome.arguments != call.arguments:
            await ctx.turn.append_item(
                EventItem(kind="tool-call-rewritten", data={"call_id": call.id, "original_arguments": call.arguments})
            )
        if isinstance(outcome, Refusal):
            await recorder.close_call(call.id, ToolOutput(text=f"[refused] {outcome.reason}", is_error=True))
            return None
        return item

    async def _run_tools(
        self, ctx: TurnContext, recorder: TurnRecorder, calls: list[ToolCallItem]
    ) -> dict[str, ToolOutput]:
        outputs: dict[str, ToolOutput] = {}
        if not self.parallel_tools or len(calls) < 2:
            for call in calls:
                outputs[call.call_id] = await self._run_tool(ctx, recorder, call)
            return outputs
        failures: list[Exception] = []
        async with anyio.create_task_group() as tg:
            for call in calls:

                async def run_one(call: ToolCallItem = call) -> None:
                    try:
                        outputs[call.call_id] = await self._run_tool(ctx, recorder, call)
                    except Exception as exc:
                        failures.append(exc)
                        tg.cancel_scope.cancel()

                tg.start_soon(run_one)
        if failures:
            raise failures[0]
        return outputs

    async def _run_tool(self, ctx: TurnContext, recorder: TurnRecorder, call: ToolCallItem) -> ToolOutput:
        output = await self._execute(ctx, call)
        await recorder.close_call(call.call_id, output)
        return output

    async def _execute(self, ctx: TurnContext, call: ToolCallItem) -> ToolOutput:
        """Run the call inside the `execute_tool` hooks."""
        wire = ToolCall(id=call.call_id, name=call.name, arguments=call.arguments)
        return await self.hooks.run_execute_tool(ctx, wire, lambda: self._run_call(ctx, call))

    @staticmethod
    async def _run_call(ctx: TurnContext, call: ToolCallItem) -> ToolOutput:
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("the arguments must be a JSON object")
        except ValueError as exc:
            return ToolOutput(
                text=f"[invalid_argument] {call.name}: arguments are not a JSON object ({exc})", is_error=True
            )
        return await ctx.tools.call(call.name, arguments, ctx, call_id=call.call_id)
