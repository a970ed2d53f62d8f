"""A master MCP client drives two real OpenCode nodes through `python -m unit_mcp.fleet` (a real subprocess on
the loopback bridge, and over stdio): health with capabilities, dispatch → poll → retrieve on both nodes in
parallel, sessions, models, interrupt and reset. The nodes run the scripted model and call a tool of the real
agent endpoint, so the tests see what reached the tools, not only what the nodes said. A session another client
started before the fleet existed is answered from the node, never guessed idle."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from opencode.event_proxy import EventProxy
from opencode.opencode_stack import MODEL, Node, agent_stack, oc
from support.server_process import ServerProcess

from unit_mcp.fleet import INSTRUCTIONS, Fleet, FleetTools, NodeSpec
from unit_mcp.fleet.nodes import password_variable
from unit_mcp.testing import Match, call, say, tool_call
from unit_mcp.wire import ERROR_META_KEY

pytestmark = pytest.mark.anyio
POLL_TIMEOUT = 60
TASKS = [("alpha", "echo_token", {"token": "alpha"}), ("beta", "unit_inspect", {"unit_id": "counter"})]


def node_arg(name: str, node: Node) -> str:
    assert node.process.port is not None
    return f"{name}=http://opencode@127.0.0.1:{node.process.port}"


def passwords(**nodes: Node) -> dict[str, str]:
    """Each node's own password in its FLEET_PASSWORD_<NAME> (a password on the command line is refused)."""
    return {password_variable(name): node.process.password or "" for name, node in nodes.items()}


