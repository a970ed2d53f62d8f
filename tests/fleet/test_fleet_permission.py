"""The fleet reads each node's permission mode when it connects: a real `opencode serve` node whose rules ask
would block on a question nobody answers (the fleet design wants nodes that never ask, its `--auto`), so
`unit-mcp fleet` says so in one line at start and `fleet_list_nodes` says it for every node."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.server_process import ServerProcess

from unit_mcp.agent.opencode import IsolatedRoot, NodeProcess
from unit_mcp.fleet.nodes import password_variable

pytestmark = pytest.mark.anyio
RULES = {  # node: its permission rules (the global opencode.json of its isolated root)
    "asks": {"*": "deny", "bash": "ask", "edit": {"*.py": "allow", "*": "ask"}},
    "quiet": {"*": "deny", "read": "allow"},
}


@asynccontextmanager
async def nodes(tmp_path: Path, binary: Path) -> AsyncIterator[dict[str, NodeProcess]]:
    started: dict[str, NodeProcess] = {}
    async with AsyncExitStack() as stack:
        for name, rules in RULES.items():
            root = IsolatedRoot(tmp_path / name)
            (root.workdir / "opencode.json").write_text(json.dumps({"permission": rules}))
            started[name] = NodeProcess(binary=binary, root=root)
            stack.push_async_callback(started[name].stop)
        async with anyio.create_task_group() as tg:
            for process in started.values():
                tg.start_soon(process.start)
        yield started


async def test_a_node_that_would_ask_is_named_at_start_and_in_fleet_list_nodes(
    tmp_path: Path, opencode_binary: Path
) -> None:
    async with nodes(tmp_path, opencode_binary) as started:
        args = [part for name, node in started.items() for part in ("--node", f"{name}=http://127.0.0.1:{node.port}")]
        env = {password_variable(name): node.password or "" for name, node in started.items()}
        fleet = ServerProcess(*args, tmp=tmp_path, module="unit_mcp.fleet", env=env)
        try:
            printed = await anyio.to_thread.run_sync(fleet.ready)
            headers = {"Authorization": f"Bearer {printed['MCP_TOKEN']}"}
            async with (
                httpx2.AsyncClient(headers=headers, timeout=30) as http,
                Client(streamable_http_client(printed["MCP_URL"], http_client=http)) as client,
            ):
                listed: Any = (await client.call_tool("fleet_list_nodes", {})).structured_content
        finally:
            assert fleet.stop() == 0
    modes = {node["name"]: node["permission"] for node in listed["nodes"]}
    assert modes["quiet"] == "never asks: every rule allows or denies"
    assert modes["asks"].startswith("would block on a question: bash, edit ask, and nobody answers a headless node")
    warnings = [line for line in fleet.stderr().splitlines() if "warning" in line]
    assert warnings == [f"unit-mcp fleet: warning: node asks {modes['asks']}"], "one line, for the node that asks"
