"""Delegation: an agent runs another registered agent in a child session linked from the parent by items.

The child session is a new one, an explicit id (created on first use, continued after), or, with `reuse`, the
latest earlier child of the same parent for that agent (so the delegate keeps its conversation). The child
records `parent_id`; the parent records `delegation-started` and `delegation-finished` events naming the
child. Cancelling the parent's turn cancels the child's. An agent resolves whom to delegate to through
`ctx.agents` (the registry, by id).
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
    ctx: TurnContext,
    agent_id: str,
    input: str,
    *,
    title: str | None = None,
    timeout: float | None = None,
    child_session_id: str | None = None,
    reuse: bool = False,
) -> TurnHandle:
    """Run `agent_id` on `input` in a child session and wait for its turn to end: a new child, the given
    `child_session_id`, or with `reuse` the latest earlier child of this session for that agent (new if none)."""
    if child_session_id is not None and reuse:
        raise ToolError("give a child_session_id or reuse=True, not both")
    if reuse:
        child_session_id = await anyio.to_thread.run_sync(earlier_child, ctx, agent_id)
    handle = await ctx.delegate(agent_id, input, title or f"delegated from {ctx.session_id}", child_session_id)
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


def earlier_child(ctx: TurnContext, agent_id: str) -> str | None:
    """The latest child session of this turn's session run by `agent_id`, or None."""
    children = [m for m in ctx.store.list() if m.parent_id == ctx.session_id and m.agent_id == agent_id]
    return max(children, key=lambda meta: meta.created_at).id if children else None


def delegation_tool(
    agent_id: str,
    *,
    name: str | None = None,
    description: str | None = None,
    risk: str = "normal",
    reuse: bool = False,
) -> LocalTool:
    """A local tool through which a model hands a task to another agent and gets its final answer; with `reuse`
    every call continues the same child session (the delegate remembers the earlier tasks)."""

    async def run(task: str, ctx: Any = None) -> str:
        if ctx is None:
            raise ToolError("delegation needs a running turn")
        handle = await delegate(ctx, agent_id, task, reuse=reuse)
        if handle.status is not TurnStatus.COMPLETED:
            raise ToolError(f"agent {agent_id} {handle.status}: {handle.error or 'no result'}")
        return handle.result or ""

    return LocalTool.from_function(
        run,
        name=name or f"delegate_to_{agent_id}",
        risk=risk,
        description=description or f"Hand a task to the {agent_id} agent and get its final answer.",
    )
