"""Change listeners: how an approval policy, a preset set, a tool surface or an MCP source tells whoever follows it
(an endpoint resyncing its tool list, a surface re-announcing its tools) that it changed."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("unit_mcp.agent")

ChangeListener = Callable[[], None]


class Listeners:
    """Callbacks run after a change. `add` returns the call that removes the listener again; a listener that raises
    is logged as a failed `what` listener and never reaches whoever made the change."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._listeners: list[ChangeListener] = []

    def add(self, listener: ChangeListener) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def notify(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:
                log.exception("%s listener failed", self.what)
