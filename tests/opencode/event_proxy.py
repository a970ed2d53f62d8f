"""EventProxy: a loopback TCP proxy in front of a real node that can break only its `/event` streams.

Every byte goes to the real `opencode serve` and back; the proxy only decides what happens to a
connection once a request on it starts with `GET /event`: pass it, refuse it (`block`: the connection is
closed at once), or `freeze` it (kept open, nothing more delivered: a stream that went silent). `cut()`
closes the event connections open now; `refuse` (a predicate on a request's first bytes) closes the
connection of any other request it picks, and `hold` (a predicate too) delays the answer to each request
it picks until `release()` returns (the node has done the work; its answer comes late, as under load).
This is how the client's reconnect, polling fallback and read-back failures are tested against the real
node, not against an imitation of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Literal

import anyio
import anyio.abc
from anyio.abc import SocketStream

Mode = Literal["pass", "block", "freeze"]


class EventProxy:
    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.mode: Mode = "pass"
        self.refuse: Callable[[bytes], bool] | None = None
        self.hold: Callable[[bytes], bool] | None = None
        self.release: Callable[[], Awaitable[None]] | None = None
        self.held = 0
        self._holding: set[SocketStream] = set()  # connections whose next answer is held
        self.event_connections = 0
        self.refused = 0
        self._events: set[SocketStream] = set()
        self._stack: AsyncExitStack | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> EventProxy:
        stack = AsyncExitStack()
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = int(listener.extra(anyio.abc.SocketAttribute.local_port))
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        tg.start_soon(listener.serve, self._handle)
        self._stack = stack
        return self

    async def __aexit__(self, *exc: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    async def cut(self) -> None:
        """Close every event stream open through the proxy now."""
        for client in list(self._events):
            await client.aclose()

    async def _handle(self, client: SocketStream) -> None:
        async with client:
            try:
                upstream = await anyio.connect_tcp(self.target_host, self.target_port)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._pump_up, client, upstream, tg.cancel_scope)
                tg.start_soon(self._pump_down, upstream, client, tg.cancel_scope)
        self._events.discard(client)

    async def _pump_up(self, client: SocketStream, upstream: SocketStream, scope: anyio.CancelScope) -> None:
        try:
            async for chunk in client:
                if self.refuse is not None and self.refuse(chunk):
                    self.refused += 1
                    break
                if chunk.startswith(b"GET /event"):
                    self.event_connections += 1
                    if self.mode == "block":
                        self.refused += 1
                        break
                    self._events.add(client)
                elif self.hold is not None and self.hold(chunk):
                    self._holding.add(client)
                await upstream.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()

    async def _pump_down(self, upstream: SocketStream, client: SocketStream, scope: anyio.CancelScope) -> None:
        try:
            async for chunk in upstream:
                if client in self._events and self.mode == "freeze":
                    continue
                if client in self._holding:
                    self._holding.discard(client)
                    self.held += 1
                    if self.release is not None:
                        await self.release()
                await client.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel()
