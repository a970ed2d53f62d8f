"""The one tool declaration: what it lists, and one wording of a bad call on the unit, fleet and local tools."""

from __future__ import annotations

import functools
import json
from typing import Any, Literal

import jsonschema
import mcp_types as types
import pytest
from agent.schema_strategy import ANY_JSON, from_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from pydantic import BaseModel, ConfigDict, Field

from unit_mcp import UnitService
from unit_mcp.agent import AgentApprovals, AgentToolSurface, LocalTool
from unit_mcp.fleet.server import TOOLS as FLEET_TOOLS
from unit_mcp.fleet.server import FleetTools
from unit_mcp.tooldecl import ARGUMENTS_HINT, PlainSchema, Refusal, ToolDecl
from unit_mcp.tools import TOOLS as UNIT_TOOLS
from unit_mcp.tools import UnitTools
from unit_mcp.wire import DRY_RUN_RISK_META_KEY, ERROR_META_KEY, RISK_META_KEY

pytestmark = pytest.mark.anyio


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: int = Field(ge=1)
    label: str | None = None


class Result(BaseModel):
    total: int


class Part(BaseModel):
    """A part, which may hold parts (a `$ref` cycle)."""

    kind: Literal["bolt", "nut"] | None = Field(None, description="what it is")
    parts: list[Part] = []
    spare: Part | None = None


class Leaf(BaseModel):
    """Only a docstring."""

    weight: float | None = Field(ge=0)
    label: str | None = Field(None, min_length=2, pattern="^[a-z]+$")


class Tree(BaseModel):
    root: Part
    leaf: Leaf | None = Field(None, description="the one leaf")
    leaves: list[Leaf] = []
    tags: dict[str, Leaf | None] = {}


RESULTS = sorted(
    {tool.result for tool in (*UNIT_TOOLS, *FLEET_TOOLS) if tool.result is not None} | {Part, Tree},
    key=lambda model: model.__name__,
)


def _paths(document: Any, at: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every place in `document` a value sits (the document itself first)."""
    inner = (
        document.items() if isinstance(document, dict) else enumerate(document) if isinstance(document, list) else ()
    )
    return [at] + [path for key, value in inner for path in _paths(value, (*at, key))]


def _replaced(document: Any, path: tuple[str | int, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    holder = copy
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return copy


@st.composite
def documents(draw: st.DrawFn, accepted: st.SearchStrategy[Any]) -> Any:
    """A document a schema accepts (drawn from `accepted`, its strategy), or one with a value somewhere in it
    swapped for any JSON value (a null often: the nullable fields are what changed)."""
    document = draw(accepted)
    if draw(st.booleans()):
        return document
    path = draw(st.sampled_from(_paths(document)))
    return _replaced(document, path, draw(st.none() | ANY_JSON))


@functools.cache
def _both_schemas(model: type[BaseModel]) -> tuple[Any, Any, st.SearchStrategy[Any]]:
    """The validators of the model's schema as every tool published it before and of its plain schema, and the
    documents to try: built once per model, not once per example (a strategy built anew in every example was
    most of this test's time)."""
    old = model.model_json_schema(mode="serialization")
    new = model.model_json_schema(mode="serialization", schema_generator=PlainSchema)
    validators = jsonschema.Draft202012Validator(old), jsonschema.Draft202012Validator(new)
    return *validators, documents(from_schema(old)) | ANY_JSON


@pytest.mark.parametrize("model", RESULTS, ids=lambda model: model.__name__)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_plain_output_schema_accepts_and_refuses_what_pydantics_does(model: type[BaseModel], data: Any) -> None:
    old, new, tried = _both_schemas(model)
    document = data.draw(tried)
    assert new.is_valid(document) == old.is_valid(document), document


def _every(schema: Any, key: str) -> list[Any]:
    if isinstance(schema, dict):
        return ([schema[key]] if key in schema else []) + [
            found for value in schema.values() for found in _every(value, key)
        ]
    return [found for value in schema for found in _every(value, key)] if isinstance(schema, list) else []


def test_a_plain_output_schema_inlines_what_it_can_and_keeps_what_clients_show() -> None:
    old = Tree.model_json_schema(mode="serialization")
    new = Tree.model_json_schema(mode="serialization", schema_generator=PlainSchema)
    assert set(new["$defs"]) == {"Part"}, "the cycle keeps its definition; Leaf is inlined"
    assert new["properties"]["root"] == {"$ref": "#/$defs/Part"}
    assert new["properties"]["leaf"] == {
        "type": ["object", "null"],
        "properties": {
            "weight": {"type": ["number", "null"], "minimum": 0, "title": "Weight"},
            "label": {
                "type": ["string", "null"],
                "minLength": 2,
                "pattern": "^[a-z]+$",
                "default": None,
                "title": "Label",
            },
        },
        "required": ["weight"],
        "title": "Leaf",
        "description": "the one leaf",  # the field's own description wins over its model's docstring
        "default": None,
    }
    kind = new["$defs"]["Part"]["properties"]["kind"]
    assert kind["type"] == ["string", "null"] and kind["enum"] == ["bolt", "nut", None]
    assert set(_every(old["properties"], "description")) <= set(_every(new, "description"))
    assert set(_every(old, "title")) == set(_every(new, "title"))
    for tool in (*UNIT_TOOLS, *FLEET_TOOLS):
        published = json.dumps(tool.output_schema)
        assert "$ref" not in published and "anyOf" not in published, tool.name


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
    assert listed.output_schema == Result.model_json_schema(mode="serialization", schema_generator=PlainSchema)
    label = listed.input_schema["properties"]["label"]
    assert label == {"type": "string"} and "title" not in listed.input_schema  # optional as its plain type


def test_validation_answers_the_model_or_one_refusal() -> None:
    tool = ToolDecl("count_up", None, "", Args)
    assert tool.validate({"count": 2}) == Args(count=2)
    refusal = tool.validate({"count": 0, "colour": "red"}, name="x_count_up")
    assert refusal == Refusal(
        "invalid_argument",
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
        "code": "invalid_argument",
        "message": "Invalid arguments for fleet_list_nodes: node: Extra inputs are not permitted.",
    }

    def count_up(count: int) -> int:
        return count + 1

    surface = AgentToolSurface(AgentApprovals(), local=[LocalTool.from_function(count_up)])
    local = await surface.call("count_up", {"count": "many"})
    assert local.is_error and local.text == (
        "[invalid_argument] Invalid arguments for count_up: count: Input should be a valid integer, unable to "
        "parse string as an integer."
    )
