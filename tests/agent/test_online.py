"""The reference's three online tests, driven by the scripted model through the OpenAI-compatible agent
against the real unit server over loopback HTTP. Hard checks are what reached the server (call counts,
exact arguments), the persisted session, turn status and tool visibility; prose only by marker."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from support.online import NONCE_PROMPT, echo_token, nonce_steps

from unit_mcp.agent import AgentApprovals, AgentRunner, AgentToolSurface, ApprovedEndpoint, OpenAIAgent, TurnStatus
from unit_mcp.agent.items import EventItem, MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.projections import display_messages
from unit_mcp.testing import Match, ScriptedModel, Step, call, say

from .conftest import NONCE, UnitServer, endpoint_client, reload, running

pytestmark = pytest.mark.anyio

MODEL = "scripted-online"  # the fixed model of this suite, recorded on every assistant message


@asynccontextmanager
async def online(
    tmp_path: Path, unit_server: UnitServer, steps: list[Step], approvals: AgentApprovals | None = None
) -> AsyncIterator[tuple[AgentRunner, ScriptedModel, AgentToolSurface]]:
    """A fresh isolated root: scripted model, tool surface on the unit server, runner with the unit agent."""
    surface = AgentToolSurface(approvals or AgentApprovals())
    async with AsyncExitStack() as stack:
        model = await stack.enter_async_context(ScriptedModel(steps))
        surface.add_source(await stack.enter_async_context(unit_server.source()))
        agent = {
            "unit-agent": lambda deps: OpenAIAgent(
                id="unit-agent", model=MODEL, base_url=model.base_url, instructions="Use only the offered tools."
            )
        }
        runner = await stack.enter_async_context(running(tmp_path, agent, surface=surface))
        yield runner, model, surface
        model.assert_done()


async def test_echo_token(tmp_path: Path, unit_server: UnitServer) -> None:
    marker = f"marker-{secrets.token_hex(6)}"
    prompt, steps = echo_token(marker)
    async with online(tmp_path, unit_server, steps) as (runner, _, _):
        session = await runner.create_session("unit-agent")
        handle = await (await runner.run_turn(session.id, prompt)).wait(20)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result is not None and marker in handle.result

    assert unit_server.model_calls() == [("echo_token", {"token": marker})]
    reloaded = reload(tmp_path, session.id)  # a fresh store, cache gone: what is on disk
    shown = display_messages(reloaded.items)
    assert [(m.role, m.content) for m in shown if m.content] == [("user", prompt), ("assistant", marker)]
    assert [m.tool_calls for m in shown if not m.content] == [["echo_token"]]
    types = [i.type for i in reloaded.items if not isinstance(i, EventItem)]
    assert types == [
        "message",
        "message",
        "tool-call",
        "tool-result",
        "message",
    ]  # user, provider step, call, result, final
    final = reloaded.items[-2]
    assert isinstance(final, MessageItem) and (final.provider, final.model) == ("openai", MODEL) and final.usage
    assert reloaded.open_tool_calls() == [] and reloaded.status == "idle"


async def test_nonce_sequencing(tmp_path: Path, unit_server: UnitServer) -> None:
    prompt, steps = NONCE_PROMPT, nonce_steps()
    async with online(tmp_path, unit_server, steps) as (runner, _, _):
        session = await runner.create_session("unit-agent")
        handle = await (await runner.run_turn(session.id, prompt)).wait(20)
        assert handle.status is TurnStatus.COMPLETED, handle.error

    assert unit_server.model_calls() == [("get_nonce", {}), ("record_value", {"value": NONCE})]
    assert handle.result == f"done:{NONCE}"
    items = reload(tmp_path, session.id).items
    assert [i.name for i in items if isinstance(i, ToolCallItem)] == ["get_nonce", "record_value"]
    assert [i.output for i in items if isinstance(i, ToolResultItem)][-1] == f"recorded:{NONCE}"


async def test_approval_boundary(tmp_path: Path, unit_server: UnitServer) -> None:
    """Only `normal` is approved: high-risk tools are absent from the endpoint and never called."""
    approvals = AgentApprovals(
        {"filesystem-read": "ask", "filesystem-write": "ask", "shell": "ask", "destructive": "ask"}
    )
    steps = [
        call("wipe_units", when=Match(last_role="user")),  # the model asks for a tool it was not offered
        say("wipe_units is not available to me.", when=Match(last_contains="approval_denied")),
    ]
    async with online(tmp_path, unit_server, steps, approvals) as (runner, model, surface):
        async with (
            ApprovedEndpoint(surface, config_root=tmp_path / "agent-opencode") as endpoint,
            endpoint_client(endpoint, "legacy") as client,
        ):
            listed = {tool.name: (tool.meta or {}).get("unit_mcp/risk") for tool in (await client.list_tools()).tools}
            assert "wipe_units" not in listed and "unit_reload" not in listed and "unit_apply_patch" not in listed
            assert set(listed.values()) == {"normal"} and "echo_token" in listed
            refused = await client.call_tool("wipe_units", {})
            assert refused.is_error

        session = await runner.create_session("unit-agent")
        handle = await (await runner.run_turn(session.id, "Call wipe_units now.")).wait(20)
        assert handle.status is TurnStatus.COMPLETED and "not available" in (handle.result or "")
        assert "wipe_units" not in model.requests[0].tool_names

    assert "wipe_units" not in unit_server.called()
    assert all(call.name not in ("unit_reload", "unit_apply_patch", "unit_run_tests") for call in unit_server.calls)
    items = reload(tmp_path, session.id).items
    denied = next(i for i in items if isinstance(i, ToolResultItem))
    assert denied.is_error and denied.output.startswith("[approval_denied] wipe_units (risk: destructive)")
    assert any(isinstance(i, EventItem) and i.kind == "approval-decided" for i in items)
