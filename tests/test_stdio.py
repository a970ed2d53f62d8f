"""`python -m unit_mcp.server --stdio`: the same tools over stdin/stdout, for clients that launch the server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from unit_mcp.tools import tool_risks

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_tools_over_stdio(units_root: Path, tmp_path: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "unit_mcp.server", "--stdio", "--units", str(units_root), "--data-dir", str(tmp_path / "d")],
    )
    async with Client(stdio_client(params), mode="legacy") as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == set(tool_risks())
        read = await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
        assert not read.is_error and read.structured_content is not None
        edit = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 3"}
        patched = await client.call_tool("unit_apply_patch", {**edit, "expected_hash": read.structured_content["hash"]})
        assert not patched.is_error and patched.structured_content["reload"]["reloaded"]
        refused = await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "../greeter.py"})
        assert refused.is_error
    assert "step = 3" in (units_root / "counter" / "__init__.py").read_text()
    assert "counter dropped" in (tmp_path / "d" / "logs" / "app.log").read_text(), "units dropped when stdin closed"
