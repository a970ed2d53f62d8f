"""One session's approvals in one turn (`TurnApprovals`): the runner's policy, the session's grants, and every
non-automatic decision recorded as an item."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import tracing
from .approvals import GRANTS_KEY, AgentApprovals, ApprovalDecision, ApprovalRequest
from .items import EventItem
from .sessions import SessionStore
from .turns import TurnController


@dataclass
class TurnApprovals:
    """One session's approvals in one turn: the runner's policy, the session's grants, and the decisions
    recorded as items. A call answered before it ran (`answered`, in a resumed turn) takes that answer."""

    policy: AgentApprovals
    store: SessionStore
    session_id: str
    turn: TurnController
    answered: dict[str, ApprovalDecision] = field(default_factory=dict)  # by tool call id

    def grants(self) -> list[str]:
        """Risks the user granted for the rest of this session."""
        return list(self.store.require(self.session_id).data.get(GRANTS_KEY, []))

    async def approve(
        self,
        risk: str,
        *,
        tool: str | None = None,
        arguments: dict[str, Any] | None = None,
        reason: str | None = None,
        call_id: str | None = None,
    ) -> ApprovalDecision:
        """Ask for a risk (policy, grants, then the approver) and record every non-automatic decision as an
        item; a remembered grant is written into the session's data with it, so it survives a restart."""
        if call_id is not None and call_id in self.answered:
            return self.answered.pop(call_id)
        request = ApprovalRequest(
            risk=risk,
            tool=tool,
            arguments=arguments,
            reason=reason,
            session_id=self.session_id,
            turn_id=self.turn.id,
            call_id=call_id,
        )
        grants = self.grants()
        asking = self.policy.check_risk(risk, grants) == "needs-approval" and self.policy.approver is not None
        if asking:
            await self.turn.append_item(EventItem(kind="approval-requested", data=request.model_dump(mode="json")))
        if asking:  # a person's answer: the wait is a span of its own
            with tracing.span("approval wait", {"unit_mcp.risk": risk, "gen_ai.tool.name": tool}) as span:
                decision = await self.policy.request_risk(request, grants)
                tracing.set_attributes(
                    span,
                    unit_mcp__approval__decision="approved" if decision.approved else "denied",
                    unit_mcp__approval__by=decision.decided_by,
                )
        else:
            decision = await self.policy.request_risk(request, grants)
        if asking or not decision.approved:  # a remembered grant (only a person's answer gives one) is saved with it
            await self.turn.append_item(
                EventItem(
                    kind="approval-decided",
                    data={"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")},
                ),
                grant=risk if decision.approved and decision.remember else None,
            )
        return decision
