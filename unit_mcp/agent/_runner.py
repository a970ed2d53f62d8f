"""AgentRunner: sessions, one active turn per session, the inbox, and turn lifecycle.

The runner knows nothing about providers (agents own that and report through the context), so one runner
serves every kind of agent; usage is in docs/agent.md.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import anyio
import anyio.abc

from .. import tracing
from ._context import TurnApprovals, TurnContext
from ._inbox import Inbox
from ._protocol import Agent
from ._registry import AgentRegistry
from ._undo import TurnUndo, checkpoint_turn, undo_turn
from .approvals import AgentApprovals, ApprovalDecision, ApprovalRequest, PendingApprovals
from .errors import AgentError, AnsweredElsewhere, TurnClosed, UnknownApproval
from .events import DEFAULT_BUFFER, AgentState, EventHub, Subscription
from .items import EventItem, MessageItem, Session, SessionMeta
from .paused import AFTER_END, DECIDED, paused_calls
from .sessions import Pending, SessionStore
from .toolsurface import AgentToolSurface
from .turns import Turn, TurnCallbacks, TurnHandle, TurnStatus, describe

log = logging.getLogger("unit_mcp.agent.runner")


PARKING_WAIT = 2.0  # seconds an answer waits for a recorded request to reach the PendingApprovals approver


@dataclass(frozen=True)
class Answered:
    """What answering an approval did (`AgentRunner.answer_approval`): `how` it went on, for which turn, the handle
    of the turn that goes on (`continued`, `resumed`), the requests its turn still waits for (`recorded`)."""

    how: Literal["continued", "resumed", "recorded", "sent_to_worker"]
    request: ApprovalRequest
    turn_id: str
    handle: TurnHandle | None = None
    still_waiting: tuple[str, ...] = ()


def _new_turn_id() -> str:
    return f"turn-{secrets.token_hex(6)}"


class DurableAnswers(Protocol):
    """Where the answer to a durable turn's request goes (`_durable.DurableClient`: to the workflow waiting)."""

    async def answer(self, request: ApprovalRequest, decision: ApprovalDecision) -> None: ...


