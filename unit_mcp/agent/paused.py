"""Approvals that outlive their turn: which requests still wait for an answer, and what a resumed turn runs.

A turn whose process ended while it asked is marked interrupted, its call closed with a synthetic result; once
every request of that turn is answered (`AgentRunner.answer_approval`), a new turn resumes it. It fails closed:
nothing runs without an answer, and every answer is in the session.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Literal

from pydantic import ValidationError

from .approvals import ApprovalDecision, ApprovalRequest
from .items import EventItem, Item, MessageItem, Session, ToolCallItem, ToolResultItem

log = logging.getLogger("unit_mcp.agent.paused")

REQUESTED = "approval-requested"
DECIDED = "approval-decided"
INTERRUPTED_OUTPUT = "[interrupted] The turn ended before this tool returned a result; it may or may not have run."
AFTER_END = "after_turn_ended"  # in the data of a decision given after the asking turn ended with the process
DURABLE = "durable"  # in a turn-started's data: a durable workflow resumes that turn, so loading never closes it
RESUMED_OUTPUT = (  # a resumed turn's claim on a call before it runs it; what stays if that turn ends too
    "[interrupted] The turn resumed after the approval and ended before this tool returned; it may or may not have run."
)


def interrupted_result(call: ToolCallItem) -> ToolResultItem:
    """The synthetic result that closes a tool call its turn left open (the call may or may not have run)."""
    return ToolResultItem(
        name=call.name,
        call_id=call.call_id,
        output=INTERRUPTED_OUTPUT,
        is_error=True,
        synthetic=True,
        parent_id=call.id,
        turn_id=call.turn_id,
    )


@dataclass
class Repair:
    """What a dead turn left and the writer that loads the session stores: partial messages made final,
    synthetic results for open tool calls, and (for a session left running) a `turn-interrupted` event."""

    finals: list[str] = field(default_factory=list)
    appended: list[Item] = field(default_factory=list)
    idle: bool = False

    def __bool__(self) -> bool:
        return bool(self.finals or self.appended or self.idle)


def repair(session: Session) -> Repair:
    """The one load-time repair: the writer stores it, readers apply it in memory (`repaired`). A running durable
    turn is left as it is: its workflow resumes it (`_durable.py`)."""
    if durable_turn(session):
        return Repair()
    fix = Repair(finals=[item.id for item in session.items if isinstance(item, MessageItem) and item.partial])
    fix.appended = [interrupted_result(call) for call in session.open_tool_calls()]
    if session.status == "running":
        reason = {"reason": "the process ended while a turn was running"}
        fix.appended.append(EventItem(kind="turn-interrupted", data=reason))
        fix.idle = True
    return fix


def repaired(session: Session) -> Session:
    """The session as a writer would load it (memory only)."""
    fix = repair(session)
    items = [item.model_copy(update={"partial": False}) if item.id in fix.finals else item for item in session.items]
    return session.model_copy(update={"items": items + fix.appended, "status": "idle" if fix.idle else session.status})


@dataclass(frozen=True)
class PausedCall:
    """A tool call of an interrupted turn that waited for approval, with its answer once there is one."""

    request: ApprovalRequest
    call: ToolCallItem
    result: ToolResultItem  # the synthetic `[interrupted]` result a resumed turn replaces
    decision: ApprovalDecision | None


def paused_calls(session: Session, turn_id: str | None = None) -> list[PausedCall]:
    """Calls that waited for approval when their turn ended with the process and have not run since, oldest
    first (of one turn when `turn_id` is given)."""
    requests: dict[str, ApprovalRequest] = {}
    decisions: dict[str, tuple[ApprovalDecision, bool]] = {}
    calls: dict[tuple[str | None, str], ToolCallItem] = {}
    results: dict[tuple[str | None, str], ToolResultItem] = {}
    for item in session.items:
        if isinstance(item, ToolCallItem):
            calls[item.turn_id, item.call_id] = item
        elif isinstance(item, ToolResultItem):
            results[item.turn_id, item.call_id] = item
        elif isinstance(item, EventItem) and item.kind in (REQUESTED, DECIDED):
            try:
                if item.kind == REQUESTED:
                    request = ApprovalRequest.model_validate(item.data)
                    requests[request.id] = request
                else:
                    decision = ApprovalDecision.model_validate(item.data.get("decision"))
                    decisions[decision.request_id] = (decision, item.data.get(AFTER_END) is True)
            except ValidationError:
                log.warning("session %s: unreadable %s item %s ignored", session.id, item.kind, item.id)
    paused = []
    for request in requests.values():
        if request.call_id is None or (turn_id is not None and request.turn_id != turn_id):
            continue
        key = (request.turn_id, request.call_id)
        call, result = calls.get(key), results.get(key)
        if call is None or result is None or not (result.synthetic and result.output == INTERRUPTED_OUTPUT):
            continue
        answer = decisions.get(request.id)
        if answer is not None and not answer[1]:
            continue  # answered while its turn was alive: the call may have started, so it is never run again
        paused.append(PausedCall(request, call, result, answer[0] if answer else None))
    return paused


def pending_requests(session: Session, live_turn_id: str | None = None) -> list[ApprovalRequest]:
    """Requests nobody has answered: those of the live turn (`live_turn_id`, being asked right now) and
    those paused in a turn that ended with the process."""
    asked: list[ApprovalRequest] = []
    answered: set[str] = set()
    for item in session.items:
        if not (isinstance(item, EventItem) and item.kind in (REQUESTED, DECIDED)):
            continue
        try:
            if item.kind == REQUESTED:
                asked.append(ApprovalRequest.model_validate(item.data))
            else:
                answered.add(ApprovalDecision.model_validate(item.data.get("decision")).request_id)
        except ValidationError:
            continue  # paused_calls logs it
    live = [r for r in asked if live_turn_id is not None and r.turn_id == live_turn_id and r.id not in answered]
    return live + [paused.request for paused in paused_calls(session) if paused.decision is None]


State = Literal["waiting", "elsewhere", "paused", "durable"]


def running_turn(session: Session) -> str | None:
    """The turn a session marked running was running when it was last written."""
    if session.status != "running":
        return None
    for item in reversed(session.items):
        if isinstance(item, EventItem) and item.kind == "turn-started":
            return str(item.data.get("turn_id") or item.turn_id or "") or None
    return None


def durable_turn(session: Session) -> bool:
    """Whether the turn a session marked running is durable."""
    if session.status != "running":
        return False
    for item in reversed(session.items):
        if isinstance(item, EventItem) and item.kind == "turn-started":
            return item.data.get(DURABLE) is True
    return False


def waiting(session: Session, live_turn: str | None, writer_pid: int) -> list[tuple[ApprovalRequest, State]]:
    """The one rule for what waits for an answer (runner, page and CLI all ask it through the store):
    `live_turn` is the turn this process runs in the session, `writer_pid` the live process holding the session
    for writing (0: none, so a turn marked running ended with its process). "waiting": asked by a turn of this
    process; "elsewhere": by a turn of another process, which asks its own approver; "paused": its turn ended
    with its process, and an answer resumes it; "durable": its durable turn waits in its workflow (whichever worker
    runs it, or none yet), and an answer is sent to that workflow."""
    if durable_turn(session):
        turn = running_turn(session)
        return [
            (request, "durable" if request.turn_id == turn else "paused") for request in pending_requests(session, turn)
        ]
    elsewhere = bool(writer_pid) and writer_pid != os.getpid() and live_turn is None
    running = live_turn or (running_turn(session) if writer_pid else None)
    view = session if writer_pid else repaired(session)
    paused = {call.request.id for call in paused_calls(view)}
    seen: set[str] = set()
    found: list[tuple[ApprovalRequest, State]] = []
    for request in pending_requests(view, running):
        if request.id in seen:
            continue
        seen.add(request.id)
        live = running == request.turn_id and request.id not in paused
        found.append((request, ("elsewhere" if elsewhere else "waiting") if live else "paused"))
    return found
