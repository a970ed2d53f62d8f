"""AgentApprovals: the policy per risk, the approver, fail-closed behaviour, recorded decisions and grants."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from unit_mcp.agent import (
    AgentApprovals,
    AgentToolSurface,
    ApprovalDecision,
    ApprovalRequest,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    TurnContext,
    TurnStatus,
)
from unit_mcp.agent.approvals import GRANTS_KEY
from unit_mcp.agent.items import EventItem, ToolResultItem

from .conftest import reload, running

pytestmark = pytest.mark.anyio


def test_default_policy_only_normal_is_automatic() -> None:
    approvals = AgentApprovals()
    assert approvals.check_risk("normal") == "approved"
    for risk in ("filesystem-read", "filesystem-write", "shell", "destructive"):
        assert approvals.check_risk(risk) == "needs-approval"
        assert approvals.check_risk(risk, grants=[risk]) == "approved"
    assert approvals.check_risk("made-up") == "needs-approval"  # unknown risks are treated as destructive
    assert approvals.check_risk(None) == "needs-approval"


def test_policy_can_be_auto_ask_or_deny_and_tells_listeners() -> None:
    approvals = AgentApprovals({"shell": "auto", "destructive": "deny"})
    changes: list[str] = []
    unsubscribe = approvals.on_change(lambda: changes.append("changed"))
    assert approvals.check_risk("shell") == "approved"
    assert approvals.check_risk("destructive", grants=["destructive"]) == "denied"
    approvals.set_policy("shell", "ask")
    approvals.set_policy("shell", "ask")  # no change, no notification
    unsubscribe()
    approvals.set_policy("normal", "deny")
    assert changes == ["changed"]
    with pytest.raises(ValueError, match="unknown risk"):
        approvals.set_policy("root", "auto")
    with pytest.raises(ValueError, match="unknown approval mode"):
        approvals.set_policy("shell", "maybe")  # type: ignore[arg-type]


def test_a_failing_listener_is_logged_and_the_others_still_hear_the_change(caplog: pytest.LogCaptureFixture) -> None:
    approvals = AgentApprovals()
    heard: list[str] = []

    def broken() -> None:
        raise RuntimeError("listener bug")

    approvals.on_change(broken)
    approvals.on_change(lambda: heard.append("second"))
    approvals.set_policy("shell", "auto")  # does not raise
    assert heard == ["second"] and approvals.mode("shell") == "auto"
    assert "approval policy listener failed" in caplog.text and "listener bug" in caplog.text


async def test_an_ask_without_an_approver_is_a_denial_not_a_wait() -> None:
    approvals = AgentApprovals()
    with anyio.fail_after(1):
        decision = await approvals.request_risk(ApprovalRequest(risk="shell", tool="unit_run_tests"))
    assert not decision.approved and decision.decided_by == "no-approver"


async def test_the_approver_decides_and_failures_deny() -> None:
    asked: list[ApprovalRequest] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision(request_id="ignored", risk="ignored", approved=request.tool == "ok", remember=True)

    approvals = AgentApprovals(approver=approver)
    yes = await approvals.request_risk(ApprovalRequest(risk="shell", tool="ok"))
    no = await approvals.request_risk(ApprovalRequest(risk="shell", tool="other"))
    assert (yes.approved, yes.remember, yes.request_id, yes.risk) == (True, True, asked[0].id, "shell")
    assert not no.approved

    async def broken(request: ApprovalRequest) -> bool:
        raise RuntimeError("terminal closed")

    approvals.attach(broken)
    failed = await approvals.request_risk(ApprovalRequest(risk="shell"))
    assert not failed.approved and failed.decided_by == "approver-failed" and "terminal closed" in (failed.reason or "")

    approvals.attach(lambda request: True)
    assert (await approvals.request_risk(ApprovalRequest(risk="shell"))).approved
    assert (await approvals.request_risk(ApprovalRequest(risk="normal"))).decided_by == "policy"


async def test_high_risk_tools_are_neither_offered_nor_run_without_approval(tmp_path: Path) -> None:
    ran: list[str] = []
    surface = AgentToolSurface(AgentApprovals())

    @surface.tool(risk="destructive")
    def wipe() -> str:
        ran.append("wipe")
        return "wiped"

    @surface.tool
    def look() -> str:
        return "fine"

    offered: list[list[str]] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        offered.append([tool["function"]["name"] for tool in request.tools])
        if request.step == 1:
            return ModelResponse.calling(("wipe", {}))
        return "could not wipe"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}, surface=surface) as runner:
        session = await runner.create_session("f")
        handle = await (await runner.run_turn(session.id, "wipe it")).wait(5)
        assert handle.status is TurnStatus.COMPLETED
    assert ran == [] and offered[0] == ["look"]
    items = reload(tmp_path, session.id).items
    result = next(i for i in items if isinstance(i, ToolResultItem))
    assert result.is_error and result.output.startswith("[approval_denied] wipe (risk: destructive)")
    decided = next(i for i in items if isinstance(i, EventItem) and i.kind == "approval-decided")
    assert decided.data["decision"]["decided_by"] == "no-approver" and decided.data["request"]["tool"] == "wipe"


async def test_decisions_are_recorded_and_remembered_grants_survive_a_restart(tmp_path: Path) -> None:
    answers = iter([ApprovalDecision(request_id="", risk="", approved=True, remember=True)])
    asked: list[str] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request.tool or "")
        return next(answers)

    surface = AgentToolSurface(AgentApprovals(approver=approver))

    @surface.tool(risk="shell")
    def run_tests() -> str:
        return "passed"

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        return ModelResponse.calling(("run_tests", {})) if request.messages[-1]["role"] == "user" else "ok"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}, surface=surface) as runner:
        session = await runner.create_session("f")
        await (await runner.run_turn(session.id, "test")).wait(5)
        await (await runner.run_turn(session.id, "test again")).wait(5)  # the grant answers; nobody is asked
    assert asked == ["run_tests"]

    restored = reload(tmp_path, session.id)
    assert restored.data[GRANTS_KEY] == ["shell"]
    events = [i.kind for i in restored.items if isinstance(i, EventItem) and i.kind.startswith("approval")]
    assert events == ["approval-requested", "approval-decided"]
    outputs = [i.output for i in restored.items if isinstance(i, ToolResultItem)]
    assert outputs == ["passed", "passed"]
