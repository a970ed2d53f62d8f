"""Several processes appending to agent sessions in one store (`unit_mcp.agent.SessionStore`: a SQLite database,
and a PostgreSQL one) are killed with SIGKILL at random moments, many times: afterwards the store is whole (the
database's own check, every session's items numbered without gaps and counted), every session loads, its
messages are the acknowledged ones in order (the one being written may be lost, nothing before it), what a dead
turn left open is repaired, and while the writers live a second writer of their sessions is refused.

The writers are forked from a zygote that has already imported the store, so that a kill costs milliseconds
rather than an interpreter start-up; each appends messages, opens and closes tool calls, marks sessions running,
rewrites items and now and then creates a session - all of it under the kills.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from unit_mcp.agent.errors import SessionLocked
from unit_mcp.agent.items import MessageItem
from unit_mcp.agent.sessions import SessionStore

from .report import Report

KILLS = 30
WRITERS = 3  # processes appending at once, each to sessions of its own
WAIT_SECONDS = 60  # for a killed writer to be reported; it takes milliseconds

ZYGOTE = r"""
import os, random, sys
try:
    import psycopg  # noqa: F401  (imported once here, not in every forked writer)
except ImportError:
    pass
from unit_mcp.agent.items import MessageItem, ToolCallItem, ToolResultItem
from unit_mcp.agent.sessions import SessionStore

def say(line):  # one write(2) of less than PIPE_BUF bytes: a kill cannot leave half a line (print can)
    os.write(1, (line + "\n").encode())

def write_forever(root, seed, k):
    store = SessionStore(root)
    ids = sorted(meta.id for meta in store.list() if meta.id.startswith(f"ses-{k}-"))
    counts = {}
    for sid in ids:
        session = store.require(sid)  # claims it, and repairs what the last kill left
        numbers = [int(i.content[2:]) for i in session.items if i.type == "message" and i.content.startswith("n=")]
        counts[sid] = max(numbers, default=0)
    say(f"ready {k}")
    rng = random.Random(seed)
    while True:
        if len(ids) < 3 and rng.random() < 0.02:
            sid = f"ses-{k}-{len(ids)}"
            store.create("hardening", session_id=sid, title="crash test")
            say(f"created {sid}")
            ids.append(sid)
            counts[sid] = 0
        sid = rng.choice(ids)
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
    root, seed, writers = line.split()
    children = []
    for k in range(int(writers)):
        go_read, go_write = os.pipe()  # a writer starts once "child <pid>" is out, so that line comes first
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_write)
                os.read(go_read, 1)
                write_forever(root, int(seed) * 10 + k, k)
            finally:
                os._exit(1)
        os.close(go_read)
        say(f"child {pid}")
        children.append((pid, go_write))
    for pid, go_write in children:
        os.write(go_write, b"g")
        os.close(go_write)
    for pid, _ in children:
        _, status = os.waitpid(pid, 0)
        say(f"exited {status}")
    say("done")
"""


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.children: list[int] = []  # the writers alive right now
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

    def run_and_kill(self, root: Path | str, seed: int, after: float, probe: Callable[[], None]) -> list[str]:
        """Fork WRITERS writers, run `probe` once all are ready, let them write for `after` seconds more, SIGKILL
        them one by one; every line they printed.

        Every wait is bounded: if no report arrives within WAIT_SECONDS the writers and the zygote are killed, the
        pipe ends and the test fails with what was read so far instead of hanging until pytest-timeout.
        """
        watchdog = threading.Timer(WAIT_SECONDS, self.kill)
        watchdog.start()
        lines = []
        try:
            self.stdin.write(f"{root} {seed} {WRITERS}\n")
            self.stdin.flush()
            self.children = [int(self._line().split()[1]) for _ in range(WRITERS)]
            ready = 0
            while ready < WRITERS:
                line = self._line()
                assert line.split()[0] in ("ready", "ack", "created"), f"a writer did not start: {line!r}"
                ready += line.startswith("ready")
                lines.append(line)
            probe()
            time.sleep(after)
            for child in self.children:
                os.kill(child, signal.SIGKILL)
            while (line := self._line()) != "done":
                lines.append(line)
        finally:
            watchdog.cancel()
        exits = [line for line in lines if line.startswith("exited")]
        assert exits == [f"exited {signal.SIGKILL}"] * WRITERS, exits
        self.children = []
        return [line for line in lines if not line.startswith(("exited", "ready"))]

    def _line(self) -> str:
        raw = self.stdout.readline()
        self.seen.append(raw)
        assert raw, (
            f"the zygote's output ended (zygote exit code {self.proc.poll()}, writers {self.children}); "
            f"{self.stuck}; last lines {list(self.seen)}"
        )
        return raw.strip()

    def kill(self) -> None:
        """The watchdog's way out: note what the writer and the zygote are blocked in, then kill both."""
        for pid in (*self.children, self.proc.pid):
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = Path(f"/proc/{pid}/wchan").read_text()
                syscall = Path(f"/proc/{pid}/syscall").read_text().split()[0]
                self.stuck.append(f"{pid}: state {stat} wchan {wchan} syscall {syscall}")
        for child in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        self.proc.kill()

    def close(self) -> None:
        for child in self.children:  # a failed test must not leave a writer running
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        self.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


