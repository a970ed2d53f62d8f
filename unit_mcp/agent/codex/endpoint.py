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

from ..endpoint import ApprovedEndpoint
from ..toolsurface import ToolOutput

if TYPE_CHECKING:
    from ..context import TurnContext


class TurnEndpoint(ApprovedEndpoint):
    def __init__(self, ctx: TurnContext, **options: Any) -> None:
        self.ctx = ctx
        super().__init__(ctx.tools, grants=ctx.approvals.grants(), **options)

    def tool_defs(self) -> list[types.Tool]:
        return self.surface.mcp_tool_defs(self.ctx.approvals.grants(), interactive=True)

    async def run_tool(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        return await self.surface.call(name, arguments, self.ctx)
