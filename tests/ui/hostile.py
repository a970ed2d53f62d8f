"""Sessions written the way a process that died while asking leaves them, for the page tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unit_mcp.agent import ApprovalRequest, SessionStore
from unit_mcp.agent.items import EventItem, MessageItem, ToolCallItem, ToolResultItem

SCRIPT = "<script>window.__pwned = 1</script>"
IMG = '<img src=x onerror="window.__pwned = 2">'
JS_URL = "javascript:window.__pwned = 3"
BIG = "A" * 5_000_000 + "<script>window.__pwned = 4</script>"
HOSTILE_ARGUMENTS = {"unit_id": SCRIPT, "source_id": IMG, "link": JS_URL, "blob": BIG}


def paused_session(root: Path, arguments: dict[str, Any], *, title: str = "paused", agent: str = "unit-agent") -> str:
    """A session whose turn asked to call `unit_read_source` with `arguments` and then died (journal left as the
    process wrote it: still running, the call open, the request unanswered); its id."""
    store = SessionStore(root)
    try:
        session_id = store.create(agent, title=title).id
        turn = "turn-0123456789ab"
        store.append_item(session_id, EventItem(kind="turn-started", data={"turn_id": turn}, turn_id=turn))
        store.append_item(session_id, MessageItem(role="user", content=f"{IMG} please", turn_id=turn))
        said = store.append_item(
            session_id, MessageItem(role="assistant", content=f"[click me]({JS_URL}) {SCRIPT}", turn_id=turn)
        )
        store.append_item(
            session_id,
            ToolCallItem(
                name="unit_inspect", arguments='{"unit_id": "x"}', call_id="c0", parent_id=said.id, turn_id=turn
            ),
        )
        store.append_item(
            session_id,
            ToolResultItem(name="unit_inspect", output=SCRIPT + IMG, call_id="c0", is_error=True, turn_id=turn),
        )
        store.append_item(
            session_id,
            ToolCallItem(
                name="unit_read_source",
                arguments=json.dumps(arguments),
                call_id="c1",
                risk="filesystem-read",
                parent_id=said.id,
                turn_id=turn,
            ),
        )
        request = ApprovalRequest(
            risk="filesystem-read",
            tool="unit_read_source",
            arguments=arguments,
            session_id=session_id,
            turn_id=turn,
            call_id="c1",
        )
        store.append_item(
            session_id, EventItem(kind="approval-requested", data=request.model_dump(mode="json"), turn_id=turn)
        )
        store.update(session_id, status="running")
        return session_id
    finally:
        store.close()
