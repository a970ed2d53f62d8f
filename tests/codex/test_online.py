"""The reference's three online tests, through the Codex-backed agent and the real Codex CLI.

The scripted model is Codex's provider (Responses API); Codex runs the tools itself, over MCP, through the
approval-filtered endpoint, which reaches the real unit server. Hard checks: what reached the server
(count, order, exact arguments), what Codex offered the model, the persisted session (reloaded from
disk), turn status; prose only by marker.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from agent.conftest import endpoint_client
from support.item_kinds import item_kinds
from support.online import NONCE_PROMPT, echo_token, nonce_steps

from unit_mcp.agent import AgentApprovals, ApprovedEndpoint, TurnStatus
from unit_mcp.agent.codex import register
from unit_mcp.agent.items import EventItem, MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.testing import Match, call, say, tool_call

from .codex_stack import (
    AGENT_ID,
    MODEL,
    NAMESPACE,
    NONCE,
    SERVER,
    TURN_TIMEOUT,
    codex_model,
    codex_options,
    codex_stack,
    reload,
)

pytestmark = pytest.mark.anyio

NATIVE = {"shell", "exec_command", "write_stdin", "apply_patch", "spawn_agent", "web_search", "view_image"}


def namespaces(body: dict) -> dict[str, list[str]]:
    """The tools a Responses request offered inside each namespace."""
    return {
        tool["name"]: [inner["name"] for inner in tool.get("tools", [])]
        for tool in body.get("tools", [])
        if tool.get("type") == "namespace"
    }


async def test_echo_token(tmp_path: Path, codex_binary: Path) -> None:
    marker = f"marker-{secrets.token_hex(6)}"
    prompt, steps = echo_token(marker)
    async with codex_stack(tmp_path, codex_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, prompt)).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == marker
        stack.model.assert_done()
        first = stack.model.requests[0]
        assert first.path == "/v1/responses" and first.body["stream"] is True and first.body["model"] == MODEL
        assert "echo_token" in namespaces(first.body)[NAMESPACE]
        assert not NATIVE & set(first.tool_names)  # no native shell, patching, sub-agents or web search
        assert "You are Unit Agent" in first.messages[0]["content"]  # the system prompt, as developer instructions
        assert list(stack.workspace().iterdir()) == []  # the run's private home is gone

    assert stack.server.calls == [("echo_token", {"token": marker})]
    reloaded = reload(tmp_path, session.id)  # a fresh store, cache gone: what is on disk
    kinds = item_kinds(reloaded.items)
    assert kinds == [
        "turn-started",
        "message",
        "unit-checkpoint",  # the turn can be undone in one step
        "codex-thread-started",
        "tool-call",
        "tool-result",
        "message",
        "codex-turn-completed",
        "turn-completed",
    ]
    user, call_item, result, final = (i for i in reloaded.items if not isinstance(i, EventItem))
    assert isinstance(user, MessageItem) and (user.role, user.content) == ("user", prompt)
    assert isinstance(call_item, ToolCallItem) and (call_item.name, call_item.risk) == ("echo_token", "normal")
    assert (call_item.provider, call_item.source) == ("codex", SERVER)
    assert isinstance(result, ToolResultItem) and result.call_id == call_item.call_id and result.output == marker
    assert isinstance(final, MessageItem) and final.role == "assistant" and final.content == marker
    assert (final.provider, final.model) == ("codex", MODEL) and final.usage and final.usage.input_tokens > 0
    assert reloaded.open_tool_calls() == [] and reloaded.status == "idle" and reloaded.agent_id == AGENT_ID


async def test_nonce_sequencing(tmp_path: Path, codex_binary: Path) -> None:
    prompt, steps = NONCE_PROMPT, nonce_steps()
    async with codex_stack(tmp_path, codex_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, prompt)).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        stack.model.assert_done()

    assert stack.server.calls == [("get_nonce", {}), ("record_value", {"value": NONCE})]
    assert handle.result == f"done:{NONCE}"
    items = reload(tmp_path, session.id).items
    calls = [i for i in items if isinstance(i, ToolCallItem)]
    results = [i for i in items if isinstance(i, ToolResultItem)]
    assert [c.name for c in calls] == ["get_nonce", "record_value"]
    assert [r.call_id for r in results] == [c.call_id for c in calls] and len({c.call_id for c in calls}) == 2
    assert results[-1].output == f"recorded:{NONCE}" and not any(r.is_error for r in results)
    assert items.index(results[0]) < items.index(calls[1])  # each result is on disk before the next call


async def test_approval_boundary(tmp_path: Path, codex_binary: Path) -> None:
    """Only `normal` is approved: high-risk tools are absent from the endpoint, never offered by Codex and
    never called, however the model names them."""
    approvals = AgentApprovals(
        {"filesystem-read": "ask", "filesystem-write": "ask", "shell": "ask", "destructive": "ask"}
    )
    steps = [
        call("wipe_units", when=Match(last_role="user")),  # a tool it was not offered, as a model would invent it
        call(tool_call("wipe_units", namespace=NAMESPACE), when=Match(last_contains="unsupported call: wipe_units")),
        say("wipe_units is not available to me.", when=Match(last_contains="unsupported call")),
    ]
    async with (
        codex_stack(tmp_path, codex_binary, steps, approvals=approvals) as stack,
        ApprovedEndpoint(stack.surface, server_name=SERVER, config_root=tmp_path / "endpoint") as endpoint,
    ):
        async with endpoint_client(endpoint, "legacy") as client:
            listed = {tool.name: (tool.meta or {}).get("unit_mcp/risk") for tool in (await client.list_tools()).tools}
            assert set(listed.values()) == {"normal"} and "echo_token" in listed
            assert not {"wipe_units", "unit_reload", "unit_apply_patch", "unit_read_source"} & set(listed)
            assert (await client.call_tool("wipe_units", {})).is_error  # refused at call time too

        # this test's agent is given that endpoint instead of serving its own per turn
        stack.runner.registry.unregister(AGENT_ID)
        options = codex_options(codex_binary, tmp_path, endpoint=endpoint)
        register(stack.runner.registry, model=codex_model(stack.model), id=AGENT_ID, **options)
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "Call wipe_units now.")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert "not available" in (handle.result or "")
        stack.model.assert_done()
        offered = stack.model.requests[0].tool_names
        assert "echo_token" in offered and "wipe_units" not in offered and "unit_apply_patch" not in offered

    assert "wipe_units" not in stack.server.called()
    assert not {"unit_reload", "unit_apply_patch", "unit_run_tests"} & set(stack.server.called())
    items = reload(tmp_path, session.id).items
    assert not any(isinstance(i, ToolCallItem) for i in items)  # Codex refused before any MCP call
    assert reload(tmp_path, session.id).status == "idle"
