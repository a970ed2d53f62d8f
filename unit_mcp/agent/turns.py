"""One turn's lifecycle: the caller's TurnHandle and the agent's TurnController over one shared Turn.

The runner creates the pair and drives the agent in a cancel scope. Whatever way a turn ends (finish,
fail, cancel, an exception, an agent that returns without finishing), it ends exactly once: every tool
call it opened gets a closing result, the outcome is persisted as items, the session goes idle and is
flushed, and the callbacks fire. The agent's cancel hook (provider-specific abort) is called at most once;
if it fails the turn is still cancelled and the hook's error is surfaced on the handle and as an item.
"""

from __future__ import annotations

import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from .errors import TurnClosed
from .events import EventHub
from .items import ErrorItem, EventItem, Item, MessageItem, SessionStatus, ToolCallItem, ToolResultItem
from .paused import RESUMED_OUTPUT
from .sessions import SessionStore

log = logging.getLogger("unit_mcp.agent.turns")

CancelHook = Callable[[], Any]
HandleCallback = Callable[["TurnHandle"], Any]


class TurnStatus(enum.StrEnum):
    """How a turn stands; each end is recorded as a `turn-<status>` event. INTERRUPTED: its work stopped unfinished
    (its worker or node died), what it did is kept (the load-time repair of a turn that ended with its process
    records the same `turn-interrupted`)."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


@dataclass
class TurnCallbacks:
    """Per-turn observers (sync or async). Their failures are logged; they never change the turn."""

    on_item: Callable[[Item], Any] | None = None
    on_partial: Callable[[Item], Any] | None = None
    on_finish: HandleCallback | None = None
    on_error: HandleCallback | None = None


async def call_observer(callback: Callable[..., Any] | None, *args: Any) -> None:
    if callback is None:
        return
    try:
        outcome = callback(*args)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("turn callback %r failed", callback)


def describe(exc: BaseException) -> str:
    """A one-line account of an exception, unwrapping single-member exception groups from task groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Turn:
    """The state behind a handle/controller pair; only the runner touches it directly."""

    def __init__(
        self,
        *,
        turn_id: str,
        session_id: str,
        agent_id: str,
        store: SessionStore,
        callbacks: TurnCallbacks | None = None,
        on_end: Callable[[Turn], Awaitable[None]] | None = None,
        cancel_timeout: float = 10.0,
        events: EventHub | None = None,
    ) -> None:
        self.id = turn_id
        self.session_id = session_id
        self.agent_id = agent_id
        self.store = store
        self.callbacks = callbacks or TurnCallbacks()
        self.cancel_timeout = cancel_timeout
        self.status = TurnStatus.RUNNING
        self.result: str | None = None
        self.error: str | None = None
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.scope: anyio.CancelScope | None = None
        self.cancel_reason: str | None = None
        self.handle = TurnHandle(self)
        self.controller = TurnController(self)
        self._on_end = on_end
        self._done = anyio.Event()
        self._ending = False
        self._cancel_hook: CancelHook | None = None
        self._hook_called = False
        self._hook_error: str | None = None
        self._open_calls: dict[str, ToolCallItem] = {}
        self._last_item_id: str | None = None
        self._handle_callbacks: list[tuple[frozenset[TurnStatus], HandleCallback]] = []
        self.events = events or EventHub()
        self.disposed = False  # cancelled because the runner is shutting down (published as `disposed`)
        self._call_started: dict[str, float] = {}
        self._streamed: dict[str, str] = {}

    @property
    def done(self) -> bool:
        return self._done.is_set()

    # -- items ------------------------------------------------------------------------------------

    async def append(
        self, item: Item, *, closing: bool = False, status: SessionStatus | None = None, grant: str | None = None
    ) -> Item:
        """Record an item of this turn (`status`: the session's, set in the same write; `grant`: a risk the user
        allowed for the rest of the session, saved with the decision that allowed it)."""
        if self._ending and not closing:
            raise TurnClosed(f"turn {self.id} has ended ({self.status}); the item was not recorded")
        item = item.model_copy(update={"turn_id": self.id, "parent_id": item.parent_id or self._last_item_id})
        stored = await anyio.to_thread.run_sync(
            lambda: self.store.append_item(self.session_id, item, status=status, grant=grant)
        )
        if isinstance(stored, ToolCallItem):
            self._open_calls[stored.call_id] = stored
        elif isinstance(stored, ToolResultItem):
            self._open_calls.pop(stored.call_id, None)
        self._last_item_id = stored.id
        self._publish_item(stored)
        await call_observer(self.callbacks.on_item, stored)
        return stored

    async def update(self, item_id: str, changes: dict[str, Any], *, persist: bool) -> Item:
        if self._ending:
            raise TurnClosed(f"turn {self.id} has ended ({self.status}); the update was not recorded")
        updated = await anyio.to_thread.run_sync(
            lambda: self.store.update_item(self.session_id, item_id, changes, persist=persist)
        )
        if isinstance(updated, MessageItem):
            self._publish_text(updated)
        elif isinstance(updated, ToolResultItem) and "output" in changes:
            self._publish_resumed(updated)
        await call_observer(self.callbacks.on_partial, updated)
        return updated

    # -- runner-wide events -----------------------------------------------------------------------

    def publish(self, kind: Any, **data: Any) -> None:
        self.events.publish(kind, session_id=self.session_id, turn_id=self.id, **data)

    def _publish_item(self, item: Item) -> None:
        if isinstance(item, MessageItem):
            self._publish_text(item)
        elif isinstance(item, ToolCallItem):
            self._call_started[item.call_id] = time.monotonic()
            self.publish("tool-call-started", call_id=item.call_id, name=item.name, item_id=item.id, risk=item.risk)
        elif isinstance(item, ToolResultItem):
            started = self._call_started.pop(item.call_id, None)
            self.publish(
                "tool-call-finished",
                call_id=item.call_id,
                name=item.name,
                item_id=item.id,
                is_error=item.is_error,
                synthetic=item.synthetic,
                duration=None if started is None else time.monotonic() - started,
            )
        elif isinstance(item, EventItem) and item.kind == "approval-requested":
            self.publish("approval-requested", request=item.data)
            self.publish("turn-status", status="waiting-for-approval", request_id=item.data.get("id"))
        elif isinstance(item, EventItem) and item.kind == "approval-decided":
            request, decision = item.data.get("request", {}), item.data.get("decision", {})
            self.publish(
                "approval-answered",
                request_id=request.get("id"),
                approved=decision.get("approved"),
                decided_by=decision.get("decided_by"),
            )
            if decision.get("decided_by") == "approver" and not self._ending:
                self.publish("turn-status", status="running")

    def _publish_resumed(self, result: ToolResultItem) -> None:
        """A call a resumed turn runs after its approval: its synthetic result is claimed, then replaced."""
        if result.synthetic and result.output == RESUMED_OUTPUT:
            self._call_started[result.call_id] = time.monotonic()
            self.publish("tool-call-started", call_id=result.call_id, name=result.name, item_id=result.id, resumed=True)
        elif not result.synthetic:
            self._publish_item(result)

    def _publish_text(self, message: MessageItem) -> None:
        """A streamed assistant message as text chunks: each `delta` extends what was published before, so
        the chunks of a message joined are its final content (`restart` marks a provider that rewrote it)."""
        if message.role != "assistant":
            return
        before = self._streamed.get(message.id, "")
        final = not message.partial
        if message.content.startswith(before):
            delta, restart = message.content[len(before) :], False
        else:
            delta, restart = message.content, True
        if final:
            self._streamed.pop(message.id, None)
        else:
            self._streamed[message.id] = message.content
        if delta or final or restart:
            self.publish("text", item_id=message.id, delta=delta, final=final, restart=restart)

    # -- cancellation -----------------------------------------------------------------------------

    def set_cancel(self, hook: CancelHook) -> None:
        if self._hook_called:
            raise TurnClosed(f"turn {self.id} was already cancelled; its cancel hook has run")
        self._cancel_hook = hook

    async def cancel(self, reason: str) -> bool:
        """Request cancellation: run the hook once, cancel the agent's scope, wait (bounded) for the end."""
        if self.status is not TurnStatus.RUNNING or self.cancel_reason is not None or self._ending:
            return False
        self.cancel_reason = reason
        with anyio.CancelScope(shield=True):
            await self._run_cancel_hook()
        if self.scope is not None:
            self.scope.cancel()
        with anyio.move_on_after(self.cancel_timeout):
            await self._done.wait()
        if not self.done:
            log.warning(
                "turn %s did not stop within %.0f s of its cancellation; ending it", self.id, self.cancel_timeout
            )
            await self.finalize_cancel()
        return True

    async def finalize_cancel(self) -> None:
        """Called by the runner once the agent has unwound from a cancellation (or by `cancel` on timeout)."""
        with anyio.CancelScope(shield=True):
            await self._run_cancel_hook()
            await self.end(TurnStatus.CANCELLED, error=self._hook_error)

    async def _run_cancel_hook(self) -> None:
        hook, self._cancel_hook = self._cancel_hook, None
        if hook is None or self._hook_called:
            return
        self._hook_called = True
        try:
            with anyio.fail_after(self.cancel_timeout):
                outcome = hook()
                if inspect.isawaitable(outcome):
                    await outcome
        except Exception as exc:
            self._hook_error = f"cancel hook failed: {describe(exc)}"
            log.warning("turn %s: %s", self.id, self._hook_error)

    # -- the end ----------------------------------------------------------------------------------

    async def end(
        self, status: TurnStatus, *, result: str | None = None, error: str | None = None, code: str | None = None
    ) -> bool:
        """End the turn once; later calls wait for the first to finish and return False."""
        if self._ending:
            await self._done.wait()
            return False
        self._ending = True
        with anyio.CancelScope(shield=True):
            try:
                await self._record_end(status, result=result, error=error, code=code)
            except Exception:
                log.exception("turn %s: could not persist its end (%s)", self.id, status)
            self.status, self.result, self.error = status, result, error
            self.ended_at = time.time()
            self._done.set()
            shown = "disposed" if status is TurnStatus.CANCELLED and self.disposed else str(status)
            self.publish("turn-status", status=shown, error=error, reason=self.cancel_reason)
            await call_observer(
                self.callbacks.on_finish if status is TurnStatus.COMPLETED else self.callbacks.on_error, self.handle
            )
            for statuses, callback in self._handle_callbacks:
                if status in statuses:
                    await call_observer(callback, self.handle)
            if self._on_end is not None:
                await self._on_end(self)
        return True

    async def _record_end(self, status: TurnStatus, *, result: str | None, error: str | None, code: str | None) -> None:
        reason = self.cancel_reason if status is TurnStatus.CANCELLED else error
        for call in list(self._open_calls.values()):
            await self.append(
                ToolResultItem(
                    name=call.name,
                    call_id=call.call_id,
                    output=f"[{status}] The turn ended before this tool returned: {reason or status}.",
                    is_error=True,
                    synthetic=True,
                    parent_id=call.id,
                ),
                closing=True,
            )
        if status in (TurnStatus.FAILED, TurnStatus.INTERRUPTED) and error:
            await self.append(ErrorItem(message=error, code=code), closing=True)
        if status is TurnStatus.CANCELLED and self._hook_error:
            await self.append(ErrorItem(message=self._hook_error, code="cancel_hook_failed"), closing=True)
        data: dict[str, Any] = {"turn_id": self.id}
        if status is TurnStatus.CANCELLED:
            data["reason"] = self.cancel_reason
        if result is not None:
            data["result"] = result
        if error is not None:
            data["error"] = error
        await self.append(EventItem(kind=f"turn-{status}", data=data), closing=True, status="idle")
        await anyio.to_thread.run_sync(self.store.flush, self.session_id)

    def on(self, statuses: frozenset[TurnStatus], callback: HandleCallback) -> None:
        if self.done:
            if self.status in statuses:
                outcome = callback(self.handle)
                if inspect.iscoroutine(outcome):
                    outcome.close()
                    raise TypeError("the turn has ended: register a plain function, not a coroutine function")
            return
        self._handle_callbacks.append((statuses, callback))

    async def wait(self, timeout: float | None) -> None:
        with anyio.fail_after(timeout):
            await self._done.wait()


