"""Arguments MCP clients add on their own (Gemini CLI's `wait_for_previous`) are accepted and ignored; every
other unknown argument is still refused. Through the SDK's real client against the real tool server."""

from __future__ import annotations

from typing import Any

import mcp_types as types
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp import Client

from unit_mcp import UnitService
from unit_mcp.tools import CLIENT_INJECTED_ARGUMENTS, ERROR_META_KEY, UnitTools, without_client_arguments

pytestmark = pytest.mark.anyio


def _text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_wait_for_previous_is_accepted_and_ignored(service: UnitService, mode: str) -> None:
    async with Client(UnitTools(service).server(), mode=mode) as client:
        plain = await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
        for flag in (True, False):
            arguments = {"unit_id": "counter", "source_id": "__init__.py", "wait_for_previous": flag}
            result = await client.call_tool("unit_read_source", arguments)
            assert not result.is_error, _text(result)
            assert result.structured_content == plain.structured_content
        listed = await client.call_tool("unit_list", {"wait_for_previous": True})
        assert not listed.is_error and listed.structured_content is not None


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"wait_for_previous": "yes"}, "wait_for_previous: Extra inputs are not permitted"),  # not its documented type
        ({"wait_for_next": True}, "wait_for_next: Extra inputs are not permitted"),
        ({"hash": "sha256:00"}, "hash: Extra inputs are not permitted"),
    ],
)
async def test_other_unknown_arguments_are_still_refused(
    service: UnitService, extra: dict[str, Any], problem: str
) -> None:
    async with Client(UnitTools(service).server()) as client:
        result = await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py", **extra})
    assert result.is_error
    assert result.meta is not None and result.meta[ERROR_META_KEY]["code"] == "invalid_argument"
    assert problem in _text(result)


_values = st.one_of(st.booleans(), st.integers(), st.text(max_size=5), st.none())
_names = st.one_of(st.sampled_from(sorted(CLIENT_INJECTED_ARGUMENTS)), st.text(min_size=1, max_size=12))


@given(st.dictionaries(_names, _values, max_size=6), st.sets(_names, max_size=3))
def test_only_known_injected_arguments_of_their_type_are_dropped(arguments: dict[str, Any], fields: set[str]) -> None:
    kept = without_client_arguments(arguments, fields)
    for key, value in arguments.items():
        injected = key in CLIENT_INJECTED_ARGUMENTS and isinstance(value, CLIENT_INJECTED_ARGUMENTS[key])
        assert (key in kept) == (key in fields or not injected)
        if key in kept:
            assert kept[key] is value


def test_a_tool_that_declares_the_name_keeps_it() -> None:
    assert without_client_arguments({"wait_for_previous": True}, {"wait_for_previous"}) == {"wait_for_previous": True}
