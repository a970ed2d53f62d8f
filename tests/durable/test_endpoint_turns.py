"""Durable turns of an agents-file OpenCode agent on `python -m unit_mcp.agent worker` (real processes, the pinned
binary, the scripted model, the real unit server): the agent's node is the worker's own and asks before its risky
call; the turn asks once (`sessions pending` lists it as durable), `DurableClient.answer` answers, the node is told
`once` (the call runs) or `reject` (the refusal recorded), and the turn completes. A worker SIGKILLed while the
approval waits takes its node with it: the worker that takes the turn over ends it `interrupted` with what was
recorded, never prompting a node again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from agent.conftest import UnitServer
from opencode.opencode_stack import oc, title_step
from support.item_kinds import item_kinds

from unit_mcp.agent import DurableClient, SessionStore
from unit_mcp.agent.approvals import ApprovalDecision, ApprovalRequest
from unit_mcp.agent.items import ErrorItem, EventItem, Session, ToolResultItem
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .workers import Workers, durable_data, stored_session, submitted

pytestmark = pytest.mark.anyio

SESSION = "ses-opencode-endpoint"
AGENT = "oc"


@dataclass
class Stack:
    model: ScriptedModel
    workers: Workers
    store: SessionStore
    client: DurableClient
    data: Path
    turn_id: str
    asked: ApprovalRequest

    def risky_requests(self) -> int:
        """How many times the model was asked for the turn's first step (the prompt reaching a node)."""
        return len([request for request in self.model.requests if request.label == "the risky call"])

    async def answer(self, approved: bool) -> None:
        decision = ApprovalDecision(request_id=self.asked.id, risk=self.asked.risk, approved=approved)
        await self.client.answer(self.asked, decision)

    def session(self) -> Session:
        return stored_session(self.data, SESSION)


@asynccontextmanager
async def asking(tmp_path: Path, binary: Path, unit_server: UnitServer) -> AsyncIterator[Stack]:
    """A durable turn of the agents file's OpenCode agent on worker A, once it waits for the approval of its node's
    `wipe_units` call."""
    data, system_db = durable_data(tmp_path)
    steps = [
        title_step(),
        call(tool_call(oc("wipe_units"), {}), when=Match(last_role="user", has_tools=True), label="the risky call"),
        say("done", when=Match(last_role="tool"), label="final"),
    ]
    async with ScriptedModel(steps) as model:
        agents = tmp_path / "agents.json"
        spec = {"id": AGENT, "provider": "opencode", "model": "m", "base_url": model.base_url}
        agents.write_text(json.dumps({"agent": [spec]}), encoding="utf-8")
        options = [
            "--agents", str(agents), "--system-db", system_db,
            "--mcp-url", unit_server.url, "--mcp-token-file", unit_server.token_file(tmp_path),
        ]  # fmt: skip
        env = {"OPENCODE_PATH": str(binary), "TMPDIR": str(tmp_path)}
        workers = Workers(data, options, env=env)
        async with submitted(workers, system_db, AGENT, SESSION, "wipe the units") as turn:
            with anyio.fail_after(120):
                while not (pending := await anyio.to_thread.run_sync(turn.store.pending, SESSION)):
                    await anyio.sleep(0.1)
            (asked,) = pending
            assert asked.state == "durable", asked
            yield Stack(model, workers, turn.store, turn.client, data, turn.turn_id, asked.request)


async def test_the_nodes_risky_call_is_asked_once_approved_through_the_client_and_runs(
    tmp_path: Path, opencode_binary: Path, unit_server: UnitServer
) -> None:
    async with asking(tmp_path, opencode_binary, unit_server) as stack:
        assert (stack.asked.tool, stack.asked.risk, stack.asked.turn_id) == ("wipe_units", "destructive", stack.turn_id)
        assert unit_server.called() == []  # it waits for the answer
        await stack.answer(True)
        with anyio.fail_after(120):
            assert await stack.client.wait(stack.turn_id) == "done"
        session = stack.session()
        prompts = stack.risky_requests()
    assert unit_server.called() == ["wipe_units"]
    assert prompts == 1
    kinds = item_kinds(session.items)
    assert kinds[:5] == ["turn-started", "message", "unit-checkpoint", "opencode-session-created", "approval-requested"]
    assert kinds.count("approval-requested") == 1 and kinds.count("approval-decided") == 1
    assert kinds[-1] == "turn-completed"
    (result,) = [item for item in session.items if isinstance(item, ToolResultItem)]
    assert result.name == "wipe_units" and not result.is_error and "wiped" in result.output
    assert session.status == "idle" and session.open_tool_calls() == []


async def test_a_denied_call_is_rejected_at_the_node_and_the_turn_completes_with_the_refusal(
    tmp_path: Path, opencode_binary: Path, unit_server: UnitServer
) -> None:
    async with asking(tmp_path, opencode_binary, unit_server) as stack:
        await stack.answer(False)
        with anyio.fail_after(120):
            assert await stack.client.wait(stack.turn_id) == "done"  # the node told the model, which answered
        session = stack.session()
    assert unit_server.called() == []
    (decided,) = [item for item in session.items if isinstance(item, EventItem) and item.kind == "approval-decided"]
    assert decided.data["decision"]["approved"] is False
    (result,) = [item for item in session.items if isinstance(item, ToolResultItem)]
    assert result.name == "wipe_units" and result.is_error and "rejected" in result.output
    assert item_kinds(session.items)[-1] == "turn-completed"
    assert session.status == "idle" and session.open_tool_calls() == []


async def test_a_worker_killed_while_the_approval_waits_takes_its_node_along_and_the_turn_ends_interrupted(
    tmp_path: Path, opencode_binary: Path, unit_server: UnitServer
) -> None:
    async with asking(tmp_path, opencode_binary, unit_server) as stack:
        stack.workers.kill("worker-a")  # and its node
        await stack.workers.start("worker-b")  # a live worker: it takes over A's turn
        with anyio.fail_after(120):
            assert await stack.client.wait(stack.turn_id) is None
        session = stack.session()
        prompts = stack.risky_requests()
        pending = await anyio.to_thread.run_sync(stack.store.pending, SESSION)
    assert "worker worker-b resumed 1 turn(s) of dead worker worker-a" in stack.workers.log("worker-b").read_text()
    assert unit_server.called() == [] and prompts == 1  # no node was prompted again
    kinds = ["turn-started", "message", "unit-checkpoint", "opencode-session-created", "approval-requested", "error"]
    kinds.append("turn-interrupted")
    assert item_kinds(session.items) == kinds
    error = session.items[-2]
    assert isinstance(error, ErrorItem) and error.code == "interrupted"
    assert "its own OpenCode node is out of reach" in error.message
    assert session.status == "idle" and pending == []
