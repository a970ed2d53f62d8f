"""The reference's three online tests, through OpenCodeAgent over a real `opencode serve` node.

The scripted model is OpenCode's provider; OpenCode runs the tools itself, through the approval-filtered
endpoint. Hard checks: what reached the tools (count, order, exact arguments), what OpenCode offered the
model, the persisted session (reloaded from disk), turn status; prose only by marker.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest
from agent.conftest import endpoint_client
from support.item_kinds import item_kinds
from support.online import NONCE_PROMPT

from unit_mcp.agent import AgentApprovals, TurnStatus
from unit_mcp.agent.items import EventItem, MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.opencode import SESSION_KEY
from unit_mcp.testing import Match, call, say, tool_call

from .opencode_stack import MODEL, NONCE, SERVER, TURN_TIMEOUT, agent_stack, oc

pytestmark = pytest.mark.anyio


async def test_echo_token(tmp_path: Path, opencode_binary: Path) -> None:
    marker = f"marker-{secrets.token_hex(6)}"
    prompt = f"Use echo_token exactly once with token {marker}. Then reply with exactly the tool output."
    steps = [
        call(tool_call(oc("echo_token"), {"token": marker}), when=Match(last_role="user", has_tools=True)),
        say("{{last}}", when=Match(last_role="tool")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, prompt)).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == marker
        stack.model.assert_done()
        opencode_id = (await stack.runner.get_session(session.id)).data[SESSION_KEY]  # type: ignore[union-attr]
        assert opencode_id in {s["id"] for s in await stack.node.client.list_sessions()}

    assert stack.recorder.calls == [("echo_token", {"token": marker})]
    reloaded = stack.reload(session.id)  # a fresh store on a copy of the files: what is on disk
    assert reloaded.data[SESSION_KEY] == opencode_id and reloaded.status == "idle"
    kinds = item_kinds(reloaded.items)
    assert kinds == [
        "turn-started",
        "message",
        "unit-checkpoint",  # the turn can be undone in one step
        "opencode-session-created",
        "tool-call",
        "tool-result",
        "message",
        "turn-completed",
    ]
    user, call_item, result, final = (i for i in reloaded.items if not isinstance(i, EventItem))
    assert isinstance(user, MessageItem) and (user.role, user.content) == ("user", prompt)
    assert isinstance(call_item, ToolCallItem) and call_item.name == "echo_token" and call_item.risk == "normal"
    assert isinstance(result, ToolResultItem) and result.call_id == call_item.call_id and result.output == marker
    assert isinstance(final, MessageItem) and final.role == "assistant" and final.content == marker
    assert (final.provider, final.model) == ("opencode", MODEL) and final.usage and final.usage.input_tokens > 0
    assert reloaded.open_tool_calls() == []


async def test_nonce_sequencing(tmp_path: Path, opencode_binary: Path) -> None:
    nonce = "{{tool:" + oc("get_nonce") + ".nonce}}"  # filled by the scripted model from the tool's result
    steps = [
        call(oc("get_nonce"), when=Match(last_role="user", has_tools=True)),
        call(tool_call(oc("record_value"), {"value": nonce}), when=Match(last_contains="nonce")),
        say(f"done:{nonce}", when=Match(last_contains="recorded:")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, NONCE_PROMPT)).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        stack.model.assert_done()

    assert stack.recorder.calls == [("get_nonce", {}), ("record_value", {"value": NONCE})]
    assert handle.result == f"done:{NONCE}"
    items = stack.reload(session.id).items
    assert [i.name for i in items if isinstance(i, ToolCallItem)] == ["get_nonce", "record_value"]
    assert [i.output for i in items if isinstance(i, ToolResultItem)] == [
        f'{{"nonce": "{NONCE}"}}',
        f"recorded:{NONCE}",
    ]


async def test_approval_boundary(tmp_path: Path, opencode_binary: Path) -> None:
    """Only `normal` is approved and nobody is asked: the high-risk tools are absent from the endpoint
    OpenCode uses and from what OpenCode offers the model; a model that names one anyway gets nothing."""
    steps = [
        call(oc("wipe_units"), when=Match(last_role="user", has_tools=True)),  # a tool it was never offered
        say("wipe_units is not available to me.", when=Match(last_role="tool")),
    ]
    async with agent_stack(tmp_path, opencode_binary, steps, approvals=AgentApprovals()) as stack:
        endpoint = stack.node.endpoint
        async with endpoint_client(endpoint, "legacy") as client:
            listed = {tool.name: (tool.meta or {}).get("unit_mcp/risk") for tool in (await client.list_tools()).tools}
        assert {"wipe_units", "unit_apply_patch", "unit_run_tests", "unit_reload", "unit_read_source"}.isdisjoint(
            listed
        )
        assert set(listed.values()) == {"normal"} and {"echo_token", "unit_list"} <= set(listed)

        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "Call wipe_units now.")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert "not available" in (handle.result or "")
        main_requests = [r for r in stack.model.requests if r.tool_names]
        assert main_requests, "OpenCode never sent the model a request with tools"
        offered = set(main_requests[0].tool_names)
        assert offered == {oc(name) for name in listed}, "OpenCode offered the model more (or less) than the endpoint"
        assert all(name.startswith(f"{SERVER}_") for name in offered)

    assert "wipe_units" not in stack.recorder.names()
    reloaded = stack.reload(session.id)
    [attempt] = [i for i in reloaded.items if isinstance(i, ToolResultItem)]  # OpenCode refused it itself
    assert attempt.name == "wipe_units" and attempt.is_error and "unavailable tool" in attempt.output
    assert reloaded.open_tool_calls() == []
