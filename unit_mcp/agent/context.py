"""The agent contract: `Agent.run(input, session, ctx)` drives one turn, reporting only through `ctx`.

`TurnContext` is what the runner hands an agent on every turn: the turn controller, the shared tool
surface, approvals and agent registry, the session's inbox, and the runner's deps. Required services are
checked when the context is built, so a misconfigured runner fails loudly instead of mid-turn.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import anyio

from .approvals import GRANTS_KEY, ApprovalDecision, ApprovalRequest, normalise_risk
from .errors import AgentError
from .inbox import Inbox
from .items import EventItem, Session
from .sessions import SessionStore
from .turns import TurnCallbacks, TurnController

if TYPE_CHECKING:
    from .approvals import AgentApprovals
    from .presets import PresetInfo
    from .registry import AgentRegistry
    from .runner import AgentRunner
    from .toolsurface import AgentToolSurface, ToolDef, ToolOutput


@runtime_checkable
class Agent(Protocol):
    """A runtime object built by a factory. `run` drives the turn and ends it with `ctx.turn.finish/fail`."""

    id: str
    name: str

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None: ...


@dataclass
class TurnContext:
    session_id: str
    turn: TurnController
    tools: AgentToolSurface
    approvals: AgentApprovals
    agents: AgentRegistry
    inbox: Inbox
    store: SessionStore
    runner: AgentRunner
    data_dir: Path
    deps: Mapping[str, Any] = field(default_factory=dict)
    callbacks: TurnCallbacks = field(default_factory=TurnCallbacks)
    answered: dict[str, ApprovalDecision] = field(default_factory=dict)  # by tool call id, in a resumed turn

    def __post_init__(self) -> None:
        for name in ("turn", "tools", "approvals", "agents", "inbox", "store", "runner"):
            if getattr(self, name) is None:
                raise AgentError(f"the turn context needs {name!r}; give the runner one")

    @property
    def session(self) -> Session:
        return self.store.require(self.session_id)

    def grants(self) -> list[str]:
        """Risks the user granted for the rest of this session."""
        return list(self.session.data.get(GRANTS_KEY, []))

    def visible_tools(self) -> list[ToolDef]:
        return self.tools.visible(self.grants(), interactive=True)

    @property
    def presets(self) -> list[PresetInfo]:
        """The active capability presets (their tools and highest risk); empty when the surface has none."""
        return self.tools.preset_infos(active_only=True)

    async def activate_preset(self, name: str) -> ToolOutput:
        """Activate a preset as the `preset_activate` tool does: above `normal` risk it is an approval request
        (recorded, answerable through the runner), and the change is a session item. An error output says why not."""
        from .presets import ACTIVATE

        return await self.tools.call(ACTIVATE, {"name": name}, self)

    async def deactivate_preset(self, name: str) -> ToolOutput:
        from .presets import DEACTIVATE

        return await self.tools.call(DEACTIVATE, {"name": name}, self)

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
        item; a remembered grant is written into the session's data so it survives a restart. A call answered
        before it ran (`answered`, in a resumed turn) takes that answer; it was recorded when it was given."""
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
        asking = self.approvals.check_risk(risk, grants) == "needs-approval" and self.approvals.approver is not None
        if asking:
            await self.turn.append_item(EventItem(kind="approval-requested", data=request.model_dump(mode="json")))
        decision = await self.approvals.request_risk(request, grants)
        if asking or not decision.approved:
            await self.turn.append_item(
                EventItem(
                    kind="approval-decided",
                    data={"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")},
                )
            )
        if decision.approved and decision.remember:
            granted = sorted({*grants, normalise_risk(risk)})
            data = {**self.session.data, GRANTS_KEY: granted}
            await anyio.to_thread.run_sync(lambda: self.store.update(self.session_id, data=data))
        return decision
