"""Stopping a Codex turn: cancelled mid-tool, or past its timeout. Either way the Codex process is gone,
the turn ends with the right status, and the session on disk has no tool call without a result."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.items import EventItem, ToolCallItem, ToolResultItem
from unit_mcp.testing import Match, Step, call, say, tool_call

from .codex_stack import TURN_TIMEOUT, codex_pids, codex_stack, reload

pytestmark = pytest.mark.anyio


async def _pid_of_run(workspace: Path) -> int:
    with anyio.fail_after(10):
        while not (pids := codex_pids(workspace)):
            await anyio.sleep(0.01)
    assert len(pids) == 1, pids
    return pids[0]


async def test_cancel_mid_tool_stops_codex_and_closes_the_call(tmp_path: Path, codex_binary: Path) -> None:
    steps = [
        call(tool_call("slow_echo", {"seconds": 30}), when=Match(last_role="user")),
        say("too late", when=Match(last_role="tool"), label="never asked"),
    ]
    async with codex_stack(tmp_path, codex_binary, steps) as stack:
        session = await stack.new_session()
        handle = await stack.runner.run_turn(session.id, "Call slow_echo.")
        pid = await _pid_of_run(stack.workspace())
        with anyio.fail_after(TURN_TIMEOUT):
            await stack.server.slow_started.wait()  # the tool is running on the unit server
        started = anyio.current_time()
        assert await handle.cancel("the user pressed stop")
        assert anyio.current_time() - started < 5  # SIGINT, not a kill after the interrupt timeout
        assert handle.status is TurnStatus.CANCELLED
        assert codex_pids(stack.workspace()) == [] and not Path(f"/proc/{pid}").exists()
        with anyio.fail_after(10):
            while "cancelled" not in stack.server.slow:  # the cancel reached the tool through MCP
                await anyio.sleep(0.01)
        assert [r.label for r in stack.model.requests] == [None]  # Codex asked the model nothing more

    assert stack.server.slow == ["started", "cancelled"]
    reloaded = reload(tmp_path, session.id)  # a fresh store: what is on disk, after the load-time repair
    assert reloaded.open_tool_calls() == [] and reloaded.status == "idle"
    (tool,) = [i for i in reloaded.items if isinstance(i, ToolCallItem)]
    (result,) = [i for i in reloaded.items if isinstance(i, ToolResultItem)]
    assert tool.name == "slow_echo" and result.call_id == tool.call_id
    assert result.synthetic and result.is_error and "the user pressed stop" in result.output
    assert result.turn_id == handle.id  # closed by the turn itself, not by the repair on load
    ended = [i for i in reloaded.items if isinstance(i, EventItem) and i.kind.startswith("turn-")]
    assert [e.kind for e in ended] == ["turn-started", "turn-cancelled"]


async def test_a_turn_past_its_timeout_is_stopped_and_fails(tmp_path: Path, codex_binary: Path) -> None:
    steps = [Step(text="slow answer", delay=20)]
    async with codex_stack(tmp_path, codex_binary, steps, agent_options={"turn_timeout": 1.5}) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "Answer slowly.")).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.FAILED
        assert handle.error == "Codex did not finish the turn within 1.5 s and was stopped"
        assert codex_pids(stack.workspace()) == []

    reloaded = reload(tmp_path, session.id)
    assert reloaded.status == "idle" and reloaded.open_tool_calls() == []
    assert reloaded.items[-2].type == "error" and reloaded.items[-2].code == "codex_timeout"  # type: ignore[union-attr]
