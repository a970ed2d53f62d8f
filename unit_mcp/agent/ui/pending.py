"""Approval requests that wait for an answer, across every session of a store, as the approval page lists them.

What waits, and in which state, is the store's `pending()` (the rule the runner and the CLI use too); this
module only adds what the page shows of each request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...webpage import DiffLine, diff_lines, unified_lines
from ..approvals import ApprovalRequest
from ..sessions import SessionStore
from .folding import Folded, fold_arguments

if TYPE_CHECKING:
    from ..toolsurface import ToolOutput

LiveTurn = Callable[[str], "str | None"]  # the turn this process runs in a session, if any
DryRun = Callable[[str, dict[str, Any]], Awaitable["ToolOutput | None"]]  # the surface's `dry_run`
MAX_DIFF_CHARS = 200_000  # a proposed patch larger than this is shown folded, as arguments only
DRY_RUN_TOOLS = ("unit_revert", "unit_revert_change", "unit_rollback")
"""Tools whose approval shows the diff of a dry run: what they write is not in their arguments."""


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


def dry_run_diffs(output: ToolOutput | None) -> list[ProposedDiff]:
    """The diffs of a dry run's result: one source's `diff` (unit_revert) or each of its `sources` (a rollback)."""
    if output is None:
        return []
    found = output.structured or {}
    if output.is_error:
        return [ProposedDiff("dry run", f"refused: {output.text[:500]}", [])]
    listed = found.get("sources")
    sources = listed if isinstance(listed, list) else [found]
    diffs = []
    for source in sources:
        diff = source.get("diff") if isinstance(source, dict) else None
        if isinstance(diff, str) and len(diff) <= MAX_DIFF_CHARS:
            target = f"{source.get('unit_id', '?')}/{source.get('source_id', '?')}"
            diffs.append(ProposedDiff(target, "the dry run's diff", unified_lines(diff)))
    return diffs or [ProposedDiff("dry run", "writes nothing", [])]


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
    diffs: list[ProposedDiff] = field(default_factory=list)


class PendingIndex:
    """The page's view of `SessionStore.pending()` for `store`, with this process's live turns."""

    def __init__(self, store: SessionStore, live_turn: LiveTurn, dry_run: DryRun | None = None) -> None:
        self.store = store
        self.live_turn = live_turn
        self.dry_run = dry_run
        self._dry_runs: dict[str, list[ProposedDiff]] = {}  # by request id: each is run once, when first shown
        self._diffs: dict[str, ProposedDiff | None] = {}  # by request id: a request's arguments never change

    def pending(self) -> list[PendingEntry]:
        """Every waiting request, newest first. Blocking (call it off the loop): a request's diff is computed the
        first time it is listed, and kept while it waits."""
        entries = []
        waiting = list(reversed(self.store.pending(live_turn=self.live_turn)))
        kept = {entry.request.id for entry in waiting}
        self._diffs = {key: diff for key, diff in self._diffs.items() if key in kept}
        self._dry_runs = {key: diffs for key, diffs in self._dry_runs.items() if key in kept}
        for entry in waiting:
            if entry.request.id not in self._diffs:
                self._diffs[entry.request.id] = proposed_diff(entry.request.tool, entry.request.arguments)
            diff = self._diffs[entry.request.id]
            entries.append(
                PendingEntry(
                    entry.request,
                    entry.session.id,
                    entry.session.agent_id,
                    entry.session.title,
                    entry.state,
                    fold_arguments(shown_arguments(entry.request.arguments, diff)),
                    entry.writer_pid,
                    [] if diff is None else [diff],
                )
            )
        return entries

    async def with_dry_runs(self, entries: list[PendingEntry]) -> list[PendingEntry]:
        """`entries` with the diff of a dry run of each unit_revert, unit_revert_change or unit_rollback request
        (through the unit server that would run it), as unit_apply_patch requests show their patch."""
        shown = []
        for entry in entries:
            tool, arguments = entry.request.tool or "", entry.request.arguments
            if self.dry_run is not None and tool.endswith(DRY_RUN_TOOLS) and isinstance(arguments, dict):
                if entry.request.id not in self._dry_runs:
                    self._dry_runs[entry.request.id] = dry_run_diffs(await self.dry_run(tool, arguments))
                entry = replace(entry, diffs=self._dry_runs[entry.request.id])
            shown.append(entry)
        return shown
