"""Approval requests that wait for an answer, across every session of a store, read from the journals without
locking or repairing them (a turn may be running in another process).

What waits is decided by `paused.pending_requests`, the function `AgentRunner.answer_approval` uses, on the
session as the next process would load it: a call a dead turn left open is given the same synthetic
`[interrupted]` result the store's load-time repair writes, in memory only. A session is read again only when
its journal changed, and only replayed when it holds an approval request at all.

Whether a turn is still alive in another process is read from the kernel's table of file locks (a session's
writer holds an exclusive `flock` on its journal): reading it takes no lock, so the page never gets in the
way of a process that opens a session.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...webpage import DiffLine, diff_lines, unified_lines
from .._paused import REQUESTED, paused_calls, pending_requests
from ..approvals import ApprovalRequest
from ..errors import AgentError
from ..items import SESSION_ID, EventItem, Session
from ..sessions import interrupted_result, replay
from .folding import Folded, fold_arguments
from .follow import read_from, signature

log = logging.getLogger("unit_mcp.agent.ui")

LiveTurn = Callable[[str], "str | None"]  # the turn this process runs in a session, if any


LOCKS = Path("/proc/locks")
MAX_DIFF_CHARS = 200_000  # a proposed patch larger than this is shown folded, as arguments only


@dataclass(frozen=True)
class ProposedDiff:
    """A unit_apply_patch request's edit as a diff: its patch, or its old text against its new."""

    target: str
    what: str
    lines: list[DiffLine]


def proposed_diff(tool: str | None, arguments: dict[str, Any] | None) -> ProposedDiff | None:
    """The diff a `unit_apply_patch` request asks for (the tool name may carry a prefix), or None."""
    if not tool or not tool.endswith("unit_apply_patch") or not isinstance(arguments, dict):
        return None
    target = f"{arguments.get('unit_id', '?')}/{arguments.get('source_id', '?')}"
    patch, old, new = arguments.get("patch"), arguments.get("old"), arguments.get("new")
    if isinstance(patch, str) and len(patch) <= MAX_DIFF_CHARS:
        return ProposedDiff(target, "the patch asked for", unified_lines(patch))
    if isinstance(old, str) and isinstance(new, str) and len(old) + len(new) <= MAX_DIFF_CHARS:
        every = " (every occurrence)" if arguments.get("replace_all") is True else ""
        return ProposedDiff(target, f"old → new{every}, lines numbered within the edit", diff_lines(old, new))
    return None


def shown_arguments(arguments: dict[str, Any] | None, diff: ProposedDiff | None) -> dict[str, Any] | None:
    """The arguments to show beside `diff`: those it does not show already."""
    if diff is None or arguments is None:
        return arguments
    return {key: value for key, value in arguments.items() if key not in ("patch", "old", "new")}


@dataclass(frozen=True)
class PendingEntry:
    request: ApprovalRequest
    session_id: str
    agent_id: str
    title: str | None
    # "waiting": its turn runs in this process and waits for the answer; "elsewhere": in another process, which
    # asks its own approver; "paused": its turn ended with its process, and an answer here resumes it
    state: str
    arguments: list[Folded]
    writer_pid: int | None = None
    diff: ProposedDiff | None = None


def journal_writers() -> dict[tuple[int, int, int], int] | None:
    """(device major, minor, inode) → pid of every exclusive `flock`, or None where the table is unreadable."""
    try:
        lines = LOCKS.read_text().splitlines()
    except OSError:
        return None
    writers = {}
    for line in lines:
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[3] == "WRITE":
            try:
                major, minor, inode = fields[5].split(":")
                writers[int(major, 16), int(minor, 16), int(inode)] = int(fields[4])
            except ValueError:
                continue
    return writers


def writer_of(path: Path, writers: dict[tuple[int, int, int], int] | None) -> int | None:
    """The pid holding the journal open for writing, 0 when nobody does, None when that cannot be known."""
    if writers is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return 0
    return writers.get((os.major(stat.st_dev), os.minor(stat.st_dev), stat.st_ino), 0)


def as_loaded(session: Session) -> Session:
    """The session as a writable store would load it: open tool calls closed by synthetic results (memory only)."""
    repaired = session.model_copy(update={"items": list(session.items)})
    for call in session.open_tool_calls():
        repaired.items.append(interrupted_result(call))
    return repaired


def running_turn(session: Session) -> str | None:
    """The turn a session marked running was running when its journal was last written."""
    if session.status != "running":
        return None
    for item in reversed(session.items):
        if isinstance(item, EventItem) and item.kind == "turn-started":
            return str(item.data.get("turn_id") or item.turn_id or "") or None
    return None


def session_pending(session: Session, live_turn: str | None, writer_pid: int | None) -> list[PendingEntry]:
    """What waits in `session`: `live_turn` is the turn this process runs in it, `writer_pid` the process holding
    its journal (0: none, so a turn marked running ended with its process; None: unknown)."""
    elsewhere = bool(writer_pid) and writer_pid != os.getpid() and live_turn is None
    running = live_turn or (running_turn(session) if writer_pid != 0 else None)
    view = session if writer_pid else as_loaded(session)
    paused = {call.request.id for call in paused_calls(view)}
    seen: set[str] = set()
    entries = []
    for request in pending_requests(view, running):
        if request.id in seen:
            continue
        seen.add(request.id)
        live = running == request.turn_id and request.id not in paused
        state = ("elsewhere" if elsewhere else "waiting") if live else "paused"
        diff = proposed_diff(request.tool, request.arguments)
        entries.append(
            PendingEntry(
                request,
                session.id,
                session.agent_id,
                session.title,
                state,
                fold_arguments(shown_arguments(request.arguments, diff)),
                writer_pid if elsewhere else None,
                diff,
            )
        )
    return entries


class PendingIndex:
    """`pending()` re-reads only the journals that changed since the last call. Thread-safe (call it off the loop)."""

    def __init__(self, root: Path, live_turn: LiveTurn) -> None:
        self.root = root
        self.live_turn = live_turn
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[object, list[PendingEntry]]] = {}

    def pending(self) -> list[PendingEntry]:
        """Every waiting request, newest first."""
        with self._lock:
            found: dict[str, tuple[object, list[PendingEntry]]] = {}
            writers = journal_writers()
            for path in self.root.glob("*.jsonl") if self.root.is_dir() else []:
                session_id = path.name.removesuffix(".jsonl")
                if not SESSION_ID.fullmatch(session_id):
                    continue
                live, writer = self.live_turn(session_id), writer_of(path, writers)
                key = (signature(path), live, writer)
                cached = self._cache.get(session_id)
                if cached is None or cached[0] != key:
                    cached = (key, self._read(path, live, writer))
                found[session_id] = cached
            self._cache = found
            entries = [entry for _, listed in found.values() for entry in listed]
        return sorted(entries, key=lambda entry: entry.request.created_at, reverse=True)

    def _read(self, path: Path, live_turn: str | None, writer_pid: int | None) -> list[PendingEntry]:
        session_id = path.name.removesuffix(".jsonl")
        try:
            if REQUESTED.encode() not in path.read_bytes():
                return []  # no approval was ever asked here: no need to replay it
            session = replay(session_id, read_from(path).records)
        except (OSError, AgentError) as exc:
            log.warning("session %s left out of the pending approvals: %s", session_id, exc)
            return []
        return session_pending(session, live_turn, writer_pid)
