"""Permissions: OpenCode's `permission.asked` for an OpenCodeAgent turn's session, answered from the approvals.

The question goes to the turn's approvals, an approved call is admitted by the endpoint and OpenCode gets `once`
or `reject`; a question the event stream missed is found by polling, so nothing waits forever. A durable turn
(`_durable.py`) asks through its workflow instead and answers with the same functions (`permission_risk`,
`activate_preset`, `answer_permission`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
from pydantic import BaseModel

from ..presets import ACTIVATE
from ..toolsurface import AgentToolSurface, ToolDef, ToolOutput
from ._client import OpenCodeClient, PermissionReply
from ._endpoint import OpenCodeEndpoint
from ._errors import OpenCodeError
from ._event_stream import NodeEvent

if TYPE_CHECKING:
    from .._context import TurnContext
    from ..approvals import ApprovalDecision
    from ._reply import ReplyRecorder

log = logging.getLogger("unit_mcp.agent.opencode.permissions")

TOOLS_TAKEN_WAIT_S = 5.0


class NodeAsk(BaseModel):
    """A node's question before one tool call: its permission request id, the permission (OpenCode's tool name)
    and the call's input, if it could be read."""

    id: str
    permission: str
    arguments: dict[str, Any] | None = None


def permission_risk(tools: AgentToolSurface, known: ToolDef | None, arguments: dict[str, Any] | None) -> str:
    """The risk a node's question is decided on: the call's own, `destructive` for a tool the surface lacks."""
    return tools.call_risk(known, arguments) if known is not None else "destructive"


async def answer_permission(
    client: OpenCodeClient,
    endpoint: OpenCodeEndpoint | None,
    request_id: str,
    known: ToolDef | None,
    name: str,
    decision: ApprovalDecision,
) -> None:
    """Tell the node: an approved call of a known tool is admitted by the endpoint and answered `once`, anything
    else `reject` with why."""
    if decision.approved and known is not None and endpoint is not None:
        endpoint.view.admit(known.name)
        await _reply(client, request_id, "once", None)
    else:
        why = decision.reason or f"decided by {decision.decided_by}"
        await _reply(client, request_id, "reject", f"{name} was not approved ({why})")


async def activate_preset(
    client: OpenCodeClient,
    endpoint: OpenCodeEndpoint | None,
    ctx: TurnContext,
    request_id: str,
    arguments: dict[str, Any] | None,
) -> None:
    """Activate the preset the agent asks for as the turn's own `preset_activate` call: the turn's approvals
    decide (a preset above `normal` waits for the user) and the session records it; OpenCode's call then
    reports it (`OpenCodeView`). Without the call's arguments nothing is activated. OpenCode hears yes only once
    it has the new tool list, so the step after the call is offered the preset's tools."""
    if arguments is None:
        output = ToolOutput(text=f"[invalid_argument] could not read which preset {ACTIVATE} names", is_error=True)
    else:
        async with _node_takes_new_tools(client, endpoint):
            output = await ctx.tools.call(ACTIVATE, arguments, ctx)
    await _reply(client, request_id, "reject" if output.is_error else "once", output.text if output.is_error else None)


async def _reply(client: OpenCodeClient, request_id: str, reply: PermissionReply, message: str | None) -> None:
    """Answer the node's question; a failure to tell it is logged, not raised (the turn goes on)."""
    try:
        await client.reply_permission(request_id, reply, message)
    except OpenCodeError as exc:
        log.warning("answering OpenCode permission %s failed: %s", request_id, exc)


@asynccontextmanager
async def _node_takes_new_tools(client: OpenCodeClient, endpoint: OpenCodeEndpoint | None) -> AsyncIterator[None]:
    """If the body changes the endpoint's tool list, wait (at most `TOOLS_TAKEN_WAIT_S`) until the node says it has
    listed them again (`mcp.tools.changed`). The node re-lists on the endpoint's notification in the background:
    a call answered first can reach the next model request before the new list does."""
    if endpoint is None:
        yield
        return
    before = [tool.name for tool in endpoint.tool_defs()]
    async with client.events.listen() as events:
        yield
        if [tool.name for tool in endpoint.tool_defs()] == before:
            return
        with anyio.move_on_after(TOOLS_TAKEN_WAIT_S) as waited:
            async for event in events:
                if event.type == "mcp.tools.changed" and event.properties.get("server") == endpoint.server_name:
                    break
        if waited.cancelled_caught:
            log.warning("the OpenCode node did not re-list the tools within %.0f s", TOOLS_TAKEN_WAIT_S)


async def pending_ask(client: OpenCodeClient, session_id: str, answered: Collection[str]) -> NodeAsk | None:
    """The first question the node has pending for `session_id` that is not among `answered`."""
    for request in await client.permissions():
        request_id = request.get("id")
        if isinstance(request_id, str) and request_id not in answered and request.get("sessionID") == session_id:
            arguments = await call_input(client, session_id, request.get("tool"))
            return NodeAsk(id=request_id, permission=str(request.get("permission") or ""), arguments=arguments)
    return None


async def call_input(client: OpenCodeClient, session_id: str, tool: Any) -> dict[str, Any] | None:
    """The arguments of the tool call a permission request is about (best effort: shown to the approver)."""
    call_id = tool.get("callID") if isinstance(tool, Mapping) else None
    if not call_id:
        return None
    try:
        messages = await client.messages(session_id, limit=5)
    except OpenCodeError:
        return None
    for message in messages:
        for part in message.get("parts") or []:
            if isinstance(part, dict) and part.get("callID") == call_id:
                state = part.get("state")
                value = state.get("input") if isinstance(state, dict) else None
                return value if isinstance(value, dict) else None
    return None


class Permissions:
    def __init__(
        self, client: OpenCodeClient, endpoint: OpenCodeEndpoint | None, ctx: TurnContext, reply: ReplyRecorder
    ) -> None:
        self.client = client
        self.endpoint = endpoint
        self.ctx = ctx
        self.reply = reply  # its node session is the one whose questions are answered
        self.answered: set[str] = set()

    async def listen(self, events: Any) -> None:
        async for event in events:
            if isinstance(event, NodeEvent) and event.type == "permission.asked":
                await self._answer(event.properties)

    async def poll(self, interval: float) -> None:
        while True:
            await anyio.sleep(interval)
            if self.reply.node_session_id is None:
                continue
            try:
                pending = await self.client.permissions()
            except OpenCodeError as exc:
                log.debug("listing pending permissions failed: %s", exc)
                continue
            for request in pending:
                await self._answer(request)

    async def _answer(self, request: Mapping[str, Any]) -> None:
        request_id, session_id = request.get("id"), self.reply.node_session_id
        if (
            not isinstance(request_id, str)
            or request_id in self.answered
            or session_id is None
            or request.get("sessionID") != session_id
        ):
            return
        self.answered.add(request_id)
        asked = str(request.get("permission") or "")
        name = self.reply.tool_name(asked)
        known = self.ctx.tools.get(name)
        arguments = await call_input(self.client, session_id, request.get("tool"))
        if known is not None and known.name == ACTIVATE:
            await activate_preset(self.client, self.endpoint, self.ctx, request_id, arguments)
            return
        risk = permission_risk(self.ctx.tools, known, arguments)
        reason = f"OpenCode asks to use {asked}"
        decision = await self.ctx.approvals.approve(risk, tool=name, arguments=arguments, reason=reason)
        await answer_permission(self.client, self.endpoint, request_id, known, name, decision)
