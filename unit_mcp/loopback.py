"""Loopback serving primitives shared by the bridge and the agent's endpoints: host checks, the listening
socket, the Host/Origin/token guard, the legacy SSE endpoint and a uvicorn server that leaves signals to the
embedding application."""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from mcp.server import Server
from mcp.server.sse import SseServerTransport
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send


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


class SseEndpoint:
    """GET /sse: one legacy SSE connection served by the MCP server until the client goes away."""

    def __init__(self, server: Server[Any], transport: SseServerTransport) -> None:
        self.server = server
        self.transport = transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.transport.connect_sse(scope, receive, send) as (read_stream, write_stream):
            await self.server.run(read_stream, write_stream, self.server.create_initialization_options())
