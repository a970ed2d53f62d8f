"""A turn undone in one step (issue 36 item 3): the runner takes a checkpoint of every unit server it works on at the
start of each turn (labelled with the session and turn) and keeps its id in the session as an event; undoing the
turn rolls the units back to it with `unit_rollback`, a dry run first (its diffs and conflicts shown to a person),
then, on their yes, for real. The CLI (`sessions undo`) and the agent page use it alike.

The agent wing reaches the units over MCP only: these are calls of the unit server's own `unit_checkpoint` and
`unit_rollback` tools, made by the runner (not the model: no approval is asked, the person asks for the undo)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from mcp import types

from .errors import AgentError
from .items import EventItem, Session
from .toolsurface import AgentToolSurface

log = logging.getLogger(__name__)

CHECKPOINT_EVENT = "unit-checkpoint"
"""The event a turn's start records: {turn_id, label, checkpoints: [{source, checkpoint_id}], errors: [...]}."""
UNDONE_EVENT = "turn-undone"
"""The event an undo records: {turn_id, checkpoints, conflicts, restored, force}."""


def turn_label(session_id: str, turn_id: str) -> str:
    return f"session {session_id} turn {turn_id}"


def _structured(result: types.CallToolResult) -> dict[str, Any]:
    """A tool result's structured content (or its text as JSON), refused as an error result."""
    text = "".join(block.text for block in result.content if isinstance(block, types.TextContent))
    if result.is_error:
        raise AgentError(text or "the tool answered with an error")
    if result.structured_content is not None:
        return dict(result.structured_content)
    try:
        found = json.loads(text)
    except ValueError:
        raise AgentError(f"the tool's answer is not JSON: {text[:200]}") from None
    if not isinstance(found, dict):
        raise AgentError("the tool's answer is not a JSON object")
    return found


async def checkpoint_turn(surface: AgentToolSurface, session_id: str, turn_id: str) -> EventItem | None:
    """A checkpoint on every unit server of the surface; the event to record (None: no unit server)."""
    sources = surface.sources_offering("unit_checkpoint")
    if not sources:
        return None
    label = turn_label(session_id, turn_id)
    marks: list[dict[str, Any]] = []
    errors: list[str] = []
    for source in sources:
        try:
            made = _structured(await source.call("unit_checkpoint", {"label": label}))
            marks.append({"source": source.name, "checkpoint_id": int(made["checkpoint_id"])})
        except Exception as exc:  # the turn goes on without it; the event says why it cannot be undone
            log.warning("checkpoint of %s at the start of turn %s failed: %s", source.name, turn_id, exc)
            errors.append(f"{source.name}: {exc}")
    return EventItem(
        kind=CHECKPOINT_EVENT,
        data={"turn_id": turn_id, "label": label, "checkpoints": marks} | ({"errors": errors} if errors else {}),
    )


def turn_checkpoint(session: Session, turn_id: str | None = None) -> EventItem:
    """The checkpoint event of `turn_id` (default: the session's newest turn that has one)."""
    found = [i for i in session.items if isinstance(i, EventItem) and i.kind == CHECKPOINT_EVENT]
    if turn_id is not None:
        found = [i for i in found if i.data.get("turn_id") == turn_id]
    if not found:
        which = f"turn {turn_id}" if turn_id else "any turn"
        raise AgentError(
            f"session {session.id} has no checkpoint of {which}: turns take one only when the agent has a unit "
            "server's tools (--mcp-url)"
        )
    event = found[-1]
    if not event.data.get("checkpoints"):
        why = "; ".join(event.data.get("errors", []))
        raise AgentError(f"turn {event.data.get('turn_id')} has no checkpoint: {why}")
    return event


@dataclass
class TurnUndo:
    """What undoing a turn did (or would do: `dry_run`), per unit server: each `unit_rollback` result."""

    session_id: str
    turn_id: str
    dry_run: bool
    rollbacks: list[dict[str, Any]] = field(default_factory=list)

    @property
    def conflicts(self) -> list[dict[str, Any]]:
        return [c for r in self.rollbacks for c in r.get("conflicts", [])]

    @property
    def sources(self) -> list[dict[str, Any]]:
        return [s for r in self.rollbacks for s in r.get("sources", [])]

    def event(self, force: bool) -> EventItem:
        return EventItem(
            kind=UNDONE_EVENT,
            turn_id=None,
            data={
                "turn_id": self.turn_id,
                "restored": [f"{s['unit_id']}/{s['source_id']}" for s in self.sources],
                "conflicts": [f"{c['unit_id']}/{c['source_id']}" for c in self.conflicts],
                "force": force,
            },
        )


async def undo_turn(
    surface: AgentToolSurface, session: Session, turn_id: str | None = None, *, dry_run: bool, force: bool = False
) -> TurnUndo:
    """Roll the units back to the checkpoint taken at the start of the turn (see the module)."""
    event = turn_checkpoint(session, turn_id)
    done = TurnUndo(session.id, str(event.data["turn_id"]), dry_run)
    for mark in event.data["checkpoints"]:
        source = next((s for s in surface.sources_offering("unit_rollback") if s.name == mark["source"]), None)
        if source is None:
            raise AgentError(f"the unit server {mark['source']!r} of that turn is not connected; nothing was undone")
        arguments = {"checkpoint_id": mark["checkpoint_id"], "dry_run": dry_run, "force": force}
        result = _structured(await source.call("unit_rollback", arguments))
        done.rollbacks.append({"source": source.name, **result})
    return done
