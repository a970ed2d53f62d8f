"""Runner-wide events: one subscription across every session of a runner, for a UI or supervisor following live.

Publishing never waits (a slow subscriber loses its oldest events and reads a `gap`); the session journal stays
the record. The kinds and `events_app` are in docs/agent.md, "Runner events".
"""

from __future__ import annotations

import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal, Protocol

import anyio
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from starlette.applications import Starlette


EventKind = Literal[
    "turn-status",
    "agent-status",
    "text",
    "tool-call-started",
    "tool-call-finished",
    "approval-requested",
    "approval-answered",
    "gap",
]
AgentState = Literal["idle", "running", "disposed"]
TurnState = Literal["queued", "running", "waiting-for-approval", "completed", "failed", "cancelled", "disposed"]
DEFAULT_BUFFER = 1024


class RunnerEvent(BaseModel):
    """One event: `seq` counts every event the hub published (a subscriber sees gaps in it after a drop)."""

    seq: int
    kind: EventKind
    session_id: str | None = None
    turn_id: str | None = None
    data: dict[str, Any] = Field(default_factory=dict)
    at: float = Field(default_factory=time.time)


class Subscription:
    """A live view of the hub's events; iterate it (`async for event in sub`) and close it when done.

    It is subscribed when created, so nothing published after `runner.events()` returned is missed."""

    def __init__(self, hub: EventHub, buffer: int) -> None:
        if buffer < 1:
            raise ValueError("an event subscription needs a buffer of at least one event")
        self._hub = hub
        self._buffer: deque[RunnerEvent] = deque()
        self._limit = buffer
        self._wake = anyio.Event()
        self._closed = False
        self.dropped = 0  # events dropped since the last gap event was read
        self.dropped_total = 0

    def _offer(self, event: RunnerEvent) -> None:
        if len(self._buffer) >= self._limit:
            self._buffer.popleft()
            self.dropped += 1
            self.dropped_total += 1
        self._buffer.append(event)
        self._wake.set()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._hub._subscribers.discard(self)
            self._wake.set()

    @property
    def closed(self) -> bool:
        return self._closed

    def _take(self) -> RunnerEvent | None:
        if self.dropped:
            count, self.dropped = self.dropped, 0
            first = self._buffer[0].seq if self._buffer else None
            return RunnerEvent(seq=-1, kind="gap", data={"dropped": count, "resumes_at": first})
        return self._buffer.popleft() if self._buffer else None

    def ready(self) -> list[RunnerEvent]:
        """Every event buffered right now (a `gap` event first when some were dropped), without waiting."""
        events: list[RunnerEvent] = []
        while (event := self._take()) is not None:
            events.append(event)
        return events

    async def next(self) -> RunnerEvent:
        """The next event (a `gap` event first when some were dropped); raises StopAsyncIteration once closed."""
        while True:
            event = self._take()
            if event is not None:
                return event
            if self._closed:
                raise StopAsyncIteration
            self._wake = anyio.Event()
            await self._wake.wait()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> RunnerEvent:
        return await self.next()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class EventHub:
    """Fans events out to subscribers without ever waiting on one."""

    def __init__(self) -> None:
        self._subscribers: set[Subscription] = set()
        self._seq = itertools.count(1)

    def subscribe(self, buffer: int = DEFAULT_BUFFER) -> Subscription:
        subscription = Subscription(self, buffer)
        self._subscribers.add(subscription)
        return subscription

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def publish(
        self, kind: EventKind, *, session_id: str | None = None, turn_id: str | None = None, **data: Any
    ) -> RunnerEvent | None:
        if not self._subscribers:
            return None
        event = RunnerEvent(seq=next(self._seq), kind=kind, session_id=session_id, turn_id=turn_id, data=data)
        for subscription in list(self._subscribers):
            subscription._offer(event)
        return event

    def close(self) -> None:
        """End every subscription (their iteration stops after the buffered events)."""
        for subscription in list(self._subscribers):
            subscription.close()


class Publisher(Protocol):
    """What `events_app` needs of the runner: its event hub."""

    @property
    def event_hub(self) -> EventHub: ...


def events_app(runner: Publisher, *, path: str = "/events", buffer: int = DEFAULT_BUFFER) -> Starlette:
    """A Starlette app serving `runner.events()` as server-sent events at `path` (`event:` is the kind, `id:`
    the seq, `data:` the event as JSON); `?session_id=` narrows it to one session. Mount it behind the
    application's own guard (e.g. `loopback.Guard` with a bearer token)."""
    from sse_starlette import EventSourceResponse
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.routing import Route

    async def stream(request: Request) -> EventSourceResponse:
        only = request.query_params.get("session_id")
        subscription = runner.event_hub.subscribe(buffer)

        async def frames() -> AsyncIterator[dict[str, str]]:
            with subscription:
                yield {"event": "ready", "data": json.dumps({"subscribers": runner.event_hub.subscribers})}
                async for event in subscription:
                    if only is not None and event.session_id not in (None, only):
                        continue
                    yield {"event": event.kind, "id": str(event.seq), "data": event.model_dump_json()}

        return EventSourceResponse(frames(), ping=15)

    return Starlette(routes=[Route(path, endpoint=stream, methods=["GET"])])