class _TurnView:
    """A view of one turn: its id and session."""

    def __init__(self, turn: Turn) -> None:
        self._turn = turn

    @property
    def id(self) -> str:
        return self._turn.id

    @property
    def session_id(self) -> str:
        return self._turn.session_id


class TurnHandle(_TurnView):
    """What `run_turn` returns at once: status, result or error, `wait`, `cancel`, and completion callbacks."""

    @property
    def agent_id(self) -> str:
        return self._turn.agent_id

    @property
    def status(self) -> TurnStatus:
        return self._turn.status

    @property
    def result(self) -> str | None:
        return self._turn.result

    @property
    def error(self) -> str | None:
        return self._turn.error

    @property
    def running(self) -> bool:
        return not self._turn.done

    async def wait(self, timeout: float | None = None) -> TurnHandle:
        """Wait for the end; raises TimeoutError after `timeout` seconds (the turn keeps running)."""
        await self._turn.wait(timeout)
        return self

    async def cancel(self, reason: str = "cancelled by the caller") -> bool:
        """Cancel and wait for the turn to end; False if it had already ended or was being cancelled."""
        return await self._turn.cancel(reason)

    def on_complete(self, callback: HandleCallback) -> None:
        self._turn.on(frozenset({TurnStatus.COMPLETED}), callback)

    def on_error(self, callback: HandleCallback) -> None:
        """Called when the turn fails, is cancelled or is interrupted."""
        self._turn.on(frozenset({TurnStatus.FAILED, TurnStatus.CANCELLED, TurnStatus.INTERRUPTED}), callback)

    def __repr__(self) -> str:
        return f"<TurnHandle {self.id} session={self.session_id} {self.status}>"


