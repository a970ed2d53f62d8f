"""A person's yes before a risky call (`--confirm RISK`): the questions waiting, their answers, and the page's
grants ("allow this risk for this client for N minutes"). The call path asks; the client (MCP elicitation) or the
unit server's page answers, whichever is first. A handshake-era call waits in `Confirmations.ask`; a 2026-07-28 call
is `park`ed while the client asks its person, and `resume`d when it retries with the answer. Every question and
answer is a change log record (outcomes asked, approved, declined, unanswered, withdrawn) and an app log line.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import anyio

from . import tracing
from .changelog import Caller, ChangeLog, Outcome, session_tag
from .errors import ConfirmationTimeout, Declined, Withdrawn

log = logging.getLogger("unit_mcp.confirm")
DEFAULT_TIMEOUT = 300.0
MAX_GRANT_MINUTES = 24 * 60

Elicit = Callable[[str], Awaitable[bool]]
"""Asks the client's person `message`; True for yes, False for no (raises when the client cannot ask, or when its
person dismissed the question without a choice: a headless client does so at once)."""
NOBODY_ASKED = "nobody (the client could not ask, and there is no page)"


@dataclass
class Question:
    """One call waiting for a yes; `token` names a parked one (2026-07-28) in the client's retry."""

    id: int
    caller: Caller
    tool: str
    risk: str
    summary: str
    diff: str | None
    asked: float
    unit_id: str | None = None
    source_id: str | None = None
    log: ChangeLog | None = None
    """Where the question and its ending are recorded (the asking server's change log)."""
    token: str | None = None
    resumed: bool = False
    """A retry carrying its token is answering it: another retry with the same token is refused."""
    answer: bool | None = None
    answered_by: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(frozen=True)
class Grant:
    """Calls of `risk` from one client run without a question until `until` (epoch seconds): from its MCP session
    `session`, or, for a client without one (stateless 2026-07-28 HTTP), from any stateless client named `client`."""

    id: int
    client: str
    session: str | None
    risk: str
    until: float

    def covers(self, caller: Caller, risk: str, now: float) -> bool:
        if risk != self.risk or self.until <= now:
            return False
        if self.session is not None:
            return caller.session_id == self.session
        return caller.session_id is None and caller.name == self.client


