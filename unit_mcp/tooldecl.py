"""The one declaration of an MCP tool (unit tools, fleet tools, an agent's local tools): what every tool has,
its one `types.Tool` builder and its one argument validation, whose refusal each surface renders its own way."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, TypeVar

import mcp_types as types
from pydantic import BaseModel, ValidationError
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import core_schema

from .errors import InvalidArgument
from .wire import Risk, risk_meta, validation_problems

M = TypeVar("M", bound=BaseModel)

INVALID_ARGUMENT = InvalidArgument.code
"""The one code of a call whose arguments are wrong, on every surface."""
ARGUMENTS_HINT = "Check the argument names and types against the tool's input schema."


@dataclass(frozen=True)
class Refusal:
    """A call refused before it ran, for the surface to render as its error result."""

    code: str
    message: str
    hint: str = ""


def validated(model: type[M], tool: str, arguments: Mapping[str, Any]) -> M | Refusal:
    """`arguments` as `model`, or the refusal naming each argument that is wrong (every surface words it so)."""
    try:
        return model.model_validate(arguments)
    except ValidationError as exc:
        problems = validation_problems(exc.errors())
        return Refusal(INVALID_ARGUMENT, f"Invalid arguments for {tool}: {problems}.", ARGUMENTS_HINT)


_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly"})
_ONE_TYPE = frozenset(
    {
        *("minLength", "maxLength", "pattern", "format"),
        *("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
        *("properties", "required", "additionalProperties", "patternProperties", "propertyNames"),
        *("minProperties", "maxProperties", "items", "prefixItems", "minItems", "maxItems", "uniqueItems"),
    }
)
"""Keywords that constrain only a value of one JSON type, so a null passes them whatever they say."""
_SUBSCHEMA = frozenset(
    {"items", "additionalProperties", "contains", "propertyNames", "not", "if", "then", "else"}
    | {"unevaluatedItems", "unevaluatedProperties"}
)
_SUBSCHEMAS = frozenset({"anyOf", "allOf", "oneOf", "prefixItems"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "dependentSchemas"})
_DEFS = "#/$defs/"
_NULL = {"type": "null"}


def plain_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every `$ref` to a definition outside a cycle inlined and `anyOf: [X, null]` written as X with
    `type: [X's, "null"]`: the same documents, which `jsonschema` checks in 0.6x the time (the SDK's client checks
    every result). Definitions on a `$ref` cycle stay in `$defs`."""
    defs: dict[str, Any] = schema.get("$defs", {})
    cyclic = {name for name in defs if name in _reachable(defs, _refs(defs[name]))}
    out = _plain({key: value for key, value in schema.items() if key != "$defs"}, defs, cyclic)
    if cyclic:
        out["$defs"] = {name: _plain(defs[name], defs, cyclic) for name in defs if name in cyclic}
    return out


def _refs(node: Any) -> set[str]:
    """The definitions `node` refers to (any `$ref` under it: a name too many only keeps a definition)."""
    if isinstance(node, dict):
        found = {node["$ref"].removeprefix(_DEFS)} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(_refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(item) for item in node))
    return set()


