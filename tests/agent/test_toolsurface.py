"""AgentToolSurface over the real unit server (loopback HTTP) and local Python tools."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from unit_mcp.agent import AgentApprovals, AgentError, AgentToolSurface, LocalTool, ToolError
from unit_mcp.agent.errors import ToolFailed
from unit_mcp.agent.toolnames import openai_tool_name
from unit_mcp.tools import tool_risks

from .conftest import TEST_TOOLS, UnitServer

pytestmark = pytest.mark.anyio


async def test_mcp_tools_carry_their_risk_into_mcp_and_openai_definitions(unit_server: UnitServer) -> None:
    surface = AgentToolSurface(AgentApprovals())
    async with unit_server.source() as source:
        surface.add_source(source)
        everything = {tool.name: tool.risk for tool in surface.tools()}
        assert everything == {**tool_risks(), **{name: tool.risk for name, tool in TEST_TOOLS.items()}}

        normal = sorted(name for name, risk in everything.items() if risk == "normal")
        mcp_defs = surface.mcp_tool_defs()
        assert sorted(tool.name for tool in mcp_defs) == normal
        unit_list = next(tool for tool in mcp_defs if tool.name == "unit_list")
        assert unit_list.meta == {"unit_mcp/risk": "normal"}
        assert unit_list.annotations is not None and unit_list.annotations.read_only_hint is True

        functions = surface.openai_tools()
        assert sorted(f["function"]["name"] for f in functions) == normal
        inspect_fn = next(f for f in functions if f["function"]["name"] == "unit_inspect")
        assert inspect_fn["type"] == "function" and inspect_fn["function"]["parameters"]["required"] == ["unit_id"]

        assert [f.source for f in surface.prompt_fragments()] == ["unit"]
        assert "unit_apply_patch" in surface.prompt_fragments()[0].text


async def test_call_enforces_approval_again_and_reaches_the_server_only_when_approved(unit_server: UnitServer) -> None:
    approvals = AgentApprovals()
    surface = AgentToolSurface(approvals)
    async with unit_server.source() as source:
        surface.add_source(source)
        denied = await surface.call("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
        assert denied.is_error and denied.text.startswith("[approval_denied] unit_read_source (risk: filesystem-read)")
        assert unit_server.called() == []

        approvals.set_policy("filesystem-read", "auto")
        read = await surface.call("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
        assert not read.is_error and read.structured is not None and read.structured["hash"].startswith("sha256:")
        refused = await surface.call("unit_read_source", {"unit_id": "nope", "source_id": "x.py"})
        assert refused.is_error and refused.text.startswith("[unknown_unit]")
        unknown = await surface.call("unit_teleport", {})
        assert unknown.is_error and unknown.text.startswith("[unknown_tool]")
    assert unit_server.called() == ["unit_read_source", "unit_read_source"]


class Greeting(BaseModel):
    name: str
    excited: bool = False


async def test_local_tools_validate_arguments_and_contain_failures() -> None:
    surface = AgentToolSurface(AgentApprovals())

    @surface.tool(prompt="Greet people by name.")
    def greet(args: Greeting) -> str:
        """Greet someone.

        Longer text that is not part of the description."""
        return f"Hello {args.name}{'!' if args.excited else '.'}"

    @surface.tool(name="add", risk="normal")
    async def add_numbers(a: int, b: int = 1) -> dict[str, int]:
        return {"sum": a + b}

    @surface.tool
    def refuse(reason: str) -> str:
        raise ToolError(f"cannot: {reason}")

    @surface.tool
    def crash() -> str:
        raise ZeroDivisionError("division by zero")

    definition = surface.get("greet")
    assert definition is not None and definition.description == "Greet someone." and definition.source == "local"
    assert definition.input_schema["required"] == ["name"]
    assert surface.prompt_fragments()[0].text == "Greet people by name."

    assert (await surface.call("greet", {"name": "Ada", "excited": True})).text == "Hello Ada!"
    added = await surface.call("add", {"a": 2})
    assert added.structured == {"sum": 3} and json.loads(added.text) == {"sum": 3}
    invalid = await surface.call("add", {"a": "two", "c": 1})
    assert (
        invalid.is_error
        and invalid.text.startswith("[invalid_argument] Invalid arguments for add:")
        and "c: Extra inputs" in invalid.text
    )
    assert (await surface.call("refuse", {"reason": "no"})).text == "[tool_error] cannot: no"
    with pytest.raises(ToolFailed, match="local tool crash failed: ZeroDivisionError"):
        await surface.call("crash", {})

    with pytest.raises(AgentError, match="already registered"):
        surface.add_local(LocalTool.from_function(lambda: "x", name="greet"))
    assert surface.remove_local("greet") and surface.get("greet") is None


def test_openai_names_are_sanitised_capped_and_distinct() -> None:
    assert openai_tool_name("unit_list") == "unit_list"
    dotted, underscored = openai_tool_name("space.unit_list"), openai_tool_name("space_unit_list")
    assert dotted.startswith("space_unit_list_") and dotted != underscored
    long_name = "x" * 100
    assert len(openai_tool_name(long_name)) == 64 and openai_tool_name(long_name) != openai_tool_name("x" * 99)
    for name in ("a b", "ü", "x" * 65, "a/b"):
        converted = openai_tool_name(name)
        assert len(converted) <= 64 and all(c.isascii() and (c.isalnum() or c in "_-") for c in converted)


async def test_prefixed_sources_map_openai_names_back_to_the_upstream_tool(unit_server: UnitServer) -> None:
    surface = AgentToolSurface(AgentApprovals())
    async with unit_server.source(prefix="dev.") as source:
        surface.add_source(source)
        functions = [f["function"]["name"] for f in surface.openai_tools()]
        echo = next(name for name in functions if name.startswith("dev_echo_token"))
        assert echo == openai_tool_name("dev.echo_token")
        result = await surface.call(echo, {"token": "via-prefix"})
        assert result.text == "via-prefix"
    assert unit_server.calls[-1].name == "echo_token"
