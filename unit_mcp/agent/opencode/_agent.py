"""OpenCodeAgent: an agent whose model and tool loop run inside an OpenCode node (the reference's SpaceAgent).

Per turn it sends the input to the session's OpenCode session and waits on the node's event stream; OpenCode
runs the tools through the approval-filtered endpoint only. The reply is read back from the node, which is
authoritative; text it could not confirm is labelled, and a cancel aborts the node's session and records the rest.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import anyio

from ... import tracing
from .._recorder import drive
from ..items import EventItem, MessageItem, Session, Usage
from ..prompts import PERSONA, system_prompt
from ..turns import describe
from ._client import ModelRef, OpenCodeClient, Sent
from ._endpoint import OpenCodeEndpoint
from ._errors import OpenCodeError
from ._permissions import NodeAsk, Permissions, pending_ask
from ._reply import PROVIDER, ReplyRecorder
from ._transcript import Reply, read_reply

if TYPE_CHECKING:
    from .._context import TurnContext

log = logging.getLogger("unit_mcp.agent.opencode.unit_agent")

SESSION_KEY = "opencode_session_id"


class OpenCodeAgent:
    def __init__(
        self,
        client: OpenCodeClient,
        *,
        model: ModelRef | str | Mapping[str, str],
        endpoint: OpenCodeEndpoint | None = None,
        id: str = "unit-agent",
        name: str = "Unit Agent",
        instructions: str = PERSONA,
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
        state = ReplyRecorder(ctx, self.tool_name)
        permissions = Permissions(self.client, self.endpoint, ctx, state)

        async def abort() -> None:
            if state.node_session_id is not None:
                await self.client.abort(state.node_session_id)

        system = await system_prompt(ctx, self.instructions)
        async with self.client.listen() as events, self.client.listen() as progress:
            reply = await drive(
                state.recorder,
                lambda: self._turn(input, session, ctx, state, system),
                cancel=abort,
                settle=lambda: self._settle(state),
                alongside=[
                    lambda: permissions.listen(events),
                    lambda: permissions.poll(self.permission_poll),
                    lambda: state.follow(progress),
                ],
                catch_up=lambda: self._catch_up(state),
            )
        assert reply is not None  # (no timeout given: `_turn` keeps its own deadline)
        await self._conclude(ctx, state, reply)

    async def _conclude(self, ctx: TurnContext, state: ReplyRecorder, reply: Reply) -> str | None:
        """Record the reply read back and end the turn: completed with its answer, failed with OpenCode's error, or
        (a durable turn whose node stopped before finishing) `interrupted`, its unfinished text labelled so."""
        await state.record(reply)
        last = reply.steps[-1].message_id if reply.steps else None
        if reply.error is not None or not reply.done:
            await state.recorder.close_partials("unconfirmed")
            if reply.error is not None:
                await ctx.turn.fail(f"OpenCode ended the reply with {reply.error}", code="opencode_error")
                return None
            if reply.text:
                cut = MessageItem(role="assistant", content=reply.text, kind="interrupted", provider=PROVIDER)
                await state.recorder.put_message(cut, last)
            unfinished = "the OpenCode node did not finish the reply (it stopped, or took longer than turn_timeout)"
            await ctx.turn.interrupted(unfinished)
            return None
        usage = Usage(input_tokens=reply.input_tokens, output_tokens=reply.output_tokens)
        final = MessageItem(role="assistant", content=reply.text, provider=PROVIDER, model=reply.model, usage=usage)
        await state.recorder.put_message(final, last)
        await state.recorder.close_partials("unconfirmed")
        await ctx.turn.finish(reply.text)
        return reply.text

    # -- the turn ---------------------------------------------------------------------------------

    async def _turn(self, input: str, session: Session, ctx: TurnContext, state: ReplyRecorder, system: str) -> Reply:
        stored = session.data.get(SESSION_KEY)
        permission = self.endpoint.view.permission_rules() if self.endpoint is not None else None
        sent = await self.client.send(
            stored if isinstance(stored, str) else None,
            input,
            title=f"{self.name}: {session.title or session.id}",
            permission=permission,
            model=self.model,
            agent=self.opencode_agent,
            system=system,
            on_session=lambda node_session_id: setattr(state, "node_session_id", node_session_id),
        )
        state.node_session_id, state.sent = sent.session_id, sent
        tracing.set_attributes(tracing.current(), unit_mcp__opencode__session_id=sent.session_id)
        await self.note_session(ctx, stored if isinstance(stored, str) else None, sent)
        return await self._wait_reply(sent, deadline=anyio.current_time() + self.turn_timeout)

    async def note_session(self, ctx: TurnContext, stored: str | None, sent: Sent) -> None:
        """Keep the node session the prompt went to, and record it when it is not the `stored` one."""
        if sent.session_id == stored:
            return
        await ctx.save_data(**{SESSION_KEY: sent.session_id})
        kind = "opencode-session-replaced" if sent.replaced else "opencode-session-created"
        details: dict[str, Any] = {"opencode_session_id": sent.session_id, "node": self.client.base_url}
        if sent.replaced:
            details.update(previous=sent.previous_session_id, reason=sent.replace_reason)
        await ctx.turn.append_item(EventItem(kind=kind, data=details))

    # -- a durable turn (`_durable.py`): the node session, the prompt and the read-back are its steps -----------

    async def open_session(self, session: Session) -> tuple[str | None, Sent]:
        """The session's stored node session and the one a durable turn's prompt goes to (the stored one, else a
        new one), nothing sent yet."""
        stored = session.data.get(SESSION_KEY)
        stored = stored if isinstance(stored, str) else None
        permission = self.endpoint.view.permission_rules() if self.endpoint is not None else None
        title = f"{self.name}: {session.title or session.id}"
        return stored, await self.client.open(stored, title=title, permission=permission)

    async def prompt_once(self, ctx: TurnContext, sent: Sent, input: str) -> None:
        """Send the prompt, unless the node has it already, under the message id `open_session` minted: run again
        (a worker died after sending it, maybe before the node stored it), the node takes it once."""
        if (await self._read(sent)).started:
            return
        system = await system_prompt(ctx, self.instructions)
        await self.client.prompt_async(
            sent.session_id,
            input,
            model=self.model,
            agent=self.opencode_agent,
            system=system,
            message_id=sent.message_id,
        )

    async def read_back(self, sent: Sent) -> Reply:
        """The reply once the node has finished it; what it has of it if the node, having begun it, goes idle twice in
        a row without finishing it (restarted), stops answering, or `turn_timeout` passes first."""
        reply = await self._read_back(sent, None)
        assert isinstance(reply, Reply)
        return reply

    async def read_back_or_ask(self, sent: Sent, answered: Collection[str]) -> Reply | NodeAsk:
        """`read_back`, unless the node first asks a permission for this node session (one not among `answered`):
        that question, for the durable turn to answer."""
        return await self._read_back(sent, answered)

    async def _read_back(self, sent: Sent, answered: Collection[str] | None) -> Reply | NodeAsk:
        reply, idle = Reply(), 0
        with anyio.move_on_after(self.turn_timeout):
            while True:
                try:
                    since = self.client.events.seq
                    if answered is not None and (asked := await pending_ask(self.client, sent.session_id, answered)):
                        return asked
                    reply = await self._read(sent)
                    if reply.done:
                        return reply
                    busy = (await self.client.session_statuses()).get(sent.session_id, "idle") != "idle"
                    idle = 0 if busy or not reply.steps else idle + 1  # (idle before its first step: not yet)
                    if idle >= 2:
                        return reply
                    with contextlib.suppress(TimeoutError):
                        await self.client.wait_idle(sent.session_id, since=since, timeout=1.0, started=True)
                except OpenCodeError as exc:
                    log.warning(
                        "reading back the reply of OpenCode session %s failed: %s", sent.session_id, describe(exc)
                    )
                    return reply
        log.warning("OpenCode session %s gave no complete reply within %.0f s", sent.session_id, self.turn_timeout)
        return reply

    async def conclude(self, ctx: TurnContext, reply: Reply) -> str | None:
        """A durable turn's end: the reply read back recorded, the turn ended (see `_conclude`); its answer."""
        return await self._conclude(ctx, ReplyRecorder(ctx, self.tool_name), reply)

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

    async def _catch_up(self, state: ReplyRecorder) -> None:
        """Before a failed turn stops the follower: let it record the events the node already sent (a tool
        call that ran), which can sit unread in its queue while it writes earlier items (bounded)."""
        target = self.client.events.seq
        with anyio.move_on_after(self.settle_timeout):
            while state.following and state.followed < target:
                await anyio.sleep(0.01)

    async def _settle(self, state: ReplyRecorder) -> None:
        """After a cancel (the hook aborted the node's session): let the node settle, read back what it
        did and record it, all bounded; the turn closes whatever stays open."""
        sent = state.sent
        if sent is None:
            return
        with anyio.move_on_after(self.settle_timeout) as scope:
            try:
                await self.client.wait_idle(sent.session_id, since=sent.since, timeout=self.settle_timeout)
                await state.record(await self._read(sent))
            except Exception as exc:
                log.warning(
                    "reading back OpenCode session %s after a cancel failed: %s", sent.session_id, describe(exc)
                )
        if scope.cancelled_caught:
            log.warning(
                "OpenCode session %s did not settle within %.0f s of an abort", sent.session_id, self.settle_timeout
            )

    def tool_name(self, opencode_name: str) -> str:
        return self.endpoint.view.local_name(opencode_name) if self.endpoint is not None else opencode_name
