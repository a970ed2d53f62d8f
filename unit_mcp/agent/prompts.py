"""Prompt utilities: optional helpers agents use to build system prompts; they own no provider behaviour.

Context enrichers are registered here, outside the runner, so the runner's API stays about lifecycle.
An enricher is `fn(ctx) -> str | None` (sync or async); `format_context` runs them in registration order
and a failing one raises `EnricherError` naming it, which fails the turn explicitly.
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .errors import AgentError, EnricherError
from .turns import describe

if TYPE_CHECKING:
    from ._context import TurnContext
    from .presets import PresetInfo
    from .toolsurface import PromptFragment, ToolDef

PERSONA = (
    "You are Unit Agent. You develop the units (hot-reloadable plugins) of a running Python application "
    "using only the approved tools you are offered. Read before you patch, patch with the hash you read, "
    "run the unit's tests and reload it; say plainly what you did, and when a tool you need is not available."
)
"""The instructions every unit-developing agent starts from (the step loop of the CLI, Codex, OpenCode)."""

Enricher = Callable[["TurnContext"], "str | Awaitable[str | None] | None"]


class PromptBlock(BaseModel):
    name: str
    content: str | None = None


class EnricherRegistry:
    """Named context enrichers; the module-level `enrichers` is the default one."""

    def __init__(self) -> None:
        self._enrichers: dict[str, Enricher] = {}

    def register(self, name: str, enricher: Enricher) -> None:
        self._enrichers[name] = enricher

    def remove(self, name: str) -> bool:
        return self._enrichers.pop(name, None) is not None

    def names(self) -> list[str]:
        return list(self._enrichers)

    async def run(self, ctx: TurnContext) -> list[tuple[str, str]]:
        lines: list[tuple[str, str]] = []
        for name, enricher in list(self._enrichers.items()):
            try:
                value = enricher(ctx)
                if inspect.isawaitable(value):
                    value = await value
            except Exception as exc:
                raise EnricherError(f"prompt enricher {name!r} failed: {describe(exc)}") from exc
            if value:
                lines.append((name, str(value)))
        return lines


enrichers = EnricherRegistry()


def register_enricher(name: str, enricher: Enricher) -> None:
    enrichers.register(name, enricher)


def remove_enricher(name: str) -> bool:
    return enrichers.remove(name)


def render_template(template: str, values: Mapping[str, Any] | None = None, /, **more: Any) -> str:
    """`$name` / `${name}` substitution; a missing name is an error naming it, never a silent blank."""
    try:
        return string.Template(template).substitute({**(values or {}), **more})
    except KeyError as exc:
        raise AgentError(f"prompt template needs a value for {exc.args[0]!r}") from None
    except ValueError as exc:
        raise AgentError(f"prompt template is malformed: {exc}") from None


async def format_context(ctx: TurnContext, registry: EnricherRegistry | None = None) -> str:
    """One `name: text` line per enricher that had something to say."""
    pairs = await (registry or enrichers).run(ctx)
    return "\n".join(f"{name}: {text}" for name, text in pairs)


def format_tools(tools: Iterable[ToolDef]) -> str:
    """The available capabilities as a list a model can read: name, risk, first line of the description."""
    lines = []
    for tool in tools:
        summary = tool.description.strip().split("\n", 1)[0] if tool.description else ""
        lines.append(f"- {tool.name} ({tool.risk})" + (f": {summary}" if summary else ""))
    return "\n".join(lines)


def format_presets(presets: Iterable[PresetInfo]) -> str:
    """Capability presets as a model reads them: name, risk, state, description and tools; an inactive one says
    how to activate it (and that the user must approve it above `normal` risk)."""
    lines = []
    for preset in presets:
        if preset.active:
            state = "active"
        elif preset.out_of_context:
            state = f"active, but offered only in context {' or '.join(preset.contexts)}"
        elif preset.risk == "normal":
            state = "inactive, activate with preset_activate"
        else:
            state = "inactive, activate with preset_activate (the user approves it)"
        summary = preset.description.strip().split("\n", 1)[0] if preset.description else ""
        lines.append(f"- {preset.name} ({preset.risk}; {state})" + (f": {summary}" if summary else ""))
        lines.append(f"  tools: {', '.join(preset.tools) or 'none available right now'}")
    return "\n".join(lines)


def format_fragments(fragments: Iterable[PromptFragment]) -> str:
    return "\n\n".join(fragment.text.strip() for fragment in fragments if fragment.text.strip())


def assemble_blocks(blocks: Iterable[PromptBlock | tuple[str, str | None]]) -> str:
    """`## Name` sections in order; empty blocks are left out."""
    sections = []
    for block in blocks:
        name, content = (block.name, block.content) if isinstance(block, PromptBlock) else block
        if content and content.strip():
            sections.append(f"## {name}\n{content.strip()}")
    return "\n\n".join(sections)


async def system_prompt(ctx: TurnContext, instructions: str) -> str:
    """The standard layout: instructions, context from enrichers, available capabilities, the capability presets
    (when the surface has them), tool guidance."""
    return assemble_blocks(
        [
            ("Instructions", instructions),
            ("Context", await format_context(ctx)),
            ("Available capabilities", format_tools(ctx.visible_tools())),
            ("Capability presets", format_presets(ctx.tools.preset_infos())),
            ("Capability guidance", format_fragments(ctx.tools.prompt_fragments())),
        ]
    )
