"""UnitAgent: the reference's SpaceAgent, an agent whose model and tool loop run inside an OpenCode node.

Per turn it assembles the system prompt from the prompt utilities (instructions, context enrichers,
available capabilities, tool guidance), sends the user's input to the OpenCode session kept in
`session.data["opencode_session_id"]` (validated before reuse, replaced when the node no longer knows
it), registers `abort` as the turn's cancel hook, and waits on the node's shared event stream. OpenCode
runs the tools itself, through the approval-filtered endpoint only; a `permission.asked` for this session
is answered from AgentApprovals, so an `ask` policy works in server mode instead of hanging.

While the node works, the agent follows its event stream: assistant text is streamed into partial
messages (`on_partial` per delta) and each tool call is recorded as it starts and its result as it ends, so
the session shows the turn as it happens, in order. When the reply is complete the agent reads it back
from the node, which is authoritative: every step's text and the final message (with provider, model and
usage) take the read-back's content, and any call the stream missed is recorded then. If that read fails,
the turn fails and records no answer: streamed text it could not confirm is labelled `kind="unconfirmed"`
(the calls seen running are kept: they did run). A cancelled turn aborts the node's session, reads back
what had happened (shielded, bounded) and records it (streamed text not claimed is labelled "interrupted"),
and the turn closes any call still open with a synthetic result.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from ..errors import TurnClosed
from ..items import EventItem, MessageItem, Session, ToolCallItem, ToolResultItem, Usage
from ..prompts import system_prompt
from ..turns import describe
from .client import ModelRef, OpenCodeClient, PermissionReply, Sent
from .endpoint import OpenCodeEndpoint
from .errors import OpenCodeError
from .events import NodeEvent
from .transcript import Reply, ToolPart, read_reply, tool_part

if TYPE_CHECKING:
    from ..context import TurnContext

log = logging.getLogger("unit_mcp.agent.opencode.unit_agent")

SESSION_KEY = "opencode_session_id"
PROVIDER = "opencode"
INSTRUCTIONS = (
    "You are Unit Agent. You develop the units (hot-reloadable plugins) of a running Python application "
    "using only the approved tools you are offered. Read before you patch, patch with the hash you read, "
    "run the unit's tests and reload it; say plainly when a tool you need is not available."
)


@dataclass
class _TurnState:
    """What one turn knows about its OpenCode side, shared with the cancel hook and the permission task."""

    session_id: str | None = None
    sent: Sent | None = None
    recorded: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)
    partials: dict[str, str] = field(default_factory=dict)
    """OpenCode message id → the partial MessageItem streaming its text."""
    streamed: dict[str, dict[str, str]] = field(default_factory=dict)
    """OpenCode message id → its text parts (part id → text so far), in the order they appeared."""
    assistant: set[str] = field(default_factory=set)
    """The assistant messages of this reply (their parent is the turn's user message)."""
    followed: int = 0
    """The seq of the last node event the follower has handled."""
    following: bool = True
    """False once the follower has stopped (its stream closed, or it failed)."""


class UnitAgent:
    def __init__(
        self,
        client: OpenCodeClient,
        *,
        model: ModelRef | str | Mapping[str, str],
        endpoint: OpenCodeEndpoint | None = None,
        id: str = "unit-agent",
        name: str = "Unit Agent",
        instructions: str = INSTRUCTIONS,
        opencode_agent: str | None = None,
        turn_timeout: float = 300.0,
        settle_timeout: float = 5.0,
        permission_poll: float = 5.0,
    ) -> None:
        """`model` is this agent's own choice (`"provider/model"`), never the runner's. `endpoint` is the
        endpoint the node's config points at: it maps OpenCode's tool names back to the surface's and
        admits the calls a user approved. `settle_timeout` bounds the read-back after a cancel."""
        self.client = client
        self.model = ModelRef.parse(model)
        self.endpoint = endpoint
        self.id = id
        self.name = name
        self.instructions = instructions
        self.opencode_agent = opencode_agent
        self.turn_timeout = turn_timeout
        self.settle_timeout = settle_timeout
        self.permission_poll = permission_poll

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
        state = _TurnState()

        async def abort() -> None:
            if state.session_id is not None:
                await self.client.abort(state.session_id)

        ctx.turn.set_cancel(abort)
        system = await system_prompt(ctx, self.instructions)
        try:
            async with (
                anyio.create_task_group() as tg,
                self.client.listen() as events,
                self.client.listen() as progress,
            ):
                tg.start_soon(self._answer_permissions, events, state, ctx)
                tg.start_soon(self._poll_permissions, state, ctx)
                tg.start_soon(self._follow, progress, state, ctx)
                try:
                    reply = await self._turn(input, session, ctx, state, system)
                except anyio.get_cancelled_exc_class():
                    with anyio.CancelScope(shield=True):
                        await self._settle(state, ctx)
                    raise
                except Exception:
                    await self._catch_up(state)
                    raise
                finally:
                    tg.cancel_scope.cancel()
        except BaseException as exc:
            # After the task group: the follower has finished recording whatever it was recording.
            kind = "interrupted" if isinstance(exc, anyio.get_cancelled_exc_class()) else "unconfirmed"
            with anyio.CancelScope(shield=True):
                await self._close_partials(state, ctx, kind)
            raise
        await self._record(reply, state, ctx)
        if reply.error is not None:
            await self._close_partials(state, ctx, "unconfirmed")
            await ctx.turn.fail(f"OpenCode ended the reply with {reply.error}", code="opencode_error")
            return
        usage = Usage(input_tokens=reply.input_tokens, output_tokens=reply.output_tokens)
        final = MessageItem(role="assistant", content=reply.text, provider=PROVIDER, model=reply.model, usage=usage)
        await self._put_message(final, reply.steps[-1].message_id if reply.steps else None, state, ctx)
        await self._close_partials(state, ctx, "unconfirmed")
        await ctx.turn.finish(reply.text)

    # -- the turn ---------------------------------------------------------------------------------

    async def _turn(self, input: str, session: Session, ctx: TurnContext, state: _TurnState, system: str) -> Reply:
        stored = session.data.get(SESSION_KEY)
        permission = self.endpoint.permission_rules() if self.endpoint is not None else None
        sent = await self.client.send(
            stored if isinstance(stored, str) else None,
            input,
            title=f"{self.name}: {session.title or session.id}",
            permission=permission,
            model=self.model,
            agent=self.opencode_agent,
            system=system,
            on_session=lambda session_id: setattr(state, "session_id", session_id),
        )
        state.session_id, state.sent = sent.session_id, sent
        if sent.session_id != stored:
            await ctx.save_data(**{SESSION_KEY: sent.session_id})
            kind = "opencode-session-replaced" if sent.replaced else "opencode-session-created"
            details: dict[str, Any] = {"opencode_session_id": sent.session_id, "node": self.client.base_url}
            if sent.replaced:
                details.update(previous=sent.previous_session_id, reason=sent.replace_reason)
            await ctx.turn.append_item(EventItem(kind=kind, data=details))
        return await self._wait_reply(sent, deadline=anyio.current_time() + self.turn_timeout)

    async def _wait_reply(self, sent: Sent, *, deadline: float) -> Reply:
        """Wait for idle on the shared stream, then confirm from the messages; an early idle (a poll, or
        the tail of an earlier turn) only costs another round."""
        since, started = sent.since, False
        while True:
            remaining = deadline - anyio.current_time()
            if remaining <= 0:
                raise TimeoutError(f"OpenCode gave no complete reply within {self.turn_timeout:.0f} s")
            await self.client.wait_idle(sent.session_id, since=since, timeout=remaining, started=started)
            since = self.client.events.seq
            reply = await self._read(sent)
            if reply.done:
                return reply
            started = reply.started

    async def _read(self, sent: Sent) -> Reply:
        try:
            messages = await self.client.messages(sent.session_id)
        except OpenCodeError as exc:
            raise OpenCodeError(f"could not read the reply back from OpenCode: {exc}") from exc
        return read_reply(messages, after_message_id=sent.after_message_id)

    async def _catch_up(self, state: _TurnState) -> None:
        """Before a failed turn stops the follower: let it record the events the node already sent (a tool
        call that ran), which can sit unread in its queue while it writes earlier items (bounded)."""
        target = self.client.events.seq
        with anyio.move_on_after(self.settle_timeout):
            while state.following and state.followed < target:
                await anyio.sleep(0.01)

    async def _settle(self, state: _TurnState, ctx: TurnContext) -> None:
        """After a cancel (the hook aborted the node's session): let the node settle, read back what it
        did and record it, all bounded; the turn closes whatever stays open."""
        sent = state.sent
        if sent is None:
            return
        with anyio.move_on_after(self.settle_timeout) as scope:
            try:
                await self.client.wait_idle(sent.session_id, since=sent.since, timeout=self.settle_timeout)
                await self._record(await self._read(sent), state, ctx)
            except Exception as exc:
                log.warning("could not read back the cancelled turn of %s: %s", sent.session_id, describe(exc))
        if scope.cancelled_caught:
            log.warning(
                "OpenCode session %s did not settle within %.0f s of an abort", sent.session_id, self.settle_timeout
            )

    # -- recording --------------------------------------------------------------------------------

    async def _record(self, reply: Reply, state: _TurnState, ctx: TurnContext) -> None:
        """Every step's text and tool calls with their results, in order, each at most once. Text that was
        streamed takes the read-back's content in its partial item; the last step's text is the final
        message, which `run` records."""
        for index, step in enumerate(reply.steps):
            last = index == len(reply.steps) - 1
            if step.text and not last and f"text:{step.message_id}" not in state.recorded:
                state.recorded.add(f"text:{step.message_id}")
                message = MessageItem(
                    role="assistant", content=step.text, kind="step", provider=PROVIDER, model=reply.model
                )
                await self._put_message(message, step.message_id, state, ctx)
            for part in step.tools:
                await self._record_tool(part, state, ctx)

    async def _put_message(
        self, message: MessageItem, opencode_id: str | None, state: _TurnState, ctx: TurnContext
    ) -> None:
        """Into the partial item that streamed this OpenCode message (keeping its place), else appended."""
        streamed = state.partials.pop(opencode_id, None) if opencode_id is not None else None
        if streamed is None:
            await ctx.turn.append_item(message)
            return
        fields = message.model_dump(include={"content", "kind", "provider", "model", "usage"})
        await ctx.turn.update_item(streamed, partial=False, **fields)

    async def _record_tool(self, part: ToolPart, state: _TurnState, ctx: TurnContext) -> None:
        """The call once it is known, its result once it has ended; each at most once."""
        name = self._tool_name(part.tool)
        if f"call:{part.call_id}" not in state.recorded:
            state.recorded.add(f"call:{part.call_id}")
            known = ctx.tools.get(name)
            await ctx.turn.append_item(
                ToolCallItem(
                    name=name,
                    arguments=part.arguments,
                    call_id=part.call_id,
                    risk=known.risk if known is not None else None,
                    source=PROVIDER,
                    provider=PROVIDER,
                )
            )
        if part.finished and f"result:{part.call_id}" not in state.recorded:
            state.recorded.add(f"result:{part.call_id}")
            await ctx.turn.append_item(
                ToolResultItem(
                    name=name,
                    call_id=part.call_id,
                    output=part.output if part.output is not None else part.error or "",
                    is_error=part.status == "error",
                )
            )

    # -- following the node while it works -------------------------------------------------------

    async def _follow(self, events: Any, state: _TurnState, ctx: TurnContext) -> None:
        """Stream this reply's assistant text into partial messages and record tool calls as they happen.

        Best effort (the read-back at the end is authoritative): events of other sessions and of earlier
        turns are skipped, and a failure here is logged, never fatal to the turn."""
        try:
            async for event in events:
                if isinstance(event, NodeEvent) and state.sent is not None and event.session_id == state.session_id:
                    # (nothing of this reply can be told apart before the prompt was sent)
                    with anyio.CancelScope(shield=True):  # an item is recorded whole, with its bookkeeping
                        await self._follow_event(event, state, ctx)
                if isinstance(event, NodeEvent):
                    state.followed = event.seq
        except Exception:
            log.warning("following OpenCode's events failed; the reply is recorded when it is complete", exc_info=True)
        finally:
            state.following = False

    async def _follow_event(self, event: NodeEvent, state: _TurnState, ctx: TurnContext) -> None:
        props = event.properties
        assert state.sent is not None
        if event.type == "message.updated":
            info = props.get("info")
            if isinstance(info, dict) and info.get("role") == "assistant":
                parent = str(info.get("parentID") or "")
                if state.sent.after_message_id is None or parent > state.sent.after_message_id:
                    state.assistant.add(str(info.get("id")))
        elif event.type == "message.part.delta":
            message_id, part_id = str(props.get("messageID")), str(props.get("partID"))
            parts = state.streamed.get(message_id)
            if parts is not None and part_id in parts and props.get("field") == "text":
                parts[part_id] += str(props.get("delta") or "")
                await self._stream(message_id, state, ctx)
        elif event.type == "message.part.updated":
            part = props.get("part")
            if not isinstance(part, dict) or str(part.get("messageID")) not in state.assistant:
                return
            if part.get("type") == "text":
                state.streamed.setdefault(str(part.get("messageID")), {})[str(part.get("id"))] = str(
                    part.get("text") or ""
                )
                await self._stream(str(part.get("messageID")), state, ctx)
            elif part.get("type") == "tool":
                tool = tool_part(part)
                if tool.status != "pending":  # a pending call has no arguments yet
                    await self._record_tool(tool, state, ctx)

    async def _stream(self, message_id: str, state: _TurnState, ctx: TurnContext) -> None:
        text = "".join(state.streamed[message_id].values())
        if not text:
            return
        item_id = state.partials.get(message_id)
        if item_id is None:
            partial = MessageItem(role="assistant", content=text, partial=True, provider=PROVIDER)
            item = await ctx.turn.append_item(partial)
            state.partials[message_id] = item.id
        else:
            await ctx.turn.update_item(item_id, content=text, persist=False)

    async def _close_partials(self, state: _TurnState, ctx: TurnContext, kind: str) -> None:
        """Streamed text the read-back did not claim stays as it was streamed, labelled with `kind`
        ("interrupted" after a cancel, "unconfirmed" when the reply failed or could not be read back), so
        it is never mistaken for an answer."""
        for message_id, item_id in list(state.partials.items()):
            state.partials.pop(message_id)
            with contextlib.suppress(TurnClosed):
                await ctx.turn.update_item(item_id, partial=False, kind=kind)

    def _tool_name(self, opencode_name: str) -> str:
        return self.endpoint.local_name(opencode_name) if self.endpoint is not None else opencode_name

    # -- permissions ------------------------------------------------------------------------------

    async def _answer_permissions(self, events: Any, state: _TurnState, ctx: TurnContext) -> None:
        async for event in events:
            if isinstance(event, NodeEvent) and event.type == "permission.asked":
                await self._answer(event.properties, state, ctx)

    async def _poll_permissions(self, state: _TurnState, ctx: TurnContext) -> None:
        """A `permission.asked` the stream missed (it was down) is found here, so nothing waits forever."""
        while True:
            await anyio.sleep(self.permission_poll)
            if state.session_id is None:
                continue
            try:
                pending = await self.client.permissions()
            except OpenCodeError as exc:
                log.debug("listing pending permissions failed: %s", exc)
                continue
            for request in pending:
                await self._answer(request, state, ctx)

    async def _answer(self, request: Mapping[str, Any], state: _TurnState, ctx: TurnContext) -> None:
        request_id = request.get("id")
        if (
            not isinstance(request_id, str)
            or request_id in state.answered
            or state.session_id is None
            or request.get("sessionID") != state.session_id
        ):
            return
        state.answered.add(request_id)
        asked = str(request.get("permission") or "")
        name = self._tool_name(asked)
        known = ctx.tools.get(name)
        risk = known.risk if known is not None else "destructive"
        arguments = await self._call_input(state.session_id, request.get("tool"))
        decision = await ctx.approvals.approve(
            risk, tool=name, arguments=arguments, reason=f"OpenCode asks to use {asked}"
        )
        reply: PermissionReply = "reject"
        if decision.approved and known is not None and self.endpoint is not None:
            self.endpoint.admit(known.name)
            reply = "once"
        try:
            why = decision.reason or f"decided by {decision.decided_by}"
            await self.client.reply_permission(
                request_id, reply, None if reply != "reject" else f"{name} was not approved ({why})"
            )
        except OpenCodeError as exc:
            log.warning("answering OpenCode permission %s failed: %s", request_id, exc)

    async def _call_input(self, session_id: str, tool: Any) -> dict[str, Any] | None:
        """The arguments of the tool call a permission request is about (best effort: shown to the approver)."""
        call_id = tool.get("callID") if isinstance(tool, Mapping) else None
        if not call_id:
            return None
        try:
            messages = await self.client.messages(session_id, limit=5)
        except OpenCodeError:
            return None
        for message in messages:
            for part in message.get("parts") or []:
                if isinstance(part, dict) and part.get("callID") == call_id:
                    state = part.get("state")
                    value = state.get("input") if isinstance(state, dict) else None
                    return value if isinstance(value, dict) else None
        return None
