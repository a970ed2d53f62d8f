"""Property: whatever state each tool call of a turn was in when its process ended, and in whatever order and
with whatever answers the approvals are given afterwards, a tool runs only after an approval given for it,
at most once, never again after it may have run, and the turn resumes exactly when its last request is
answered.

Each example writes the first life's journal with a real `SessionStore` (the turn left running), then a real
`AgentRunner` on the same folder loads it (the load-time repair), lists and answers the requests.
"""

from __future__ import annotations

import json
import tempfile
import threading
from pathlib import Path
from typing import Literal

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unit_mcp.agent import (
    AgentApprovals,
    AgentError,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    ApprovalDecision,
    ApprovalRequest,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    PendingApprovals,
    SessionStore,
    TurnContext,
    TurnStatus,
)
from unit_mcp.agent.errors import UnknownApproval
from unit_mcp.agent.items import EventItem, MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.paused import RESUMED_OUTPUT

# What each call of the first life's turn had reached when the process ended:
# ran by policy, no approval needed | asked, answered and ran | asked, answered, running when it ended |
# asked and waiting for the answer.
Fate = Literal["policy", "answered-ran", "answered-running", "waiting"]
FATES: list[Fate] = ["policy", "answered-ran", "answered-running", "waiting"]
TURN = "turn-first"


