"""OpenCodeClient against a real node: its REST surface and error mapping, and the event stream's
reconnect and polling fallback when the stream is refused or goes silent (broken by an `EventProxy`)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import anyio
import httpx
import pytest

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.items import ErrorItem, MessageItem, ToolCallItem
from unit_mcp.agent.opencode import (
    PINNED_VERSION,
    NodeUnavailable,
    OpenCodeClient,
    OpenCodeHTTPError,
    UnknownOpenCodeSession,
)
from unit_mcp.testing import Match, call, say, tool_call

from .opencode_stack import SERVER, TURN_TIMEOUT, agent_stack, oc

pytestmark = pytest.mark.anyio


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def echo_steps(token: str) -> list:  # type: ignore[type-arg]
    return [
        call(tool_call(oc("echo_token"), {"token": token}), when=Match(last_role="user", has_tools=True)),
        say("{{last}}", when=Match(last_role="tool")),
    ]


async def test_rest_surface_and_errors(tmp_path: Path, opencode_binary: Path) -> None:
    async with agent_stack(tmp_path, opencode_binary, []) as stack:
        node, client = stack.node.process, stack.node.client
        assert await client.health() == {"healthy": True, "version": PINNED_VERSION}
        assert (await client.mcp_status())[SERVER]["status"] == "connected"

        rules = [{"permission": oc("echo_token"), "pattern": "*", "action": "deny"}]
        created = await client.create_session(title="rest", permission=rules)
        assert created["title"] == "rest" and created["id"] in {s["id"] for s in await client.list_sessions()}
        assert (await client.get_session(created["id"]))["id"] == created["id"]
        assert await client.messages(created["id"]) == []
        assert await client.permissions() == []
        assert created["id"] not in await client.session_statuses()

        assert await client.delete_session(created["id"])
        with pytest.raises(UnknownOpenCodeSession, match="404"):
            await client.get_session(created["id"])
        with pytest.raises(UnknownOpenCodeSession):
            await client.prompt_async(created["id"], "hello")

        # A session that disappears after it was checked and before the prompt reaches it is replaced, once.
        doomed = (await client.create_session(title="doomed"))["id"]
        deleted: list[str] = []

        def delete_it_first(session_id: str) -> None:  # runs right before the prompt goes out
            if not deleted:
                deleted.append(session_id)
                auth = httpx.BasicAuth("opencode", node.password or "")
                httpx.delete(f"{node.url}/session/{session_id}", auth=auth, timeout=5).raise_for_status()

        sent = await client.send(doomed, "hello", title="replacement", on_session=delete_it_first)
        assert deleted == [doomed]
        assert sent.replaced and sent.session_id != doomed and sent.previous_session_id == doomed
        assert sent.replace_reason == f"the node lost session {doomed} before the prompt reached it"
        assert (await client.get_session(sent.session_id))["title"] == "replacement"
        await client.abort(sent.session_id)

        async with OpenCodeClient(node.url or "", password="wrong", timeout=5) as stranger:
            with pytest.raises(OpenCodeHTTPError) as refused:
                await stranger.health()
            assert refused.value.status == 401

        started = time.monotonic()
        async with OpenCodeClient(f"http://127.0.0.1:{unused_port()}", timeout=3) as nobody:
            with pytest.raises(NodeUnavailable, match="did not answer GET /global/health"):
                await nobody.health()
        assert time.monotonic() - started < 5

        # close() rejects whoever still waits on the stream.
        waiter = OpenCodeClient(node.url or "", password=node.password, timeout=5)
        opened, close_now = anyio.Event(), anyio.Event()
        failure: list[BaseException] = []

        async def own_client() -> None:  # the client is entered and closed in one task
            async with waiter:
                opened.set()
                await close_now.wait()

        async def wait_forever() -> None:
            try:
                await waiter.wait_idle("ses_never", since=waiter.events.seq, timeout=30)
            except NodeUnavailable as exc:
                failure.append(exc)

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(own_client)
                await opened.wait()
                tg.start_soon(wait_forever)
                await anyio.sleep(0.2)
                close_now.set()
        assert failure and "closed" in str(failure[0])


async def test_refused_event_stream_falls_back_to_polling(tmp_path: Path, opencode_binary: Path) -> None:
    options = {"connect_wait": 0.5, "poll_interval": 0.5}
    async with agent_stack(
        tmp_path, opencode_binary, echo_steps("polled"), proxied=True, client_options=options
    ) as stack:
        proxy, client = stack.nodes[0].proxy, stack.node.client
        assert proxy is not None
        proxy.mode = "block"
        await proxy.cut()
        with anyio.fail_after(5):
            while client.events.connected:
                await anyio.sleep(0.05)

        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "echo")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == "polled"
        assert not client.events.connected and proxy.refused >= 2, "the stream was not refused throughout"


async def test_silent_event_stream_is_reopened(tmp_path: Path, opencode_binary: Path) -> None:
    options = {"heartbeat_timeout": 3.0}
    async with agent_stack(
        tmp_path, opencode_binary, echo_steps("reopened"), proxied=True, client_options=options
    ) as stack:
        proxy, client = stack.nodes[0].proxy, stack.node.client
        assert proxy is not None
        with anyio.fail_after(5):
            await client.events.wait_connected(5)
        connects = client.events.connects
        proxy.mode = "freeze"  # the connection stays open; nothing more arrives on it (nor on a new one)

        session = await stack.new_session()
        handle = await stack.runner.run_turn(session.id, "echo")
        started = time.monotonic()
        with anyio.fail_after(10):
            while client.events.connected:
                await anyio.sleep(0.05)
        assert time.monotonic() - started < 3.0 + 2.0, "the silence was not noticed in time"
        assert "ReadTimeout" in (client.events.last_error or ""), client.events.last_error
        proxy.mode = "pass"
        with anyio.fail_after(3.0 + 5.0):  # the frozen reconnect attempt times out too, then a clean one
            while client.events.connects == connects or not client.events.connected:
                await anyio.sleep(0.05)

        await handle.wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == "reopened"


async def test_failed_read_back_fails_the_turn_without_lossy_text(tmp_path: Path, opencode_binary: Path) -> None:
    """The reply cannot be read back from the node: the turn fails, saying so, and records no answer (what
    was streamed is labelled unconfirmed; the call seen on the event stream is kept, since it ran)."""
    async with agent_stack(tmp_path, opencode_binary, echo_steps("lost"), proxied=True) as stack:
        proxy = stack.nodes[0].proxy
        assert proxy is not None
        proxy.refuse = lambda chunk: chunk.startswith(b"GET /session/") and b"/message" in chunk.split(b"\r\n", 1)[0]
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "echo")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.FAILED
        assert "could not read the reply back from OpenCode" in (handle.error or ""), handle.error
        assert proxy.refused >= 1 and stack.recorder.calls == [("echo_token", {"token": "lost"})]

    items = stack.reload(session.id).items
    answers = [i for i in items if isinstance(i, MessageItem) and i.role == "assistant"]
    assert all(i.kind == "unconfirmed" and not i.partial for i in answers), answers  # streamed, never confirmed
    [call] = [i for i in items if isinstance(i, ToolCallItem)]  # seen running on the event stream: it did run
    assert call.name == "echo_token" and call.arguments == '{"token": "lost"}'
    [error] = [i for i in items if isinstance(i, ErrorItem)]
    assert "could not read the reply back" in error.message
