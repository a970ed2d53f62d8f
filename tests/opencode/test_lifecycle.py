"""OpenCodeAgent's lifecycle against a real node: cancelling mid-tool, a stale session id, a restarted node."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.items import EventItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.opencode import SESSION_KEY, read_reply
from unit_mcp.proctree import kill_tree, running
from unit_mcp.testing import Match, ScriptedError, Step, call, say, tool_call

from .opencode_stack import TURN_TIMEOUT, agent_stack, oc

pytestmark = pytest.mark.anyio


async def test_cancel_mid_tool_aborts_the_node_and_closes_the_call(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [
        call(tool_call(oc("slow_echo"), {"seconds": 60}), when=Match(last_role="user", has_tools=True)),
        say("still here", when=Match(user_contains="still there")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        client = stack.node.client
        session = await stack.new_session()
        handle = await stack.runner.run_turn(session.id, "Call slow_echo and wait for it.")
        with anyio.fail_after(TURN_TIMEOUT):
            await stack.recorder.slow_started.wait()  # OpenCode is now waiting on the tool
        opencode_id = (await stack.runner.get_session(session.id)).data[SESSION_KEY]  # type: ignore[union-attr]
        assert client.status(opencode_id) == "busy"

        started = time.monotonic()
        assert await handle.cancel("the user pressed stop")
        cancel_seconds = time.monotonic() - started
        assert handle.status is TurnStatus.CANCELLED
        assert cancel_seconds < 10, f"cancelling took {cancel_seconds:.1f} s"

        # The node: the session is idle, its reply ended as aborted, the tool part is closed as an error.
        assert opencode_id not in await client.session_statuses()
        reply = read_reply(await client.messages(opencode_id), after_message_id=None)
        assert reply.error is not None and "Abort" in reply.error
        [part] = reply.tool_parts()
        assert (part.tool, part.status) == (oc("slow_echo"), "error")
        with anyio.fail_after(10):  # the abort reached the tool through the endpoint
            while "cancelled" not in stack.recorder.slow:
                await anyio.sleep(0.05)

        # The agent session: the call and its closing result, nothing open; the session goes on.
        items = stack.reload(session.id).items
        calls = [i for i in items if isinstance(i, ToolCallItem)]
        results = [i for i in items if isinstance(i, ToolResultItem)]
        assert [c.name for c in calls] == ["slow_echo"] and [r.call_id for r in results] == [calls[0].call_id]
        assert results[0].is_error
        assert stack.reload(session.id).open_tool_calls() == []
        assert any(isinstance(i, EventItem) and i.kind == "turn-cancelled" for i in items)

        follow_up = await (await stack.runner.run_turn(session.id, "Are you still there?")).wait(TURN_TIMEOUT)
        assert follow_up.status is TurnStatus.COMPLETED, follow_up.error
        assert follow_up.result == "still here"
        last = stack.model.requests[-1]
        assert [m["role"] for m in last.messages].count("tool") == 1, "the aborted call reached the model unanswered"

    assert stack.recorder.slow == ["started", "cancelled"]


async def test_stale_session_id_is_replaced(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [
        say("first done", when=Match(user_contains="first")),
        say("second done", when=Match(user_contains="second")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        session = await stack.new_session()
        first = await (await stack.runner.run_turn(session.id, "first")).wait(TURN_TIMEOUT)
        assert first.status is TurnStatus.COMPLETED, first.error
        old = (await stack.runner.get_session(session.id)).data[SESSION_KEY]  # type: ignore[union-attr]
        assert await stack.node.client.delete_session(old)

        second = await (await stack.runner.run_turn(session.id, "second")).wait(TURN_TIMEOUT)
        assert second.status is TurnStatus.COMPLETED, second.error
        assert second.result == "second done"
        stack.model.assert_done()

    reloaded = stack.reload(session.id)
    new = reloaded.data[SESSION_KEY]
    assert new != old
    [replaced] = [i for i in reloaded.items if isinstance(i, EventItem) and i.kind == "opencode-session-replaced"]
    assert replaced.data["previous"] == old and replaced.data["opencode_session_id"] == new
    assert "no longer knows" in replaced.data["reason"]


async def test_restarted_node_is_reconnected(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [say("before", when=Match(user_contains="before")), say("after", when=Match(user_contains="after"))]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        node, client = stack.node.process, stack.node.client
        session = await stack.new_session()
        first = await (await stack.runner.run_turn(session.id, "before the restart")).wait(TURN_TIMEOUT)
        assert first.status is TurnStatus.COMPLETED, first.error
        assert client.events.connects == 1
        old_pid, url = node.pid, node.url

        await node.restart()
        assert node.pid != old_pid and node.url == url
        with anyio.fail_after(20):
            while client.events.connects < 2 or not client.events.connected:
                await anyio.sleep(0.05)

        second = await (await stack.runner.run_turn(session.id, "after the restart")).wait(TURN_TIMEOUT)
        assert second.status is TurnStatus.COMPLETED, second.error
        assert second.result == "after"
        stack.model.assert_done()

    reloaded = stack.reload(session.id)
    assert not [i for i in reloaded.items if isinstance(i, EventItem) and i.kind == "opencode-session-replaced"]


async def test_provider_error_fails_the_turn_with_its_message(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [Step(error=ScriptedError(status=400, message="the scripted provider refuses"), label="refusal")]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "anything")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.FAILED
        assert "the scripted provider refuses" in (handle.error or ""), handle.error
        assert handle.error is not None and handle.error.startswith("OpenCode ended the reply with")
    assert stack.reload(session.id).status == "idle"


async def test_new_turn_supersedes_a_running_one(tmp_path: Path, opencode_binary: Path) -> None:
    """A second input while OpenCode is mid-tool: the first turn is aborted on the node and cancelled, the
    second runs on the same OpenCode session, and the idle that ends the aborted turn does not end it."""
    steps = [
        call(tool_call(oc("slow_echo"), {"seconds": 60}), when=Match(user_contains="first", has_tools=True)),
        say("second done", when=Match(user_contains="second"), delay=1.0),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        session = await stack.new_session()
        first = await stack.runner.run_turn(session.id, "first: call slow_echo")
        with anyio.fail_after(TURN_TIMEOUT):
            await stack.recorder.slow_started.wait()
        second = await stack.runner.run_turn(session.id, "second")
        assert first.status is TurnStatus.CANCELLED
        await second.wait(TURN_TIMEOUT)
        assert (second.status, second.result) == (TurnStatus.COMPLETED, "second done"), second.error
        stack.model.assert_done()

    reloaded = stack.reload(session.id)
    assert reloaded.open_tool_calls() == []
    assert not [i for i in reloaded.items if isinstance(i, EventItem) and i.kind.startswith("opencode-session-re")]
    cancelled = [i for i in reloaded.items if isinstance(i, EventItem) and i.kind == "turn-cancelled"]
    assert cancelled and "superseded" in cancelled[0].data["reason"]


PARENT = """
import sys, anyio
from unit_mcp.agent.opencode import IsolatedRoot, NodeProcess

async def main() -> None:
    async with NodeProcess(binary=sys.argv[1], root=IsolatedRoot(sys.argv[2])) as node:
        print(node._proc.pid, flush=True)
        await anyio.sleep(600)

anyio.run(main)
"""


def test_a_node_does_not_outlive_the_process_that_started_it_even_sigkilled(
    tmp_path: Path, opencode_binary: Path
) -> None:
    """A SIGKILLed runner or durable worker leaves no node behind (the kernel signals it: `dies_with_parent`)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(opencode_binary), str(tmp_path / "node")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        node = int(parent.stdout.readline())  # (kill_tree below would take it were the test to fail)
        assert running(node)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(30)
        deadline = time.monotonic() + 30
        while running(node) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not running(node), "the node outlived its SIGKILLed parent"
    finally:
        kill_tree(parent.pid)
        with contextlib.suppress(NameError, ProcessLookupError):
            os.kill(node, signal.SIGKILL)