class TurnController(_TurnView):
    """What an agent gets as `ctx.turn`: report items, register cancellation, and end the turn."""

    @property
    def cancelled(self) -> bool:
        """Cooperative check for agents that poll: cancellation has been requested."""
        return self._turn.cancel_reason is not None

    async def append_item(self, item: Item, *, grant: str | None = None) -> Item:
        """Persist an item (parent defaults to the turn's previous item) and emit `on_item`; `grant` (a decision's)
        is added to the session's grants in the same write."""
        return await self._turn.append(item, grant=grant)

    async def update_item(self, item_id: str, *, persist: bool = True, **changes: Any) -> Item:
        """Change an item; `persist=False` for streaming partials (memory and `on_partial` only)."""
        return await self._turn.update(item_id, changes, persist=persist)

    def set_cancel(self, hook: CancelHook) -> None:
        """Register the provider-specific abort (sync or async); it replaces an earlier one and runs at most once."""
        self._turn.set_cancel(hook)

    async def finish(self, result: str | None = None) -> None:
        if self._turn.cancel_reason is not None or not await self._turn.end(TurnStatus.COMPLETED, result=result):
            raise TurnClosed(f"turn {self._turn.id} had already ended ({self._turn.status}) or is being cancelled")

    async def fail(self, error: str | BaseException, *, code: str | None = None) -> None:
        message = describe(error) if isinstance(error, BaseException) else error
        if code is None and isinstance(error, BaseException):
            code = type(error).__name__
        if not await self._turn.end(TurnStatus.FAILED, error=message, code=code):
            raise TurnClosed(f"turn {self._turn.id} had already ended ({self._turn.status})")

    async def interrupted(self, reason: str) -> None:
        """End the turn interrupted: its work stopped unfinished (the node or worker doing it died); `reason` is
        recorded as an error coded `interrupted`."""
        if not await self._turn.end(TurnStatus.INTERRUPTED, error=reason, code=str(TurnStatus.INTERRUPTED)):
            raise TurnClosed(f"turn {self._turn.id} had already ended ({self._turn.status})")
