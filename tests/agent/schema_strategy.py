"""Hypothesis strategies for the JSON Schema that tool input schemas use (pydantic's and hand-written ones).

hypothesis-jsonschema would be the library for this, but its last release (0.23.1) fails on current
Hypothesis (it uses an internal API that is gone), so this covers the subset tools use: objects with
properties, required and additionalProperties; strings with length bounds or a pattern;
integers and numbers with bounds;
booleans, null, arrays, enum, const, anyOf/oneOf, and local `$ref`s. An unsupported keyword fails loudly.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text()
ANY_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
_IGNORED = {"title", "description", "default", "examples", "$defs", "definitions", "$schema", "format"}
_HANDLED = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
    "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum", "const", "anyOf", "oneOf",
    "$ref", "pattern",
}  # fmt: skip


def from_schema(schema: dict[str, Any], root: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    root = root if root is not None else schema
    unknown = set(schema) - _IGNORED - _HANDLED
    if unknown:
        raise ValueError(f"schema keywords not covered by this strategy: {sorted(unknown)}")
    if "$ref" in schema:
        path = schema["$ref"].removeprefix("#/").split("/")
        target: Any = root
        for part in path:
            target = target[part]
        return st.deferred(lambda: from_schema(target, root))  # lazily: a `$ref` cycle is a recursive model
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(option, root) for option in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": one}, root) for one in kind])
    if kind == "object":
        return _object(schema, root)
    if kind == "array":
        items = from_schema(schema.get("items", {}), root)
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 4), 4))
    if kind == "string" and "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    if kind == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=schema.get("maxLength", 40))
    if kind == "integer":
        low = schema.get("minimum", (schema["exclusiveMinimum"] + 1) if "exclusiveMinimum" in schema else None)
        high = schema.get("maximum", (schema["exclusiveMaximum"] - 1) if "exclusiveMaximum" in schema else None)
        return st.integers(min_value=low, max_value=high)
    if kind == "number":
        return st.floats(
            min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
            max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
            allow_nan=False,
            allow_infinity=False,
        ) | st.integers(min_value=-(2**53), max_value=2**53).filter(lambda n: _within(n, schema))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind is None:
        return ANY_JSON
    raise ValueError(f"schema type {kind!r} not covered by this strategy")


def _within(n: int, schema: dict[str, Any]) -> bool:
    """Whether `n` meets the schema's bounds, inclusive and exclusive (a whole number for a `number`)."""
    return (
        schema.get("minimum", n) <= n <= schema.get("maximum", n)
        and ("exclusiveMinimum" not in schema or n > schema["exclusiveMinimum"])
        and ("exclusiveMaximum" not in schema or n < schema["exclusiveMaximum"])
    )


def _object(schema: dict[str, Any], root: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    properties: dict[str, Any] = schema.get("properties", {})
    required = set(schema.get("required", []))
    extra = schema.get("additionalProperties", True)
    fixed = st.fixed_dictionaries(
        {name: from_schema(properties[name], root) for name in properties if name in required},
        optional={name: from_schema(sub, root) for name, sub in properties.items() if name not in required},
    )
    if extra is False:
        return fixed
    values = ANY_JSON if extra is True else from_schema(extra, root)
    keys = st.text(max_size=8).filter(lambda key: key not in properties)
    return st.tuples(fixed, st.dictionaries(keys, values, max_size=2)).map(lambda pair: {**pair[1], **pair[0]})
