"""The one tool declaration: what it lists, and one wording of a bad call on the unit, fleet and local tools."""

from __future__ import annotations

import mcp_types as types
import pytest
from mcp import Client
from pydantic import BaseModel, ConfigDict, Field

from unit_mcp import UnitService
from unit_mcp.agent import AgentApprovals, AgentToolSurface, LocalTool
from unit_mcp.fleet.server import FleetTools
from unit_mcp.tooldecl import ARGUMENTS_HINT, Refusal, ToolDecl
from unit_mcp.tools import UnitTools
from unit_mcp.wire import DRY_RUN_RISK_META_KEY, ERROR_META_KEY, RISK_META_KEY

pytestmark = pytest.mark.anyio


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1)
    label: str | None = None


class Result(BaseModel):
    total: int


def test_a_declaration_publishes_only_what_it_declares() -> None:
    bare = ToolDecl("count_up", None, "", Args).mcp_tool()
    assert (bare.title, bare.description, bare.annotations, bare.output_schema) == (None, "", None, None)
    assert bare.meta == {RISK_META_KEY: "normal"}
    assert bare.input_schema == Args.model_json_schema()

    full = ToolDecl(
        "count_up",
        "Count up",
        "Adds one.",
        args=Args,
        result=Result,
        risk="shell",
        dry_run_risk="filesystem-read",
        read_only=False,
        idempotent=False,
        compact_schema=True,
    )
    listed = full.mcp_tool(name="x_count_up", description="Adds one (prefixed).")
    assert (listed.name, listed.title, listed.description) == ("x_count_up", "Count up", "Adds one (prefixed).")
    assert listed.meta == {RISK_META_KEY: "shell", DRY_RUN_RISK_META_KEY: "filesystem-read"}
    assert listed.annotations == types.ToolAnnotations(title="Count up", read_only_hint=False, idempotent_hint=False)
    assert listed.output_schema == Result.model_json_schema(mode="serialization")
    label = listed.input_schema["properties"]["label"]
    assert label == {"type": "string"} and "title" not in listed.input_schema  # optional as its plain type


def test_validation_answers_the_model_or_one_refusal() -> None:
    tool = ToolDecl("count_up", None, "", Args)
    assert tool.validate({"count": 2}) == Args(count=2)
    refusal = tool.validate({"count": 0, "colour": "red"}, name="x_count_up")
    assert refusal == Refusal(
        "invalid_arguments",
        "Invalid arguments for x_count_up: count: Input should be greater than or equal to 1; "
        "colour: Extra inputs are not permitted.",
        ARGUMENTS_HINT,
    )


async def test_the_unit_fleet_and_local_tools_word_a_bad_call_alike(service: UnitService) -> None:
    async with Client(UnitTools(service).server()) as client:
        unit = await client.call_tool("unit_read_log", {"lines": 0})
    assert unit.is_error and unit.meta is not None
    assert unit.meta[ERROR_META_KEY] == {  # the unit tools' published code for any bad argument
        "code": "invalid_argument",
        "message": "Invalid arguments for unit_read_log: lines: Input should be greater than or equal to 1.",
        "hint": ARGUMENTS_HINT,
    }

    fleet = await FleetTools(None).call("fleet_list_nodes", {"node": "a"})  # type: ignore[arg-type]  # never reached
    assert fleet.is_error and fleet.meta is not None
    assert fleet.meta[ERROR_META_KEY] == {
        "code": "invalid_arguments",
        "message": "Invalid arguments for fleet_list_nodes: node: Extra inputs are not permitted.",
    }

    def count_up(count: int) -> int:
        return count + 1

    surface = AgentToolSurface(AgentApprovals(), local=[LocalTool.from_function(count_up)])
    local = await surface.call("count_up", {"count": "many"})
    assert local.is_error and local.text == (
        "[invalid_arguments] Invalid arguments for count_up: count: Input should be a valid integer, unable to "
        "parse string as an integer."
    )
