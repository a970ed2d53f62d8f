"""Loopback serving primitives shared by the bridge and the agent's endpoints: host checks, the listening
socket and a uvicorn server that leaves signals to the embedding application."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Iterator

import uvicorn


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
