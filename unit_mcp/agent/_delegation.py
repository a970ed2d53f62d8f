"""Delegation: an agent runs another registered agent in a child session linked from the parent by items.

The child session records `parent_id`; the parent records `delegation-started` and `delegation-finished`
events naming the child. Cancelling the parent's turn cancels the child's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from .errors import ToolError
from .items import EventItem
from .toolsurface import LocalTool
from .turns import TurnHandle, TurnStatus

if TYPE_CHECKING:
    from ._context import TurnContext


async def delegate(
    ctx: TurnContext, agent_id: str, input: str, *, title: str | None = None, timeout: float | None = None
) -> TurnHandle:
    """Run `agent_id` on `input` in a new child session and wait for its turn to end."""
    handle = await ctx.delegate(agent_id, input, title or f"delegated from {ctx.session_id}")
    started = {"child_session_id": handle.session_id, "agent_id": agent_id, "input": input}
    try:
        await ctx.turn.append_item(EventItem(kind="delegation-started", data=started))
        await handle.wait(timeout)
    except BaseException:
        with anyio.CancelScope(shield=True):
            await handle.cancel(f"the delegating turn {ctx.turn.id} stopped waiting")
        raise
    await ctx.turn.append_item(
        EventItem(
            kind="delegation-finished",
            data={
                "child_session_id": handle.session_id,
                "agent_id": agent_id,
                "status": str(handle.status),
                "result": handle.result,
                "error": handle.error,
            },
        )
    )
    return handle


def delegation_tool(
    agent_id: str, *, name: str | None = None, description: str | None = None, risk: str = "normal"
) -> LocalTool:
    """A local tool through which a model hands a task to another agent and gets its final answer."""

    async def run(task: str, ctx: Any = None) -> str:
        if ctx is None:
            raise ToolError("delegation needs a running turn")
        handle = await delegate(ctx, agent_id, task)
        if handle.status is not TurnStatus.COMPLETED:
            raise ToolError(f"agent {agent_id} {handle.status}: {handle.error or 'no result'}")
        return handle.result or ""

    return LocalTool.from_function(
        run,
        name=name or f"delegate_to_{agent_id}",
        risk=risk,
        description=description or f"Hand a task to the {agent_id} agent and get its final answer.",
    )
