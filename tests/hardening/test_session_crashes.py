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
import threading
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
WAIT_SECONDS = 60  # for a killed writer to be reported; it takes milliseconds

ZYGOTE = r"""
import os, sys
from pathlib import Path
from unit_mcp.agent.items import MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.sessions import SessionStore

def say(line):  # one write(2) of less than PIPE_BUF bytes: a kill cannot leave half a line (print can)
    os.write(1, (line + "\n").encode())

def write_forever(root, seed):
    store = SessionStore(root, compact_after=4)
    ids = sorted(path.name.removesuffix(".jsonl") for path in Path(root).glob("*.jsonl"))
    counts = {}
    for sid in ids:
        session = store.require(sid)  # replays and repairs what the last kill left
        numbers = [int(i.content[2:]) for i in session.items if i.type == "message" and i.content.startswith("n=")]
        counts[sid] = max(numbers, default=0)
    say("ready")
    step = seed
    while True:
        step += 1
        if len(ids) < 6 and step % 40 == 0:
            sid = f"ses-{len(ids)}"
            store.create("hardening", session_id=sid, title="crash test")
            say(f"created {sid}")
            ids.append(sid)
            counts[sid] = 0
        if not ids:
            continue
        sid = ids[step % len(ids)]
        counts[sid] += 1
        n = counts[sid]
        first = store.append_item(sid, MessageItem(role="user", content=f"n={n}"))
        say(f"ack {sid} {n}")
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
    go_read, go_write = os.pipe()  # the writer starts once "child <pid>" is out, so that line always comes first
    pid = os.fork()
    if pid == 0:
        try:
            os.close(go_write)
            os.read(go_read, 1)
            write_forever(root, int(seed))
        finally:
            os._exit(1)
    os.close(go_read)
    say(f"child {pid}")
    os.write(go_write, b"g")
    os.close(go_write)
    _, status = os.waitpid(pid, 0)
    say(f"exited {status}")
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.child: int | None = None  # the writer alive right now, if any
        self.stuck: list[str] = []  # what the watchdog found the processes doing
        self.seen = collections.deque[str](maxlen=4)  # the last lines read, for the failure message

    @property
    def stdin(self) -> IO[str]:
        assert self.proc.stdin is not None
        return self.proc.stdin

    @property
    def stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def run_and_kill(self, root: Path, seed: int, after: float) -> list[str]:
        """Fork a writer, let it write for `after` seconds once ready, SIGKILL it; every line it printed.

        Every wait is bounded: if no report arrives within WAIT_SECONDS the writer and the zygote are killed, the
        pipe ends and the test fails with what was read so far instead of hanging until pytest-timeout.
        """
        watchdog = threading.Timer(WAIT_SECONDS, self.kill)
        watchdog.start()
        try:
            self.stdin.write(f"{root} {seed}\n")
            self.stdin.flush()
            child = self.child = int(self._line().split()[1])
            ready = self._line()
            assert ready == "ready", f"the writer did not start: {ready!r}"
            time.sleep(after)
            os.kill(child, signal.SIGKILL)
            lines = []
            while not (line := self._line()).startswith("exited"):
                lines.append(line)
        finally:
            watchdog.cancel()
        assert line == f"exited {signal.SIGKILL}", line
        self.child = None
        return lines

    def _line(self) -> str:
        raw = self.stdout.readline()
        self.seen.append(raw)
        assert raw, (
            f"the zygote's output ended (zygote exit code {self.proc.poll()}, writer {self.child}); "
            f"{self.stuck}; last lines {list(self.seen)}"
        )
        return raw.strip()

    def kill(self) -> None:
        """The watchdog's way out: note what the writer and the zygote are blocked in, then kill both."""
        for pid in (self.child, self.proc.pid):
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = Path(f"/proc/{pid}/wchan").read_text()
                syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
                self.stuck.append(f"{pid}: state {stat} wchan {wchan} syscall {syscall}")
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        self.proc.kill()

    def close(self) -> None:
        if self.child is not None:  # a failed test must not leave a writer running
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child, signal.SIGKILL)
        self.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


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
                acked[sid] = len(numbers)  # the next writer goes on from what the store holds
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
        acknowledged_messages=figures_seen["ack"],
        lost_acknowledged_messages=0,
        unacknowledged_last_message_kept=figures_seen["unacknowledged last message kept"],
        torn_tails_cut_on_load=figures_seen["torn tails"],
        sessions_that_failed_to_load=0,
        temporary_files_left_by_kills=len(leftovers),
        seconds=round(elapsed, 1),
    )
    assert figures_seen["created"] >= 1 and figures_seen["ack"] >= KILLS
    assert leftovers == [], "the next writer of a journal removes what a killed rewrite left behind"
