"""Approval requests that wait for an answer, across every session of a store, as the approval page lists them.

What waits, and in which state, is the store's `pending()` (the rule the runner and the CLI use too); this
module only adds what the page shows of each request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..approvals import ApprovalRequest
from ..sessions import SessionStore
from .folding import Folded, fold_arguments

LiveTurn = Callable[[str], "str | None"]  # the turn this process runs in a session, if any


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


class PendingIndex:
    """The page's view of `SessionStore.pending()` for `store`, with this process's live turns."""

    def __init__(self, store: SessionStore, live_turn: LiveTurn) -> None:
        self.store = store
        self.live_turn = live_turn

    def pending(self) -> list[PendingEntry]:
        """Every waiting request, newest first. Blocking (call it off the loop)."""
        return [
            PendingEntry(
                entry.request,
                entry.session.id,
                entry.session.agent_id,
                entry.session.title,
                entry.state,
                fold_arguments(entry.request.arguments),
                entry.writer_pid,
            )
            for entry in reversed(self.store.pending(live_turn=self.live_turn))
        ]
