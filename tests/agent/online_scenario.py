"""The reference's online scenario against a real provider: run only by `scripts/test-online` (its name is not a
test module's, so `scripts/test` and `.ci/run` never collect it), which checks the configuration first and hands
it over in `UNIT_MCP_ONLINE_SETTINGS` (the key stays in the variable the configuration names). A real model on
the real unit server over loopback HTTP: the hard checks are what reached the server, the persisted session,
the turn's status and which tools were offered; prose only by marker (docs/agent.md, "Online tests")."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from support.online import NONCE_PROMPT

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, TurnStatus
from unit_mcp.agent.agentfile import AgentSpec, start_agents
from unit_mcp.agent.items import MessageItem, ToolCallItem

from .conftest import NONCE, UnitServer, reload

pytestmark = pytest.mark.anyio
AGENT = "online-agent"
TURN_SECONDS = 120.0  # a real model's turn (the reference's turn timeout)


def settings() -> AgentSpec:
    given = os.environ.get("UNIT_MCP_ONLINE_SETTINGS")
    if not given:
        pytest.fail("no UNIT_MCP_ONLINE_SETTINGS: run the online scenario with scripts/test-online (it checks them)")
    return AgentSpec.model_validate({**json.loads(given), "id": AGENT})


@asynccontextmanager
async def online(tmp_path: Path, unit_server: UnitServer, approvals: AgentApprovals) -> AsyncIterator[AgentRunner]:
    """A fresh root: the configured agent over the unit server's tools, a runner with its own session store."""
    surface = AgentToolSurface(approvals)
    registry = AgentRegistry()
    async with AsyncExitStack() as stack:
        surface.add_source(await stack.enter_async_context(unit_server.source()))
        await start_agents(stack, registry, [settings()], surface=surface)
        runner = await stack.enter_async_context(
            AgentRunner(store=tmp_path / "sessions", registry=registry, tools=surface)
        )
        yield runner


async def turn(runner: AgentRunner, prompt: str) -> tuple[str, str]:
    session = await runner.create_session(AGENT)
    handle = await (await runner.run_turn(session.id, prompt)).wait(TURN_SECONDS)
    assert handle.status is TurnStatus.COMPLETED, f"the turn ended {handle.status}: {handle.error}"
    return session.id, handle.result or ""


async def test_echo_token(tmp_path: Path, unit_server: UnitServer) -> None:
    marker = f"marker-{secrets.token_hex(6)}"
    prompt = (
        f"Use echo_token exactly once with token {marker}. Then reply with exactly the tool output and no extra text."
    )
    async with online(tmp_path, unit_server, AgentApprovals()) as runner:
        session_id, result = await turn(runner, prompt)
    assert unit_server.model_calls() == [("echo_token", {"token": marker})]
    assert marker in result
    items = reload(tmp_path, session_id).items
    messages = [item for item in items if isinstance(item, MessageItem) and item.content]
    assert messages[0].role == "user" and messages[-1].role == "assistant" and marker in messages[-1].content
    assert messages[-1].model, "the assistant's message records the model"


async def test_nonce_sequencing(tmp_path: Path, unit_server: UnitServer) -> None:
    async with online(tmp_path, unit_server, AgentApprovals()) as runner:
        session_id, result = await turn(runner, NONCE_PROMPT)
    assert unit_server.model_calls() == [("get_nonce", {}), ("record_value", {"value": NONCE})]
    assert NONCE in result
    calls = [item.name for item in reload(tmp_path, session_id).items if isinstance(item, ToolCallItem)]
    assert calls == ["get_nonce", "record_value"]


async def test_approval_boundary(tmp_path: Path, unit_server: UnitServer) -> None:
    """Only `normal` is approved: the high-risk tool is not offered, and never called."""
    approvals = AgentApprovals(
        {"filesystem-read": "ask", "filesystem-write": "ask", "shell": "ask", "destructive": "ask"}
    )
    async with online(tmp_path, unit_server, approvals) as runner:
        await turn(runner, "Call the wipe_units tool now, then say what happened.")
    assert "wipe_units" not in unit_server.called()
    assert all(call.name not in ("unit_reload", "unit_apply_patch", "unit_run_tests") for call in unit_server.calls)
