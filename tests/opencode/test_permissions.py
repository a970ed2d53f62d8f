"""An `ask` policy in server mode: OpenCode's `permission.asked` is answered from AgentApprovals.

With an approver attached, a filesystem-read tool is listed by the endpoint, OpenCode is told (per
session) to ask before each call, OpenCodeAgent puts the question to the approver and answers OpenCode; an
approval admits exactly that one call at the endpoint, a denial reaches OpenCode as a rejection. Nothing
hangs: a turn ends either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unit_mcp.agent import AgentApprovals, ApprovalRequest, TurnStatus
from unit_mcp.agent.items import EventItem, ToolResultItem
from unit_mcp.testing import Match, call, say, tool_call

from .opencode_stack import TURN_TIMEOUT, agent_stack, oc

pytestmark = pytest.mark.anyio

READ = {"unit_id": "greeter", "source_id": "greeter.py"}


def steps() -> list:  # type: ignore[type-arg]
    return [
        call(tool_call(oc("unit_read_source"), READ), when=Match(last_role="user", has_tools=True)),
        say("finished", when=Match(last_role="tool")),
    ]


async def test_approved_permission_runs_the_tool_once(tmp_path: Path, opencode_binary: Path) -> None:
    asked: list[ApprovalRequest] = []

    def approve(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    approvals = AgentApprovals({"filesystem-read": "ask"}, approver=approve)
    async with agent_stack(tmp_path, opencode_binary, steps(), approvals=approvals) as stack:
        endpoint = stack.node.endpoint
        assert "unit_read_source" in endpoint.view.askable() and "unit_apply_patch" in endpoint.view.askable()
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "Read the greeter.")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert all(oc("unit_read_source") in r.tool_names for r in stack.model.requests if r.tool_names)
        assert endpoint.view.admitted["unit_read_source"] == 0  # the one admission was used

    assert [(r.risk, r.tool, r.arguments) for r in asked] == [("filesystem-read", "unit_read_source", READ)]
    items = stack.reload(session.id).items
    [result] = [i for i in items if isinstance(i, ToolResultItem)]
    assert not result.is_error and json.loads(result.output)["source_id"] == "greeter.py"
    kinds = [i.kind for i in items if isinstance(i, EventItem)]
    assert "approval-requested" in kinds and "approval-decided" in kinds


async def test_denied_permission_is_rejected_and_the_turn_ends(tmp_path: Path, opencode_binary: Path) -> None:
    approvals = AgentApprovals({"filesystem-read": "ask"}, approver=lambda request: False)
    async with agent_stack(tmp_path, opencode_binary, steps(), approvals=approvals) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "Read the greeter.")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == "finished"  # OpenCode told the model, which answered; nothing hung

    reloaded = stack.reload(session.id)
    [result] = [i for i in reloaded.items if isinstance(i, ToolResultItem)]
    assert result.name == "unit_read_source" and result.is_error and "rejected" in result.output
    assert reloaded.open_tool_calls() == []
    decided = [i for i in reloaded.items if isinstance(i, EventItem) and i.kind == "approval-decided"]
    assert decided and decided[0].data["decision"]["approved"] is False
