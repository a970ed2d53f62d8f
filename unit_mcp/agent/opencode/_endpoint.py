"""OpenCode's view of the approval-filtered endpoint: the tools a user may approve one call at a time too.

A tool whose risk is `ask` is offered while an approver is attached, OpenCode is told to ask before each call,
and an approved answer admits exactly one call here (`admit`): a call without one is refused, so the endpoint
fails closed even if OpenCode's rules were loosened or its answer forged.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types

from .._endpoint import ApprovedEndpoint
from ..presets import ACTIVATE
from ..toolsurface import AgentToolSurface, ToolDef, ToolOutput

_OPENCODE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def opencode_tool_name(server_name: str, tool_name: str) -> str:
    """The name OpenCode gives an MCP tool: `<server>_<tool>`, other characters than `[A-Za-z0-9_-]` as `_`."""
    return _OPENCODE_NAME.sub("_", f"{server_name}_{tool_name}")


@dataclass
class OpenCodeView:
    surface: AgentToolSurface
    server_name: str
    grants: list[str]
    admitted: collections.Counter[str] = field(default_factory=collections.Counter)
    """Tool name → calls a user approved that have not run yet."""

    def tool_defs(self) -> list[types.Tool]:
        return self.surface.mcp_tool_defs(self.grants, interactive=True)

    def askable(self) -> list[str]:
        """Offered tools that need an approval per call (their risk is `ask` and not granted), and `preset_activate`
        (whose risk is the named preset's)."""
        return self._askable(self.surface.visible(self.grants, interactive=True))

    def _askable(self, tools: Iterable[ToolDef]) -> list[str]:
        approvals = self.surface.approvals
        return [
            tool.name
            for tool in tools
            if tool.name == ACTIVATE
            or (
                approvals.check_risk(tool.risk, self.grants) == "needs-approval"
                and approvals.usable(tool.least_risk, self.grants, interactive=True)
            )
        ]

    def permission_rules(self) -> list[dict[str, str]]:
        """Per-session OpenCode rules: ask before each call of an askable tool, offered now or once a preset is
        activated during the turn (the isolated config allows `<server>_*`, and the last matching rule wins)."""
        return [
            {"permission": opencode_tool_name(self.server_name, name), "pattern": "*", "action": "ask"}
            for name in self._askable(self.surface.registered())
        ]

    def local_name(self, opencode_name: str) -> str:
        """The surface's name for a tool as OpenCode names it (the server prefix stripped)."""
        prefix = opencode_tool_name(self.server_name, "")
        if not opencode_name.startswith(prefix):
            return opencode_name
        for tool in self.surface.tools():
            if opencode_tool_name(self.server_name, tool.name) == opencode_name:
                return tool.name
        return opencode_name.removeprefix(prefix)

    def admit(self, tool_name: str) -> None:
        """Let one call of `tool_name` through (an approval the user gave for one OpenCode request)."""
        self.admitted[tool_name] += 1

    async def run(self, name: str, arguments: dict[str, Any]) -> ToolOutput:
        """An askable tool's call takes one admission if there is one (OpenCode asks before each of its calls),
        which grants this call's own risk (a dry run's, or the tool's); without one it runs only if that risk is
        approved outright."""
        tool = self.surface.get(name)
        if tool is not None and tool.name == ACTIVATE:
            return await self._activated(arguments)
        if tool is None or self.surface.approvals.check_risk(tool.risk, self.grants) != "needs-approval":
            return await self.surface.call(name, arguments, grants=self.grants)
        risk = self.surface.call_risk(tool, arguments)
        if self.admitted[tool.name] > 0:
            self.admitted[tool.name] -= 1
            return await self.surface.call(tool.name, arguments, grants=[*self.grants, risk])
        if self.surface.approvals.check_risk(risk, self.grants) == "approved":
            return await self.surface.call(tool.name, arguments, grants=self.grants)
        text = f"[approval_required] {tool.name} (risk: {risk}) needs an approval for each call."
        return ToolOutput(text=text, is_error=True)

    async def _activated(self, arguments: dict[str, Any]) -> ToolOutput:
        """`preset_activate` as OpenCode calls it after asking: the preset approved then is active, so say so;
        otherwise it is activated only if the policy allows its risk outright."""
        presets, name = self.surface.presets, arguments.get("name")
        if presets is not None and isinstance(name, str) and name in presets.names() and presets.is_active(name):
            info = presets.describe(self.surface.registered(), name)
            tools = ", ".join(info.tools) or "none right now"
            return ToolOutput(
                text=f"preset {name} is active; its tools: {tools}", structured=info.model_dump(mode="json")
            )
        return await self.surface.call(ACTIVATE, arguments, grants=self.grants)


OpenCodeEndpoint = ApprovedEndpoint[OpenCodeView]


def opencode_endpoint(
    surface: AgentToolSurface, *, server_name: str = "unit-agent", grants: Iterable[str] = (), **options: Any
) -> OpenCodeEndpoint:
    """The endpoint an OpenCode node's config points at, offering OpenCode's view of `surface`."""
    view = OpenCodeView(surface, server_name, list(grants))
    return ApprovedEndpoint(surface, view=view, server_name=server_name, **options)
