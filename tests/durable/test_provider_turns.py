"""Durable OpenCode and Codex turns on workers (real processes, the real pinned binaries, the scripted model): a
worker SIGKILLed while the node works on its turn's prompt is replaced by a live worker (`--takeover`) that
re-attaches to the node's session, reads back what happened without sending the prompt again, and completes the turn;
if the node died too, that worker ends the turn `interrupted` instead of leaving it running. A Codex turn whose worker
died cannot be resumed (Codex keeps nothing): the worker that takes it over ends it `interrupted`, never running Codex
on the prompt again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from opencode.opencode_stack import MODEL, scripted_provider, title_step
from support.item_kinds import item_kinds
from support.turn_parts import turn_context

from unit_mcp.agent import (
    AgentApprovals,
    AgentRegistry,
    DurableClient,
    SessionStore,
)
from unit_mcp.agent.items import ErrorItem, EventItem, MessageItem, Session
from unit_mcp.agent.opencode import IsolatedRoot, NodeProcess, OpenCodeAgent
from unit_mcp.agent.turns import Turn
from unit_mcp.testing import Match, ScriptedModel, say

from .provider_worker import AGENT
from .workers import Workers, durable_data, stored_session, submitted

pytestmark = pytest.mark.anyio

SESSION = "ses-opencode-durable"
ANSWER = "hello, once"


@dataclass
class Stack:
    model: ScriptedModel
    node: NodeProcess
    workers: Workers
    client: DurableClient
    data: Path
    turn_id: str

    def prompts(self) -> int:
        """How many times the turn's prompt reached the model."""
        return len([request for request in self.model.requests if request.label == "the answer"])

    def session(self) -> Session:
        return stored_session(self.data, SESSION)


@asynccontextmanager
async def killed_mid_turn(tmp_path: Path, binary: Path) -> AsyncIterator[Stack]:
    """A durable turn of the OpenCode agent queued for worker A, and A SIGKILLed while the scripted model holds the
    turn's prompt (it answers 8 s after it came)."""
    data, system_db = durable_data(tmp_path)
    steps = [title_step(), say(ANSWER, when=Match(user_contains="greet"), delay=8, label="the answer")]
    root = IsolatedRoot(tmp_path / "node")
    async with ScriptedModel(steps) as model:
        root.add_config(scripted_provider(model.base_url))
        async with NodeProcess(binary=binary, root=root) as node:
            assert node.url is not None and node.password is not None
            env = {"OPENCODE_SERVER_PASSWORD": node.password}
            workers = Workers.script(data, system_db, "opencode", node.url, MODEL, env)
            async with submitted(workers, system_db, AGENT, SESSION, "greet me") as turn:
                stack = Stack(model, node, workers, turn.client, data, turn.turn_id)
                with anyio.fail_after(120):
                    while not stack.prompts():
                        await anyio.sleep(0.05)
                workers.kill("worker-a")  # while the model delays its answer
                yield stack


async def test_a_live_worker_reattaches_to_the_node_session_of_a_killed_worker_and_completes_the_turn(
    tmp_path: Path, opencode_binary: Path
) -> None:
    async with killed_mid_turn(tmp_path, opencode_binary) as stack:
        await stack.workers.start("worker-b")  # a live worker: it takes over A's turn
        with anyio.fail_after(180):
            assert await stack.client.wait(stack.turn_id) == ANSWER
        session = stack.session()
        (created,) = [item for item in session.items if isinstance(item, EventItem) and item.kind.startswith("open")]
        async with stack.node.client() as node:
            messages = await node.messages(created.data["opencode_session_id"])
        prompts = stack.prompts()
    assert "worker worker-b resumed 1 turn(s) of dead worker worker-a" in stack.workers.log("worker-b").read_text()
    # The prompt went to the node once and reached the model once; the reply was read back into the session once.
    assert prompts == 1
    assert [message["info"]["role"] for message in messages] == ["user", "assistant"]
    kinds = ["turn-started", "message", "opencode-session-created", "message", "turn-completed"]
    assert item_kinds(session.items) == kinds
    assert [item.content for item in session.items if isinstance(item, MessageItem)] == ["greet me", ANSWER]
    assert session.status == "idle" and {item.turn_id for item in session.items} == {stack.turn_id}


