"""TurnRecorder, the one recorder every agent writes its turn with: a tool call is opened and closed once
(a repeated report is ignored), streamed text becomes one message per provider message, made final in place,
and text nothing confirmed is labelled. Through a real runner and session store, read back from disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.turn_parts import TurnRecorder

from unit_mcp.agent import AgentApprovals, AgentToolSurface, TurnContext, TurnStatus
from unit_mcp.agent.items import MessageItem, Session, ToolCallItem, ToolResultItem
from unit_mcp.agent.toolsurface import ToolOutput

from .conftest import reload, running

pytestmark = pytest.mark.anyio


class Reporting:
    """A provider that reports every call and message twice, as a stream and then as a read-back would."""

    id = name = "reporting"

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
        recorder = TurnRecorder(ctx.turn, ctx.tools, provider="prov")
        assert await recorder.open_call("c1", "work", '{"n": 1}') is not None
        assert await recorder.open_call("c1", "work", '{"n": 1}') is None
        await recorder.close_call("c1", ToolOutput(text="done", structured={"n": 1}))
        await recorder.close_call("c1", ToolOutput(text="again"))
        await recorder.close_call("never-opened", ToolOutput(text="stray"))
        await recorder.stream("m1", "Hel")
        await recorder.stream("m1", "Hello")
        await recorder.stream("m2", "half a thought")
        await recorder.put_message(MessageItem(role="assistant", content="Hello!", provider="prov"), "m1")
        await recorder.put_message(MessageItem(role="assistant", content="not streamed", provider="prov"), "m3")
        await recorder.close_partials("interrupted")
        await ctx.turn.finish("Hello!")


async def test_calls_once_messages_in_place_unconfirmed_text_labelled(tmp_path: Path) -> None:
    surface = AgentToolSurface(AgentApprovals())
    surface.tool(lambda n: str(n), name="work", risk="shell")
    async with running(tmp_path, {"reporting": lambda deps: Reporting()}, surface=surface) as runner:
        session = await runner.create_session("reporting")
        handle = await runner.run_turn(session.id, "go")
        await handle.wait(30)
        assert handle.status is TurnStatus.COMPLETED, handle.error
    items = reload(tmp_path, session.id).items
    calls = [item for item in items if isinstance(item, ToolCallItem)]
    results = [item for item in items if isinstance(item, ToolResultItem)]
    assert [(c.call_id, c.risk, c.provider, c.source) for c in calls] == [("c1", "shell", "prov", "local")]
    assert [(r.call_id, r.output, r.structured, r.parent_id) for r in results] == [
        ("c1", "done", {"n": 1}, calls[0].id)
    ]
    said = [(m.content, m.kind, m.partial) for m in items if isinstance(m, MessageItem) and m.role == "assistant"]
    assert said == [("Hello!", None, False), ("half a thought", "interrupted", False), ("not streamed", None, False)]