class Master:
    """The master agent's side: an MCP client calling fleet tools and reading their structured results."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def __call__(self, tool: str, **arguments: Any) -> dict[str, Any]:
        result = await self.client.call_tool(tool, arguments)
        assert not result.is_error, f"{tool} failed: {result.content}"
        assert result.structured_content is not None
        return result.structured_content

    async def refused(self, tool: str, **arguments: Any) -> str:
        result = await self.client.call_tool(tool, arguments)
        assert result.is_error, f"{tool} was expected to fail: {result.structured_content}"
        return "".join(getattr(block, "text", "") for block in result.content)

    async def until_idle(self, node: str) -> None:
        with anyio.fail_after(POLL_TIMEOUT):
            while (await self("fleet_get_session_status", node=node))["status"] != "idle":
                await anyio.sleep(0.2)


@asynccontextmanager
async def over_http(tmp: Path, nodes: Sequence[str], env: dict[str, str]) -> AsyncIterator[Master]:
    args = [part for node in nodes for part in ("--node", node)]
    process = ServerProcess(*args, tmp=tmp, module="unit_mcp.fleet", env=env)
    try:
        printed = process.ready()
        assert printed["MCP_SSE_URL"].endswith("/sse")
        headers = {"Authorization": f"Bearer {printed['MCP_TOKEN']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http,
            Client(streamable_http_client(printed["MCP_URL"], http_client=http)) as client,
        ):
            assert client.instructions == INSTRUCTIONS
            yield Master(client)
    finally:
        assert process.stop() == 0


async def test_a_master_dispatches_polls_and_retrieves_on_two_nodes_in_parallel(
    tmp_path: Path, opencode_binary: Path
) -> None:
    # node a calls a local tool of the agent endpoint, node b a tool of the real unit server behind it
    steps = [
        call(
            tool_call(oc(tool), arguments),
            when=Match(user_contains=f"{word} task", last_role="user", has_tools=True),
            label=f"{word} asks",  # each node's first answer waits until the other node has asked: nodes
            after=f"{other} asks",  # run one after the other never get both answers, and the error fails the test
        )
        for (word, tool, arguments), other in zip(TASKS, ("beta", "alpha"), strict=True)
    ]
    steps += [
        say(f"{word} done", when=Match(user_contains=f"{word} task", last_role="tool")) for word in ("alpha", "beta")
    ]
    steps.append(say("still here", when=Match(user_contains="alpha again")))
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=2) as stack:
        a, b = stack.nodes
        async with over_http(tmp_path, [node_arg("a", a), node_arg("b", b)], passwords(a=a, b=b)) as master:
            listed = await master("fleet_list_nodes")
            assert [(n["name"], n["session_id"]) for n in listed["nodes"]] == [("a", None), ("b", None)]

            health = await master("fleet_node_health", node="a")
            assert health["healthy"] and health["version"]
            capabilities = health["capabilities"]
            assert capabilities["default"] == "deny" and capabilities["rules"] == {"unit-agent_*": "allow"}
            assert capabilities["mcp"] == {"unit-agent": "connected"} and capabilities["model"] == MODEL
            assert "Allowed: unit-agent_*" in capabilities["summary"]
            assert await a.client.list_sessions() == []  # the health check created no session
            ping = await master("fleet_node_health", node="b", include_capabilities=False)
            assert ping["healthy"] and ping["capabilities"] is None

            sent_a = await master("fleet_send_message", node="a", message="alpha task")
            sent_b = await master("fleet_send_message", node="b", message="beta task")
            assert sent_a["new_session"] and sent_b["new_session"]
            # fire-and-forget: both dispatches are back while both nodes still work on their tasks
            both = [await master("fleet_get_session_status", node=n) for n in ("a", "b")]
            assert [(s["status"], s["source"]) for s in both] == [("busy", "events")] * 2  # both nodes at work

            await master.until_idle("a")
            await master.until_idle("b")
            for node, (word, tool, arguments), sent in zip("ab", TASKS, (sent_a, sent_b), strict=True):
                read = await master("fleet_get_session_messages", node=node)
                assert read["session_id"] == sent["session_id"] and read["status"] == "idle"
                roles = [m["role"] for m in read["messages"]]
                assert roles[0] == "user" and read["messages"][0]["text"] == f"{word} task"
                assert read["messages"][-1]["role"] == "assistant" and read["messages"][-1]["text"] == f"{word} done"
                (used,) = [t for m in read["messages"] for t in m["tools"]]
                assert (used["tool"], used["status"], used["input"]) == (oc(tool), "completed", arguments)
                if tool == "echo_token":
                    assert used["output"] == word
                else:  # the unit server's own answer about the counter unit
                    assert json.loads(used["output"])["unit_id"] == "counter"
                newest = await master("fleet_get_session_messages", node=node, limit=1)
                assert [m["text"] for m in newest["messages"]] == [f"{word} done"]

            sessions = await master("fleet_list_sessions", node="a")
            assert [(s["id"], s["working"], s["status"]) for s in sessions["sessions"]] == [
                (sent_a["session_id"], True, "idle")
            ]
            models = await master("fleet_list_models", node="b")
            assert models["default"] == MODEL and {"id": MODEL, "name": "m", "default": True} in models["models"]
            again = await master("fleet_send_message", node="a", message="alpha again")  # the same session goes on
            assert again["session_id"] == sent_a["session_id"] and not again["new_session"]
            await master.until_idle("a")
            newest = await master("fleet_get_session_messages", node="a", limit=2)
            assert [m["text"] for m in newest["messages"]] == ["alpha again", "still here"]

            assert "no node named 'c'" in await master.refused("fleet_send_message", node="c", message="x")
            assert "[invalid_argument]" in await master.refused("fleet_send_message", node="a")

    assert stack.recorder.calls == [("echo_token", {"token": "alpha"})]
    first = {r.last_text: r.received_at for r in stack.model.requests if r.last_message["role"] == "user"}
    finals = [r.received_at for r in stack.model.requests if r.last_message["role"] == "tool"]
    assert max(first["alpha task"], first["beta task"]) < min(finals), "the two nodes did not work in parallel"


async def test_interrupt_and_reset_over_stdio(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [
        call(tool_call(oc("slow_echo"), {"seconds": 60}), when=Match(user_contains="slow task", has_tools=True)),
        say("fresh start", when=Match(user_contains="gamma task")),
        say("rebuilt", when=Match(user_contains="delta task")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=1) as stack:
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "unit_mcp.fleet", "--stdio", "--node", node_arg("a", stack.node)],
            env=passwords(a=stack.node),
        )
        async with Client(stdio_client(params), mode="legacy") as client:
            master = Master(client)
            assert {t.name for t in (await client.list_tools()).tools} >= {"fleet_reset_session", "fleet_list_models"}
            assert "no working session yet" in await master.refused("fleet_get_session_status", node="a")

            slow = await master("fleet_send_message", node="a", message="slow task")
            with anyio.fail_after(POLL_TIMEOUT):
                await stack.recorder.slow_started.wait()
            assert (await master("fleet_get_session_status", node="a"))["status"] == "busy"
            refusal = await master.refused("fleet_reset_session", node="a")
            assert "is busy: wait until it is idle, or stop it with fleet_interrupt_session" in refusal

            stopped = await master("fleet_interrupt_session", node="a")
            assert stopped == {"node": "a", "session_id": slow["session_id"], "interrupted": True}
            await master.until_idle("a")

            reset = await master("fleet_reset_session", node="a", delete=True)
            assert reset == {"node": "a", "previous_session_id": slow["session_id"], "deleted": True}
            assert slow["session_id"] not in {s["id"] for s in await stack.node.client.list_sessions()}
            fresh = await master("fleet_send_message", node="a", message="gamma task")
            assert fresh["new_session"] and fresh["session_id"] != slow["session_id"]
            await master.until_idle("a")
            read = await master("fleet_get_session_messages", node="a")
            assert [m["text"] for m in read["messages"]] == ["gamma task", "fresh start"]

            # the node loses the working session (deleted behind the fleet's back): the next message rebuilds it
            assert await stack.node.client.delete_session(fresh["session_id"])
            rebuilt = await master("fleet_send_message", node="a", message="delta task")
            assert rebuilt["new_session"] and rebuilt["replaced_session_id"] == fresh["session_id"]
            await master.until_idle("a")
            read = await master("fleet_get_session_messages", node="a")
            assert [m["text"] for m in read["messages"]] == ["delta task", "rebuilt"]
    assert stack.recorder.slow == ["started", "cancelled"]


async def test_with_the_event_stream_down_the_status_comes_from_the_node(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [call(tool_call(oc("slow_echo"), {"seconds": 60}), when=Match(user_contains="slow task", has_tools=True))]
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=1) as stack:
        assert stack.node.process.port is not None
        async with EventProxy(stack.node.process.port) as proxy:
            proxy.mode = "block"  # every /event request of the fleet's client is refused: the stream never comes up
            spec = NodeSpec("a", proxy.url, password=stack.node.process.password)
            async with Fleet([spec], timeout=10) as fleet:
                sent = await fleet.send("a", "slow task")
                with anyio.fail_after(POLL_TIMEOUT):
                    await stack.recorder.slow_started.wait()
                status = await fleet.status("a")
                assert (status.status, status.source) == ("busy", "node")
                assert (await fleet.interrupt("a")).interrupted
                with anyio.fail_after(POLL_TIMEOUT):
                    while (status := await fleet.status("a")).status != "idle":
                        await anyio.sleep(0.2)
                assert status.source == "node" and status.session_id == sent.session_id
                assert proxy.event_connections > 0 and fleet.list_nodes().nodes[0].event_stream == "reconnecting"


async def test_a_reply_that_ends_before_the_prompt_is_answered_leaves_the_session_idle(
    tmp_path: Path, opencode_binary: Path
) -> None:
    """The node takes the prompt up and ends its reply, and the fleet's event stream says so, before the answer to
    the prompt's POST arrives (as under load): the fleet's status is idle, not a busy no event will ever clear."""
    steps = [say("quick", when=Match(user_contains="quick task"))]
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=1) as stack:
        assert stack.node.process.port is not None
        async with EventProxy(stack.node.process.port) as proxy:
            spec = NodeSpec("a", proxy.url, password=stack.node.process.password)
            async with Fleet([spec], timeout=30) as fleet:
                client = fleet.node("a").client
                assert await client.events.wait_connected(POLL_TIMEOUT)
                async with client.listen() as events:

                    async def after_the_reply_ended() -> None:
                        with anyio.fail_after(POLL_TIMEOUT):
                            async for event in events:
                                if event.type == "session.idle":
                                    return

                    proxy.hold = lambda request: b"/prompt_async " in request.split(b"\r\n", 1)[0]
                    proxy.release = after_the_reply_ended
                    sent = await fleet.send("a", "quick task")
                assert proxy.held == 1
                assert sent.session_id not in await client.session_statuses()  # the node: idle
                status = await fleet.status("a")
                assert (status.status, status.source) == ("idle", "events")
                read = await fleet.messages("a")
                assert [m.text for m in read.messages] == ["quick task", "quick"]


async def test_a_session_busy_before_the_fleet_started_is_answered_from_the_node(
    tmp_path: Path, opencode_binary: Path
) -> None:
    steps = [call(tool_call(oc("slow_echo"), {"seconds": 60}), when=Match(user_contains="slow task", has_tools=True))]
    async with agent_stack(tmp_path, opencode_binary, steps, nodes=1) as stack:
        busy = await stack.node.client.send(None, "slow task")  # another client, before the fleet exists
        with anyio.fail_after(POLL_TIMEOUT):
            await stack.recorder.slow_started.wait()
        spec = NodeSpec("a", stack.node.client.base_url, password=stack.node.process.password)
        async with Fleet([spec], timeout=10) as fleet:
            tools = FleetTools(fleet)
            assert await fleet.node("a").client.events.wait_connected(POLL_TIMEOUT)
            # the stream is up but never saw this session go busy: its cache would say idle
            assert fleet.node("a").client.status(busy.session_id) == "idle"
            status = await fleet.status("a", busy.session_id)
            assert (status.status, status.source) == ("busy", "node")
            read = await fleet.messages("a", busy.session_id)
            assert read.status == "busy" and read.messages[0].text == "slow task"

            unknown = await tools.call("fleet_get_session_status", {"node": "a", "session_id": "ses_nope"})
            assert unknown.is_error and unknown.meta is not None
            assert unknown.meta[ERROR_META_KEY]["code"] == "unknown_session"
            assert "does not know session ses_nope" in unknown.content[0].text  # type: ignore[union-attr]

            assert (await fleet.interrupt("a", busy.session_id)).interrupted
            with anyio.fail_after(POLL_TIMEOUT):
                while (status := await fleet.status("a", busy.session_id)).status != "idle":
                    await anyio.sleep(0.2)
            assert status.source == "node"
    assert stack.recorder.slow == ["started", "cancelled"]
