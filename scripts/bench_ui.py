#!/usr/bin/env python3
"""Benchmark: what the approval page costs on a store of many sessions.

- one poll of a page's event stream (`store_state`: a stat per journal), which every open page does 4 times a
  second;
- listing the pending approvals cold (every journal read, those holding a request replayed) and warm (nothing
  changed: only stats), and after one session changed;
- rendering the transcript of a session holding a 5 MB tool argument, and the HTML size the browser gets.

Printed, not asserted:  .venv/bin/python scripts/bench_ui.py [--sessions N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, ApprovalRequest, SessionStore
from unit_mcp.agent.items import EventItem, MessageItem, ToolCallItem
from unit_mcp.agent.ui import AgentUI
from unit_mcp.webpage.auth import SESSION_HEADER


def fill(root: Path, sessions: int) -> str:
    """`sessions` sessions of 20 items; every tenth left paused on an approval; the last holds a 5 MB argument."""
    store = SessionStore(root, durability="never")
    last = ""
    for n in range(sessions):
        session = store.create("bench", title=f"session {n}")
        for m in range(18):
            store.append_item(session, MessageItem(role="user" if m % 2 else "assistant", content=f"message {m} " * 20))
        arguments: dict[str, Any] = {"unit_id": "counter", "blob": "A" * 5_000_000 if n == sessions - 1 else "x"}
        store.append_item(
            session, ToolCallItem(name="unit_reload", arguments=json.dumps(arguments), call_id="c1", turn_id="turn-1")
        )
        if n % 10 == 0 or n == sessions - 1:
            request = ApprovalRequest(
                risk="shell", tool="unit_reload", arguments=arguments, turn_id="turn-1", call_id="c1"
            )
            store.append_item(
                session, EventItem(kind="approval-requested", data=request.model_dump(mode="json"), turn_id="turn-1")
            )
            store.update(session, status="running")
        last = session.id
    store.close()
    return last


def timed(action: Callable[[], object], repeat: int) -> float:
    """Median milliseconds of `action`."""
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "sessions"
        big = fill(root, args.sessions)
        runner = AgentRunner(store=root, registry=AgentRegistry(), tools=AgentToolSurface(AgentApprovals()))
        ui = AgentUI(runner, port=8000)
        print(f"{args.sessions} sessions of 20 items, {args.sessions // 10 + 1} with a pending approval")
        print(f"  event-stream poll (store_state):   {timed(ui.store_state, 20):8.1f} ms")
        print(f"  pending approvals, cold:           {timed(lambda: pending_cold(ui), 1):8.1f} ms")
        print(f"  pending approvals, warm:           {timed(ui.pending.pending, 20):8.1f} ms")
        with TestClient(ui.app, base_url="http://127.0.0.1:8000") as client:
            login = client.get(ui.login_url("http://127.0.0.1:8000"))  # the shell, with the page session's secret
            found = re.search(r'data-session="([^"]+)"', login.text)
            assert found is not None, login.text
            client.headers[SESSION_HEADER] = found.group(1)
            pages: list[int] = []

            def page() -> None:
                pages.append(len(client.get(f"/sessions/{big}").content))

            print(f"  transcript with a 5 MB argument:   {timed(page, 5):8.1f} ms, {pages[-1]:,} bytes of HTML")
            listed: list[int] = []

            def pending_page() -> None:
                listed.append(len(client.get("/").content))

            print(
                f"  pending page (warm):               {timed(pending_page, 5):8.1f} ms, {listed[-1]:,} bytes of HTML"
            )


def pending_cold(ui: AgentUI) -> None:
    """Every journal read again, as on the first request after start."""
    ui.pending._cache.clear()
    ui.pending.pending()


if __name__ == "__main__":
    main()
