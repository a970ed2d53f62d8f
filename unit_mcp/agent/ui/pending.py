"""Approval requests that wait for an answer, across every session of a store, as the approval page lists them.

What waits, and in which state, is the store's `pending()` (the rule the runner and the CLI use too); this
module only adds what the page shows of each request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...webpage import DiffLine, diff_lines, unified_lines
from ..approvals import ApprovalRequest
from ..sessions import SessionStore
from .folding import Folded, fold_arguments

LiveTurn = Callable[[str], "str | None"]  # the turn this process runs in a session, if any
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
    # asks its own approver; "paused": its turn ended with its process, and an answer here resumes it; "durable":
    # its durable turn waits on a worker, and an answer here is sent to it
    state: str
    arguments: list[Folded]
    writer_pid: int | None = None
    diff: ProposedDiff | None = None


class PendingIndex:
    """The page's view of `SessionStore.pending()` for `store`, with this process's live turns."""

    def __init__(self, store: SessionStore, live_turn: LiveTurn) -> None:
        self.store = store
        self.live_turn = live_turn

    def pending(self) -> list[PendingEntry]:
        """Every waiting request, newest first. Blocking (call it off the loop)."""
        entries = []
        for entry in reversed(self.store.pending(live_turn=self.live_turn)):
            diff = proposed_diff(entry.request.tool, entry.request.arguments)
            entries.append(
                PendingEntry(
                    entry.request,
                    entry.session.id,
                    entry.session.agent_id,
                    entry.session.title,
                    entry.state,
                    fold_arguments(shown_arguments(entry.request.arguments, diff)),
                    entry.writer_pid,
                    diff,
                )
            )
        return entries
