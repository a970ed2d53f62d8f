"""A session's change records (`SessionStore.changes`) folded into what its page shows: one view per item, the
session's metadata, and the durations only the stream knows (a tool call's start, a turn's start).

The page renders a `Transcript` of every change; its live stream feeds the same class the changes since, so
both show an item the same way. A record that does not validate is shown as damaged, never trusted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from ..approvals import ApprovalDecision, ApprovalRequest
from ..items import ITEM, SESSION_ID, ErrorItem, EventItem, Item, MessageItem, ToolCallItem, ToolResultItem
from ..paused import DECIDED, REQUESTED, RESUMED_OUTPUT
from .folding import Folded, fold_arguments, fold_text, fold_value

MESSAGE_SHOW = 20_000  # characters of one message shown (models can write a lot)
PRETTY_LIMIT = 1_000_000  # a JSON output longer than this is shown as it is, not parsed
TURN_ID = re.compile(r"turn-[0-9a-f]{12}")
TURN_ENDS = {"turn-completed", "turn-failed", "turn-cancelled", "turn-interrupted"}


@dataclass
class ItemView:
    """One item as the page shows it."""

    id: str
    kind: str  # CSS class: message-user, message-assistant, tool-call, tool-result, approval, turn, event, error
    title: str
    created_at: float
    turn_id: str | None = None
    badge: str | None = None  # a risk label, a decision, a status
    error: bool = False
    blocks: list[Folded] = field(default_factory=list)
    duration: float | None = None  # seconds
    note: str | None = None
    child_session: str | None = None  # a delegation's child session, a valid session id
    undo_turn: tuple[str, str] | None = None  # (session, turn) a turn's checkpoint can undo


@dataclass
class Change:
    """What one record changed: an item to show (new or replacing the one with its id) or the session's status."""

    item: ItemView | None = None
    status: str | None = None


def _output(item: ToolResultItem) -> Folded:
    """A tool's output; JSON (what MCP tools mirror their structured result as) pretty-printed."""
    if item.output.startswith("{") and len(item.output) <= PRETTY_LIMIT:
        try:
            return fold_value(json.loads(item.output))
        except ValueError:
            pass
    return fold_text(item.output)