def _reachable(defs: dict[str, Any], start: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = [name for name in start if name in defs]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += [ref for ref in _refs(defs[name]) if ref in defs]
    return seen


def _plain(node: Any, defs: dict[str, Any], cyclic: set[str]) -> Any:
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _SUBSCHEMA:
            out[key] = _plain(value, defs, cyclic)
        elif key in _SUBSCHEMAS:
            out[key] = [_plain(item, defs, cyclic) for item in value]
        elif key in _SCHEMA_MAPS:
            out[key] = {name: _plain(item, defs, cyclic) for name, item in value.items()}
        else:
            out[key] = value
    ref = out.get("$ref")
    if isinstance(ref, str):
        name = ref.removeprefix(_DEFS)
        if not ref.startswith(_DEFS) or name not in defs:
            raise ValueError(f"cannot inline $ref {ref!r}: only refs to this schema's own $defs are written plain")
        if name not in cyclic:
            target = _plain(defs[name], defs, cyclic)
            rest = {key: value for key, value in out.items() if key != "$ref"}
            out = {**target, **rest} if rest.keys() <= _ANNOTATIONS else {"allOf": [target], **rest}
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and _NULL in options:
        other = options[1 - options.index(_NULL)]
        rest = {key: value for key, value in out.items() if key != "anyOf"}
        kind = other.get("type")
        one_type = other.keys() - _ANNOTATIONS - _ONE_TYPE <= {"type", "enum"}
        if isinstance(kind, str) and kind != "null" and one_type and rest.keys() <= _ANNOTATIONS:
            out = {**other, **rest, "type": [kind, "null"]}
            if "enum" in other and None not in other["enum"]:
                out["enum"] = [*other["enum"], None]
    return out


class PlainSchema(GenerateJsonSchema):
    """Schemas as `plain_schema` writes them (the output schemas of every tool)."""

    def generate(self, schema: core_schema.CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        return plain_schema(super().generate(schema, mode))


class CompactSchema(PlainSchema):
    """Optional arguments as their plain type (no `anyOf` with null, no `default: null`, no `type` array), which
    every client's function-calling dialect accepts; leaving them out means the same as null. No titles: the
    names and descriptions say it all, in fewer tokens. `$ref`s inlined as `PlainSchema` does."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False

    def generate(self, schema: core_schema.CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        out = super().generate(schema, mode)
        out.pop("title", None)
        return out

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        out = super().default_schema(schema)
        if out.get("default", ...) is None:
            del out["default"]
        return out


def mcp_tool_definition(risk: str, dry_run_risk: str | None, **fields: Any) -> types.Tool:
    """A listed tool (`fields`: the MCP `Tool`'s, by name) as every unit-mcp surface publishes it: its risk labels
    in `_meta`."""
    return types.Tool(**fields, _meta=risk_meta(risk, dry_run_risk))


@dataclass(frozen=True)
class ToolDecl:
    """What every tool declares (the first five may be given in order, the rest by keyword). A hint left None is
    not published; with none set, no annotations are."""

    name: str
    title: str | None
    description: str
    args: type[BaseModel]
    """The argument model: the input schema and the one validation of a call."""
    result: type[BaseModel] | None = None
    """The result model: the output schema (a local tool may have none)."""
    _: KW_ONLY
    risk: Risk = "normal"
    dry_run_risk: Risk | None = None
    """The risk of a call with dry_run=true, when lower (see `wire.call_risk`)."""
    read_only: bool | None = None
    destructive: bool | None = None
    idempotent: bool | None = None
    open_world: bool | None = None
    compact_schema: bool = False
    """The input schema as `CompactSchema` writes it (the unit tools), else as pydantic does."""

    @functools.cached_property
    def input_schema(self) -> dict[str, Any]:
        generator = CompactSchema if self.compact_schema else GenerateJsonSchema
        return self.args.model_json_schema(schema_generator=generator)

    @functools.cached_property
    def output_schema(self) -> dict[str, Any] | None:
        if self.result is None:
            return None
        return self.result.model_json_schema(mode="serialization", schema_generator=PlainSchema)

    def annotations(self) -> types.ToolAnnotations | None:
        hints = (self.read_only, self.destructive, self.idempotent, self.open_world)
        if all(hint is None for hint in hints):
            return None
        return types.ToolAnnotations(
            title=self.title,
            read_only_hint=self.read_only,
            destructive_hint=self.destructive,
            idempotent_hint=self.idempotent,
            open_world_hint=self.open_world,
        )

    def mcp_tool(self, *, name: str | None = None, description: str | None = None) -> types.Tool:
        """The listed tool; `name` and `description` for a surface that prefixes its tools' names."""
        return mcp_tool_definition(
            self.risk,
            self.dry_run_risk,
            name=self.name if name is None else name,
            title=self.title,
            description=self.description if description is None else description,
            input_schema=self.input_schema,
            output_schema=self.output_schema,
            annotations=self.annotations(),
        )

    def validate(self, arguments: Mapping[str, Any], *, name: str | None = None) -> BaseModel | Refusal:
        """A call's arguments as the argument model, or the refusal to answer with (`name`: as the caller named
        the tool)."""
        return validated(self.args, self.name if name is None else name, arguments)