async def test_a_turn_whose_node_died_with_its_worker_ends_interrupted_on_the_worker_that_takes_it_over(
    tmp_path: Path, opencode_binary: Path
) -> None:
    async with killed_mid_turn(tmp_path, opencode_binary) as stack:
        await stack.node.stop()  # the node dies too: nothing is left to re-attach to
        await stack.workers.start("worker-b")
        with anyio.fail_after(180):
            assert await stack.client.wait(stack.turn_id) is None
        session = stack.session()
    kinds = ["turn-started", "message", "opencode-session-created", "error", "turn-interrupted"]
    assert item_kinds(session.items) == kinds
    error = session.items[-2]
    assert isinstance(error, ErrorItem) and error.code == "interrupted"
    assert "did not finish the reply" in error.message
    assert session.status == "idle"


@pytest.mark.parametrize("again", ["at once", "while answering", "after the answer"])
async def test_the_prompt_step_run_again_sends_nothing_the_node_has_already(
    tmp_path: Path, opencode_binary: Path, again: str
) -> None:
    """A worker that died after sending the prompt, before DBOS recorded the step, has the step run again: at once
    (the node may not have stored the first yet: the race CI once lost), while the model answers, or after."""
    delay = 3.0 if again == "while answering" else 0.0
    steps = [title_step(), say(ANSWER, when=Match(user_contains="greet"), delay=delay, label="the answer")]
    root = IsolatedRoot(tmp_path / "node")
    store = SessionStore(tmp_path / "sessions")
    session = store.create(AGENT, session_id=SESSION)
    approvals, registry = AgentApprovals(), AgentRegistry()
    turn = Turn(turn_id="turn-1", session_id=SESSION, agent_id=AGENT, store=store)
    ctx = turn_context(turn, store, approvals, registry)
    try:
        async with ScriptedModel(steps) as model:
            root.add_config(scripted_provider(model.base_url))
            async with NodeProcess(binary=opencode_binary, root=root) as node, node.client() as client:
                agent = OpenCodeAgent(client, model=MODEL, id=AGENT, turn_timeout=60)
                _, sent = await agent.open_session(session)
                await agent.prompt_once(ctx, sent, "greet me")
                if again == "while answering":
                    with anyio.fail_after(30):
                        while not [request for request in model.requests if request.label == "the answer"]:
                            await anyio.sleep(0.02)
                elif again == "after the answer":
                    assert (await agent.read_back(sent)).done
                await agent.prompt_once(ctx, sent, "greet me")  # the step again, on the worker that took over
                reply = await agent.read_back(sent)
                await anyio.sleep(0.5)  # room for a second answer, were one coming
                messages = await client.messages(sent.session_id)
            prompts = [request for request in model.requests if request.label == "the answer"]
    finally:
        store.close()
    assert reply.done and reply.text == ANSWER
    assert [message["info"]["role"] for message in messages] == ["user", "assistant"]
    assert messages[0]["info"]["id"] == sent.message_id
    assert len(prompts) == 1


async def test_a_codex_turn_whose_worker_is_killed_ends_interrupted_on_the_worker_that_takes_it_over(
    tmp_path: Path, codex_binary: Path
) -> None:
    data, system_db = durable_data(tmp_path)
    steps = [say(ANSWER, when=Match(user_contains="greet"), delay=8, label="the answer")]
    async with ScriptedModel(steps) as model:
        workers = Workers.script(data, system_db, "codex", str(codex_binary), model.base_url, {"TMPDIR": str(tmp_path)})
        async with submitted(workers, system_db, AGENT, SESSION, "greet me") as turn:
            with anyio.fail_after(120):
                while not [request for request in model.requests if request.label == "the answer"]:
                    await anyio.sleep(0.05)
            workers.kill("worker-a")  # while the model delays its answer
            await workers.start("worker-b")
            with anyio.fail_after(120):
                assert await turn.client.wait(turn.turn_id) is None
        prompts = [request for request in model.requests if request.label == "the answer"]
    session = stored_session(data, SESSION)
    assert "worker worker-b resumed 1 turn(s) of dead worker worker-a" in workers.log("worker-b").read_text()
    assert len(prompts) == 1  # Codex never ran on the prompt again
    kinds = item_kinds(session.items)
    assert kinds[:3] == ["turn-started", "message", "codex-begun"] and kinds[-2:] == ["error", "turn-interrupted"]
    assert len({item.id for item in session.items}) == len(session.items)
    error = session.items[-2]
    assert isinstance(error, ErrorItem) and error.code == "interrupted"
    assert "Codex keeps nothing to resume" in error.message
    assert session.status == "idle" and session.open_tool_calls() == []
