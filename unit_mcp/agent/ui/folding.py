"""Model and tool content shaped for the page: long values are folded and cut on the server, so a 5 MB argument
costs the browser a few kilobytes. Escaping is not done here: the templates autoescape everything they print.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FOLD_CHARS = 240  # a value longer than this, or with more lines than FOLD_LINES, is shown folded
FOLD_LINES = 8
SHOW_CHARS = 8_000  # at most this much of one value reaches the page
PREVIEW_CHARS = 100
SHOW_ITEMS = 100  # of a list or object nested in an argument


@dataclass(frozen=True)
class Folded:
    """One value as the page shows it: `text` (cut to SHOW_CHARS, `omitted` characters left out), folded behind
    a one-line `preview` when it is long."""

    label: str | None
    text: str
    preview: str
    omitted: int
    folded: bool


def fold_text(text: str, label: str | None = None, *, show: int = SHOW_CHARS) -> Folded:
    shown = text[:show]
    head = " ".join(shown[: PREVIEW_CHARS * 4].split())  # lines joined: pretty JSON starts with a lone "{"
    preview = head[:PREVIEW_CHARS] + ("…" if len(head) > PREVIEW_CHARS or len(shown) > PREVIEW_CHARS * 4 else "")
    folded = len(text) > FOLD_CHARS or shown.count("\n") >= FOLD_LINES
    return Folded(label, shown, preview, len(text) - len(shown), folded)


def _cut(value: Any, depth: int = 0) -> Any:
    """The value with long strings and big containers cut, so pretty-printing it stays cheap."""
    if isinstance(value, str):
        if len(value) > SHOW_CHARS:
            return f"{value[:SHOW_CHARS]}… [{len(value) - SHOW_CHARS:,} more characters]"
        return value
    if depth > 20:
        return "… [nested too deep]"
    if isinstance(value, dict):
        cut = {str(key)[:PREVIEW_CHARS]: _cut(item, depth + 1) for key, item in list(value.items())[:SHOW_ITEMS]}
        if len(value) > SHOW_ITEMS:
            cut["…"] = f"[{len(value) - SHOW_ITEMS:,} more keys]"
        return cut
    if isinstance(value, list):
        items = [_cut(item, depth + 1) for item in value[:SHOW_ITEMS]]
        if len(value) > SHOW_ITEMS:
            items.append(f"… [{len(value) - SHOW_ITEMS:,} more items]")
        return items
    return value


def pretty(value: Any) -> str:
    return json.dumps(_cut(value), indent=2, ensure_ascii=False)


def fold_value(value: Any, label: str | None = None) -> Folded:
    """A string as its text, anything else as pretty JSON."""
    if isinstance(value, str):
        return fold_text(value, label)
    return fold_text(pretty(value), label)


def fold_arguments(arguments: dict[str, Any] | str | None) -> list[Folded]:
    """Tool arguments, one entry per top-level key; JSON text that does not parse is shown as it is."""
    if isinstance(arguments, str):
        text = arguments
        try:
            arguments = json.loads(text) if text.strip() else {}
        except ValueError:
            return [fold_text(text, "(not JSON)")]
    if arguments is None:
        return []
    if not isinstance(arguments, dict):
        return [fold_value(arguments)]
    entries = [fold_value(value, str(key)[:PREVIEW_CHARS]) for key, value in list(arguments.items())[:SHOW_ITEMS]]
    if len(arguments) > SHOW_ITEMS:
        entries.append(fold_text(f"{len(arguments) - SHOW_ITEMS:,} more arguments not shown", "…"))
    return entries
