"""Permissions: OpenCode's `permission.asked` for an OpenCodeAgent turn's session, answered from the approvals.

The question goes to the turn's approvals, an approved call is admitted by the endpoint and OpenCode gets `once`
or `reject`; a question the event stream missed is found by polling, so nothing waits forever.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import anyio

from ..presets import ACTIVATE
from ..toolsurface import ToolOutput
from ._client import OpenCodeClient, PermissionReply
from ._endpoint import OpenCodeEndpoint
from ._errors import OpenCodeError
from ._event_stream import NodeEvent

if TYPE_CHECKING:
    from .._context import TurnContext
    from ._reply import ReplyRecorder

log = logging.getLogger("unit_mcp.agent.opencode.permissions")


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
        arguments = await self._call_input(session_id, request.get("tool"))
        if known is not None and known.name == ACTIVATE:
            await self._activate(request_id, arguments)
            return
        risk = self.ctx.tools.call_risk(known, arguments) if known is not None else "destructive"
        reason = f"OpenCode asks to use {asked}"
        decision = await self.ctx.approvals.approve(risk, tool=name, arguments=arguments, reason=reason)
        reply: PermissionReply = "reject"
        if decision.approved and known is not None and self.endpoint is not None:
            self.endpoint.view.admit(known.name)
            reply = "once"
        try:
            why = decision.reason or f"decided by {decision.decided_by}"
            await self.client.reply_permission(
                request_id, reply, None if reply != "reject" else f"{name} was not approved ({why})"
            )
        except OpenCodeError as exc:
            log.warning("answering OpenCode permission %s failed: %s", request_id, exc)

    async def _activate(self, request_id: str, arguments: dict[str, Any] | None) -> None:
        """Activate the preset the agent asks for as the turn's own `preset_activate` call: the turn's approvals
        decide (a preset above `normal` waits for the user) and the session records it; OpenCode's call then
        reports it (`OpenCodeView`). Without the call's arguments nothing is activated."""
        if arguments is None:
            output = ToolOutput(text=f"[invalid_argument] could not read which preset {ACTIVATE} names", is_error=True)
        else:
            output = await self.ctx.tools.call(ACTIVATE, arguments, self.ctx)
        try:
            if output.is_error:
                await self.client.reply_permission(request_id, "reject", output.text)
            else:
                await self.client.reply_permission(request_id, "once", None)
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
