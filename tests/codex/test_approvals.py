"""Asking the user from a Codex turn: Codex never asks, the turn's endpoint does, when a call arrives.

With an approver attached, tools whose risk is `ask` are offered to Codex; each call waits for the
approver, the request and the decision are session items, a remembered grant is kept in the session, and
a denial reaches the model as an error result while nothing reaches the unit server."""

from __future__ import annotations

from pathlib import Path

import pytest

from unit_mcp.agent import AgentApprovals, ApprovalDecision, ApprovalRequest, TurnStatus
from unit_mcp.agent.approvals import GRANTS_KEY
from unit_mcp.agent.items import EventItem, ToolCallItem, ToolResultItem
from unit_mcp.testing import Match, call, say, tool_call

from .codex_stack import TURN_TIMEOUT, codex_stack, reload

pytestmark = pytest.mark.anyio


async def test_the_approver_decides_each_askable_call_and_a_remembered_grant_sticks(
    tmp_path: Path, codex_binary: Path
) -> None:
    asked: list[tuple[str, str | None]] = []

    def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append((request.risk, request.tool))
        if request.risk == "filesystem-read":
            return ApprovalDecision(request_id=request.id, risk=request.risk, approved=True, remember=True)
        return ApprovalDecision(request_id=request.id, risk=request.risk, approved=False, reason="not today")

    steps = [
        call(
            tool_call("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"}),
            when=Match(last_role="user"),
        ),
        call(
            tool_call("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"}),
            when=Match(last_contains="counter"),
        ),
        call(
            tool_call(
                "unit_apply_patch", {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Hi"}
            ),
            when=Match(last_contains="greet"),
        ),
        say("The patch was not approved.", when=Match(last_contains="[approval_denied]")),
    ]
    async with codex_stack(tmp_path, codex_binary, steps, approvals=AgentApprovals(approver=approver)) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "Read two units, then patch greeter.")).wait(
            TURN_TIMEOUT
        )
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == "The patch was not approved."
        stack.model.assert_done()
        offered = stack.model.requests[0].tool_names
        assert {"unit_read_source", "unit_apply_patch", "echo_token"} <= set(offered)  # askable: offered

    assert asked == [("filesystem-read", "unit_read_source"), ("shell", "unit_apply_patch")]
    assert [name for name, _ in stack.server.calls] == ["unit_read_source", "unit_read_source"]
    reloaded = reload(tmp_path, session.id)
    assert reloaded.data[GRANTS_KEY] == ["filesystem-read"]  # remembered for the rest of the session
    decided = [i for i in reloaded.items if isinstance(i, EventItem) and i.kind == "approval-decided"]
    assert [(e.data["request"]["tool"], e.data["decision"]["approved"]) for e in decided] == [
        ("unit_read_source", True),
        ("unit_apply_patch", False),
    ]
    patch_call = next(i for i in reloaded.items if isinstance(i, ToolCallItem) and i.name == "unit_apply_patch")
    denied = next(i for i in reloaded.items if isinstance(i, ToolResultItem) and i.call_id == patch_call.call_id)
    assert denied.is_error and denied.output.startswith("[approval_denied] unit_apply_patch (risk: shell)")
    assert "not today" in denied.output and not denied.synthetic
    assert reloaded.items.index(decided[1]) < reloaded.items.index(denied)


async def test_without_an_approver_nothing_askable_is_offered(tmp_path: Path, codex_binary: Path) -> None:
    steps = [say("only normal tools here", when=Match(last_role="user"))]
    async with codex_stack(tmp_path, codex_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "What can you do?")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        offered = set(stack.model.requests[0].tool_names)
    assert {"echo_token", "unit_list", "unit_inspect"} <= offered
    assert not {"unit_read_source", "unit_apply_patch", "unit_run_tests", "unit_reload", "wipe_units"} & offered
