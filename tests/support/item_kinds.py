"""How the provider tests compare transcripts: one word per session item."""

from __future__ import annotations

from collections.abc import Iterable

from unit_mcp.agent.items import EventItem, Item


def item_kinds(items: Iterable[Item]) -> list[str]:
    """The item's type ("message", "tool_call"...), or for an event its kind ("turn-started"...)."""
    return [item.kind if isinstance(item, EventItem) else item.type for item in items]