class Confirmations:
    """The calls of the listed risks that wait for a yes, within `timeout` seconds, per server."""

    def __init__(
        self,
        risks: Iterable[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.time,
        on_page: bool = False,
    ) -> None:
        self.risks = frozenset(risks)
        self.timeout = timeout
        self.clock = clock
        self.on_page = on_page
        """Whether a page (`UnitsUI`) lists the questions; without one, only the client can answer."""
        self.version = 0
        """Bumped on every change of the questions or grants (the page redraws on it)."""
        self._ids = itertools.count(1)
        self._questions: dict[int, Question] = {}
        self._grants: dict[int, Grant] = {}

    def _changed(self) -> None:
        self.version += 1

    def needed(self, risk: str, caller: Caller) -> bool:
        """Whether a call of `risk` from `caller` waits for a yes (no live grant covers it)."""
        if risk not in self.risks:
            return False
        now = self.clock()
        return not any(g.covers(caller, risk, now) for g in self._grants.values())

    def questions(self) -> list[Question]:
        self._expire_parked()
        return sorted(self._questions.values(), key=lambda q: q.id)

    def grants(self) -> list[Grant]:
        now = self.clock()
        for grant in [g for g in self._grants.values() if g.until <= now]:
            del self._grants[grant.id]
            log.info("grant %d expired: %s for client %r", grant.id, grant.risk, grant.client)
            self._changed()
        return sorted(self._grants.values(), key=lambda g: g.id)

    def question(
        self,
        caller: Caller,
        tool: str,
        risk: str,
        summary: str,
        diff: str | None,
        *,
        unit_id: str | None = None,
        source_id: str | None = None,
        log: ChangeLog | None = None,
    ) -> Question:
        """A new question about one call, to `ask` now or `park` for the client's next round; recorded in `log`."""
        return Question(next(self._ids), caller, tool, risk, summary, diff, self.clock(), unit_id, source_id, log)

    async def ask(
        self, question: Question, elicit: Elicit | None, *, gone: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Wait for a yes (returns), a no ([declined]) or the timeout ([confirmation_timeout]); cancelled, or
        `gone` returned (the client went away: `unit_mcp.cancel.client_gone`), the question is withdrawn."""
        attributes = {
            "unit_mcp.tool": question.tool,
            "unit_mcp.risk": question.risk,
            "unit_mcp.unit_id": question.unit_id,
        }
        with tracing.span("confirmation wait", attributes):
            await self._ask(question, elicit, gone)

    async def _ask(self, question: Question, elicit: Elicit | None, gone: Callable[[], Awaitable[None]] | None) -> None:
        tool = question.tool
        if elicit is None and not self.on_page:
            await self._record(question, "declined", "declined", "nobody can be asked: no elicitation and no page")
            raise Declined(
                f"{tool} needs a person's yes, and nobody can be asked: this client shows no questions (MCP "
                "elicitation) and this server has no page (--stdio).",
                hint="Use a client with elicitation, or serve over HTTP and answer on the page at UNITS_UI_URL.",
            )
        await self._open(question)
        answered, left = False, False

        async def watch(gone: Callable[[], Awaitable[None]], scope: anyio.CancelScope) -> None:
            nonlocal left
            await gone()
            left = True
            scope.cancel()

        try:
            with anyio.move_on_after(self.timeout):
                async with anyio.create_task_group() as tasks:
                    if elicit is not None:
                        tasks.start_soon(self._elicit, question, elicit)
                    if gone is not None:
                        tasks.start_soon(watch, gone, tasks.cancel_scope)
                    await question.done.wait()
                    tasks.cancel_scope.cancel()  # the page answered first: the elicitation is withdrawn
            answered = not left
        finally:
            if not answered:
                with anyio.CancelScope(shield=True):
                    await self._close(question, withdrawn=True)
        if left:
            raise Withdrawn(f"{tool} was withdrawn: the client went away before an answer.")
        await self._close(question)

    async def park(self, question: Question) -> None:
        """Open a question the client asks its person between two rounds (2026-07-28): its `token` goes into the
        call's request state; the page can answer it too, until `resume` or the timeout."""
        question.token = secrets.token_urlsafe(16)
        await self._open(question)

    async def resume(self, token: str, yes: bool | None) -> None:
        """The client's retry of a parked question with its person's answer (None: the question was dismissed or
        not shown, so the page decides within the timeout): returns on a yes, raises [declined] or
        [confirmation_timeout]. The page's answer, when it came first, stands."""
        self._expire_parked()
        question = next((q for q in self._questions.values() if q.token == token), None)
        if question is None:
            raise ConfirmationTimeout("This question is no longer waiting (it timed out); the call did not run.")
        if question.resumed:
            raise Declined(
                f"{question.tool} is being answered by another retry with the same requestState; this one did not run.",
                hint="Retry a call once with its requestState, and wait for that retry's result.",
            )
        question.resumed = True
        if question.answer is None and yes is not None:
            self.answer(question.id, yes, by="the client")
        elif question.answer is None and not self.on_page:
            self.answer(question.id, False, by=NOBODY_ASKED)
        elif question.answer is None:
            log.info("question %d was not answered through the client; waiting for the page", question.id)
            answered = False
            try:
                with anyio.move_on_after(question.asked + self.timeout - self.clock()):
                    await question.done.wait()
                answered = True
            finally:
                if not answered:
                    with anyio.CancelScope(shield=True):
                        await self._close(question, withdrawn=True)
        await self._close(question)

    def message(self, question: Question) -> str:
        """What the client's person is asked."""
        diff = f"\n\n{question.diff}" if question.diff else ""
        return f"Allow this call? {question.summary}{diff}"

    async def _open(self, question: Question) -> None:
        self._questions[question.id] = question
        self._changed()
        log.info(
            "question %d: %s (risk %s) from client %r session %s waits for a yes: %s",
            question.id, question.tool, question.risk, question.caller.name, session_tag(question.caller.session_id),
            question.summary,
        )  # fmt: skip
        await self._record(question, "asked", None, question.summary)

    async def _close(self, question: Question, *, withdrawn: bool = False) -> None:
        """Take the question off the list and record how it ended (whoever closes it first); then raise unless it was
        a yes, for every waiter alike: a question closed already still answers with its answer, never as a yes."""
        if self._questions.pop(question.id, None) is not None:
            self._changed()
            await self._record_ending(question, withdrawn=withdrawn)
        if withdrawn:
            return
        if question.answer is None:
            waited = f"{question.tool} waited {self.timeout:g} s"
            raise ConfirmationTimeout(f"{waited} for a person's yes and got no answer.")
        if not question.answer:
            raise Declined(f"{question.tool} was declined by a person ({question.answered_by}).")

    async def _record_ending(self, question: Question, *, withdrawn: bool) -> None:
        if withdrawn:
            log.info("question %d withdrawn: the client went away before an answer", question.id)
            await self._record(question, "withdrawn", None, "the client went away before an answer")
        elif question.answer is None:
            log.info("question %d: no answer within %g s", question.id, self.timeout)
            await self._record(question, "unanswered", "confirmation_timeout", f"no answer within {self.timeout:g} s")
        elif question.answer:
            await self._record(question, "approved", None, f"yes from {question.answered_by}")
        else:
            await self._record(question, "declined", "declined", f"no from {question.answered_by}")

    def _expire_parked(self) -> None:
        """Drop parked questions whose client did not come back within the timeout (nothing waits on them). The
        page calls this from a worker thread: whoever pops a question records it."""
        deadline = self.clock() - self.timeout
        for question in list(self._questions.values()):
            if question.token is None or question.asked > deadline or self._questions.pop(question.id, None) is None:
                continue
            self._changed()
            log.info("question %d: the client did not come back within %g s", question.id, self.timeout)
            if question.answer is None:
                self._write(question, "unanswered", "confirmation_timeout", "the client did not come back")
            else:
                said, outcome = ("yes", "approved") if question.answer else ("no", "declined")
                self._write(question, outcome, None, f"{said} from {question.answered_by}, unused")  # type: ignore[arg-type]

    async def _record(self, question: Question, outcome: Outcome, code: str | None, message: str) -> None:
        tracing.add_event(f"confirmation {outcome}", by=question.answered_by, question=question.id)
        if outcome != "asked":
            tracing.set_attributes(
                tracing.current(),
                unit_mcp__confirmation__outcome=outcome,
                unit_mcp__confirmation__by=question.answered_by,
            )
        await anyio.to_thread.run_sync(self._write, question, outcome, code, message)

    def _write(self, question: Question, outcome: Outcome, code: str | None, message: str) -> None:
        if question.log is None:
            return
        question.log.record(
            caller=question.caller,
            tool=question.tool,
            unit_id=question.unit_id,
            source_id=question.source_id,
            outcome=outcome,
            error_code=code,
            message=f"question {question.id} ({question.risk}): {message}",
            duration_ms=(self.clock() - question.asked) * 1000,
        )

    async def _elicit(self, question: Question, elicit: Elicit) -> None:
        try:
            yes = await elicit(self.message(question))
        except Exception as exc:  # the client could not ask, or its person made no choice: the page still can
            log.info("question %d was not answered through the client (%s); waiting for the page", question.id, exc)
            if not self.on_page:
                self.answer(question.id, False, by=NOBODY_ASKED)
            return
        self.answer(question.id, yes, by="the client")

    def answer(self, question_id: int, yes: bool, *, by: str) -> bool:
        """Answer a waiting question; False when it is no longer waiting (answered, timed out, withdrawn)."""
        question = self._questions.get(question_id)
        if question is None or question.answer is not None:
            return False
        question.answer, question.answered_by = yes, by
        question.done.set()
        log.info("question %d answered %s by %s", question_id, "yes" if yes else "no", by)
        self._changed()
        return True

    def allow(self, question_id: int, minutes: float) -> Grant | None:
        """Grant the waiting question's client its risk for `minutes` and answer the question yes; None when it is
        no longer waiting."""
        question = self._questions.get(question_id)
        if question is None or question.answer is not None:
            return None
        grant = self.grant(question.caller, question.risk, minutes)
        self.answer(question_id, True, by=f"the page (grant {grant.id})")
        return grant

    def grant(self, caller: Caller, risk: str, minutes: float) -> Grant:
        """Let `caller`'s calls of `risk` run without a question for `minutes` (shown and revocable on the page):
        its MCP session's where it has one, else every stateless client's of its name."""
        if risk not in self.risks:
            raise ValueError(f"risk {risk!r} needs no yes here; choose one of {', '.join(sorted(self.risks))}")
        if not 0 < minutes <= MAX_GRANT_MINUTES:
            raise ValueError(f"minutes must be above 0 and at most {MAX_GRANT_MINUTES}")
        if caller.session_id is None and not caller.name:
            raise ValueError("this client has neither an MCP session nor a name to allow it by; answer each call")
        grant = Grant(next(self._ids), caller.name or "", caller.session_id, risk, self.clock() + minutes * 60)
        self._grants[grant.id] = grant
        log.info(
            "grant %d: %s for client %r session %s for %g minutes", grant.id, risk, grant.client, grant.session, minutes
        )
        self._changed()
        return grant

    def revoke(self, grant_id: int) -> bool:
        grant = self._grants.pop(grant_id, None)
        if grant is None:
            return False
        log.info("grant %d revoked: %s for client %r", grant_id, grant.risk, grant.client)
        self._changed()
        return True
