"""Properties of tool arguments (reference 002: "generated args satisfying a spec pass validateArgs").

Arguments generated from each tool's input schema, as the surface offers it (the real unit tools listed over
MCP, local tools of many shapes, the preset control tools), pass the validation that will check them (a local
tool's argument model; the unit server's own argument model for its tools), and survive every encoding a
provider puts them through unchanged: OpenAI chat-completion tool calls (and the chat history the loop sends
back), the Responses API / Codex `mcp_tool_call` item, an OpenCode tool part, the MCP `tools/call` request,
and the session journal.
"""

from __future__ import annotations

import json
import secrets
import shutil
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp_types as types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionMessageToolCall
from pydantic import BaseModel, Field
from support.codex_parts import McpToolCall

from unit_mcp import Host, UnitService
from unit_mcp.agent import AgentApprovals, AgentToolSurface, McpToolSource
from unit_mcp.agent.items import ITEM, MessageItem, ToolCallItem
from unit_mcp.agent.opencode import tool_part
from unit_mcp.agent.presets import Preset, PresetManager
from unit_mcp.agent.projections import chat_messages
from unit_mcp.agent.toolnames import openai_tool_name
from unit_mcp.agent.toolsurface import ToolDef
from unit_mcp.tools import TOOLS, UnitTools

from .conftest import EXAMPLE_UNITS
from .schema_strategy import from_schema


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Point(BaseModel):
    x: float
    y: float = 0.0


class Shape(BaseModel):
    name: str = Field(min_length=1, max_length=20)
    points: list[Point] = Field(max_length=4)
    colour: Colour = Colour.RED
    tags: dict[str, str] = Field(default_factory=dict)
    closed: bool | None = None


def draw(shape: Shape) -> str:
    return shape.name


def move(dx: int, dy: int = 0, mode: Literal["relative", "absolute"] = "relative", note: str | None = None) -> str:
    return mode


def scale(factors: list[float], *, unit: str = "px") -> str:
    return unit


def tool_defs(tmp: Path) -> tuple[AgentToolSurface, dict[str, ToolDef]]:
    """The surface's tools: the unit server's (listed over MCP, in memory), local ones, the preset tools."""
    units = tmp / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    surface = AgentToolSurface(AgentApprovals(), presets=PresetManager([Preset(name="all", tools=["*"], active=True)]))
    for fn in (draw, move, scale):
        surface.tool(fn)

    async def collect() -> list[ToolDef]:
        with Host(units, tmp / "data", namespace=f"prop_units_{secrets.token_hex(4)}") as host:
            async with McpToolSource(UnitTools(UnitService(host)).server()) as source:
                surface.add_source(source)  # its tool list stays with the surface once it is closed
                return surface.tools()

    return surface, {tool.name: tool for tool in anyio.run(collect)}


@pytest.fixture(scope="module")
def surface_and_tools(tmp_path_factory: pytest.TempPathFactory) -> tuple[AgentToolSurface, dict[str, ToolDef]]:
    return tool_defs(tmp_path_factory.mktemp("props"))


SERVER_MODELS = {spec.name: spec.args for spec in TOOLS}


def test_every_kind_of_tool_is_covered(surface_and_tools: tuple[AgentToolSurface, dict[str, ToolDef]]) -> None:
    _, tools = surface_and_tools
    names = set(tools)
    assert set(SERVER_MODELS) <= names
    assert {"draw", "move", "scale", "preset_activate", "preset_deactivate"} <= names


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_generated_arguments_pass_validation_and_survive_every_encoding(
    surface_and_tools: tuple[AgentToolSurface, dict[str, ToolDef]], data: st.DataObject
) -> None:
    surface, tools = surface_and_tools
    tool = tools[data.draw(st.sampled_from(sorted(tools)), label="tool")]
    arguments: dict[str, Any] = data.draw(from_schema(tool.input_schema), label="arguments")

    # validation: what checks the arguments when the call runs accepts them
    local = surface._local.get(tool.name)
    validator = local.args if local is not None else SERVER_MODELS[tool.upstream_name]
    validator.model_validate(arguments)

    encoded = json.dumps(arguments, ensure_ascii=False)

    # OpenAI chat completions: the SDK's tool call as the model sends it, resolved back to the tool
    wire = ChatCompletionMessageToolCall.model_validate(
        {"id": "call_1", "type": "function", "function": {"name": openai_tool_name(tool.name), "arguments": encoded}}
    )
    assert surface.get(wire.function.name) == tool
    assert json.loads(wire.function.arguments) == arguments

    # the session journal, and the chat history the loop sends back to the model
    message = MessageItem(id="itm-1", role="assistant", content="")
    call = ToolCallItem(
        id="itm-2", name=tool.name, arguments=wire.function.arguments, call_id=wire.id, parent_id="itm-1"
    )
    stored = ITEM.validate_json(call.model_dump_json())
    assert isinstance(stored, ToolCallItem) and json.loads(stored.arguments) == arguments
    (sent,) = [m for m in chat_messages([message, stored]) if m["role"] == "assistant"]
    assert json.loads(sent["tool_calls"][0]["function"]["arguments"]) == arguments

    # Responses API / Codex: an mcp_tool_call item carries the arguments as an object or as JSON text
    for form in (arguments, encoded):
        item = McpToolCall.model_validate_json(json.dumps({"id": "i", "tool": tool.name, "arguments": form}))
        assert json.loads(item.arguments_json()) == arguments

    # OpenCode: a tool part's input
    raw = json.dumps({"callID": "c", "tool": tool.name, "state": {"status": "running", "input": arguments}})
    part = tool_part(json.loads(raw))  # as the node sends it
    assert json.loads(part.arguments) == arguments

    # MCP tools/call, as the surface sends it to a server and as an endpoint receives it
    params = types.CallToolRequestParams(name=tool.upstream_name, arguments=arguments)
    again = types.CallToolRequestParams.model_validate_json(params.model_dump_json(by_alias=True))
    assert again.arguments == arguments