def first_life(root: Path, fates: list[Fate]) -> str:
    store = SessionStore(root, durability="never")
    try:
        session_id = store.create("f").id
        store.update(session_id, status="running")
        store.append_item(session_id, EventItem(kind="turn-started", data={"turn_id": TURN}, turn_id=TURN))
        store.append_item(session_id, MessageItem(role="user", content="deploy", turn_id=TURN))
        for n, fate in enumerate(fates):
            call_id = f"call-{n}"
            arguments = json.dumps({"n": n})
            store.append_item(
                session_id,
                ToolCallItem(name="deploy", call_id=call_id, arguments=arguments, risk="shell", turn_id=TURN),
            )
            if fate != "policy":
                request = ApprovalRequest(
                    risk="shell", tool="deploy", arguments={"n": n}, session_id=session_id, turn_id=TURN
                ).model_copy(update={"call_id": call_id})
                store.append_item(
                    session_id,
                    EventItem(kind="approval-requested", data=request.model_dump(mode="json"), turn_id=TURN),
                )
                if fate != "waiting":
                    decision = ApprovalDecision(request_id=request.id, risk="shell", approved=True)
                    data = {"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}
                    store.append_item(session_id, EventItem(kind="approval-decided", data=data, turn_id=TURN))
            if fate in ("policy", "answered-ran"):
                store.append_item(
                    session_id, ToolResultItem(name="deploy", call_id=call_id, output=f"ran {n}", turn_id=TURN)
                )
        return session_id
    finally:
        store.close()  # the process ends here, its turn still running


def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
    return "resumed: " + " | ".join(m["content"] for m in request.messages if m["role"] == "tool")


async def second_life(
    root: Path, session_id: str, fates: list[Fate], answers: list[tuple[int, bool]]
) -> tuple[set[int], set[int]]:
    """Answer as `answers` says (a call index, approve?); the calls answered and those approved."""
    ran: list[int] = []
    surface = AgentToolSurface(AgentApprovals(approver=PendingApprovals()))

    @surface.tool(risk="shell")
    def deploy(n: int) -> str:
        ran.append(n)
        return f"ran {n} again"

    registry = AgentRegistry()
    registry.register("f", lambda deps: FunctionAgent(model, id="f"))
    waiting = [n for n, fate in enumerate(fates) if fate == "waiting"]
    async with AgentRunner(store=root, registry=registry, tools=surface) as runner:
        pending = await runner.pending_approvals(session_id)
        assert [r.call_id for r in pending] == [f"call-{n}" for n in waiting]  # only the calls that waited
        by_call = {int((r.call_id or "").split("-")[1]): r.id for r in pending}
        approved: set[int] = set()
        answered: set[int] = set()
        for choice, approve in answers:
            n = sorted(by_call)[choice % len(by_call)] if by_call else choice
            request_id = by_call.get(n, f"apr-unknown-{n}")
            if n in answered or n not in by_call:
                try:
                    await runner.answer_approval(session_id, request_id, approved=approve)
                except UnknownApproval as exc:
                    assert "no pending approval" in str(exc)
                else:
                    raise AssertionError(f"request of call {n} answered twice or unknown, and accepted")
                continue
            handle = (await runner.answer_approval(session_id, request_id, approved=approve)).handle
            answered.add(n)
            if approve:
                approved.add(n)
            if answered != set(waiting):
                assert handle is None, "the turn resumed before all its requests were answered"
                assert ran == [], "nothing runs before the turn resumes"
                continue
            assert handle is not None, "the last answer resumes the turn"
            await handle.wait(10)
            assert handle.status is TurnStatus.COMPLETED, handle.error
            assert handle.result is not None and handle.result.startswith("resumed: ")
        assert sorted(ran) == sorted(approved) if answered == set(waiting) else ran == []
        left = {r.call_id for r in await runner.pending_approvals(session_id)}
        assert left == {f"call-{n}" for n in set(waiting) - answered}
    return answered, approved


def check_results(root: Path, session_id: str, fates: list[Fate], answered: set[int], approved: set[int]) -> None:
    resumed = answered == {n for n, fate in enumerate(fates) if fate == "waiting"}
    store = SessionStore(root)
    try:
        outputs = {
            item.call_id: item.output for item in store.require(session_id).items if isinstance(item, ToolResultItem)
        }
    finally:
        store.close()
    for n, fate in enumerate(fates):
        output = outputs[f"call-{n}"]
        if fate in ("policy", "answered-ran"):
            assert output == f"ran {n}"
        elif fate == "answered-running" or not resumed:
            assert output.startswith("[interrupted]"), "a call that may have run, or not resumed yet, is left alone"
        elif n in approved:
            assert output == f"ran {n} again"
        else:
            assert output.startswith("[approval_denied]")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    fates=st.lists(st.sampled_from(FATES), min_size=1, max_size=4),
    answers=st.lists(st.tuples(st.integers(0, 5), st.booleans()), max_size=6),
)
def test_after_a_restart_tools_run_only_when_approved_and_at_most_once(
    fates: list[Fate], answers: list[tuple[int, bool]]
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        session_id = first_life(root, fates)
        answered, approved = anyio.run(second_life, root, session_id, fates, answers)
        check_results(root, session_id, fates, answered, approved)


@pytest.mark.anyio
async def test_a_resumed_turn_cancelled_while_the_tool_runs_never_runs_it_again(tmp_path: Path) -> None:
    session_id = first_life(tmp_path, ["waiting"])
    started, release, runs = threading.Event(), threading.Event(), []
    surface = AgentToolSurface(AgentApprovals(approver=PendingApprovals()))

    @surface.tool(risk="shell")
    def deploy(n: int) -> str:
        runs.append(n)
        started.set()
        release.wait(10)
        return "finished late"

    registry = AgentRegistry()
    registry.register("f", lambda deps: FunctionAgent(model, id="f"))
    async with AgentRunner(store=tmp_path, registry=registry, tools=surface) as runner:
        (request,) = await runner.pending_approvals(session_id)
        with pytest.raises(AgentError, match=f"still waits for answers to {request.id}"):
            await runner.resume_turn(session_id, TURN)
        handle = (await runner.answer_approval(session_id, request.id, approved=True)).handle
        assert handle is not None
        assert await anyio.to_thread.run_sync(started.wait, 10)
        assert await handle.cancel("changed my mind")
        release.set()
        assert handle.status is TurnStatus.CANCELLED
        with pytest.raises(AgentError, match="no call waiting to be resumed"):
            await runner.resume_turn(session_id, TURN)  # it may have run: never again
        assert await runner.pending_approvals(session_id) == []
    assert runs == [0]
    store = SessionStore(tmp_path)
    try:
        (result,) = [i for i in store.require(session_id).items if isinstance(i, ToolResultItem)]
    finally:
        store.close()
    assert result.output == RESUMED_OUTPUT
