"""AgentApprovals: which risks an agent may use on its own, and who decides the others.

Each risk label has a mode: `auto` (allowed), `ask` (a pluggable approver decides) or `deny`. The defaults
follow the reference: only `normal` is automatic. Everything fails closed: an unknown risk label is treated
as `destructive`, an `ask` with no approver attached is a denial (never a wait), and an approver that
raises denies. A user may grant a risk for the rest of a session (`remember`); the grant is stored in the
session's data by the caller, so it survives a restart, and handed back here as `grants`.
"""

from __future__ import annotations

import inspect
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import anyio
from pydantic import BaseModel, Field

from ..wire import RISKS, Risk
from ._listeners import ChangeListener, Listeners

log = logging.getLogger("unit_mcp.agent.approvals")

Mode = Literal["auto", "ask", "deny"]
Decision = Literal["approved", "denied", "needs-approval"]
DecidedBy = Literal["policy", "grant", "approver", "no-approver", "approver-failed"]

MODES: tuple[Mode, ...] = get_args(Mode)
DEFAULT_POLICY: dict[Risk, Mode] = {
    "normal": "auto",
    "filesystem-read": "ask",
    "filesystem-write": "ask",
    "shell": "ask",
    "destructive": "ask",
}
GRANTS_KEY = "approval_grants"


def normalise_risk(risk: str | None) -> Risk:
    """A known risk label, or `destructive` for anything missing or unknown (fail closed)."""
    return risk if risk in RISKS else "destructive"  # type: ignore[return-value]


class ApprovalRequest(BaseModel):
    """What an approver is asked; serialisable so a pending question can be shown, stored and answered later."""

    id: str = Field(default_factory=lambda: f"apr-{secrets.token_hex(6)}")
    risk: str
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    reason: str | None = None
    session_id: str | None = None
    turn_id: str | None = None
    call_id: str | None = None  # the tool call waiting for the answer; a turn resumed after a restart runs it
    created_at: float = Field(default_factory=time.time)


class ApprovalDecision(BaseModel):
    """The answer to one request; `remember` asks to grant the risk for the rest of the session."""

    request_id: str
    risk: str
    approved: bool
    remember: bool = False
    decided_by: DecidedBy = "approver"
    reason: str | None = None


Approver = Callable[[ApprovalRequest], Awaitable[ApprovalDecision | bool] | ApprovalDecision | bool]


def _denied(request: ApprovalRequest, by: DecidedBy, reason: str) -> ApprovalDecision:
    return ApprovalDecision(request_id=request.id, risk=request.risk, approved=False, decided_by=by, reason=reason)


