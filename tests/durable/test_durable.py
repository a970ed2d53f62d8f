"""A durable turn survives its worker: worker A (a real process: the step-loop agent on the scripted model, the
unit tools over HTTP, DBOS on SQLite) is SIGKILLed while the model delays its second answer; A restarted (same
executor id) resumes the workflow (on DBOS's event loop, with one model client for the rest of the turn); the
session has every item once and no tool call ran twice.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from agent.conftest import UnitServer, reload
from support.item_kinds import item_kinds

from unit_mcp.agent import (
    AgentApprovals,
    AgentError,
    AgentRegistry,
    AgentToolSurface,
    ApprovalDecision,
    DurableClient,
    DurableWorker,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    OpenAIAgent,
    SessionStore,
    TurnContext,
)
from unit_mcp.agent.approvals import GRANTS_KEY
from unit_mcp.agent.items import EventItem, MessageItem, ToolResultItem
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .provider_worker import AGENT
from .workers import Workers, durable_data, stored_session, submitted

pytestmark = pytest.mark.anyio

SESSION = "ses-durable"


async def test_a_turn_resumes_on_a_restarted_worker_after_a_kill_mid_turn(
    tmp_path: Path, unit_server: UnitServer
) -> None:
    script = [
        call(tool_call("record_value", {"value": "one"}), label="first call"),
        say("never sent", when=Match(last_role="tool"), delay=120, label="the answer worker A dies waiting for"),
        call(tool_call("record_value", {"value": "two"}), when=Match(last_role="tool"), label="second call"),
        say("done", when=Match(last_role="tool"), label="final"),
    ]
    data, system_db = durable_data(tmp_path)
    async with ScriptedModel(script) as model:
        env = {"MCP_TOKEN": unit_server.token}
        workers = Workers.script(data, system_db, "openai", unit_server.url, model.base_url, env)
        async with submitted(workers, system_db, AGENT, SESSION, "record one, then two") as turn:
            with anyio.fail_after(60):
                while len(model.requests) < 2:
                    await anyio.sleep(0.05)
            workers.kill("worker-a")  # while the model delays its second answer
            assert [c.arguments for c in unit_server.calls if c.name == "record_value"] == [{"value": "one"}]
            await workers.start("worker-a")  # restarted with the same identity: it resumes the turn at launch
            with anyio.fail_after(120):
                assert await turn.client.wait(turn.turn_id) == "done"
        model.assert_done()
    # The resumed turn (on DBOS's event loop) made one model client for its two model requests.
    assert workers.log("worker-a").read_text().count("model client made") == 1

    # Each tool call ran once: the first was checkpointed before the kill, the second ran after it.
    assert [c.arguments for c in unit_server.calls if c.name == "record_value"] == [
        {"value": "one"},
        {"value": "two"},
    ]
    session = stored_session(data, SESSION)
    assert item_kinds(session.items) == [
        "turn-started",
        "message",
        "unit-checkpoint",  # taken once, a step: the resumed turn took the recorded one
        "message",
        "tool-call",
        "tool-result",
        "message",
        "tool-call",
        "tool-result",
        "message",
        "turn-completed",
    ]
    assert {item.turn_id for item in session.items} == {turn.turn_id}
    assert [item.content for item in session.items if isinstance(item, MessageItem)] == [
        "record one, then two",
        "",
        "",
        "done",
    ]
    started = session.items[0]
    assert isinstance(started, EventItem) and started.data["durable"] is True
    assert session.status == "idle"


def test_loading_a_session_leaves_a_running_durable_turn_open(tmp_path: Path) -> None:
    """The store's load-time repair closes a dead turn as interrupted, but not a durable one: its worker resumes it."""
    store = SessionStore(tmp_path / "sessions")
    store.create("recorder", session_id=SESSION)
    store.append_item(
        SESSION,
        EventItem(kind="turn-started", data={"turn_id": "turn-1", "durable": True}, turn_id="turn-1"),
        status="running",
    )
    store.close()
    session = reload(tmp_path, SESSION)
    assert item_kinds(session.items) == ["turn-started"]
    assert session.status == "running"


async def test_a_streaming_agent_is_refused_a_durable_turn_in_one_line(tmp_path: Path) -> None:
    registry = AgentRegistry()
    registry.register("streamer", lambda deps: OpenAIAgent(id="streamer", model="m", base_url="http://127.0.0.1:9/v1"))
    store = SessionStore(tmp_path / "sessions")
    try:
        store.create("streamer", session_id=SESSION)
        surface = AgentToolSurface(AgentApprovals())
        async with DurableWorker(store=store, registry=registry, tools=surface, data_dir=tmp_path) as worker:
            with pytest.raises(AgentError, match=r"agent streamer streams or compacts: give it stream=False"):
                await worker.submit(SESSION, "hello")
        assert store.require(SESSION).items == []
    finally:
        store.close()


async def test_an_always_answer_to_a_durable_turn_grants_the_risk_in_the_decisions_write(tmp_path: Path) -> None:
    """The answer's decision and its "always" grant are written together (`append_item(grant=)`): the session keeps
    the grant, and the next turn runs the same risk without asking."""
    surface = AgentToolSurface(AgentApprovals())

    @surface.tool(risk="shell")
    def run_tests() -> str:
        return "passed"

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        return ModelResponse.calling(("run_tests", {})) if request.messages[-1]["role"] == "user" else "ok"

    registry = AgentRegistry()
    registry.register("f", lambda deps: FunctionAgent(model, id="f"))
    store = SessionStore(tmp_path / "sessions")
    try:
        store.create("f", session_id=SESSION)
        async with DurableWorker(store=store, registry=registry, tools=surface, data_dir=tmp_path) as worker:
            first = await worker.submit(SESSION, "test")
            with anyio.fail_after(60):
                while not (pending := await anyio.to_thread.run_sync(store.pending, SESSION)):
                    await anyio.sleep(0.05)
            (asked,) = pending
            assert asked.state == "durable" and store.require(SESSION).data.get(GRANTS_KEY) is None
            request = asked.request
            async with DurableClient(worker.system_database_url) as client:
                await client.answer(
                    request, ApprovalDecision(request_id=request.id, risk=request.risk, approved=True, remember=True)
                )
            with anyio.fail_after(60):
                assert await worker.wait(first) == "ok"
            assert store.require(SESSION).data[GRANTS_KEY] == ["shell"]
            with anyio.fail_after(60):
                assert await worker.wait(await worker.submit(SESSION, "test again")) == "ok"
    finally:
        store.close()
    session = reload(tmp_path, SESSION)
    assert session.data[GRANTS_KEY] == ["shell"]
    asks = [i.kind for i in session.items if isinstance(i, EventItem) and i.kind.startswith("approval")]
    assert asks == ["approval-requested", "approval-decided"]  # the second turn was not asked
    assert [i.output for i in session.items if isinstance(i, ToolResultItem)] == ["passed", "passed"]