@pytest.fixture(params=["sqlite", "postgres"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """The store: a folder, or a new database of the test cluster (whose PGPASSFILE the zygote then inherits)."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_cluster").new_database())
    return tmp_path / "sessions"


@pytest.fixture
def zygote(root: Path | str) -> Iterator[Zygote]:
    started = Zygote()
    yield started
    started.close()


def test_sigkill_while_several_processes_append_loses_at_most_the_last_item(
    root: Path | str, zygote: Zygote, figures: Report
) -> None:
    first = SessionStore(root)
    for k in range(WRITERS):
        first.create("hardening", session_id=f"ses-{k}-0", title="crash test")
    first.close()  # a store holds what it created until it lets go
    rng = random.Random(11)
    acked: dict[str, int] = collections.defaultdict(int)
    seen = collections.Counter[str]()

    def second_writer_is_refused() -> None:
        intruder = SessionStore(root)
        try:
            with pytest.raises(SessionLocked, match="open for writing elsewhere"):
                intruder.load(f"ses-{rng.randrange(WRITERS)}-0")
            seen["second writers refused"] += 1
        finally:
            intruder.close()

    started = time.perf_counter()
    for kill in range(1, KILLS + 1):
        for line in zygote.run_and_kill(root, kill, rng.uniform(0.0, 0.15), second_writer_is_refused):
            word, sid, *rest = line.split()
            if word == "ack":
                acked[sid] = int(rest[0])
            seen[word] += 1
        checker = SessionStore(root, read_only=True)
        assert checker.verify() == [], f"kill {kill}: the store is torn"  # whatever the kills hit
        checker.close()
        store = SessionStore(root)
        try:
            for meta in store.list():
                session = store.require(meta.id)  # every session loads, its dead writer's claim taken over
                numbers = [
                    int(item.content[2:])
                    for item in session.items
                    if isinstance(item, MessageItem) and item.content.startswith("n=")
                ]
                assert numbers == list(range(1, len(numbers) + 1)), f"kill {kill}: {meta.id} holds {numbers[-5:]}"
                assert acked[meta.id] <= len(numbers) <= acked[meta.id] + 1, (
                    f"kill {kill}: {meta.id} acknowledged {acked[meta.id]} messages but holds {len(numbers)}"
                )
                seen["unacknowledged last message kept"] += len(numbers) == acked[meta.id] + 1
                acked[meta.id] = len(numbers)  # the next writer goes on from what the store holds
                assert session.open_tool_calls() == [] and session.status == "idle", "the dead turn was repaired"
            assert set(acked) <= {meta.id for meta in store.list()}, "every acknowledged session is listed"
        finally:
            store.close()
    figures.record(
        "session_crashes" if isinstance(root, Path) else "session_crashes_postgres",
        kills=KILLS,
        writers_per_kill=WRITERS,
        sessions=len(acked),
        sessions_created_under_fire=seen["created"],
        acknowledged_messages=seen["ack"],
        lost_acknowledged_messages=0,
        unacknowledged_last_message_kept=seen["unacknowledged last message kept"],
        second_writers_refused=seen["second writers refused"],
        sessions_that_failed_to_load=0,
        seconds=round(time.perf_counter() - started, 1),
    )
    assert seen["created"] >= 1 and seen["ack"] >= KILLS and seen["second writers refused"] == KILLS
