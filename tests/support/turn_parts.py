"""What a test needs to drive one turn by hand, as a provider does inside a runner: a `TurnContext` made as the
runner makes one, and `TurnRecorder`, the recorder every provider writes its turn with. Both are the runner's
internals (`unit_mcp.agent` exports `TurnContext` as agents receive it): tests reach them here only."""

from __future__ import annotations

from unit_mcp.agent import AgentApprovals, AgentError, AgentRegistry, AgentToolSurface, TurnContext, TurnHandle
from unit_mcp.agent._inbox import Inbox
from unit_mcp.agent._recorder import TurnRecorder
from unit_mcp.agent._turnapprovals import TurnApprovals
from unit_mcp.agent.sessions import SessionStore
from unit_mcp.agent.turns import Turn

__all__ = ["TurnRecorder", "turn_context"]


async def _no_delegation(*_: object) -> TurnHandle:
    raise AgentError("this turn delegates nothing")


def turn_context(turn: Turn, store: SessionStore, approvals: AgentApprovals, agents: AgentRegistry) -> TurnContext:
    """The context the runner would hand an agent for `turn`: the policy's approvals for its session, an empty
    inbox, a tool surface with no tools; it delegates nothing."""
    return TurnContext(
        session_id=turn.session_id,
        turn=turn.controller,
        tools=AgentToolSurface(approvals),
        approvals=TurnApprovals(approvals, store, turn.session_id, turn.controller),
        inbox=Inbox(),
        store=store,
        delegate=_no_delegation,
        agents=agents,
    )
