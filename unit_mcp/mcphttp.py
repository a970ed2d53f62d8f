"""`McpHttpServer`: one low-level MCP server on loopback over Streamable HTTP (`/mcp`) and legacy SSE (`/sse`),
served by the bridge and by every agent endpoint alike.

Every request is checked before any MCP code runs (loopback `Host`/`Origin`, the per-run bearer token), and what
one client can hold is bounded (`Limits`), so a buggy or hostile client cannot starve the rest (docs/safety.md).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import secrets
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import pydantic_core
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.lowlevel import Server
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import REQUEST_CANCELLED, EventMessage, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.shared._stream_protocols import ReadStream, WriteStream
from mcp.shared.jsonrpc_dispatcher import cancelled_request_id_from_params, progress_token_from_params
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from mcp_types import ErrorData, JSONRPCError, JSONRPCResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .cancel import client_gone
from .loopback import KEEP_ALIVE_TIMEOUT, MAX_CONNECTIONS, REQUEST_TIMEOUT, Guard, LoopbackServer, security_settings
from .wire import MCP_PATH, MESSAGE_PATH, SSE_PATH

log = logging.getLogger("unit_mcp.mcphttp")


@dataclass(frozen=True)
class Limits:
    """What one client can hold: `max_body_bytes` per request body (413), `max_streams` open event streams
    (503), `max_sessions` Streamable HTTP sessions (503; one idle for `session_idle_timeout` seconds is closed),
    `max_connections` open connections or running requests (503; an idle connection is closed to make room for a
    new one), `keep_alive_timeout` seconds before an idle
    keep-alive connection is closed, `request_timeout` seconds for a request to arrive whole."""

    max_body_bytes: int = 16 * 1024 * 1024  # above the service's 2 MB source limit, with room for JSON escaping
    max_streams: int = 64
    max_sessions: int = 512
    max_connections: int = MAX_CONNECTIONS
    keep_alive_timeout: int = KEEP_ALIVE_TIMEOUT
    session_idle_timeout: float = 30 * 60
    request_timeout: float = REQUEST_TIMEOUT


DEFAULT_LIMITS = Limits()


class _StreamLimit:
    """At most `limit` event streams (GET /sse, GET /mcp) open at once; the next one is refused with 503.

    An event stream lives as long as its client keeps it open, so without a bound a client that opens streams
    and never closes them would hold a task and a connection each until the connection limit refuses everyone.
    """

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        if self.open >= self.limit:
            refusal = PlainTextResponse(
                f"Too many open event streams (the limit is {self.limit}); close one and retry.",
                status_code=503,
                headers={"Retry-After": "1"},
            )
            await refusal(scope, receive, send)
            return
        self.open += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.open -= 1


_json_reply: ContextVar[bool] = ContextVar("unit_mcp_json_reply", default=False)
"""Set while a POST that asked for no progress is served, and so in the context its handler runs in (the SDK's
dispatcher runs a request's handler in a copy of the context that posted it)."""


def wants_progress(body: bytes) -> bool:
    """Whether a posted JSON-RPC message carries `params._meta.progressToken` (as the SDK reads it).

    A JSON key can spell `progressToken` only with those bytes or with `\\u` escapes, so a body with neither
    is decided without parsing it; anything unparsable is the SDK's to refuse."""
    if b"progressToken" not in body and b"\\u" not in body:
        return False
    try:
        message = pydantic_core.from_json(body)
    except ValueError:
        return False
    params = message.get("params") if isinstance(message, dict) else None
    return isinstance(params, dict) and progress_token_from_params(params) is not None


async def _disconnected(receive: Receive) -> None:
    """Returns once the POST's connection dropped (or its answer went out: then nothing waits on it any more)."""
    while (await receive()).get("type") != "http.disconnect":
        pass


class _PerRequestTransport(StreamableHTTPServerTransport):
    """The SDK's handshake-era transport, in JSON-response mode for each POST that asks for no progress and in
    SSE mode for the others.

    The SDK sets `json_response` per session manager, and in JSON mode drops every request-scoped notification,
    so `unit_run_tests` could not stream progress; but it reads the flag only while serving a POST (in that
    request's task) and when routing a request-scoped message. Here the flag is the POST's own `_json_reply`;
    Accept is checked as for SSE either way (clients must accept both), and a request-scoped message sent while
    handling a JSON-mode request is dropped where the server writes it, as the SDK's JSON mode does, so it
    cannot take the response's place. tests/test_mcphttp.py pins the SDK behaviour this relies on.
    """

    @property
    def is_json_response_enabled(self) -> bool:
        return _json_reply.get()

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, value: bool) -> None:
        if value:
            raise ValueError("JSON responses are chosen per request here")

    async def _validate_accept_header(self, request: Request, scope: Scope, send: Send) -> bool:
        mode = _json_reply.set(False)
        try:
            return await super()._validate_accept_header(request, scope, send)
        finally:
            _json_reply.reset(mode)

    async def _handle_post_request(self, scope: Scope, request: Request, receive: Receive, send: Send) -> None:
        body = await request.body()  # Starlette keeps the body for the SDK
        if b"notifications/cancelled" in body:
            self._answer_cancelled(body)
        mode = _json_reply.set(not wants_progress(body))
        gone = client_gone.set(functools.partial(_disconnected, receive))
        try:
            await super()._handle_post_request(scope, request, receive, send)
        finally:
            client_gone.reset(gone)
            _json_reply.reset(mode)

    def _answer_cancelled(self, body: bytes) -> None:
        """The client cancelled a request that waits for one JSON body: answer it now with the `REQUEST_CANCELLED`
        error the SDK sends once the handler has settled (on a stream that error would end it). Left open until
        then, the POST could be answered while the client is closing, and the SDK 2.3 client raises on a JSON
        answer it can no longer deliver; the SDK's own answer, when it comes, finds no request and is dropped."""
        try:
            message = pydantic_core.from_json(body)
        except ValueError:
            return
        params = message.get("params") if isinstance(message, dict) else None
        request_id = cancelled_request_id_from_params(params) if isinstance(params, dict) else None
        key = str(request_id)
        if request_id is None or key not in self._request_streams or key in self._sse_stream_writers:
            return
        error = ErrorData(code=REQUEST_CANCELLED, message="Request cancelled")
        with contextlib.suppress(anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._request_streams[key][0].send_nowait(
                EventMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error))
            )

    @asynccontextmanager
    async def connect(
        self,
    ) -> AsyncGenerator[tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]]:
        async with super().connect() as (read_stream, write_stream):
            yield read_stream, _JsonModeDrop(write_stream)


