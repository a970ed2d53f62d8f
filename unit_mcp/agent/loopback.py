"""LoopbackServer: one ASGI app served by uvicorn on a loopback port, inside the caller's event loop.

Shared by the approval-filtered endpoint and the scripted model server. The socket is bound before
uvicorn starts (port 0 without races), signals are left to the embedding application, and `start`/`stop`
must run in the same task (they enter and leave a task group).
"""

from __future__ import annotations

import socket
from contextlib import AsyncExitStack

import anyio
import uvicorn
from starlette.types import ASGIApp

from ..loopback import QuietUvicorn, bind_loopback, is_loopback, url_host
from .errors import EndpointError


class LoopbackServer:
    """`bind()` first when the app needs its own port (e.g. for a Host allow-list), then `start(app)`."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: int = 1) -> None:
        if not is_loopback(host):
            raise EndpointError(f"refusing to serve on {host!r}: only loopback (127.0.0.1, ::1, localhost) is allowed")
        self.host = "127.0.0.1" if host == "localhost" else host
        self.requested_port = port
        self.shutdown_timeout = shutdown_timeout
        self.port: int | None = None
        self._server: QuietUvicorn | None = None
        self._stack: AsyncExitStack | None = None
        self._failure: BaseException | None = None
        self._sock: socket.socket | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise EndpointError("the server is not started")
        return f"http://{url_host(self.host)}:{self.port}"

    def bind(self) -> int:
        """Bind the listening socket now and return its port (idempotent)."""
        if self._sock is None:
            self._sock = self._bind()
            self.port = self._sock.getsockname()[1]
        assert self.port is not None
        return self.port

    async def start(self, app: ASGIApp) -> None:
        if self._stack is not None:
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
                timeout_graceful_shutdown=self.shutdown_timeout,
            )
        )
        stack = AsyncExitStack()
        tg = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        tg.start_soon(self._serve, server, sock)
        while not server.started:
            if self._failure is not None or server.should_exit:
                await self.stop()
                raise EndpointError(f"the HTTP server failed to start: {self._failure or 'lifespan startup failed'}")
            await anyio.sleep(0.005)

    async def stop(self) -> None:
        stack, server = self._stack, self._server
        self._stack = self._server = None
        if server is not None:
            server.should_exit = True
        if stack is not None:
            await stack.aclose()
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self.port = None

    async def _serve(self, server: QuietUvicorn, sock: socket.socket) -> None:
        try:
            await server.serve(sockets=[sock])
        except (Exception, SystemExit) as exc:  # uvicorn exits the process when lifespan startup fails
            self._failure = exc
            server.should_exit = True
        finally:
            sock.close()

    def _bind(self) -> socket.socket:
        try:
            return bind_loopback(self.host, self.requested_port)
        except OSError as exc:
            raise EndpointError(
                f"cannot listen on {url_host(self.host)}:{self.requested_port}: {exc.strerror}"
            ) from exc
