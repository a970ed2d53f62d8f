"""An OpenCode agent asks for a preset above `normal`: OpenCode asks before `preset_activate`, the turn puts the
request to its approvals (answered through the runner, as the page and the CLI do), and an approval activates
the preset and records it in the session; a denial activates nothing."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream

from unit_mcp.agent import AgentApprovals, ApprovalRequest, PendingApprovals, TurnStatus
from unit_mcp.agent.items import EventItem, ToolResultItem
from unit_mcp.agent.opencode import NodeEvent
from unit_mcp.agent.presets import Preset, PresetManager
from unit_mcp.testing import Match, call, say, tool_call

from .opencode_stack import TURN_TIMEOUT, Stack, agent_stack, oc

pytestmark = pytest.mark.anyio

ASK = {"name": "read", "reason": "to read the greeter"}
READ = {"unit_id": "greeter", "source_id": "greeter.py"}


def presets() -> PresetManager:
    return PresetManager(
        [
            Preset(name="look", tools=["echo_token"], active=True),
            Preset(name="read", description="Read unit sources.", tools=["unit_read_source"]),
        ]
    )


def steps() -> list:  # type: ignore[type-arg]
    return [
        call(tool_call(oc("preset_activate"), ASK), when=Match(last_role="user", has_tools=True)),
        call(
            tool_call(oc("unit_read_source"), READ),
            when=Match(last_role="tool", tools_offered=[oc("unit_read_source")]),
        ),
        say("finished", when=Match(last_role="tool")),
    ]


async def answer_next(stack: Stack, session_id: str, approved: bool, after: str | None = None) -> ApprovalRequest:
    """Answer the next approval the turn waits for (not `after`, already answered), through the runner, as the
    page and the CLI do."""
    with anyio.fail_after(TURN_TIMEOUT):
        while not (pending := [r for r in await stack.runner.pending_approvals(session_id) if r.id != after]):
            await anyio.sleep(0.05)
    [request] = pending
    await stack.runner.answer_approval(session_id, request.id, approved=approved)
    return request


def event_kinds(events: MemoryObjectReceiveStream[NodeEvent]) -> list[str]:
    """The types of the node's events received so far."""
    kinds = []
    while True:
        try:
            kinds.append(events.receive_nowait().type)
        except anyio.WouldBlock:
            return kinds


async def ask_and_answer(stack: Stack, approved: bool) -> str:
    session = await stack.new_session()
    handle = await stack.runner.run_turn(session.id, "Read the greeter.")
    assert stack.surface.presets is not None and not stack.surface.presets.is_active("read")
    request = await answer_next(stack, session.id, approved)
    assert (request.tool, request.risk, request.arguments) == ("preset_activate", "filesystem-read", ASK)
    if approved:  # the preset's tool is offered now, still asked for per call by the policy
        request = await answer_next(stack, session.id, True, after=request.id)
        assert (request.tool, request.risk, request.arguments) == ("unit_read_source", "filesystem-read", READ)
    done = await handle.wait(TURN_TIMEOUT)
    assert done.status is TurnStatus.COMPLETED, done.error
    return session.id


async def test_an_approved_preset_request_activates_the_preset_in_the_session(
    tmp_path: Path, opencode_binary: Path
) -> None:
    approvals = AgentApprovals({"filesystem-read": "ask"}, approver=PendingApprovals())
    async with agent_stack(tmp_path, opencode_binary, steps(), approvals=approvals, presets=presets()) as stack:
        assert "preset_activate" in stack.node.endpoint.view.askable()
        async with stack.node.client.events.listen() as events:
            session_id = await ask_and_answer(stack, approved=True)
            kinds = event_kinds(events)
        assert stack.surface.presets.is_active("read")  # type: ignore[union-attr]
    # OpenCode heard the yes only once its node had the new tool list (else its next step could miss the tools)
    assert kinds.index("mcp.tools.changed") < kinds.index("permission.replied"), kinds

    items = stack.reload(session_id).items
    events = [i for i in items if isinstance(i, EventItem)]
    kinds = [i.kind for i in events]
    assert kinds.index("approval-requested") < kinds.index("approval-decided") < kinds.index("preset-activated")
    [activated] = [i for i in events if i.kind == "preset-activated"]
    assert activated.data["name"] == "read" and activated.data["reason"] == ASK["reason"]
    results = {i.name: i for i in items if isinstance(i, ToolResultItem)}
    assert not results["preset_activate"].is_error and "preset read is active" in results["preset_activate"].output
    assert any(oc("unit_read_source") in r.tool_names for r in stack.model.requests if r.tool_names), (
        "the next step is offered the preset's tool"
    )
    read = results["unit_read_source"]
    assert not read.is_error and json.loads(read.output)["source_id"] == "greeter.py"


async def test_a_denied_preset_request_activates_nothing(tmp_path: Path, opencode_binary: Path) -> None:
    approvals = AgentApprovals({"filesystem-read": "ask"}, approver=PendingApprovals())
    async with agent_stack(tmp_path, opencode_binary, steps(), approvals=approvals, presets=presets()) as stack:
        session_id = await ask_and_answer(stack, approved=False)
        assert not stack.surface.presets.is_active("read")  # type: ignore[union-attr]
        assert all(oc("unit_read_source") not in r.tool_names for r in stack.model.requests)

    items = stack.reload(session_id).items
    assert not [i for i in items if isinstance(i, EventItem) and i.kind == "preset-activated"]
    [result] = [i for i in items if isinstance(i, ToolResultItem)]
    assert result.name == "preset_activate" and result.is_error
