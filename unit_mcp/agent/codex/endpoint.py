"""TurnEndpoint: the approval-filtered endpoint of one Codex turn, which asks the user when the policy says so.

Codex itself never asks (`approval_policy = "never"` and every tool of the endpoint approved in its
config): asking happens here, where the call arrives. The endpoint offers what the policy and the
session's grants allow, plus, while an approver is attached, the tools whose risk is `ask`; a call of
one of those waits for the approver through the turn, so the request and the decision are session items
and a grant the user asks to remember is stored in the session (later calls, and later turns, do not ask
again). A denial is an error result Codex hands back to the model; without an approver nothing askable is
offered, and a call of a tool that is not offered is refused: the endpoint fails closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.context import ServerRequestContext

from ..endpoint import ApprovedEndpoint
from ..errors import ToolFailed

if TYPE_CHECKING:
    from ..context import TurnContext


class TurnEndpoint(ApprovedEndpoint):
    def __init__(self, ctx: TurnContext, **options: Any) -> None:
        self.ctx = ctx
        super().__init__(ctx.tools, grants=ctx.approvals.grants(), **options)

    def tool_defs(self) -> list[types.Tool]:
        return self.surface.mcp_tool_defs(self.ctx.approvals.grants(), interactive=True)

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        if params.name not in {tool.name for tool in self.tool_defs()}:
            return _error(f"[not_available] {params.name} is not an approved tool.")
        try:
            output = await self.surface.call(params.name, dict(params.arguments or {}), self.ctx)
        except ToolFailed as exc:
            return _error(str(exc))
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=output.text)],
            structured_content=output.structured,
            is_error=output.is_error,
        )


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)
