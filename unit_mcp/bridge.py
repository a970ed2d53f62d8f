"""The loopback bridge: one MCP server on 127.0.0.1 over Streamable HTTP and legacy SSE, plus an isolated
OpenCode config that points at it.

An application starts it inside its own process around its own host (`async with Bridge(server)` or
`await bridge.start()` / `await bridge.stop()`); `python -m unit_mcp.server` is a thin wrapper over it.
Every request is checked before any MCP code runs: a `Host` or `Origin` that is not loopback is refused
(DNS rebinding: 421 / 403) and, unless auth is off, so is a request without the per-run bearer token (401).

What one client can take is bounded, so a buggy or hostile one cannot starve the rest: request bodies (413),
open event streams (503), Streamable HTTP sessions (503, idle ones expire), open connections (uvicorn answers
503 beyond the limit), idle keep-alive connections (closed after a few seconds) and requests that do not arrive
whole in time (a silent or trickling client is disconnected after 30 s).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp.server import Server
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .loopback import (
    REQUEST_TIMEOUT,
    Guard,
    LoopbackServer,
    SseEndpoint,
    is_loopback,
    security_settings,
    url_host,
)
from .opencode_isolation import config_path, opencode_config, write_opencode_config

MCP_PATH = "/mcp"
SSE_PATH = "/sse"
MESSAGE_PATH = "/messages/"
MAX_BODY_BYTES = 16 * 1024 * 1024  # above the service's 2 MB source limit, with room for JSON escaping
MAX_STREAMS = 64
MAX_SESSIONS = 512
MAX_CONNECTIONS = 256
KEEP_ALIVE_TIMEOUT = 5
SESSION_IDLE_TIMEOUT = 30 * 60
_SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

log = logging.getLogger("unit_mcp.bridge")


class BridgeError(RuntimeError):
    """The bridge cannot start as asked: a non-loopback host, a port it cannot bind, a config it cannot write."""


@dataclass(frozen=True)
class BridgeStatus:
    started: bool
    host: str
    port: int | None
    url: str | None
    sse_url: str | None
    config_root: str | None
    config_path: str | None


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


def _user_opencode_dirs() -> set[Path]:
    homes = [Path.home() / ".config"]
    if os.environ.get("XDG_CONFIG_HOME"):
        homes.append(Path(os.environ["XDG_CONFIG_HOME"]))
    return {(home / "opencode").resolve() for home in homes}


class Bridge:
    """Serves one MCP server on loopback and writes `<config_root>/opencode/opencode.json` for it.

    `config_root` defaults to a fresh temporary folder removed at stop; a given folder is kept. The bearer
    token is new on every start. Start and stop are idempotent; call them from the same asyncio event loop
    (uvicorn runs on asyncio), e.g. `async with Bridge(tools.server()) as bridge: ...`.

    Bounds: `max_body_bytes` per request body (413), `max_streams` open event streams (503), `max_sessions`
    Streamable HTTP sessions (503; a session idle for `session_idle_timeout` seconds is closed),
    `max_connections` open connections or running requests (uvicorn answers 503 beyond it),
    `keep_alive_timeout` seconds before an idle keep-alive connection is closed and `request_timeout` seconds
    for a request to arrive whole (a silent or trickling client is disconnected).
    """

    def __init__(
        self,
        server: Server[Any],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        server_name: str = "unit-dev",
        config_root: str | os.PathLike[str] | None = None,
        auth: bool = True,
        shutdown_timeout: int = 1,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_streams: int = MAX_STREAMS,
        max_sessions: int = MAX_SESSIONS,
        max_connections: int = MAX_CONNECTIONS,
        keep_alive_timeout: int = KEEP_ALIVE_TIMEOUT,
        session_idle_timeout: float = SESSION_IDLE_TIMEOUT,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        if not is_loopback(host):
            raise BridgeError(
                f"refusing to serve on {host!r}: unit-mcp binds to loopback only (127.0.0.1, ::1 or localhost)"
            )
        if not _SERVER_NAME.fullmatch(server_name):
            raise BridgeError(f"server name {server_name!r} must be 1-64 of A-Z a-z 0-9 _ - (starting alphanumeric)")
        self.server = server
        self.host = "127.0.0.1" if host == "localhost" else host
        self.requested_port = port
        self.server_name = server_name
        self.auth = auth
        self.shutdown_timeout = shutdown_timeout
        self.max_body_bytes = max_body_bytes
        self.max_streams = max_streams
        self.max_sessions = max_sessions
        self.max_connections = max_connections
        self.keep_alive_timeout = keep_alive_timeout
        self.session_idle_timeout = session_idle_timeout
        self.request_timeout = request_timeout
        self._given_config_root = Path(config_root).resolve() if config_root is not None else None
        self._config_root: Path | None = None
        self._port: int | None = None
        self._token: str | None = None
        self._loopback: LoopbackServer | None = None

    # -- public surface -----------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        """The bearer token of the current run (None before start or with auth off)."""
        return self._token

    @property
    def url(self) -> str | None:
        return None if self._port is None else f"http://{url_host(self.host)}:{self._port}{MCP_PATH}"

    @property
    def sse_url(self) -> str | None:
        return None if self._port is None else f"http://{url_host(self.host)}:{self._port}{SSE_PATH}"

    @property
    def config_path(self) -> Path | None:
        return None if self._config_root is None else config_path(self._config_root)

    def status(self) -> BridgeStatus:
        return BridgeStatus(
            started=self._loopback is not None,
            host=self.host,
            port=self._port,
            url=self.url,
            sse_url=self.sse_url,
            config_root=str(self._config_root) if self._config_root is not None else None,
            config_path=str(self.config_path) if self.config_path is not None else None,
        )

    def opencode_env(self) -> dict[str, str]:
        """The environment an OpenCode process needs to use only this server: its own XDG_CONFIG_HOME."""
        if self._config_root is None:
            raise BridgeError("the bridge is not started")
        return {"XDG_CONFIG_HOME": str(self._config_root)}

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> BridgeStatus:
        """Bind, write the OpenCode config, serve; returns once requests are accepted. Fails loudly."""
        if self._loopback is not None:
            return self.status()
        if not self.auth:
            log.warning("authentication is off: any local process can call the unit tools on this server")
        loopback = LoopbackServer(
            host=self.host,
            port=self.requested_port,
            shutdown_timeout=self.shutdown_timeout,
            limit_concurrency=self.max_connections,
            timeout_keep_alive=self.keep_alive_timeout,
            request_timeout=self.request_timeout,
            error=BridgeError,
        )
        self._loopback = loopback  # taken at once: a second start() meanwhile returns instead of serving twice
        try:
            self._port = loopback.bind()
            self._token = secrets.token_urlsafe(32) if self.auth else None
            self._config_root = self._prepare_config_root()
            self._write_config()
            await loopback.start(self._app())
        except BaseException:
            self._loopback = None
            await loopback.stop()
            self._release()
            raise
        log.info("serving MCP on %s and %s", self.url, self.sse_url)
        return self.status()

    async def stop(self) -> None:
        """Stop serving (open streams get `shutdown_timeout` seconds), then remove a temporary config root."""
        loopback, self._loopback = self._loopback, None
        try:
            if loopback is not None:
                failure = await loopback.stop()
                if failure is not None:
                    log.error("the MCP HTTP server failed", exc_info=failure)
        finally:
            self._release()

    # -- internals ------------------------------------------------------------------------------

    def _prepare_config_root(self) -> Path:
        if self._given_config_root is None:
            return Path(tempfile.mkdtemp(prefix="unit-mcp-opencode-"))
        root = self._given_config_root
        if (root / "opencode").resolve() in _user_opencode_dirs():
            raise BridgeError(f"{root} is the user's own OpenCode config home; give the bridge a folder of its own")
        return root

    def _write_config(self) -> None:
        path = self.config_path
        assert path is not None and self.url is not None and self._config_root is not None
        try:
            write_opencode_config(
                self._config_root, opencode_config(url=self.url, server_name=self.server_name, token=self._token)
            )
        except OSError as exc:
            raise BridgeError(f"cannot write the OpenCode config {path}: {exc}") from exc

    def _release(self) -> None:
        if self._config_root is not None and self._given_config_root is None:
            shutil.rmtree(self._config_root, ignore_errors=True)
        self._config_root = self._port = self._token = None

    def _app(self) -> Starlette:
        assert self._port is not None
        security = security_settings(self.host, self._port)
        manager = StreamableHTTPSessionManager(
            app=self.server,
            security_settings=security,
            max_request_body_size=self.max_body_bytes,
            max_sessions=self.max_sessions,
            session_idle_timeout=self.session_idle_timeout,
        )
        sse = SseServerTransport(MESSAGE_PATH, security_settings=security, max_request_body_size=self.max_body_bytes)
        return Starlette(
            routes=[
                Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(manager)),
                Route(SSE_PATH, endpoint=SseEndpoint(self.server, sse), methods=["GET"]),
                Mount(MESSAGE_PATH, app=sse.handle_post_message),
            ],
            middleware=[
                Middleware(Guard, security=security, token=self._token),
                Middleware(_StreamLimit, limit=self.max_streams),
            ],
            lifespan=lambda app: manager.run(),
        )
