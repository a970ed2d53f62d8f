"""Cancellation that reaches blocking work running in a worker thread.

A thread cannot be interrupted, so long work checks a flag: the tool layer opens `cancellation()` around each
call it runs in a thread and sets it when the client cancels. Python code can do the same:
`with cancellation() as cancel: ...`, then `cancel.set()` from another thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_current: ContextVar[threading.Event | None] = ContextVar("unit_mcp_cancellation", default=None)

client_gone: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar("unit_mcp_client_gone", default=None)
"""Set by a transport that can tell, while it serves a request: returns once that request's client has gone (its
connection dropped without a cancel). A call that waits for a person watches it (`mcphttp` sets it for handshake-era
HTTP; the 2026-era transport cancels the handler itself, and legacy SSE and stdio end the session)."""


@contextmanager
def cancellation() -> Iterator[threading.Event]:
    """An event that, once set, asks the work started in this context (and threads it spawns via anyio) to stop."""
    event = threading.Event()
    token = _current.set(event)
    try:
        yield event
    finally:
        _current.reset(token)


def requested() -> bool:
    """Whether the caller of the work running in this context has cancelled it."""
    event = _current.get()
    return event is not None and event.is_set()


def wait(done: threading.Event, timeout: float, *, poll: float = 0.1) -> bool:
    """`done.wait(timeout)` that gives up early, returning False, once the caller cancels."""
    deadline = time.monotonic() + timeout
    while not done.wait(max(0.0, min(poll, deadline - time.monotonic()))):
        if time.monotonic() >= deadline or requested():
            return False
    return True
