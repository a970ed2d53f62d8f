"""A turn paused for approval survives its process: the app is killed (SIGKILL) while a call waits for an answer,
a new process loads the session, lists the request, and answering it resumes the turn where it stopped.

The app is one module (`APP`), run as a real subprocess until it waits, then imported by the test for the
second life, so both lives build the same runner, tool and scripted model.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import anyio
import pytest
from support.item_kinds import item_kinds

from unit_mcp.agent import (
    AgentApprovals,
    AgentError,
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
    TurnHandle,
    TurnStatus,
)
from unit_mcp.agent.approvals import GRANTS_KEY
from unit_mcp.agent.items import EventItem, ToolResultItem
from unit_mcp.agent.paused import paused_calls, pending_requests
from unit_mcp.agent.projections import chat_messages

from .conftest import reload, running

pytestmark = pytest.mark.anyio

SESSION = "ses-paused"
APP = r'''
import os, sys
from pathlib import Path

import anyio

from unit_mcp.agent import (
    AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, FunctionAgent, ModelResponse, PendingApprovals,
)


def build(root, calls):
    """The app: one shell-risk tool that leaves a trace, a model that calls it `calls` times then reports."""
    approver = PendingApprovals()
    surface = AgentToolSurface(AgentApprovals(approver=approver))

    @surface.tool(risk="shell")
    def deploy(target: str) -> str:
        with (root / "deployed.txt").open("a") as out:
            out.write(target + "\n")
        return f"deployed {target}"

    def model(request, ctx):
        if request.messages[-1]["role"] == "user":
            return ModelResponse.calling(*[("deploy", {"target": f"t{n}"}) for n in range(calls)])
        return "done: " + " | ".join(m["content"] for m in request.messages if m["role"] == "tool")

    registry = AgentRegistry()
    registry.register("deployer", lambda deps: FunctionAgent(model, id="deployer"))
    return AgentRunner(store=root / "sessions", registry=registry, tools=surface), approver


async def first_life(root, calls):
    runner, approver = build(root, calls)
    async with runner:
        await runner.create_session("deployer", session_id="ses-paused")
        await runner.run_turn("ses-paused", "deploy please")
        while len(approver.pending()) < calls:
            await anyio.sleep(0.01)
        os.write(1, ("waiting " + " ".join(r.id for r in approver.pending()) + "\n").encode())
        await anyio.sleep(120)  # killed here


if __name__ == "__main__":
    anyio.run(first_life, Path(sys.argv[1]), int(sys.argv[2]))
'''


def app(root: Path) -> ModuleType:
    path = root / "paused_app.py"
    path.write_text(APP)
    spec = importlib.util.spec_from_file_location(f"paused_app_{os.getpid()}_{id(root)}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kill_while_waiting(root: Path, calls: int) -> list[str]:
    """Run the app's first life until `calls` approvals wait, SIGKILL it; the request ids it saw."""
    app(root)
    process = subprocess.Popen(
        [sys.executable, str(root / "paused_app.py"), str(root), str(calls)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        assert line[:1] == ["waiting"], f"the app did not reach its approvals (exit code {process.poll()})"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    assert process.returncode == -signal.SIGKILL
    return line[1:]


def deployed(root: Path) -> list[str]:
    path = root / "deployed.txt"
    return path.read_text().split() if path.exists() else []


async def test_a_turn_paused_for_approval_survives_a_restart_and_resumes_when_approved(tmp_path: Path) -> None:
    waited = kill_while_waiting(tmp_path, calls=1)
    assert deployed(tmp_path) == []  # nothing ran without an answer

    runner, approver = app(tmp_path).build(tmp_path, 1)
    async with runner:
        pending = await runner.pending_approvals(SESSION)
        assert [r.id for r in pending] == waited
        assert (pending[0].tool, pending[0].arguments, pending[0].risk) == ("deploy", {"target": "t0"}, "shell")
        assert approver.pending() == []  # nothing waits in this process: the request is in the journal
        answered = await runner.answer_approval(SESSION, waited[0], approved=True, remember=True)
        assert answered.how == "resumed"
        handle = answered.handle
        assert handle is not None
        await handle.wait(10)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == "done: deployed t0"
        assert await runner.pending_approvals(SESSION) == []
        with pytest.raises(AgentError, match="no pending approval"):
            await runner.answer_approval(SESSION, waited[0], approved=True)  # answered once, and only once
    assert deployed(tmp_path) == ["t0"]

    restored = reload(tmp_path, SESSION)
    assert item_kinds(restored.items) == [
        "turn-started",
        "message",
        "message",
        "tool-call",
        "approval-requested",
        "tool-result",  # the synthetic [interrupted] result, replaced in place by the real one
        "turn-interrupted",
        "approval-decided",
        "turn-started",
        "message",
        "turn-completed",
    ]
    (result,) = [i for i in restored.items if isinstance(i, ToolResultItem)]
    assert (result.output, result.is_error, result.synthetic) == ("deployed t0", False, False)
    assert restored.data[GRANTS_KEY] == ["shell"]  # `remember` granted the risk for the rest of the session
    assert restored.status == "idle"
    messages = chat_messages(restored.items, None)  # still a valid conversation: each call has its one result
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[2]["content"] == "deployed t0"


async def test_a_paused_turn_resumes_once_every_request_is_answered_and_a_denial_runs_nothing(
    tmp_path: Path,
) -> None:
    waited = kill_while_waiting(tmp_path, calls=2)
    assert len(waited) == 2

    runner, _ = app(tmp_path).build(tmp_path, 2)
    async with runner:
        pending = await runner.pending_approvals(SESSION)
        assert {r.id for r in pending} == set(waited)
        by_target = {r.arguments["target"]: r.id for r in pending if r.arguments}
        with pytest.raises(AgentError, match=r"no pending approval 'apr-nope' \(pending: apr-"):
            await runner.answer_approval(SESSION, "apr-nope", approved=True)
        recorded = await runner.answer_approval(SESSION, by_target["t1"], approved=False, reason="not today")
        assert (recorded.how, recorded.handle, recorded.still_waiting) == ("recorded", None, (by_target["t0"],))
        assert [r.id for r in await runner.pending_approvals(SESSION)] == [by_target["t0"]]
        handle = (await runner.answer_approval(SESSION, by_target["t0"], approved=True)).handle
        assert handle is not None
        await handle.wait(10)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result is not None and handle.result.startswith("done: deployed t0 | [approval_denied] deploy")
        assert "not today" in handle.result
    assert deployed(tmp_path) == ["t0"]  # the denied call never ran
    restored = reload(tmp_path, SESSION)
    outputs = [(i.output.split(" ")[0], i.synthetic) for i in restored.items if isinstance(i, ToolResultItem)]
    assert outputs == [("deployed", False), ("[approval_denied]", False)]
    assert restored.data.get(GRANTS_KEY) is None


async def test_an_agent_that_cannot_resume_leaves_the_request_pending(tmp_path: Path) -> None:
    waited = kill_while_waiting(tmp_path, calls=1)

    class RunOnly:
        id = name = "deployer"

        async def run(self, input: str, session: object, ctx: TurnContext) -> None:
            await ctx.turn.finish("ran")

    async with running(tmp_path, {"deployer": lambda deps: RunOnly()}) as runner:
        with pytest.raises(AgentError, match="cannot resume a turn"):
            await runner.answer_approval(SESSION, waited[0], approved=True)
        assert [r.id for r in await runner.pending_approvals(SESSION)] == waited
    assert deployed(tmp_path) == []


def waiting_model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
    return ModelResponse.calling(("deploy", {})) if request.messages[-1]["role"] == "user" else "finished"


@dataclass
class Waiting:
    """A live turn whose one call waits in a `PendingApprovals` approver."""

    runner: AgentRunner
    approver: PendingApprovals
    session_id: str
    handle: TurnHandle
    request: ApprovalRequest
    ran: list[str]


@asynccontextmanager
async def waiting_turn(
    tmp_path: Path, approver: PendingApprovals | None = None, *, parked: bool = True
) -> AsyncIterator[Waiting]:
    """Until the turn's request is in the journal and (`parked`) has reached the approver."""
    approver, ran = approver or PendingApprovals(), []
    surface = AgentToolSurface(AgentApprovals(approver=approver))

    @surface.tool(risk="shell")
    def deploy() -> str:
        ran.append("deploy")
        return "deployed"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(waiting_model, id="f")}, surface=surface) as runner:
        session = await runner.create_session("f")
        handle = await runner.run_turn(session.id, "go")
        with anyio.fail_after(5):
            while not (pending := await runner.pending_approvals(session.id)) or (parked and not approver.pending()):
                await anyio.sleep(0.005)
        yield Waiting(runner, approver, session.id, handle, pending[0], ran)


