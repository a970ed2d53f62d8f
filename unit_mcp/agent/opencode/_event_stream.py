"""EventStream: the one persistent `GET /event` SSE stream of an OpenCode node, shared by every caller.

It keeps a status cache per session, wakes idle waiters and fans events out; a stream silent past
`heartbeat_timeout` is reopened, and while it is down the statuses waited for are polled. A waiter accepts
`idle` only after evidence that the session worked since its `since` mark.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._errors import NodeUnavailable

log = logging.getLogger("unit_mcp.agent.opencode.events")

Poll = Callable[[], Awaitable[dict[str, str]]]
_ACTIVITY = {"message.updated", "message.part.updated", "message.part.delta", "session.error", "permission.asked"}


@dataclass(frozen=True)
class NodeEvent:
    """One event from the node: `type` and `properties` as OpenCode sent them, `seq` in arrival order."""

    seq: int
    type: str
    properties: dict[str, Any]

    @property
    def session_id(self) -> str | None:
        value = self.properties.get("sessionID")
        if value is None and isinstance(self.properties.get("info"), dict):
            value = self.properties["info"].get("sessionID")
        return value if isinstance(value, str) else None


@dataclass
class _Waiter:
    session_id: str
    since: int
    started: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    via: str | None = None
    error: BaseException | None = None


class _Listener:
    def __init__(self, session_id: str | None, send: MemoryObjectSendStream[NodeEvent]) -> None:
        self.session_id = session_id
        self.send = send
        self.dropped = 0


class EventStream:
    def __init__(
        self,
        http: httpx.AsyncClient,
        poll: Poll,
        *,
        path: str = "/event",
        heartbeat_timeout: float = 15.0,
        reconnect_delay: float = 0.25,
        max_reconnect_delay: float = 2.0,
        poll_interval: float = 1.0,
        connect_timeout: float = 5.0,
    ) -> None:
        self.http = http
        self.poll = poll
        self.path = path
        self.heartbeat_timeout = heartbeat_timeout
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.poll_interval = poll_interval
        self.connect_timeout = connect_timeout
        self.seq = 0
        self.connects = 0
        self.last_error: str | None = None
        self._statuses: dict[str, str] = {}
        self._idle_seq: dict[str, int] = {}
        self._activity_seq: dict[str, int] = {}
        self._busy_seq: dict[str, int] = {}  # the last busy (or retry) status event per session
        self._waiters: list[_Waiter] = []
        self._listeners: list[_Listener] = []
        self._connected = anyio.Event()
        self._disconnected = anyio.Event()
        self._disconnected.set()
        self._closed = False

    # -- state ------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def status(self, session_id: str) -> str:
        """The cached status (`idle` when the node has said nothing about the session): no network."""
        return self._statuses.get(session_id, "idle")

    def mark_busy(self, session_id: str, since: int) -> None:
        """Optimistic busy right after a prompt sent at the event mark `since` is accepted, before the node's first
        event arrives; not when the stream already saw the session take the prompt up and end it after the mark (a
        quick reply can end before the prompt's own answer comes back): busy then would never be cleared."""
        idle_at, busy_at = self._idle_seq.get(session_id, 0), self._busy_seq.get(session_id, 0)
        if not since < busy_at < idle_at:
            self._statuses[session_id] = "busy"

    async def wait_connected(self, timeout: float) -> bool:
        with anyio.move_on_after(timeout):
            await self._connected.wait()
        return self.connected

    # -- waiting ----------------------------------------------------------------------------------

    async def wait_idle(self, session_id: str, *, since: int, timeout: float, started: bool = False) -> str:
        """Wait until the session is idle after the `since` mark; returns how that was learnt (`event` or
        `poll`). `started` says the caller already knows the session took up its prompt (so any idle after
        the mark counts). Raises TimeoutError naming the stream's state, or NodeUnavailable when closed."""
        if self._closed:
            raise NodeUnavailable("the OpenCode client is closed")
        idle_at, active_at = self._idle_seq.get(session_id, 0), self._activity_seq.get(session_id, 0)
        if idle_at > since and (started or since < active_at < idle_at):
            return "event"
        waiter = _Waiter(session_id, since, started=started or active_at > since)
        self._waiters.append(waiter)
        try:
            with anyio.fail_after(timeout):
                await waiter.done.wait()
        except TimeoutError:
            state = "connected" if self.connected else f"disconnected ({self.last_error or 'not yet connected'})"
            raise TimeoutError(
                f"OpenCode session {session_id} did not become idle within {timeout:.0f} s "
                f"(status {self.status(session_id)!r}, event stream {state})"
            ) from None
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        if waiter.error is not None:
            raise waiter.error
        return waiter.via or "event"

    # -- listening --------------------------------------------------------------------------------

    @asynccontextmanager
    async def listen(
        self, session_id: str | None = None, *, buffer: int = 1000
    ) -> AsyncIterator[MemoryObjectReceiveStream[NodeEvent]]:
        """Events of one session (or all), buffered; a listener that falls `buffer` events behind loses
        the newest ones (counted and logged) rather than slowing the shared stream down."""
        send, receive = anyio.create_memory_object_stream[NodeEvent](buffer)
        listener = _Listener(session_id, send)
        self._listeners.append(listener)
        try:
            async with receive:
                yield receive
        finally:
            self._listeners.remove(listener)
            send.close()
            if listener.dropped:
                log.warning("an event listener of OpenCode session %s dropped %d events", session_id, listener.dropped)

    # -- running ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the stream open until cancelled; poll while it is down. Runs in the client's task group."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._poll_while_down)
            delay = self.reconnect_delay
            while not self._closed:
                try:
                    await self._read_stream()
                    self.last_error = "the node closed the event stream"
                    delay = self.reconnect_delay
                except (httpx.HTTPError, OSError, ValueError) as exc:
                    self.last_error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    delay = self.reconnect_delay if self.connected else min(delay * 2, self.max_reconnect_delay)
                finally:
                    self._set_connected(False)
                log.debug("event stream %s: %s; reconnecting in %.2f s", self.path, self.last_error, delay)
                await anyio.sleep(delay)

    def close(self, reason: str = "the OpenCode client is closed") -> None:
        """Reject every waiter and end every listener; the caller cancels `run`."""
        self._closed = True
        for waiter in list(self._waiters):
            waiter.error = NodeUnavailable(reason)
            waiter.done.set()
        for listener in list(self._listeners):
            listener.send.close()

    async def _read_stream(self) -> None:
        # The read timeout bounds the wait for the headers and then every silence between chunks: the
        # node's heartbeat comes every 10 s, so a longer silence means the stream is dead.
        timeout = httpx.Timeout(self.connect_timeout, read=self.heartbeat_timeout)
        async with self.http.stream("GET", self.path, timeout=timeout) as response:
            if response.status_code != 200:
                await response.aread()
                raise httpx.HTTPStatusError(
                    f"GET {self.path} answered {response.status_code}: {response.text[:200]}",
                    request=response.request,
                    response=response,
                )
            self.connects += 1
            self._set_connected(True)
            if self.connects > 1:
                await self._refresh("reconnect")
            data: list[str] = []
            async for line in response.aiter_lines():
                if line == "":
                    if data:
                        self._dispatch("\n".join(data))
                        data = []
                elif line.startswith("data:"):
                    data.append(line[5:].removeprefix(" "))

    def _set_connected(self, connected: bool) -> None:
        if connected and not self._connected.is_set():
            self._connected.set()
            self._disconnected = anyio.Event()
        elif not connected and self._connected.is_set():
            self._connected = anyio.Event()
            self._disconnected.set()

    def _dispatch(self, data: str) -> None:
        try:
            payload = json.loads(data)
        except ValueError:
            log.debug("ignoring a non-JSON event: %.200s", data)
            return
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            return
        properties = payload.get("properties")
        if not isinstance(properties, dict):
            data_field = payload.get("data")
            properties = data_field if isinstance(data_field, dict) else {}
        self.seq += 1
        event = NodeEvent(self.seq, payload["type"], properties)
        self._apply(event)
        for listener in list(self._listeners):
            if listener.session_id is not None and event.session_id != listener.session_id:
                continue
            try:
                listener.send.send_nowait(event)
            except anyio.WouldBlock:
                listener.dropped += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass

    def _apply(self, event: NodeEvent) -> None:
        session_id = event.session_id
        if session_id is None:
            return
        status: str | None = None
        if event.type == "session.status":
            raw = event.properties.get("status")
            status = raw.get("type") if isinstance(raw, dict) else None
        elif event.type == "session.idle":
            status = "idle"
        if status is not None:
            self._statuses[session_id] = status
        active = status in ("busy", "retry") or event.type in _ACTIVITY
        if active:
            self._activity_seq[session_id] = event.seq
        if status in ("busy", "retry"):
            self._busy_seq[session_id] = event.seq
        elif status == "idle":
            self._idle_seq[session_id] = event.seq
        for waiter in list(self._waiters):
            if waiter.session_id != session_id or event.seq <= waiter.since:
                continue
            if active:
                waiter.started = True
            elif status == "idle" and waiter.started:
                waiter.via = "event"
                waiter.done.set()

    async def _refresh(self, via: str) -> None:
        """Ask the node for the status of every session (absent means idle) and wake idle waiters."""
        try:
            statuses = await self.poll()
        except Exception as exc:
            log.debug("polling session status failed: %s", exc)
            return
        for session_id in set(self._statuses) | {w.session_id for w in self._waiters}:
            self._statuses[session_id] = statuses.get(session_id, "idle")
        for waiter in list(self._waiters):
            if self._statuses[waiter.session_id] == "idle":
                waiter.via = via
                waiter.done.set()

    async def _poll_while_down(self) -> None:
        """The polling fallback: while the stream is down and someone waits, poll every `poll_interval`."""
        while not self._closed:
            await self._disconnected.wait()
            await anyio.sleep(self.poll_interval)
            if not self.connected and self._waiters:
                await self._refresh("poll")
