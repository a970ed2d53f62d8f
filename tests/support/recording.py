"""The unit server the provider tests run against: the real unit tools plus test tools, every call recorded
before it runs (shared by the agent, OpenCode and Codex stacks)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext

from unit_mcp.tools import RISK_META_KEY, UnitTools


@dataclass
class TestTool:
    risk: str
    schema: dict[str, Any]
    run: Callable[[dict[str, Any]], Any]  # the text it answers, or an awaitable of it


def turn_checkpoint(name: str, arguments: Mapping[str, Any]) -> bool:
    """The checkpoint an agent runner takes at the start of every turn (labelled "session … turn …"), not a call the
    model made."""
    return name == "unit_checkpoint" and str(arguments.get("label", "")).startswith("session ")


def recording_server(
    unit_tools: UnitTools, tools: Mapping[str, TestTool], record: Callable[[str, dict[str, Any]], None]
) -> Server[Any]:
    """The real unit tools plus `tools`; `record(name, arguments)` is told of every call before it runs."""
    extra = [
        types.Tool(
            name=name, description=f"Test tool {name}.", input_schema=tool.schema, _meta={RISK_META_KEY: tool.risk}
        )
        for name, tool in tools.items()
    ]

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        listed = await unit_tools.list_tools(ctx, params)
        return types.ListToolsResult(tools=[*listed.tools, *extra])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        arguments = dict(params.arguments or {})
        record(params.name, arguments)
        tool = tools.get(params.name)
        if tool is None:
            return await unit_tools.call_tool(ctx, params)
        text = tool.run(arguments)
        if inspect.isawaitable(text):
            text = await text
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    return Server(
        "unit-dev",
        instructions=unit_tools.instructions,
        get_tool_input_schema=lambda name: None,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