class Transcript:
    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.meta: dict[str, Any] = {}
        self.items: dict[str, ItemView] = {}
        self._call_started: dict[str, float] = {}
        self._turn_started: dict[str, float] = {}

    @property
    def status(self) -> str:
        return str(self.meta.get("status", "idle"))

    def apply_all(self, records: list[dict[str, Any]]) -> list[Change]:
        return [change for record in records for change in self.apply(record)]

    def apply(self, record: dict[str, Any]) -> list[Change]:
        op = record.get("op")
        if op == "session" and isinstance(record.get("session"), dict):
            before = self.status if self.meta else None
            self.meta = {key: value for key, value in record["session"].items() if key != "items"}
            return [Change(status=self.status)] if self.status != before else []
        if op in ("item", "update_item"):
            view = self._view(record.get("item"), replaced=op == "update_item")
            self.items[view.id] = view
            return [Change(item=view)]
        return []

    # -- one view per item kind -------------------------------------------------------------------

    def _view(self, raw: Any, *, replaced: bool = False) -> ItemView:
        try:
            item = ITEM.validate_python(raw)
        except ValidationError:
            ident = str(raw.get("id", "")) if isinstance(raw, dict) else ""
            return ItemView(id=ident[:64] or "damaged", kind="error", title="damaged item", created_at=0, error=True)
        if isinstance(item, MessageItem):
            return self._message(item)
        if isinstance(item, ToolCallItem):
            self._call_started.setdefault(item.call_id, item.created_at)
            return self._base(
                item, "tool-call", f"→ {item.name}", badge=item.risk, blocks=fold_arguments(item.arguments)
            )
        if isinstance(item, ToolResultItem):
            # a result replaced later is a resumed turn's: when its call ran is not recorded
            started = None if replaced else self._call_started.get(item.call_id)
            note = "written by the runner: the tool never returned" if item.synthetic else None
            if replaced and item.output == RESUMED_OUTPUT:
                note = "claimed by the turn that resumed after the approval"
            elif replaced and not item.synthetic:
                note = "run by the turn that resumed after the approval"
            view = self._base(
                item,
                "tool-result",
                f"{'✗' if item.is_error else '←'} {item.name}",
                error=item.is_error,
                badge="error" if item.is_error else None,
                blocks=[_output(item)],
                note=note,
            )
            view.duration = None if started is None else max(0.0, item.created_at - started)
            return view
        if isinstance(item, ErrorItem):
            blocks = [fold_text(item.message)]
            return self._base(item, "error", "turn error", error=True, badge=item.code, blocks=blocks)
        return self._event(item)

    def _base(self, item: Item, kind: str, title: str, **fields: Any) -> ItemView:
        return ItemView(id=item.id, kind=kind, title=title, created_at=item.created_at, turn_id=item.turn_id, **fields)

    def _message(self, item: MessageItem) -> ItemView:
        title = item.role + (f" ({item.kind})" if item.kind else "")
        note = "streaming…" if item.partial else None
        if item.model:
            note = f"{item.provider + '/' if item.provider else ''}{item.model}" + (
                f", {item.usage.input_tokens} in / {item.usage.output_tokens} out tokens" if item.usage else ""
            )
        blocks = [fold_text(item.content, show=MESSAGE_SHOW)] if item.content else []
        return self._base(item, f"message-{item.role}", title, blocks=blocks, note=note)

    def _event(self, item: EventItem) -> ItemView:
        data = item.data
        if item.kind == REQUESTED:
            try:
                request = ApprovalRequest.model_validate(data)
            except ValidationError:
                return self._base(item, "error", "unreadable approval request", error=True)
            return self._base(
                item,
                "approval",
                f"approval asked for {request.tool or 'a tool'}",
                badge=request.risk,
                # the call it asks for is shown above it with the same arguments
                blocks=[] if request.call_id else fold_arguments(request.arguments),
                note=request.reason or (f"for call {request.call_id}" if request.call_id else None),
            )
        if item.kind == DECIDED:
            try:
                decision = ApprovalDecision.model_validate(data.get("decision"))
            except ValidationError:
                return self._base(item, "error", "unreadable approval decision", error=True)
            tool = (data.get("request") or {}).get("tool") if isinstance(data.get("request"), dict) else None
            verdict = "approved" if decision.approved else "denied"
            always = " (always, this session)" if decision.remember else ""
            return self._base(
                item,
                "approval",
                f"{verdict}{always}: {tool or decision.risk}",
                badge=verdict,
                error=not decision.approved,
                note=f"by {decision.decided_by}" + (f": {decision.reason}" if decision.reason else ""),
            )
        if item.kind == "turn-started":
            turn_id = str(data.get("turn_id", ""))
            self._turn_started.setdefault(turn_id, item.created_at)
            resumes = data.get("resumes")
            return self._base(item, "turn", f"turn {turn_id} started", note=f"resumes {resumes}" if resumes else None)
        if item.kind in TURN_ENDS:
            status = item.kind.removeprefix("turn-")
            turn_id = str(data.get("turn_id") or item.turn_id or "")
            started = self._turn_started.get(turn_id)
            blocks = [fold_value(data[key], key) for key in ("result", "error", "reason") if data.get(key)]
            view = self._base(
                item,
                "turn",
                f"turn {turn_id} {status}" if turn_id else f"turn {status}",
                badge=status,
                error=status != "completed",
                blocks=blocks,
            )
            view.duration = None if started is None else max(0.0, item.created_at - started)
            return view
        if item.kind == "unit-checkpoint":
            turn_id = str(data.get("turn_id", ""))
            marks = data.get("checkpoints") or []
            view = self._base(
                item,
                "event",
                f"checkpoint at the start of turn {turn_id}",
                note=", ".join(f"{m.get('source')} #{m.get('checkpoint_id')}" for m in marks if isinstance(m, dict))
                or "; ".join(map(str, data.get("errors", []))),
                error=not marks,
            )
            if marks and TURN_ID.fullmatch(turn_id):
                view.undo_turn = (self.session_id, turn_id)
            return view
        child = data.get("child_session_id")
        view = self._base(
            item, "event", item.kind, blocks=[fold_value(value, str(key)) for key, value in list(data.items())[:50]]
        )
        if isinstance(child, str) and SESSION_ID.fullmatch(child):
            view.child_session = child
        return view
