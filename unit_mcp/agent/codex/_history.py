"""The prompt of one Codex run: the session's earlier turns as a transcript, then the new input.

Every run is a fresh, ephemeral Codex thread (nothing of Codex's own survives a run), while the session's
item stream is the canonical history. So a follow-up turn hands Codex what was said and done before, as
text, bounded to the newest `limit` characters so a long session cannot outgrow the model's context.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..items import Item, MessageItem, ToolCallItem, ToolResultItem

CLIPPED = "[earlier conversation clipped]"


def _clip(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def transcript(items: Sequence[Item], *, tool_width: int = 500) -> list[str]:
    """User and assistant messages, and each tool call with its result, one line each."""
    results = {item.call_id: item for item in items if isinstance(item, ToolResultItem)}
    lines: list[str] = []
    for item in items:
        if isinstance(item, MessageItem) and item.role in ("user", "assistant") and item.content:
            lines.append(f"{item.role}: {item.content}")
        elif isinstance(item, ToolCallItem):
            result = results.get(item.call_id)
            outcome = "no result" if result is None else ("error: " if result.is_error else "") + result.output
            lines.append(f"tool {item.name} {_clip(item.arguments, tool_width)} -> {_clip(outcome, tool_width)}")
    return lines


def codex_prompt(items: Sequence[Item], turn_id: str, input: str, *, limit: int = 20_000) -> str:
    """`input` alone on a session's first turn; otherwise the transcript of the earlier turns first."""
    lines = transcript([item for item in items if item.turn_id != turn_id])
    if not lines:
        return input
    text = "\n".join(lines)
    if len(text) > limit:
        text = f"{CLIPPED}\n{text[-limit:]}"
    return f"## Conversation so far\n{text}\n\n## Your task now\n{input}"
