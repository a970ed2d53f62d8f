"""A process appending to agent sessions (`unit_mcp.agent.SessionStore`) is killed with SIGKILL at random
moments, many times: afterwards every session loads, its messages are the acknowledged ones in order (the one
being written may be lost, nothing before it), and what a dead turn left open is repaired.

The writer is forked from a zygote that has already imported the store, so that a kill costs milliseconds
rather than an interpreter start-up; it appends messages, opens and closes tool calls, marks sessions running,
rewrites items (which compacts journals) and now and then creates a session - all of it under the kills.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from unit_mcp.agent.items import MessageItem
from unit_mcp.agent.journal import read
from unit_mcp.agent.sessions import SessionStore

from .report import Report

KILLS = 30

ZYGOTE = r"""
import os, sys
from pathlib import Path
from unit_mcp.agent.items import MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.sessions import SessionStore

def write_forever(root, seed):
    store = SessionStore(root, compact_after=4)
    ids = sorted(path.name.removesuffix(".jsonl") for path in Path(root).glob("*.jsonl"))
    counts = {}
    for sid in ids:
        session = store.require(sid)  # replays and repairs what the last kill left
        numbers = [int(i.content[2:]) for i in session.items if i.type == "message" and i.content.startswith("n=")]
        counts[sid] = max(numbers, default=0)
    print("ready", flush=True)
    step = seed
    while True:
        step += 1
        if len(ids) < 6 and step % 40 == 0:
            sid = f"ses-{len(ids)}"
            store.create("hardening", session_id=sid, title="crash test")
            print(f"created {sid}", flush=True)
            ids.append(sid)
            counts[sid] = 0
        if not ids:
            continue
        sid = ids[step % len(ids)]
        counts[sid] += 1
        n = counts[sid]
        first = store.append_item(sid, MessageItem(role="user", content=f"n={n}"))
        print(f"ack {sid} {n}", flush=True)
        if n % 3 == 0:
            store.update(sid, status="running")
            store.append_item(sid, ToolCallItem(name="unit_list", call_id=f"call-{n}"))
            if n % 2 == 0:
                store.append_item(sid, ToolResultItem(name="unit_list", call_id=f"call-{n}", output="[]"))
                store.update(sid, status="idle")
        if n % 5 == 0:
            store.update_item(sid, first.id, {"content": f"n={n}", "kind": "rewritten"})

for line in sys.stdin:
    root, seed = line.split()
    pid = os.fork()
    if pid == 0:
        try:
            write_forever(root, int(seed))
        finally:
            os._exit(1)
    print(f"child {pid}", flush=True)
    _, status = os.waitpid(pid, 0)
    print(f"exited {status}", flush=True)
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.child: int | None = None  # the writer alive right now, if any

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def run_and_kill(self, root: Path, seed: int, after: float) -> list[str]:
        """Fork a writer, let it write for `after` seconds once ready, SIGKILL it; every line it printed."""
        self.stdin.write(f"{root} {seed}\n")
        self.stdin.flush()
        child = self.child = int(self.stdout.readline().split()[1])
        lines = []
        ready = self.stdout.readline().strip()
        assert ready == "ready", f"the writer did not start: {ready!r}"
        time.sleep(after)
        os.kill(child, signal.SIGKILL)
        while not (line := self.stdout.readline().strip()).startswith("exited"):
            lines.append(line)
        assert line == f"exited {signal.SIGKILL}", line
        self.child = None
        return lines

    def close(self) -> None:
        if self.child is not None:  # a failed test must not leave a writer running
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        self.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def zygote() -> Iterator[Zygote]:
    started = Zygote()
    yield started
    started.close()


def test_sigkill_while_appending_to_sessions_loses_at_most_the_last_item(
    tmp_path: Path, zygote: Zygote, figures: Report
) -> None:
    root = tmp_path / "sessions"
    first = SessionStore(root)
    first.create("hardening", session_id="ses-0", title="crash test")
    first.close()  # a store holds its journals locked while open
    rng = random.Random(11)
    acked: dict[str, int] = collections.defaultdict(int)
    figures_seen = collections.Counter[str]()
    started = time.perf_counter()
    for kill in range(1, KILLS + 1):
        for line in zygote.run_and_kill(root, seed=kill * 7, after=rng.uniform(0.0, 0.15)):
            word, sid, *rest = line.split()
            if word == "ack":
                acked[sid] = int(rest[0])
            figures_seen[word] += 1
        for journal in root.glob("*.jsonl"):  # a kill mid-line leaves a torn tail that the next load cuts off
            figures_seen["torn tails"] += read(journal)[1] != journal.stat().st_size
        store = SessionStore(root)
        try:
            metas = {meta.id for meta in store.list()}
            for journal in sorted(root.glob("*.jsonl")):
                sid = journal.name.removesuffix(".jsonl")
                session = store.require(sid)  # every session loads (and is repaired)
                numbers = [
                    int(item.content[2:])
                    for item in session.items
                    if isinstance(item, MessageItem) and item.content.startswith("n=")
                ]
                assert numbers == list(range(1, len(numbers) + 1)), f"kill {kill}: {sid} holds {numbers[-5:]}"
                assert acked[sid] <= len(numbers) <= acked[sid] + 1, (
                    f"kill {kill}: {sid} acknowledged {acked[sid]} messages but holds {len(numbers)}"
                )
                figures_seen["unacknowledged last message kept"] += len(numbers) == acked[sid] + 1
                assert session.open_tool_calls() == [] and session.status == "idle", "the dead turn was repaired"
                assert sid in metas, f"{sid} is listed"
        finally:
            store.close()
    elapsed = time.perf_counter() - started
    leftovers = sorted(path.name for path in root.iterdir() if path.name.startswith("."))
    figures.record(
        "session_crashes",
        kills=KILLS,
        sessions=len(list(root.glob("*.jsonl"))),
        sessions_created_under_fire=figures_seen["created"],
        acknowledged_messages=sum(acked.values()),
        lost_acknowledged_messages=0,
        unacknowledged_last_message_kept=figures_seen["unacknowledged last message kept"],
        torn_tails_cut_on_load=figures_seen["torn tails"],
        sessions_that_failed_to_load=0,
        temporary_files_left_by_kills=len(leftovers),
        seconds=round(elapsed, 1),
    )
    assert figures_seen["created"] >= 1 and sum(acked.values()) >= KILLS
    assert leftovers == [], "the next writer of a journal removes what a killed rewrite left behind"
