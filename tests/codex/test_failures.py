"""Codex runs that go wrong fail the turn with a clear error, and the session stays loadable and usable:
a model stream that breaks off, a model that answers with an HTTP error, a model server that is down, and
an MCP endpoint Codex cannot reach (`required = true`: never a silent run without tools)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from support.codex_parts import CodexHome, McpServer, codex_exec

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.codex import CodexModel
from unit_mcp.agent.items import ErrorItem, EventItem, MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.testing import Match, ScriptedError, ScriptedModel, Step, call, say, tool_call

from .codex_stack import TURN_TIMEOUT, codex_pids, codex_stack, reload

pytestmark = pytest.mark.anyio


def free_port() -> int:
    """A loopback port nobody listens on (closed right after the kernel picked it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_stream_that_breaks_off_fails_the_turn_and_the_session_stays_usable(
    tmp_path: Path, codex_binary: Path
) -> None:
    steps = [
        call(tool_call("echo_token", {"token": "kept"}), when=Match(user_contains="first")),
        Step(text="I was about to say that the token is", break_off=True, match=Match(last_role="tool")),
        say("recovered", when=Match(user_contains="tool echo_token")),  # the follow-up sees the history
    ]
    async with codex_stack(tmp_path, codex_binary, steps) as stack:
        session = await stack.new_session()
        failed = await (await stack.runner.run_turn(session.id, "first: echo kept")).wait(TURN_TIMEOUT)
        assert failed.status is TurnStatus.FAILED
        assert failed.error == (
            "Codex failed the turn: stream disconnected before completion: stream closed before response.completed"
        )
        assert stack.model.requests[1].error == "the stream was broken off, as scripted"
        assert codex_pids(stack.workspace()) == []

        again = await (await stack.runner.run_turn(session.id, "try again")).wait(TURN_TIMEOUT)
        assert again.status is TurnStatus.COMPLETED and again.result == "recovered", again.error
        stack.model.assert_done()
        follow_up = stack.model.requests[2].messages[-1]["content"]
        assert "user: first: echo kept" in follow_up and "tool echo_token" in follow_up and "-> kept" in follow_up

    assert stack.server.calls == [("echo_token", {"token": "kept"})]
    reloaded = reload(tmp_path, session.id)  # loadable from disk, nothing left open
    assert reloaded.status == "idle" and reloaded.open_tool_calls() == []
    errors = [i for i in reloaded.items if isinstance(i, ErrorItem)]
    assert [(e.code, e.message) for e in errors] == [("codex_turn_failed", failed.error)]
    result = next(i for i in reloaded.items if isinstance(i, ToolResultItem))
    assert result.output == "kept" and not result.synthetic  # the completed call stays as Codex reported it
    ends = [i.kind for i in reloaded.items if isinstance(i, EventItem) and i.kind in ("turn-failed", "turn-completed")]
    assert ends == ["turn-failed", "turn-completed"]
    final = [i for i in reloaded.items if isinstance(i, MessageItem) and i.role == "assistant"]
    assert [m.content for m in final] == ["recovered"]


async def test_a_model_error_fails_the_turn_with_codex_words(tmp_path: Path, codex_binary: Path) -> None:
    steps = [Step(error=ScriptedError(status=400, message="context length exceeded", type="invalid_request_error"))]
    async with codex_stack(tmp_path, codex_binary, steps) as stack:
        session = await stack.new_session()
        failed = await (await stack.runner.run_turn(session.id, "hello")).wait(TURN_TIMEOUT)
        assert failed.status is TurnStatus.FAILED
        assert (failed.error or "").startswith("Codex failed the turn: ") and "context length exceeded" in (
            failed.error or ""
        )
        assert len(stack.model.requests) == 1  # no retry

    reloaded = reload(tmp_path, session.id)
    assert reloaded.status == "idle" and not any(isinstance(i, ToolCallItem) for i in reloaded.items)


async def test_a_model_server_that_is_down_fails_the_turn_at_once(tmp_path: Path, codex_binary: Path) -> None:
    down = CodexModel(name="m", base_url=f"http://127.0.0.1:{free_port()}/v1")
    async with codex_stack(tmp_path, codex_binary, [], agent_options={"model": down}) as stack:
        session = await stack.new_session()
        failed = await (await stack.runner.run_turn(session.id, "hello")).wait(TURN_TIMEOUT)
        assert failed.status is TurnStatus.FAILED
        assert failed.error == "Codex failed the turn: Connection failed: error sending request"


async def test_an_unreachable_mcp_endpoint_fails_the_run(tmp_path: Path, codex_binary: Path) -> None:
    """Without its tools Codex would answer anyway; `required = true` makes the missing endpoint fatal."""
    home = CodexHome(parent=tmp_path)
    async with ScriptedModel([say("I answered without tools", repeat=True)]) as model:
        codex_model = CodexModel(name="m", base_url=model.base_url)
        server = McpServer(name="unit-agent", url=f"http://127.0.0.1:{free_port()}/mcp", token="t", startup_timeout=2)
        process = codex_exec(codex_binary, home, codex_model, server, "hello")
        async with process:
            events = [event async for event in process.events()]
            code = await process.wait()
        assert model.requests == []  # the model was never asked
    assert code == 1 and not any(getattr(event, "type", "") == "turn.completed" for event in events)
    assert "required MCP servers failed to initialize: unit-agent" in process.stderr_tail()
