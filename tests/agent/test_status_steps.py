"""A running turn's current step as `agent status` reads it from the stored items, whatever order a turn's calls,
results, questions and answers came in: waiting for a person while a question of this turn is unanswered, else in
the first call without a result, else in a model request; an earlier turn's items never count. And the store's
`running()` it reads, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unit_mcp.agent import SessionStore
from unit_mcp.agent.approvals import ApprovalDecision, ApprovalRequest
from unit_mcp.agent.items import EventItem, Item, MessageItem, Session, ToolCallItem, ToolResultItem
from unit_mcp.agent.status import current_step, read_status

TURN = "turn-now"
OPS = st.lists(st.sampled_from(["say", "call", "result", "ask", "answer"]), max_size=12)


def turn_items(ops: list[str], turn: str, t0: float) -> list[Item]:
    items: list[Item] = [EventItem(kind="turn-started", data={"turn_id": turn}, turn_id=turn, created_at=t0)]
    calls: list[str] = []
    asked: list[ApprovalRequest] = []
    for n, op in enumerate(ops, 1):
        at = t0 + n
        if op == "say":
            items.append(MessageItem(role="assistant", content="…", turn_id=turn, created_at=at))
        elif op == "call":
            calls.append(f"{turn}-call-{n}")
            items.append(ToolCallItem(name=f"tool{n}", call_id=calls[-1], turn_id=turn, created_at=at))
        elif op == "result" and calls:
            items.append(ToolResultItem(name="t", call_id=calls.pop(0), turn_id=turn, created_at=at))
        elif op == "ask":
            request = ApprovalRequest(id=f"apr-{turn}-{n}", risk="shell", tool=f"asked{n}", turn_id=turn, created_at=at)
            asked.append(request)
            items.append(EventItem(kind="approval-requested", data=request.model_dump(mode="json"), created_at=at))
        elif op == "answer" and asked:
            request = asked.pop(0)
            decision = ApprovalDecision(request_id=request.id, risk="shell", approved=True)
            data = {"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}
            items.append(EventItem(kind="approval-decided", data=data, turn_id=turn, created_at=at))
    return items


@given(before=OPS, now=OPS)
def test_the_step_is_the_question_else_the_open_call_else_the_model(before: list[str], now: list[str]) -> None:
    earlier = turn_items(before, "turn-before", 1000.0)  # an earlier turn's leftovers never count
    items = earlier + turn_items(now, TURN, 2000.0)
    session = Session(id="ses-1", agent_id="a", status="running", created_at=1, updated_at=3000, items=items)
    step, tool, since, started = current_step(session)
    assert started == 2000.0
    mine = items[len(earlier) :]
    events = [item for item in mine if isinstance(item, EventItem)]
    decided = {item.data["decision"]["request_id"] for item in events if item.kind == "approval-decided"}
    waiting = [item for item in events if item.kind == "approval-requested" and item.data["id"] not in decided]
    results = {item.call_id for item in mine if isinstance(item, ToolResultItem)}
    open_calls = [item for item in mine if isinstance(item, ToolCallItem) and item.call_id not in results]
    if waiting:
        assert (step, tool, since) == ("waiting for a person", waiting[0].data["tool"], waiting[0].created_at)
    elif open_calls:
        assert (step, tool) == ("tool call", open_calls[0].name) and since >= open_calls[0].created_at
    else:
        assert (step, tool, since) == ("model request", None, mine[-1].created_at)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_running_lists_running_sessions_with_their_live_writer_on_either_database(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    """`SessionStore.running()`, what `agent status` reads: only sessions marked running, each with the process
    holding it (this one, alive), read by another store that claims nothing."""
    address: str | Path = tmp_path / "sessions"
    if database == "postgres":
        address = str(request.getfixturevalue("pg_cluster").new_database())
    store = SessionStore(address)
    reader = SessionStore(address, read_only=True)
    try:
        store.create("agent-a", session_id="ses-idle")
        store.create("agent-b", session_id="ses-busy")
        store.append_item("ses-busy", EventItem(kind="turn-started", data={"turn_id": TURN}), status="running")
        store.append_item("ses-busy", ToolCallItem(name="slow_echo", call_id="c1", turn_id=TURN))
        ((session, writer),) = reader.running()
        assert (session.id, session.agent_id, session.status) == ("ses-busy", "agent-b", "running")
        assert writer is not None and writer.pid == os.getpid() and writer.alive()
        (turn,) = read_status(reader).turns
        assert (turn.step, turn.tool, turn.turn_id) == ("tool call", "slow_echo", TURN)
        assert turn.worker == f"pid {os.getpid()} on {socket.gethostname()}" and not turn.durable
        assert reader.load("ses-busy") is not None  # still readable; the writer keeps its claim:
        store.append_item("ses-busy", EventItem(kind="turn-completed", data={}), status="idle")
        assert reader.running() == [] and read_status(reader).turns == []
    finally:
        reader.close()
        store.close()
