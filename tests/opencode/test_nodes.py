"""Several nodes: the runner drives OpenCodeAgent turns on two real OpenCode nodes at once, one session per
node, each finishing (or cancelled) on its own."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.opencode import SESSION_KEY
from unit_mcp.testing import Match, call, say, tool_call

from .opencode_stack import TURN_TIMEOUT, agent_stack, oc

pytestmark = pytest.mark.anyio

ANSWER_DELAY = 2.0  # each scripted answer takes this long, so concurrent turns overlap visibly


async def test_two_nodes_finish_both_turns_concurrently(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [
        call(
            tool_call(oc("echo_token"), {"token": "{{user}}"}),
            when=Match(user_contains="alpha", last_role="user", has_tools=True),
            label="alpha asks",
            after="beta asks",  # each node's first answer waits until the other node has asked: turns run one
        ),  # after the other never get both answers, and the step's error fails the test
        call(
            tool_call(oc("echo_token"), {"token": "{{user}}"}),
            when=Match(user_contains="beta", last_role="user", has_tools=True),
            label="beta asks",
            after="alpha asks",
        ),
        say("alpha done", when=Match(user_contains="alpha", last_role="tool")),
        say("beta done", when=Match(user_contains="beta", last_role="tool")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=2) as stack:
        a, b = stack.nodes
        assert a.process.url != b.process.url and a.root.root != b.root.root
        session_a = await stack.new_session(a.agent_id)
        session_b = await stack.new_session(b.agent_id)
        ended: dict[str, float] = {}
        started = time.time()
        turn_a = await stack.runner.run_turn(session_a.id, "alpha")
        turn_b = await stack.runner.run_turn(session_b.id, "beta")
        turn_a.on_complete(lambda handle: ended.setdefault("alpha", time.time()))
        turn_b.on_complete(lambda handle: ended.setdefault("beta", time.time()))
        await turn_a.wait(TURN_TIMEOUT)
        await turn_b.wait(TURN_TIMEOUT)
        assert (turn_a.status, turn_a.result) == (TurnStatus.COMPLETED, "alpha done"), turn_a.error
        assert (turn_b.status, turn_b.result) == (TurnStatus.COMPLETED, "beta done"), turn_b.error
        stack.model.assert_done()

        # Each node ran its own session, and the two turns overlapped: both nodes had asked the model
        # before either turn ended.
        ids = [(await stack.runner.get_session(s.id)).data[SESSION_KEY] for s in (session_a, session_b)]  # type: ignore[union-attr]
        assert ids[0] in {s["id"] for s in await a.client.list_sessions()}
        assert ids[1] in {s["id"] for s in await b.client.list_sessions()}
        first = {
            r.last_text: r.received_at
            for r in stack.model.requests
            if r.tool_names and r.last_message["role"] == "user"
        }
        timeline = f"started {started}, first requests {first}, ended {ended}"
        assert max(first.values()) < min(ended.values()), f"the two turns did not overlap: {timeline}"

    assert sorted(args["token"] for _, args in stack.recorder.calls) == ["alpha", "beta"]


async def test_cancelling_one_node_leaves_the_other_running(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [
        call(tool_call(oc("slow_echo"), {"seconds": 60}), when=Match(user_contains="slow", has_tools=True)),
        say("quick done", when=Match(user_contains="quick"), delay=ANSWER_DELAY),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=2) as stack:
        a, b = stack.nodes
        slow = await stack.runner.run_turn((await stack.new_session(a.agent_id)).id, "slow")
        with anyio.fail_after(TURN_TIMEOUT):
            await stack.recorder.slow_started.wait()
        quick = await stack.runner.run_turn((await stack.new_session(b.agent_id)).id, "quick")
        assert await slow.cancel("only this one")
        assert slow.status is TurnStatus.CANCELLED and quick.running
        await quick.wait(TURN_TIMEOUT)
        assert (quick.status, quick.result) == (TurnStatus.COMPLETED, "quick done"), quick.error