class AgentRunner:
    def __init__(
        self,
        *,
        store: SessionStore | str | os.PathLike[str],
        registry: AgentRegistry,
        tools: AgentToolSurface,
        approvals: AgentApprovals | None = None,
        cancel_timeout: float = 10.0,
        durable: DurableAnswers | None = None,
    ) -> None:
        if registry is None or tools is None:
            raise AgentError("the runner needs an agent registry and a tool surface")
        self._owns_store = not isinstance(store, SessionStore)
        self.store = store if isinstance(store, SessionStore) else SessionStore(store)
        self.registry = registry
        self.tools = tools
        self.approvals = approvals or tools.approvals
        self.cancel_timeout = cancel_timeout
        self.durable = durable
        self._active: dict[str, Turn] = {}
        self._inboxes: dict[str, Inbox] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._superseded: set[str] = set()
        self._agent_states: dict[str, AgentState] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._dropping = False
        self.event_hub = EventHub()

    async def __aenter__(self) -> AgentRunner:
        stack = AsyncExitStack()
        self._tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self._dropping = False
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.drop()
        finally:
            stack, self._stack = self._stack, None
            if stack is not None:
                await stack.aclose()
            self._tg = None
            self.event_hub.close()
            if self._owns_store:
                await anyio.to_thread.run_sync(self.store.close)

    # -- sessions ---------------------------------------------------------------------------------

    async def create_session(
        self,
        agent_id: str,
        *,
        title: str | None = None,
        data: dict[str, Any] | None = None,
        parent_id: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        return await anyio.to_thread.run_sync(
            lambda: self.store.create(agent_id, title=title, data=data, parent_id=parent_id, session_id=session_id)
        )

    async def get_session(self, session_id: str) -> Session | None:
        return await anyio.to_thread.run_sync(self.store.load, session_id)

    async def delete_session(self, session_id: str) -> bool:
        await self.cancel_turn(session_id, "the session was deleted")
        self._inboxes.pop(session_id, None)
        return await anyio.to_thread.run_sync(self.store.delete, session_id)

    async def list_sessions(self) -> list[SessionMeta]:
        return await anyio.to_thread.run_sync(self.store.list)

    def events(self, *, buffer: int = DEFAULT_BUFFER) -> Subscription:
        """Every session's turn status changes, text chunks, tool calls and approvals, from now on:
        `async with runner.events() as events: async for event in events: ...`. A subscriber that falls
        `buffer` events behind loses the oldest and reads a `gap` event counting them; turns never wait."""
        return self.event_hub.subscribe(buffer)

    def inbox(self, session_id: str) -> Inbox:
        return self._inboxes.setdefault(session_id, Inbox())

    def active_turn(self, session_id: str) -> TurnHandle | None:
        turn = self._active.get(session_id)
        return None if turn is None or turn.done else turn.handle

    # -- turns ------------------------------------------------------------------------------------

    async def run_turn(self, session_id: str, input: str, callbacks: TurnCallbacks | None = None) -> TurnHandle:
        """Start a turn now (cancelling a running one) and return its handle without waiting for it."""
        handle = await self._start(session_id, [input], callbacks, supersede=True)
        assert handle is not None
        return handle

    async def enqueue(self, session_id: str, input: str, callbacks: TurnCallbacks | None = None) -> TurnHandle | None:
        """Start a turn now if the session is idle, else after the running turn (then None is returned)."""
        if self.active_turn(session_id) is not None:
            self.inbox(session_id).enqueue(input)
            self.event_hub.publish("turn-status", session_id=session_id, status="queued")
            return None
        return await self._start(session_id, [input], callbacks, supersede=False)

    async def steer(self, session_id: str, text: str) -> bool:
        """Deliver `text` into the running turn before its next model request (True), or, with no turn
        running, queue it as the input of a new turn (False)."""
        turn = self._active.get(session_id)
        if turn is not None and not turn.done and turn.cancel_reason is None:
            self.inbox(session_id).steer(text)
            return True
        await self.enqueue(session_id, text)
        return False

    async def pending_approvals(self, session_id: str) -> list[ApprovalRequest]:
        """Approval requests nobody has answered: the running turn's, and those of a turn that ended with the
        process while it waited (answer them with `answer_approval` to resume that turn)."""
        await anyio.to_thread.run_sync(self.store.require, session_id)
        return [entry.request for entry in await anyio.to_thread.run_sync(self._pending, session_id)]

    async def undo_turn(
        self, session_id: str, turn_id: str | None = None, *, dry_run: bool = True, force: bool = False
    ) -> TurnUndo:
        """Roll the units back to the checkpoint taken at the start of `turn_id` (default: the newest turn that has
        one): a dry run unless `dry_run` is False, which a person's yes should come before. Refused while a turn runs
        in the session; the undo is recorded in it."""
        if self.active_turn(session_id) is not None:
            raise AgentError(f"a turn is running in session {session_id}: stop it before undoing one")
        session = await anyio.to_thread.run_sync(self.store.require, session_id)
        done = await undo_turn(self.tools, session, turn_id, dry_run=dry_run, force=force)
        if not dry_run:
            await anyio.to_thread.run_sync(lambda: self.store.append_item(session_id, done.event(force)))
        return done

    async def answer_approval(
        self,
        session_id: str,
        request_id: str,
        *,
        approved: bool,
        remember: bool = False,
        reason: str | None = None,
        callbacks: TurnCallbacks | None = None,
    ) -> Answered:
        """Answer a pending approval request; what the answer did is the result's `how`:

        - `continued`: the turn waiting for it right now through a `PendingApprovals` approver goes on (`handle`);
        - `sent_to_worker`: a durable turn's request went to its workflow (`durable`), which records it and goes on;
        - `recorded`: the request's turn ended with the process and waits for its other requests (`still_waiting`);
        - `resumed`: that was the last one: a turn resuming it started (`handle`); the answered calls run or are
          denied, then the model continues.

        Raises `UnknownApproval` for a request that does not wait, `AnsweredElsewhere` while a turn runs that
        asks its own approver (or another turn runs), AgentError when the session's agent cannot resume a turn.
        """
        approver = self.approvals.approver
        lock = self._locks.setdefault(session_id, anyio.Lock())
        async with lock:
            pending = await anyio.to_thread.run_sync(self._pending, session_id)
            entry = next((e for e in pending if e.request.id == request_id), None)
            if entry is None:
                await anyio.to_thread.run_sync(self.store.require, session_id)  # an unknown session says so
                waiting = ", ".join(e.request.id for e in pending) or "none"
                raise UnknownApproval(
                    f"session {session_id} has no pending approval {request_id!r} (pending: {waiting})"
                )
            request = entry.request
            assert request.turn_id is not None
            if entry.state == "durable":  # its worker holds the session: nothing is written here
                await self._answer_durable(request, approved, remember, reason)
                return Answered("sent_to_worker", request, request.turn_id)
            active = self.active_turn(session_id)
            if active is not None:
                if request.turn_id != active.id:
                    raise AnsweredElsewhere(
                        f"turn {active.id} is running in session {session_id}; answer after it ends"
                    )
                if (
                    isinstance(approver, PendingApprovals)
                    and await approver.arrived(request_id, PARKING_WAIT)
                    and approver.answer(request_id, approved=approved, remember=remember, reason=reason)
                ):
                    return Answered("continued", request, active.id, handle=active)
                raise AnsweredElsewhere(f"turn {active.id} is asking its approver for {request_id} now; answer there")
            session = await anyio.to_thread.run_sync(self.store.require, session_id)
            self._require_resumable(session)  # before recording: an answer nothing can act on is refused
            decision = ApprovalDecision(
                request_id=request.id,
                risk=request.risk,
                approved=approved,
                remember=remember,
                reason=reason or f"{'approved' if approved else 'denied'} after the asking turn ended",
            )
            record = {"request": request.model_dump(mode="json"), "decision": decision.model_dump(mode="json")}
            decided = EventItem(kind=DECIDED, data={**record, AFTER_END: True}, turn_id=request.turn_id)
            grant = request.risk if approved and remember else None

            def write() -> Session:
                self.store.append_item(session_id, decided, grant=grant)
                return self.store.require(session_id)

            session = await anyio.to_thread.run_sync(write)
            self.event_hub.publish(
                "approval-answered",
                session_id=session_id,
                turn_id=request.turn_id,
                request_id=request.id,
                approved=approved,
                decided_by="approver",
            )
            still = tuple(p.request.id for p in paused_calls(session, request.turn_id) if p.decision is None)
            if still:
                return Answered("recorded", request, request.turn_id, still_waiting=still)
        handle = await self.resume_turn(session_id, request.turn_id, callbacks)
        return Answered("resumed", request, request.turn_id, handle=handle)

    async def resume_turn(self, session_id: str, turn_id: str, callbacks: TurnCallbacks | None = None) -> TurnHandle:
        """Resume turn `turn_id`, which ended with the process while calls waited for approval, once every one of
        them is answered. `answer_approval` does this at the last answer; call it yourself only when that start
        failed (another turn was running) or the resuming turn was cancelled before it ran anything. A call the
        resuming turn had started is never run again."""
        session = await anyio.to_thread.run_sync(self.store.require, session_id)
        paused = paused_calls(session, turn_id)
        if not paused:
            raise AgentError(f"turn {turn_id} of session {session_id} has no call waiting to be resumed")
        unanswered = [call.request.id for call in paused if call.decision is None]
        if unanswered:
            raise AgentError(f"turn {turn_id} still waits for answers to {', '.join(unanswered)}")
        self._require_resumable(session)
        handle = await self._start(session_id, [], callbacks, supersede=False, resume=turn_id)
        if handle is None:
            raise AgentError(
                f"a turn is running in session {session_id}; the answers are recorded: call resume_turn("
                f"{session_id!r}, {turn_id!r}) after it ends"
            )
        return handle

    async def _answer_durable(
        self, request: ApprovalRequest, approved: bool, remember: bool, reason: str | None
    ) -> None:
        if self.durable is None:
            raise AgentError(
                f"{request.id} is asked by durable turn {request.turn_id}: answer it with the workers' system database "
                "(the CLI's --workers or --system-db; AgentRunner(durable=DurableClient(...)))"
            )
        decision = ApprovalDecision(
            request_id=request.id, risk=request.risk, approved=approved, remember=remember, reason=reason
        )
        await self.durable.answer(request, decision)
        self.event_hub.publish(
            "approval-answered",
            session_id=request.session_id,
            turn_id=request.turn_id,
            request_id=request.id,
            approved=approved,
            decided_by="approver",
        )

    def _pending(self, session_id: str) -> list[Pending]:
        """What waits in a session, by the store's one rule (the page and the CLI ask the same)."""
        return self.store.pending(session_id, self.live_turn)

    def live_turns(self) -> dict[str, str]:
        """Session id -> the id of the turn this runner runs in it."""
        return {sid: turn.handle.id for sid, turn in list(self._active.items()) if not turn.done}

    def live_turn(self, session_id: str) -> str | None:
        """The id of the turn this runner runs in the session, if any."""
        handle = self.active_turn(session_id)
        return None if handle is None else handle.id

    def _require_resumable(self, session: Session) -> None:
        agent = self.registry.require(session.agent_id)
        if not callable(getattr(agent, "resume", None)):
            raise AgentError(f"agent {agent.id} cannot resume a turn, so its approvals cannot be answered")

    async def set_preset(self, session_id: str, name: str, *, active: bool) -> bool:
        """The user (not an agent) turns a capability preset on or off, so no approval is asked; the change is
        recorded in the session as a `preset-activated` / `preset-deactivated` item. True if it changed."""
        presets = self.tools.presets
        if presets is None:
            raise AgentError("the tool surface has no presets: give AgentToolSurface a PresetManager")
        await anyio.to_thread.run_sync(self.store.require, session_id)
        changed = presets.activate(name) if active else presets.deactivate(name)
        info = presets.describe(self.tools.registered(), name)
        data = {"name": name, "risk": info.risk, "tools": info.tools, "changed": changed, "by": "user"}
        kind = "preset-activated" if active else "preset-deactivated"
        await anyio.to_thread.run_sync(self.store.append_item, session_id, EventItem(kind=kind, data=data))
        return changed

    async def set_context(self, context: str | None) -> list[str]:
        """The application's current context (say the view the user works in): presets declared for contexts
        follow it, the endpoints resync, and each session with a running turn records a `context-changed` item
        (every turn's `turn-started` names the context it started in). The ids of those sessions."""
        presets = self.tools.presets
        if presets is None:
            raise AgentError("the tool surface has no presets: give AgentToolSurface a PresetManager")
        previous = presets.context
        offered, withdrawn = presets.set_context(context)
        if context == previous:
            return []
        data = {"context": context, "previous": previous, "offered": offered, "withdrawn": withdrawn}
        affected = []
        for turn in list(self._active.values()):
            if turn.done:
                continue
            with contextlib.suppress(TurnClosed):
                await turn.append(EventItem(kind="context-changed", data=data))
                affected.append(turn.session_id)
        return affected

    async def cancel_turn(self, session_id: str, reason: str = "cancelled by the caller") -> bool:
        turn = self._active.get(session_id)
        return False if turn is None else await turn.cancel(reason)

    async def flush(self) -> None:
        await anyio.to_thread.run_sync(self.store.flush)

    async def drop(self) -> None:
        """Cancel every active turn (closing its tool calls) and flush; the runner can be entered again."""
        self._dropping = True
        for turn in list(self._active.values()):
            turn.disposed = True
            await turn.cancel("the runner is shutting down")
        for agent_id in sorted(self._agent_states):
            self.event_hub.publish("agent-status", agent_id=agent_id, status="disposed")
        self._agent_states.clear()
        await self.flush()

    # -- internals --------------------------------------------------------------------------------

    async def _start(
        self,
        session_id: str,
        inputs: list[str],
        callbacks: TurnCallbacks | None,
        *,
        supersede: bool,
        resume: str | None = None,
    ) -> TurnHandle | None:
        tg = self._tg
        if tg is None or self._dropping:
            raise AgentError("the runner is not running: use `async with AgentRunner(...) as runner`")
        lock = self._locks.setdefault(session_id, anyio.Lock())
        async with lock:
            session = await anyio.to_thread.run_sync(self.store.require, session_id)
            agent = self.registry.require(session.agent_id)
            turn_id = _new_turn_id()
            old = self._active.get(session_id)
            if old is not None and not old.done:
                if not supersede:
                    for text in inputs:
                        self.inbox(session_id).enqueue(text)
                    if inputs:
                        self.event_hub.publish("turn-status", session_id=session_id, status="queued")
                    return None
                self._superseded.add(old.id)
                await old.cancel(f"superseded by turn {turn_id}")
            turn = Turn(
                turn_id=turn_id,
                session_id=session_id,
                agent_id=agent.id,
                store=self.store,
                callbacks=callbacks,
                on_end=self._ended,
                cancel_timeout=self.cancel_timeout,
                events=self.event_hub,
            )
            self._active[session_id] = turn
            try:
                started = {"turn_id": turn_id, "agent_id": agent.id} | ({"resumes": resume} if resume else {})
                if self.tools.presets is not None and self.tools.presets.context is not None:
                    started["context"] = self.tools.presets.context
                await turn.append(EventItem(kind="turn-started", data=started), status="running")
                for text in inputs:
                    await turn.append(MessageItem(role="user", content=text))
            except Exception as exc:
                await turn.end(
                    TurnStatus.FAILED, error=f"the turn could not start: {describe(exc)}", code="start_failed"
                )
                raise
            approvals = TurnApprovals(self.approvals, self.store, session_id, turn.controller)
            ctx = TurnContext(
                session_id=session_id,
                turn=turn.controller,
                tools=self.tools,
                approvals=approvals,
                inbox=self.inbox(session_id),
                store=self.store,
                delegate=functools.partial(self._delegate, session_id),
                agents=self.registry,
            )
            if self._dropping:  # the runner began shutting down while this turn was set up: it never runs
                turn.disposed = True
                turn.cancel_reason = "the runner is shutting down"
                await turn.finalize_cancel()
                return turn.handle
            turn.publish("turn-status", status="running", agent_id=agent.id, resumes=resume)
            self._agent_status(agent.id)
            tg.start_soon(self._drive, turn, agent, "\n\n".join(inputs), ctx, resume)
            return turn.handle

    async def _delegate(
        self, parent_id: str, agent_id: str, input: str, title: str, child_id: str | None
    ) -> TurnHandle:
        """A turn of `agent_id` in a child session of `parent_id`: a new one, or `child_id` (created if missing;
        an existing session must be a child of `parent_id` run by `agent_id`)."""
        self.registry.require(agent_id)
        child = await self.get_session(child_id) if child_id is not None else None
        if child is None:
            child = await self.create_session(agent_id, parent_id=parent_id, title=title, session_id=child_id)
        elif child.parent_id != parent_id or child.agent_id != agent_id:
            raise AgentError(
                f"session {child_id} is not a child of session {parent_id} run by agent {agent_id} "
                f"(its parent: {child.parent_id}, its agent: {child.agent_id}); name another id or leave it out"
            )
        elif self.active_turn(child.id) is not None:
            raise AgentError(f"child session {child.id} is busy with another delegated turn; wait for it first")
        return await self.run_turn(child.id, input)

    async def _drive(self, turn: Turn, agent: Agent, input: str, ctx: TurnContext, resume: str | None) -> None:
        """Run (or resume) the agent in the turn's cancel scope; whatever happens, the turn ends exactly once."""
        attributes = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": agent.id,
            "gen_ai.agent.name": getattr(agent, "name", None),
            "gen_ai.conversation.id": turn.session_id,
            "unit_mcp.turn.id": turn.id,
            "unit_mcp.turn.resumes": resume,
        }
        with tracing.span(f"invoke_agent {agent.id}", attributes) as span, anyio.CancelScope() as scope:
            turn.scope = scope
            tracing.set_content(span, "gen_ai.input.messages", input or None)
            if turn.cancel_reason is not None:
                scope.cancel()
            try:
                # The turn can be undone in one step: a checkpoint on each unit server first (in the turn's trace).
                marked = await checkpoint_turn(self.tools, turn.session_id, turn.id)
                if marked is not None:
                    await turn.append(marked)
                if resume is not None:
                    await agent.resume(resume, ctx)  # type: ignore[attr-defined]
                else:
                    await agent.run(input, ctx.session, ctx)
            except TurnClosed:
                pass
            except Exception as exc:
                tracing.fail(span, type(exc).__name__)
                if turn.cancel_reason is None and not turn.done:
                    log.info("turn %s of agent %s failed: %s", turn.id, agent.id, describe(exc), exc_info=True)
                    await turn.end(TurnStatus.FAILED, error=describe(exc), code=type(exc).__name__)
        if not turn.done:
            if turn.cancel_reason is not None:
                await turn.finalize_cancel()
            else:
                await turn.end(
                    TurnStatus.FAILED,
                    error=f"agent {agent.id} returned without finishing the turn",
                    code="unfinished_turn",
                )

    async def _ended(self, turn: Turn) -> None:
        """Clear the active turn; steering that came too late and queued input start the next turn."""
        if self._active.get(turn.session_id) is turn:
            del self._active[turn.session_id]
        if not self._dropping:
            self._agent_status(turn.agent_id)
        superseded = turn.id in self._superseded
        self._superseded.discard(turn.id)
        inbox = self._inboxes.get(turn.session_id)
        if inbox is None:
            return
        inbox.requeue_steering()
        if inbox.has_queued and not superseded and not self._dropping and self._tg is not None:
            texts = [message.text for message in inbox.drain_queued()]
            self._tg.start_soon(self._start_queued, turn.session_id, texts)

    def _agent_status(self, agent_id: str) -> None:
        """Publish `agent-status` when the agent's state changed: running while any turn of it runs, else idle."""
        running = any(turn.agent_id == agent_id and not turn.done for turn in self._active.values())
        state: AgentState = "running" if running else "idle"
        if self._agent_states.get(agent_id) != state:
            self._agent_states[agent_id] = state
            self.event_hub.publish("agent-status", agent_id=agent_id, status=state)

    async def _start_queued(self, session_id: str, texts: list[str]) -> None:
        try:
            await self._start(session_id, texts, None, supersede=False)
        except Exception:
            log.exception("could not start the queued turn of session %s", session_id)
