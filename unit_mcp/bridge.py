"""The loopback bridge: one MCP server on 127.0.0.1 over Streamable HTTP and legacy SSE, plus an isolated
OpenCode config that points at it.

An application starts it inside its own process around its own host (`async with Bridge(server)` or
`await bridge.start()` / `await bridge.stop()`); `python -m unit_mcp.server` is a thin wrapper over it. The
serving itself (Host/Origin guard, bearer token, the bounds on what one client can hold) is `McpHttpServer`,
the same server every agent endpoint uses.
"""

from __future__ import annotations

import logging
import os
import re
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.lowlevel import Server
from starlette.types import ASGIApp

from .mcphttp import DEFAULT_LIMITS, Limits, McpHttpServer
from .opencode_isolation import ConfigHome, IsolationRefused, opencode_config
from .stdio import first_signal

if TYPE_CHECKING:
    import uvicorn

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


class Bridge:
    """Serves one MCP server on loopback and writes `<config_root>/opencode/opencode.json` for it.

    `config_root` defaults to a fresh temporary folder removed at stop; a given folder is kept. The bearer
    token is new on every start. `limits` bound what one client can hold (see `Limits`). Start and stop are
    idempotent; call them from the same asyncio event loop (uvicorn runs on asyncio), e.g.
    `async with Bridge(tools.server()) as bridge: ...`.
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
        limits: Limits = DEFAULT_LIMITS,
        config_extra: Mapping[str, Any] | None = None,
        config_prefix: str = "unit-mcp-opencode-",
        error: type[Exception] = BridgeError,
        pages: Mapping[str, ASGIApp] | None = None,
    ) -> None:
        """`config_extra` goes into the OpenCode config beside the server entry (agent endpoints add their
        permission rules); `error` is the exception type start and stop raise (agent endpoints raise their own);
        `pages` are web pages served beside the MCP endpoints (path prefix -> app, e.g. the unit server's page
        at /units), under the same Host/Origin guard and caps but with their own browser credential."""
        if not _SERVER_NAME.fullmatch(server_name):
            raise error(f"server name {server_name!r} must be 1-64 of A-Z a-z 0-9 _ - (starting alphanumeric)")
        self.server = server
        self.server_name = server_name
        self.limits = limits
        self.config_extra = dict(config_extra or {})
        self._error = error
        self._config = ConfigHome(config_root, prefix=config_prefix)
        self._http = McpHttpServer(
            host=host,
            port=port,
            auth=auth,
            limits=limits,
            shutdown_timeout=shutdown_timeout,
            error=error,
            pages=pages,
        )
        self.host = self._http.host
        self._started = False

    # -- public surface -----------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        """The bearer token of the current run (None before start or with auth off)."""
        return self._http.token

    @property
    def base_url(self) -> str | None:
        """`http://host:port` while started: where `pages` are mounted."""
        return self._http.base_url

    @property
    def url(self) -> str | None:
        return self._http.url

    @property
    def sse_url(self) -> str | None:
        return self._http.sse_url

    @property
    def config_path(self) -> Path | None:
        return self._config.path

    def status(self) -> BridgeStatus:
        return BridgeStatus(
            started=self._started,
            host=self.host,
            port=self._http.port,
            url=self.url,
            sse_url=self.sse_url,
            config_root=str(self._config.root) if self._config.root is not None else None,
            config_path=str(self.config_path) if self.config_path is not None else None,
        )

    def opencode_env(self) -> dict[str, str]:
        """The environment an OpenCode process needs to use only this server: its own XDG_CONFIG_HOME."""
        env = self._config.env()
        if env is None:
            raise self._error("the bridge is not started")
        return env

    async def __aenter__(self) -> Bridge:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> BridgeStatus:
        """Bind, write the OpenCode config, serve; returns once requests are accepted. Fails loudly."""
        if self._started:
            return self.status()
        if not self._http.auth:
            log.warning("authentication is off: any local process can call the unit tools on this server")
        self._started = True  # taken at once: a second start() meanwhile returns instead of serving twice
        try:
            self._http.bind()
            assert self.url is not None
            try:
                self._config.write(
                    opencode_config(
                        url=self.url, server_name=self.server_name, token=self.token, extra=self.config_extra
                    )
                )
            except (IsolationRefused, OSError) as exc:
                raise self._error(f"cannot write the OpenCode config: {exc}") from exc
            await self._http.start(self.server)
        except BaseException:
            await self.stop()
            raise
        log.info("serving MCP on %s and %s", self.url, self.sse_url)
        return self.status()

    async def serve_until_stopped(self, beside: uvicorn.Server | None = None) -> None:
        """Serve until SIGINT or SIGTERM, with the application's own uvicorn server `beside` the bridge, then return:
        `async with Bridge(...)` removes the temporary config and the process exits 0. The one way to embed the
        bridge beside an ASGI server: uvicorn is asked to stop and allowed to finish (it re-raises the signal it
        caught once it has stopped, which without a handler kills the process before anything is cleaned up)."""
        if not self._started:
            raise self._error("the bridge is not started")
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as group:

                async def stop_on_signal() -> None:
                    await first_signal(signals)
                    if beside is None:
                        group.cancel_scope.cancel()
                    else:
                        beside.should_exit = True  # a graceful stop: its lifespan and open requests end first

                group.start_soon(stop_on_signal)
                if beside is None:
                    await anyio.sleep_forever()
                else:
                    await beside.serve()
                group.cancel_scope.cancel()

    async def stop(self) -> None:
        """Stop serving (open streams get `shutdown_timeout` seconds), then remove a temporary config root."""
        self.host = self._http.host
        self._started = False
        try:
            await self._http.stop()
        finally:
            self._config.remove()
