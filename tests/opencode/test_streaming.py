"""OpenCodeAgent follows the node while it works: text streams into partial messages, tool calls are recorded
as they happen, and the read-back at the end settles every item in place (nothing duplicated, nothing
left partial)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.item_kinds import item_kinds

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.items import EventItem, Item, MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.turns import TurnCallbacks
from unit_mcp.testing import Match, call, say, tool_call

from .opencode_stack import TURN_TIMEOUT, agent_stack, oc

pytestmark = pytest.mark.anyio

STEP_TEXT = "Let me echo that token for you first."
FINAL_TEXT = "The token came back as tok-7 and this answer streams in small pieces."


async def test_text_streams_and_calls_are_recorded_as_they_happen(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [
        call(
            tool_call(oc("echo_token"), {"token": "tok-7"}),
            text=STEP_TEXT,
            when=Match(last_role="user", has_tools=True),
            chunk_size=6,
            chunk_delay=0.05,
        ),
        say(FINAL_TEXT, when=Match(last_role="tool"), chunk_size=6, chunk_delay=0.1),
    ]
    partials: list[tuple[str, str]] = []
    live: list[Item] = []
    callbacks = TurnCallbacks(
        on_item=live.append,
        on_partial=lambda item: partials.append((item.id, item.content)),  # type: ignore[union-attr]
    )
    async with agent_stack(tmp_path, opencode_binary, steps) as stack:
        session = await stack.new_session()
        handle = await (await stack.runner.run_turn(session.id, "echo tok-7", callbacks)).wait(TURN_TIMEOUT)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == FINAL_TEXT

    assert stack.recorder.calls == [("echo_token", {"token": "tok-7"})]
    streamed = {item.id: item.content for item in live if isinstance(item, MessageItem) and item.partial}
    assert len(streamed) == 2, live  # one partial item per model step
    final_updates = [content for item_id, content in partials if content and FINAL_TEXT.startswith(content)]
    # The final text arrived in growing pieces: a part of it before the whole (under load OpenCode sends fewer,
    # bigger updates: 2 distinct pieces at a load of 10, so more is not asked).
    assert len(set(final_updates)) >= 2 and min(map(len, final_updates)) < len(FINAL_TEXT), partials
    live_kinds = item_kinds(live)
    first_partial = next(n for n, i in enumerate(live) if isinstance(i, MessageItem) and i.partial)
    assert live_kinds.index("tool-call") > first_partial, live_kinds  # the call was recorded after its step's text

    reloaded = stack.reload(session.id)
    kinds = item_kinds(reloaded.items)
    assert kinds == [
        "turn-started",
        "message",
        "unit-checkpoint",  # the turn can be undone in one step
        "opencode-session-created",
        "message",
        "tool-call",
        "tool-result",
        "message",
        "turn-completed",
    ]
    user, step, call_item, result, final = (i for i in reloaded.items if not isinstance(i, EventItem))
    assert isinstance(user, MessageItem) and user.role == "user"
    assert isinstance(step, MessageItem) and (step.kind, step.content, step.partial) == ("step", STEP_TEXT, False)
    assert isinstance(call_item, ToolCallItem) and call_item.name == "echo_token"
    assert isinstance(result, ToolResultItem) and result.output == "tok-7"
    assert isinstance(final, MessageItem) and (final.content, final.partial) == (FINAL_TEXT, False)
    assert final.usage is not None and final.model is not None
    assert {step.id, final.id} == set(streamed), "the streamed items became the recorded ones, in place"
