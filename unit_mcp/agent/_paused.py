"""Approvals that outlive their turn: which requests still wait for an answer, and what a resumed turn runs.

A turn that asks for approval records `approval-requested` (with the model's tool call id) before it waits.
If the process ends meanwhile, loading the session closes that call with the synthetic `[interrupted]` result
and marks the turn interrupted; the request stays unanswered in the journal. `AgentRunner.answer_approval`
records the answer (`approval-decided`) and, once every such request of that turn is answered, starts a turn
that resumes it (`LoopAgent.resume`): an approved call runs then, a denied one is answered with the denial,
the result takes the synthetic one's place, and the model goes on from there.

It fails closed: nothing runs without an answer, a request whose turn was cancelled or that has no tool call
to resume is not pending, and every answer is in the journal.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pydantic import ValidationError

from .approvals import ApprovalDecision, ApprovalRequest
from .items import EventItem, Session, ToolCallItem, ToolResultItem
from .sessions import INTERRUPTED_OUTPUT

log = logging.getLogger("unit_mcp.agent.paused")

REQUESTED = "approval-requested"
DECIDED = "approval-decided"
AFTER_END = "after_turn_ended"  # in the data of a decision given after the asking turn ended with the process
RESUMED_OUTPUT = (  # a resumed turn's claim on a call before it runs it; what stays if that turn ends too
    "[interrupted] The turn resumed after the approval and ended before this tool returned; it may or may not have run."
)


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