async def test_a_live_turn_waits_for_the_answer_given_through_the_runner(tmp_path: Path) -> None:
    async with waiting_turn(tmp_path) as live:
        runner, request = live.runner, live.request
        assert (request.session_id, request.turn_id, request.tool) == (live.session_id, live.handle.id, "deploy")
        assert request.call_id is not None
        assert [r.id for r in await runner.pending_approvals(live.session_id)] == [request.id]
        assert live.ran == []
        answered = await runner.answer_approval(live.session_id, request.id, approved=True)
        assert answered.how == "continued" and answered.handle is live.handle
        await live.handle.wait(5)
        assert live.handle.status is TurnStatus.COMPLETED and live.handle.result == "finished"
        assert await runner.pending_approvals(live.session_id) == []
    assert live.ran == ["deploy"]


async def test_a_cancelled_turns_request_is_withdrawn_not_pending(tmp_path: Path) -> None:
    async with waiting_turn(tmp_path) as live:
        runner, request = live.runner, live.request
        assert await runner.cancel_turn(live.session_id)
        await live.handle.wait(5)
        assert live.handle.status is TurnStatus.CANCELLED
        assert live.approver.pending() == [] and not live.approver.answer(request.id, approved=True)
        assert await runner.pending_approvals(live.session_id) == []
        with pytest.raises(AgentError, match="no pending approval"):
            await runner.answer_approval(live.session_id, request.id, approved=True)
    assert live.ran == []


def test_unreadable_approval_items_are_ignored_not_fatal(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    try:
        session_id = store.create("f").id
        store.append_item(session_id, EventItem(kind="approval-requested", data={"risk": 5}, turn_id="turn-x"))
        store.append_item(session_id, EventItem(kind="approval-decided", data={"decision": "yes"}, turn_id="turn-x"))
        session = store.require(session_id)
    finally:
        store.close()
    assert pending_requests(session, live_turn_id="turn-x") == [] and paused_calls(session) == []


async def test_an_answer_given_as_soon_as_the_request_is_journaled_waits_for_it_to_reach_the_approver(
    tmp_path: Path,
) -> None:
    class SlowToPark(PendingApprovals):
        async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
            await anyio.sleep(0.3)  # the request is already in the journal meanwhile
            return await super().__call__(request)

    async with waiting_turn(tmp_path, SlowToPark(), parked=False) as live:
        assert live.approver.pending() == []  # journaled, not parked yet
        answered = await live.runner.answer_approval(live.session_id, live.request.id, approved=True)
        assert answered.handle is live.handle
        await live.handle.wait(5)
        assert live.handle.status is TurnStatus.COMPLETED
    assert live.ran == ["deploy"]