class AgentApprovals:
    """The risk policy, the attached approver and the listeners that resync what tools are visible."""

    def __init__(self, policy: Mapping[str, Mode] | None = None, *, approver: Approver | None = None) -> None:
        self._policy: dict[Risk, Mode] = dict(DEFAULT_POLICY)
        for risk, mode in (policy or {}).items():
            self._set(risk, mode)
        self.approver = approver
        self._listeners = Listeners("approval policy")

    @property
    def policy(self) -> dict[Risk, Mode]:
        return dict(self._policy)

    def set_policy(self, risk: str, mode: Mode) -> None:
        """Change one risk's mode and tell listeners (e.g. the approval-filtered endpoint) to resync."""
        if self._set(risk, mode):
            self._listeners.notify()

    def attach(self, approver: Approver | None) -> None:
        """Attach (or with None detach) the approver that answers `ask` requests."""
        self.approver = approver
        self._listeners.notify()

    def on_change(self, listener: ChangeListener) -> Callable[[], None]:
        return self._listeners.add(listener)

    def mode(self, risk: str | None) -> Mode:
        return self._policy[normalise_risk(risk)]

    def check_risk(self, risk: str | None, grants: Iterable[str] = ()) -> Decision:
        """Decide without asking anyone: `approved`, `denied`, or `needs-approval`."""
        mode = self.mode(risk)
        if mode == "auto":
            return "approved"
        if mode == "deny":
            return "denied"
        return "approved" if normalise_risk(risk) in set(grants) else "needs-approval"

    def usable(self, risk: str | None, grants: Iterable[str] = (), *, interactive: bool = False) -> bool:
        """Whether a tool of this risk may be offered: approved now, or askable when an approver is attached."""
        decision = self.check_risk(risk, grants)
        return decision == "approved" or (decision == "needs-approval" and interactive and self.approver is not None)

    async def request_risk(self, request: ApprovalRequest, grants: Iterable[str] = ()) -> ApprovalDecision:
        """Decide, asking the approver if the policy says `ask`. Never waits when no approver is attached."""
        decision = self.check_risk(request.risk, grants)
        if decision != "needs-approval":
            by: DecidedBy = "grant" if decision == "approved" and self.mode(request.risk) == "ask" else "policy"
            reason = f"the policy for {normalise_risk(request.risk)} is {self.mode(request.risk)}"
            return ApprovalDecision(
                request_id=request.id, risk=request.risk, approved=decision == "approved", decided_by=by, reason=reason
            )
        approver = self.approver
        if approver is None:
            return _denied(
                request, "no-approver", f"{normalise_risk(request.risk)} needs approval and no approver is attached"
            )
        try:
            answer = approver(request)
            outcome = await answer if inspect.isawaitable(answer) else answer
        except Exception as exc:
            log.warning("approver failed for %s; denying", request.id, exc_info=True)
            return _denied(request, "approver-failed", f"the approver failed ({type(exc).__name__}: {exc}); denied")
        if isinstance(outcome, ApprovalDecision):
            return outcome.model_copy(update={"request_id": request.id, "risk": request.risk})
        return ApprovalDecision(request_id=request.id, risk=request.risk, approved=outcome is True)

    def _set(self, risk: str, mode: str) -> bool:
        if risk not in RISKS:
            raise ValueError(f"unknown risk {risk!r}; one of {', '.join(RISKS)}")
        if mode not in MODES:
            raise ValueError(f"unknown approval mode {mode!r}; one of {', '.join(MODES)}")
        changed = self._policy[risk] != mode  # type: ignore[index]
        self._policy[risk] = mode  # type: ignore[index]
        return changed


@dataclass
class _Waiting:
    request: ApprovalRequest
    answered: anyio.Event = field(default_factory=anyio.Event)
    decision: ApprovalDecision | None = None


class PendingApprovals:
    """An approver for a UI or an API: each request waits until `answer()` is called or its turn is cancelled.

    Attach it (`AgentApprovals(approver=PendingApprovals())`) and answer through `AgentRunner.answer_approval`,
    which also answers requests whose turn ended with the process. Use it from the runner's event loop.
    """

    def __init__(self) -> None:
        self._waiting: dict[str, _Waiting] = {}
        self._expected: dict[str, anyio.Event] = {}

    def pending(self, session_id: str | None = None) -> list[ApprovalRequest]:
        """The requests waiting right now, oldest first (of one session when `session_id` is given)."""
        return [w.request for w in self._waiting.values() if session_id in (None, w.request.session_id)]

    def waiting_for(self, request_id: str) -> ApprovalRequest | None:
        waiting = self._waiting.get(request_id)
        return None if waiting is None else waiting.request

    async def arrived(self, request_id: str, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the request to reach this approver (a turn records a request just before
        it asks); whether it waits here now."""
        if request_id not in self._waiting:
            event = self._expected.setdefault(request_id, anyio.Event())
            with anyio.move_on_after(timeout):
                await event.wait()
            if self._expected.get(request_id) is event:
                del self._expected[request_id]
        return request_id in self._waiting

    def answer(self, request_id: str, *, approved: bool, remember: bool = False, reason: str | None = None) -> bool:
        """Answer a waiting request (True), or False when no request of that id is waiting."""
        waiting = self._waiting.get(request_id)
        if waiting is None or waiting.decision is not None:
            return False
        request = waiting.request
        waiting.decision = ApprovalDecision(
            request_id=request_id, risk=request.risk, approved=approved, remember=remember, reason=reason
        )
        waiting.answered.set()
        return True

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        waiting = self._waiting[request.id] = _Waiting(request)
        expected = self._expected.pop(request.id, None)
        if expected is not None:
            expected.set()
        try:
            await waiting.answered.wait()
        finally:
            del self._waiting[request.id]
        assert waiting.decision is not None
        return waiting.decision
