"""Loopback serving primitives shared by the bridge, the agent's endpoints and the scripted model server:
host checks, the listening socket, the Host/Origin/token guard, and
`LoopbackServer`, which serves one ASGI app with uvicorn inside the caller's asyncio event loop and leaves
signals to the embedding application."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import secrets
import socket
import threading
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import anyio
import h11
import uvicorn
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def bind_loopback(host: str, port: int) -> socket.socket:
    """A listening, non-blocking socket (port 0: a free one, read it with getsockname). Raises OSError.

    proto must say TCP: asyncio turns Nagle off (TCP_NODELAY) only on sockets that do, and with Nagle on
    every response after the first on a keep-alive connection waits ~40 ms for a delayed ACK.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class QuietUvicorn(uvicorn.Server):
    """Leaves SIGINT/SIGTERM to the embedding application (uvicorn would take them over and re-raise them)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


REQUEST_TIMEOUT = 30.0  # seconds for a request to arrive whole; a local client sends one in milliseconds
MAX_CONNECTIONS = 256  # open connections, well below the usual 1,024 file descriptors
# Seconds an idle keep-alive connection stays open: longer than any client keeps one idle (httpx 5 s, Node's
# fetch 4 s, aiohttp 15 s, reqwest 90 s), so the client always closes first. A server that closes at the same
# moment a client reuses the connection makes that request fail (a ReadError in httpx). Idle connections still
# make room when the slots are full, so a long keep-alive holds nothing another client needs.
KEEP_ALIVE_TIMEOUT = 120
ACCEPT_BATCH = 64  # connections accepted per turn of the event loop (and the kernel's accept queue)


class CoalescedWrites:
    """A connection's transport whose writes made in one turn of the event loop leave in one send.

    uvicorn writes a response's head and its body separately; on loopback every send wakes the client, which then
    reads the head alone and waits again for the body. Joined, a response costs one send and one wake-up. Data
    written in a turn leaves at the start of the next one, and before the connection is closed; a write of
    `JOIN_LIMIT` bytes or more leaves at once, after what is pending (joining it would copy it)."""

    JOIN_LIMIT = 64 * 1024

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if len(data) >= self.JOIN_LIMIT:
            self.flush()
            self.transport.write(data)
            return
        if not self.pending:
            self.loop.call_soon(self.flush)
        self.pending.append(bytes(data))

    def flush(self) -> None:
        if self.pending:
            data = self.pending[0] if len(self.pending) == 1 else b"".join(self.pending)
            self.pending.clear()
            if not self.transport.is_closing():
                self.transport.write(data)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def abort(self) -> None:
        self.pending.clear()
        self.transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def coalesce_writes(transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> asyncio.Transport:
    return cast(asyncio.Transport, CoalescedWrites(transport, loop))


def bounded_protocol(request_timeout: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol with a deadline for each request to arrive whole (headers and body), counted
    from the connection or from the request's first byte, and room kept for a client with a request.

    Without the deadline a client that connects and sends nothing, or trickles a request byte by byte, holds one
    of the connection slots for ever (uvicorn times out only idle keep-alive connections). Without the room a
    few hundred such sockets make uvicorn answer 503 to everyone, and a thousand take every file descriptor:
    so once `max_connections` are open, a new connection closes the one that has waited longest without a
    request in flight (never-used ones before kept-alive ones). A new connection is closed that way only after
    `max_connections` newer ones, and at most `ACCEPT_BATCH` are accepted per turn of the event loop, so the
    request of one that sends it at once (any real client) arrives first. A request that has arrived runs, and
    streams, as long as it likes.
    """

    class Bounded(H11Protocol):
        # connections without a request in flight, longest waiting first: none yet, or kept alive after one
        fresh: ClassVar[dict[Bounded, None]] = {}
        kept: ClassVar[dict[Bounded, None]] = {}
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(coalesce_writes(transport, self.loop))
            self._make_room()
            self.fresh[self] = None
            self._watch()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.cycle is not None and not self.cycle.response_complete:
                self._not_waiting()
            self._watch()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.kept[self] = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            self._not_waiting()
            super().connection_lost(exc)

        def _make_room(self) -> None:
            """uvicorn answers 503 once `max_connections` are open: close waiting ones, longest waiting first."""
            while len(self.connections) >= max_connections and (self.fresh or self.kept):
                oldest = next(iter(self.fresh or self.kept))
                oldest._not_waiting()
                self.connections.discard(oldest)
                oldest.transport.close()

        def _not_waiting(self) -> None:
            self.fresh.pop(self, None)
            self.kept.pop(self, None)

        def _arriving(self) -> bool:
            return self.conn.their_state in (h11.IDLE, h11.SEND_BODY)

        def _watch(self) -> None:
            if not self._arriving():
                self._cancel()
            elif self._deadline is None:
                self._deadline = self.loop.call_later(request_timeout, self._expired)

        def _cancel(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self._arriving() and not self.transport.is_closing():
                self.transport.close()

    return Bounded


class LoopbackServer:
    """One ASGI app served by uvicorn on a loopback port, as a task of the caller's asyncio event loop.

    `bind()` first when the app needs its port (e.g. for a Host allow-list), then `start(app)`; `stop()` may
    run in another task of the same loop. Failures are raised as `error`, the caller's own exception type.
    `max_connections` open connections or running requests (503 beyond it; an idle connection makes room for a
    new one), `timeout_keep_alive` seconds for an idle keep-alive connection and `request_timeout` seconds for a
    request to arrive whole bound what one client can hold.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        shutdown_timeout: int = 1,
        max_connections: int = MAX_CONNECTIONS,
        timeout_keep_alive: int = KEEP_ALIVE_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
        error: type[Exception] = RuntimeError,
    ) -> None:
        self.error = error
        if not is_loopback(host):
            raise error(f"refusing to serve on {host!r}: serving on loopback only (127.0.0.1, ::1 or localhost)")
        self.host = "127.0.0.1" if host == "localhost" else host
        self.requested_port = port
        self.shutdown_timeout = shutdown_timeout
        self.max_connections = max_connections
        self.timeout_keep_alive = timeout_keep_alive
        self.request_timeout = request_timeout
        self.port: int | None = None
        self._sock: socket.socket | None = None
        self._server: QuietUvicorn | None = None
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None  # start_on_own_loop: the thread and what ends it
        self._stopping: threading.Event | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise self.error("the server is not started")
        return f"http://{url_host(self.host)}:{self.port}"

    def bind(self) -> int:
        """Bind the listening socket now and return its port (idempotent)."""
        if self._sock is None and self._task is None:
            try:
                self._sock = bind_loopback(self.host, self.requested_port)
            except OSError as exc:
                where = f"{url_host(self.host)}:{self.requested_port}"
                raise self.error(f"cannot listen on {where}: {exc.strerror}") from exc
            self.port = self._sock.getsockname()[1]
        assert self.port is not None
        return self.port

    async def start(self, app: ASGIApp) -> None:
        """Serve `app`; returns once requests are accepted, or raises `error` (the socket is closed then)."""
        if self._task is not None:
            return
        self.bind()
        sock, self._sock = self._sock, None
        assert sock is not None
        server = self._server = QuietUvicorn(
            uvicorn.Config(
                app,
                log_config=None,
                log_level="warning",
                access_log=False,
                lifespan="on",
                ws="none",
                http=bounded_protocol(self.request_timeout, self.max_connections),
                timeout_graceful_shutdown=self.shutdown_timeout,
                limit_concurrency=self.max_connections,
                backlog=ACCEPT_BATCH,
                timeout_keep_alive=self.timeout_keep_alive,
            )
        )
        task = self._task = asyncio.get_running_loop().create_task(self._serve(server, sock))
        while not server.started:
            if task.done():
                failure = await self.stop()
                raise self.error(f"the HTTP server failed to start: {failure or 'it stopped first'}") from failure
            await asyncio.sleep(0.005)

    async def start_on_own_loop(self, app: ASGIApp, name: str) -> None:
        """Serve `app` from an event loop of its own on a thread named `name`, like `start` otherwise: its requests
        do not queue behind the work of the caller's loop. `unit-mcp serve --app-port` serves the application so:
        the MCP calls that change its units run on the caller's loop, and a request that arrived meanwhile no longer
        waits for them (p99 in the second after a change: 1.13-1.20x the quiet p99 on one loop, 0.89-0.98 so).
        `stop()` from the caller's loop stops it and joins the thread."""
        if self._thread is not None or self._task is not None:
            return
        caller = asyncio.get_running_loop()
        started: asyncio.Future[None] = caller.create_future()
        stopping = self._stopping = threading.Event()

        def report(failure: BaseException | None) -> None:
            if started.done():
                return
            if failure is None:
                started.set_result(None)
            else:
                started.set_exception(failure)

        async def serve() -> None:
            try:
                await self.start(app)
            except BaseException as exc:
                caller.call_soon_threadsafe(report, exc)
                return
            caller.call_soon_threadsafe(report, None)
            try:
                await asyncio.get_running_loop().run_in_executor(None, stopping.wait)
            finally:
                await self.stop()

        self._thread = threading.Thread(target=asyncio.run, args=(serve(),), name=name, daemon=True)
        self._thread.start()
        try:
            await started
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> BaseException | None:
        """Stop serving (open streams get `shutdown_timeout` seconds); what the server failed with, if anything."""
        thread = self._thread
        if thread is not None and threading.current_thread() is not thread:
            self._thread = None
            if self._stopping is not None:
                self._stopping.set()
            with anyio.CancelScope(shield=True):  # a cancelled caller still waits the few moments uvicorn takes
                await asyncio.to_thread(thread.join)
            return None
        task, server = self._task, self._server
        self._task = self._server = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.port = None
        if task is None or server is None:
            return None
        server.should_exit = True
        with anyio.CancelScope(shield=True):  # a cancelled caller still waits the few moments uvicorn takes
            await asyncio.wait([task])
        return None if task.cancelled() else task.exception()

    async def _serve(self, server: QuietUvicorn, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process when the app's lifespan startup fails
            raise self.error("lifespan startup failed") from exc
        finally:
            sock.close()


def security_settings(host: str, port: int) -> TransportSecuritySettings:
    """Only loopback names on our own port for Host; any loopback origin (e.g. a local Inspector web page)."""
    names = {"127.0.0.1", "localhost", "[::1]", url_host(host)}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(f"{name}:{port}" for name in names),
        allowed_origins=sorted(f"http://{name}:*" for name in names),
    )


class Guard:
    """Refuses DNS-rebinding requests (bad Host 421, bad Origin 403), then requests without the bearer token
    (401), before the MCP transports see them."""

    def __init__(self, app: ASGIApp, *, security: TransportSecuritySettings, token: str | None) -> None:
        self.app = app
        self.security = TransportSecurityMiddleware(security)
        self.expected = f"Bearer {token}".encode() if token is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = await self.security.validate_request(Request(scope), is_post=False)
        if refusal is None and self.expected is not None and not self._authorized(Headers(scope=scope)):
            refusal = PlainTextResponse(
                "Unauthorized: send the bearer token printed by the server.",
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="unit-mcp"'},
            )
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, headers: Headers) -> bool:
        assert self.expected is not None
        given = headers.get("authorization", "")
        scheme, _, credentials = given.partition(" ")
        candidate = f"Bearer {credentials.strip()}".encode() if scheme.lower() == "bearer" else b""
        return secrets.compare_digest(candidate, self.expected)