class _JsonModeDrop:
    """The server's write stream, dropping a request-scoped notification or request sent while handling a
    JSON-mode request: a JSON body carries only the response."""

    def __init__(self, inner: WriteStream[SessionMessage]) -> None:
        self.inner = inner

    async def send(self, item: SessionMessage, /) -> None:
        metadata = item.metadata
        if (
            _json_reply.get()
            and isinstance(metadata, ServerMessageMetadata)
            and metadata.related_request_id is not None
            and not isinstance(item.message, JSONRPCResponse | JSONRPCError)
        ):
            log.debug("dropped a message for request %s: its answer is one JSON body", metadata.related_request_id)
            return
        await self.inner.send(item)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _JsonModeDrop:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None


class _SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, opening each handshake-era session on a `_PerRequestTransport` (2026-era
    requests already get a JSON body when their handler sends no notification).

    The SDK builds and registers the session's transport (it takes no transport class); it is given the subclass,
    which adds no state of its own, before it serves anything."""

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        transport = super()._admit_session(requestor)
        if transport is not None:
            transport.__class__ = _PerRequestTransport
        return transport


class _SseEndpoint:
    """GET /sse: one legacy SSE connection served by the MCP server until the client goes away."""

    def __init__(self, server: Server[Any], transport: SseServerTransport) -> None:
        self.server = server
        self.transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.transport.connect_sse(scope, receive, send) as (read_stream, write_stream):
            await self.server.run(read_stream, write_stream, self.server.create_initialization_options())


class McpHttpServer:
    """Serves one `mcp.server.Server` on a loopback port, inside the caller's asyncio event loop.

    `bind()` takes the port and a fresh bearer token (when `auth`), so a caller can write them down before
    serving; `start(server)` serves (a session manager runs once, so give a fresh server on every start);
    `stop()` stops, giving open streams `shutdown_timeout` seconds. Failures are raised as `error`.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        auth: bool = True,
        limits: Limits = DEFAULT_LIMITS,
        shutdown_timeout: int = 1,
        error: type[Exception] = RuntimeError,
        pages: Mapping[str, ASGIApp] | None = None,
    ) -> None:
        """`pages` are web pages mounted beside the MCP endpoints (path prefix -> app): behind the same Host/Origin
        guard and caps, without the bearer token (a page checks its own browser credential)."""
        self.auth = auth
        self.limits = limits
        self.pages = dict(pages or {})
        self._loopback = LoopbackServer(
            host=host,
            port=port,
            shutdown_timeout=shutdown_timeout,
            max_connections=limits.max_connections,
            timeout_keep_alive=limits.keep_alive_timeout,
            request_timeout=limits.request_timeout,
            error=error,
        )
        self.host = self._loopback.host
        self.token: str | None = None

    @property
    def port(self) -> int | None:
        return self._loopback.port

    @property
    def base_url(self) -> str | None:
        return None if self.port is None else self._loopback.base_url

    @property
    def url(self) -> str | None:
        return None if self.port is None else f"{self._loopback.base_url}{MCP_PATH}"

    @property
    def sse_url(self) -> str | None:
        return None if self.port is None else f"{self._loopback.base_url}{SSE_PATH}"

    def bind(self) -> int:
        """Bind the listening socket (idempotent) and draw the run's token; returns the port."""
        port = self._loopback.bind()
        if self.auth and self.token is None:
            self.token = secrets.token_urlsafe(32)
        return port

    async def start(self, server: Server[Any]) -> None:
        """Serve `server`; returns once requests are accepted, or raises `error` (nothing is left listening)."""
        try:
            await self._loopback.start(self._app(server, self.bind()))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop serving; the next `bind()` draws a new port (if it was 0) and a new token."""
        self.token = None
        failure = await self._loopback.stop()
        if failure is not None:
            log.error("the MCP HTTP server failed", exc_info=failure)

    def _app(self, server: Server[Any], port: int) -> Starlette:
        security = security_settings(self.host, port)
        limits = self.limits
        manager = _SessionManager(
            app=server,
            security_settings=security,
            max_request_body_size=limits.max_body_bytes,
            max_sessions=limits.max_sessions,
            session_idle_timeout=limits.session_idle_timeout,
        )
        sse = SseServerTransport(MESSAGE_PATH, security_settings=security, max_request_body_size=limits.max_body_bytes)
        mcp = Starlette(
            routes=[
                Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(manager)),
                Route(SSE_PATH, endpoint=_SseEndpoint(server, sse), methods=["GET"]),
                Mount(MESSAGE_PATH, app=sse.handle_post_message),
            ],
            middleware=[
                Middleware(Guard, security=security, token=self.token),
                Middleware(_StreamLimit, limit=limits.max_streams),
            ],
        )
        pages = [Mount(path, app=Guard(page, security=security, token=None)) for path, page in self.pages.items()]
        return Starlette(routes=[*pages, Mount("", app=mcp)], lifespan=lambda app: manager.run())
