"""A person's yes before a risky call (`--confirm RISK`): the questions waiting, their answers, and the page's
grants ("allow this risk for this client for N minutes"). The call path asks (`Confirmations.ask`); the client
(MCP elicitation) or the unit server's page answers, whichever is first. Questions and answers go to the app log
(logger `unit_mcp.confirm`): the change log records writes, and a question is not one.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import anyio

from .changelog import Caller
from .errors import ConfirmationTimeout, Declined

log = logging.getLogger("unit_mcp.confirm")
DEFAULT_TIMEOUT = 300.0
MAX_GRANT_MINUTES = 24 * 60

Elicit = Callable[[str], Awaitable[bool]]
"""Asks the client's person `message`; True for yes, False for no (raises when the client cannot ask)."""


@dataclass
class Question:
    """One call waiting for a yes."""

    id: int
    caller: Caller
    tool: str
    risk: str
    summary: str
    diff: str | None
    asked: float
    answer: bool | None = None
    answered_by: str | None = None
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass(frozen=True)
class Grant:
    """Calls of `risk` from the client named `client` run without a question until `until` (epoch seconds)."""

    id: int
    client: str
    risk: str
    until: float


class Confirmations:
    """The calls of the listed risks that wait for a yes, within `timeout` seconds, per server."""

    def __init__(
        self, risks: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT, clock: Callable[[], float] = time.time
    ) -> None:
        self.risks = frozenset(risks)
        self.timeout = timeout
        self.clock = clock
        self.on_page = False
        """Whether a page lists the questions (`UnitsUI` sets it); without one, only the client can answer."""
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
        return not any(g.client == caller.name and g.risk == risk and g.until > now for g in self._grants.values())

    def questions(self) -> list[Question]:
        return sorted(self._questions.values(), key=lambda q: q.id)

    def grants(self) -> list[Grant]:
        now = self.clock()
        for grant in [g for g in self._grants.values() if g.until <= now]:
            del self._grants[grant.id]
            log.info("grant %d expired: %s for client %r", grant.id, grant.risk, grant.client)
            self._changed()
        return sorted(self._grants.values(), key=lambda g: g.id)

    async def ask(
        self, caller: Caller, tool: str, risk: str, summary: str, diff: str | None, elicit: Elicit | None
    ) -> None:
        """Wait for a yes (returns), a no ([declined]) or the timeout ([confirmation_timeout]); cancelled (the
        client went away), the question is withdrawn."""
        if elicit is None and not self.on_page:
            raise Declined(
                f"{tool} needs a person's yes, and nobody can be asked: this client shows no questions (MCP "
                "elicitation) and this server has no page (--stdio).",
                hint="Use a client with elicitation, or serve over HTTP and answer on the page at UNITS_UI_URL.",
            )
        question = Question(next(self._ids), caller, tool, risk, summary, diff, self.clock())
        self._questions[question.id] = question
        self._changed()
        log.info(
            "question %d: %s (risk %s) from client %r session %s waits for a yes: %s",
            question.id, tool, risk, caller.name, caller.session_id, summary,
        )  # fmt: skip
        answered = False
        try:
            with anyio.move_on_after(self.timeout):
                async with anyio.create_task_group() as tasks:
                    if elicit is not None:
                        tasks.start_soon(self._elicit, question, elicit)
                    await question.done.wait()
                    tasks.cancel_scope.cancel()  # the page answered first: the elicitation is withdrawn
            answered = True
        finally:
            del self._questions[question.id]
            self._changed()
            if not answered:
                log.info("question %d withdrawn: the client went away before an answer", question.id)
        if question.answer is None:
            log.info("question %d: no answer within %g s", question.id, self.timeout)
            raise ConfirmationTimeout(f"{tool} waited {self.timeout:g} s for a person's yes and got no answer.")
        if not question.answer:
            raise Declined(f"{tool} was declined by a person ({question.answered_by}).")

    async def _elicit(self, question: Question, elicit: Elicit) -> None:
        try:
            diff = f"\n\n{question.diff}" if question.diff else ""
            yes = await elicit(f"Allow this call? {question.summary}{diff}")
        except Exception as exc:  # the client could not ask: the page still can
            log.info("question %d could not be asked through the client (%s); waiting for the page", question.id, exc)
            if not self.on_page:
                self.answer(question.id, False, by="nobody (the client could not ask, and there is no page)")
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

    def grant(self, client: str, risk: str, minutes: float) -> Grant:
        """Let `client`'s calls of `risk` run without a question for `minutes` (shown and revocable on the page)."""
        if risk not in self.risks:
            raise ValueError(f"risk {risk!r} needs no yes here; choose one of {', '.join(sorted(self.risks))}")
        if not client:
            raise ValueError("name the client (its clientInfo name, as the waiting list shows it)")
        if not 0 < minutes <= MAX_GRANT_MINUTES:
            raise ValueError(f"minutes must be above 0 and at most {MAX_GRANT_MINUTES}")
        grant = Grant(next(self._ids), client, risk, self.clock() + minutes * 60)
        self._grants[grant.id] = grant
        log.info("grant %d: %s for client %r for %g minutes", grant.id, risk, client, minutes)
        self._changed()
        return grant

    def revoke(self, grant_id: int) -> bool:
        grant = self._grants.pop(grant_id, None)
        if grant is None:
            return False
        log.info("grant %d revoked: %s for client %r", grant_id, grant.risk, grant.client)
        self._changed()
        return True
