"""Who a call is made for, and whether its caller declared it may be a repeat: context the change log records."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import TypeVar

from ..changelog import NOBODY, Caller

R = TypeVar("R")

_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("unit_mcp_caller", default=NOBODY)
_REPLAY: contextvars.ContextVar[bool] = contextvars.ContextVar("unit_mcp_replay", default=False)


def call_as(caller: Caller, call: Callable[[], R], *, replay: bool = False) -> R:
    """Run `call` on behalf of `caller`: the change log records who made the writes it makes. `replay`: the caller
    may be repeating a call whose result is in place (`wire.REPLAY_META_KEY`), which then answers `already_applied`."""
    token, replaying = _CALLER.set(caller), _REPLAY.set(replay)
    try:
        return call()
    finally:
        _REPLAY.reset(replaying)
        _CALLER.reset(token)


def caller() -> Caller:
    """Who the current call is made for (`call_as`)."""
    return _CALLER.get()


def replaying() -> bool:
    """Whether the current call's caller declared it may be a repeat (`call_as(..., replay=True)`)."""
    return _REPLAY.get()
