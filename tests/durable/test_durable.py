"""A durable turn survives its worker: worker A (a real process: the step-loop agent on the scripted model, the
unit tools over HTTP, DBOS on SQLite) is SIGKILLed while the model delays its second answer; worker B, started
with A's executor id, resumes the workflow (on DBOS's event loop, with one model client for the rest of the turn);
the session has every item once and no tool call ran twice.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from agent.conftest import UnitServer, reload
from anyio.streams.buffered import BufferedByteReceiveStream
from support.item_kinds import item_kinds

from unit_mcp.agent import AgentApprovals, AgentError, AgentRegistry, AgentToolSurface, OpenAIAgent, SessionStore
from unit_mcp.agent._durable import DurableWorker
from unit_mcp.agent.items import EventItem, MessageItem
from unit_mcp.agent.opencode import OpenCodeAgent, OpenCodeClient, opencode_endpoint
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

pytestmark = pytest.mark.anyio

SESSION = "ses-durable"
WORKER = r"""
import sys
from pathlib import Path

import anyio
import openai

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentToolSurface, McpToolSource, OpenAIAgent, SessionStore
from unit_mcp.agent._durable import DurableWorker

made = []
construct = openai.AsyncOpenAI.__init__


def counted(self, *args, **kwargs):
    made.append(self)
    construct(self, *args, **kwargs)


openai.AsyncOpenAI.__init__ = counted  # each model client this worker makes


async def main(root, model_url, mcp_url, token_file, turn_id):
    surface = AgentToolSurface(AgentApprovals())
    registry = AgentRegistry()
    agent = OpenAIAgent(id="recorder", model="scripted", base_url=model_url, stream=False)
    registry.register("recorder", lambda deps: agent)
    store = SessionStore(root / "sessions")
    try:
        async with McpToolSource(mcp_url, token=Path(token_file).read_text().strip()) as source:
            surface.add_source(source)
            async with DurableWorker(
                store=store, registry=registry, tools=surface, data_dir=root, executor_id="worker-a"
            ) as worker:
                if turn_id == "new":
                    store.create("recorder", session_id="ses-durable")
                    turn_id = await worker.submit("ses-durable", "record one, then two")
                    print("submitted", turn_id, flush=True)
                print("result", await worker.wait(turn_id), flush=True)
                print("model clients", len(made), flush=True)
    finally:
        store.close()


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]), *sys.argv[2:])
"""


def worker(root: Path, model: ScriptedModel, unit_server: UnitServer, turn_id: str) -> list[str]:
    (root / "worker.py").write_text(WORKER)
    return [
        sys.executable,
        str(root / "worker.py"),
        str(root),
        model.base_url,
        unit_server.url,
        unit_server.token_file(root),
        turn_id,
    ]


async def test_a_turn_resumes_on_a_restarted_worker_after_a_kill_mid_turn(
    tmp_path: Path, unit_server: UnitServer
) -> None:
    script = [
        call(tool_call("record_value", {"value": "one"}), label="first call"),
        say("never sent", when=Match(last_role="tool"), delay=120, label="the answer worker A dies waiting for"),
        call(tool_call("record_value", {"value": "two"}), when=Match(last_role="tool"), label="second call"),
        say("done", when=Match(last_role="tool"), label="final"),
    ]
    async with ScriptedModel(script) as model:
        first = await anyio.open_process(worker(tmp_path, model, unit_server, "new"), stderr=subprocess.DEVNULL)
        try:
            assert first.stdout is not None
            lines = BufferedByteReceiveStream(first.stdout)
            with anyio.fail_after(60):
                line = [""]
                while line[:1] != ["submitted"]:  # DBOS logs on stdout too
                    line = (await lines.receive_until(b"\n", 65536)).decode().split()
            turn_id = line[1]
            with anyio.fail_after(60):
                while len(model.requests) < 2:
                    await anyio.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            await first.wait()
        assert first.returncode == -signal.SIGKILL
        assert [c.arguments for c in unit_server.calls if c.name == "record_value"] == [{"value": "one"}]

        with anyio.fail_after(120):
            second = await anyio.run_process(worker(tmp_path, model, unit_server, turn_id), check=False)
        assert second.returncode == 0, second.stderr.decode()[-2000:]
        said = second.stdout.decode().splitlines()
        assert "result done" in said
        assert "model clients 1" in said  # the resumed turn's two model requests share one client
        model.assert_done()

    # Each tool call ran once: the first was checkpointed before the kill, the second ran after it.
    assert [c.arguments for c in unit_server.calls if c.name == "record_value"] == [
        {"value": "one"},
        {"value": "two"},
    ]
    session = reload(tmp_path, SESSION)
    assert item_kinds(session.items) == [
        "turn-started",
        "message",
        "message",
        "tool-call",
        "tool-result",
        "message",
        "tool-call",
        "tool-result",
        "message",
        "turn-completed",
    ]
    assert {item.turn_id for item in session.items} == {turn_id}
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


async def test_an_opencode_agent_whose_node_asks_before_each_call_is_refused_a_durable_turn_in_one_line(
    tmp_path: Path,
) -> None:
    surface = AgentToolSurface(AgentApprovals())
    store = SessionStore(tmp_path / "sessions")
    try:
        store.create("oc", session_id=SESSION)
        async with opencode_endpoint(surface, config_root=tmp_path / "opencode-config") as endpoint:
            registry = AgentRegistry()
            client = OpenCodeClient("http://127.0.0.1:9")  # never reached: the agent is refused first
            registry.register("oc", lambda deps: OpenCodeAgent(client, model="scripted/m", id="oc", endpoint=endpoint))
            async with DurableWorker(store=store, registry=registry, tools=surface, data_dir=tmp_path) as worker:
                with pytest.raises(AgentError, match=r"agent oc's OpenCode node asks the runner before each tool call"):
                    await worker.submit(SESSION, "hello")
        assert store.require(SESSION).items == []
    finally:
        store.close()
