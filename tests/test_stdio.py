"""`python -m unit_mcp.server --stdio`: the same tools over stdin/stdout, for clients that launch the server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from unit_mcp.stdio import _Lines
from unit_mcp.tools import tool_risks

pytestmark = pytest.mark.anyio


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


async def test_what_unit_code_prints_goes_to_stderr_not_onto_the_wire(units_root: Path, tmp_path: Path) -> None:
    (units_root / "noisy.py").write_text(
        '"""Prints at import and in init."""\nprint("noise at import")\n\n\n'
        'def init(host):\n    print("noise in init")\n'
    )
    stderr = tmp_path / "stderr.txt"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "unit_mcp.server", "--stdio", "--units", str(units_root), "--data-dir", str(tmp_path / "d")],
    )
    with stderr.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), mode="legacy") as client:
            reloaded = await client.call_tool("unit_reload", {"unit_id": "noisy"})
            assert not reloaded.is_error, reloaded.content
            listed = await client.call_tool("unit_list", {})
            assert "noisy" in {unit["unit_id"] for unit in listed.structured_content["units"]}  # type: ignore[index]
    printed = stderr.read_text()
    assert printed.count("noise at import") == 2 and printed.count("noise in init") == 2, printed


def requests_then_eof(units_root: Path, tmp_path: Path, stdin: Any) -> dict[int, Any]:
    """Run the stdio server on `stdin` (its requests, then its end); the replies by id."""
    command = ["-m", "unit_mcp.server", "--stdio", "--units", str(units_root), "--data-dir", str(tmp_path)]
    done = subprocess.run([sys.executable, *command], stdin=stdin, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return {reply["id"]: reply for reply in map(json.loads, done.stdout.decode().splitlines())}


REQUESTS = [
    {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    },
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    # a test run takes a subprocess: still running when stdin ends, and answered all the same
    {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "unit_run_tests", "arguments": {"unit_id": "counter"}},
    },
]


def check_replies(replies: dict[int, Any]) -> None:
    assert {tool["name"] for tool in replies[2]["result"]["tools"]} == set(tool_risks())
    assert replies[3]["result"]["structuredContent"]["passed"] is True, replies[3]


def test_a_regular_file_on_stdin_is_served_by_the_sdk_transport(units_root: Path, tmp_path: Path) -> None:
    """asyncio pipes cannot read a regular file; such a stdin falls back to the SDK's threaded transport. Every
    request read before the end of the file is answered (the SDK alone cancels what still runs at EOF)."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text("".join(json.dumps(line) + "\n" for line in REQUESTS))
    with requests.open("rb") as stdin:
        check_replies(requests_then_eof(units_root, tmp_path, stdin))


def test_requests_piped_in_are_all_answered_after_stdin_closes(units_root: Path, tmp_path: Path) -> None:
    """`producer | python -m unit_mcp.server --stdio`: the asyncio pipe path drains the same way."""
    read_end, write_end = os.pipe()
    os.write(write_end, "".join(json.dumps(line) + "\n" for line in REQUESTS).encode())
    os.close(write_end)
    try:
        check_replies(requests_then_eof(units_root, tmp_path, read_end))
    finally:
        os.close(read_end)


async def test_a_line_longer_than_the_limit_is_dropped_and_reading_goes_on() -> None:
    reader = asyncio.StreamReader(limit=16)
    reader.feed_data(b'{"short": 1}\n' + b"x" * 100 + b"\n" + b"y" * 40)
    reader.feed_data(b'\n{"after": 2}\n{"last": 3}')
    reader.feed_eof()
    assert [line async for line in _Lines(reader)] == ['{"short": 1}\n', '{"after": 2}\n', '{"last": 3}']


@pytest.mark.parametrize("mode", ["branch", "off"])
async def test_git_history_chooses_where_a_units_folder_in_git_records(
    units_root: Path, tmp_path: Path, mode: str
) -> None:
    git = ["git", "-C", str(units_root), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "units"]):
        subprocess.run([*git, *args], check=True)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "unit_mcp.server", "--stdio", "--units", str(units_root), "--git-history", mode],
    )
    async with Client(stdio_client(params), mode="legacy") as client:
        listed = {tool.name for tool in (await client.list_tools()).tools}
        assert ("unit_history" in listed) is (mode == "branch")
        edit = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 3"}
        assert not (await client.call_tool("unit_apply_patch", edit)).is_error
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True, check=True).stdout
    assert log.splitlines()[0] == ("unit_apply_patch: counter/__init__.py" if mode == "branch" else "units")


HTTP_ONLY = ("unit_mcp.bridge", "unit_mcp.mcphttp", "unit_mcp.unitpage", "unit_mcp.clients", "unit_mcp.asgi", "jinja2")
"""What only the HTTP server uses: a server on stdio (launched by its client, which waits) imports none of it."""


def imported_modules(importtime_stderr: str) -> list[str]:
    """The module names of `python -X importtime` lines."""
    return [
        line.rpartition("|")[2].strip()
        for line in importtime_stderr.splitlines()
        if line.startswith("import time:") and "self [us]" not in line
    ]


def test_a_stdio_server_answers_initialize_without_client_or_http_modules(units_root: Path, tmp_path: Path) -> None:
    """Exec to the answer of `initialize` is mostly imports: the server imports neither the SDK's client (which the
    SDK's package `__init__` would) nor the high-level MCPServer, nor what only HTTP serving needs."""
    command = [sys.executable, "-X", "importtime", "-m", "unit_mcp.server", "--stdio", "--no-watch"]
    hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
    server = subprocess.Popen(
        [*command, "--units", str(units_root), "--data-dir", str(tmp_path / "d")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(hello) + "\n")
        server.stdin.flush()
        answer = json.loads(server.stdout.readline())
        server.stdin.close()  # the server ends once stdin closes
        assert server.stderr is not None
        stderr = server.stderr.read()
        server.wait(timeout=60)
    finally:
        server.kill()
    assert answer["result"]["serverInfo"]["name"] == "unit-mcp"
    modules = imported_modules(stderr)
    assert "mcp.server.lowlevel.server" in modules and "unit_mcp.tools" in modules, "importtime lines were read"
    assert [m for m in modules if m.startswith(("mcp.client", "mcp.server.mcpserver", "httpx2"))] == []
    assert [m for m in modules if m.startswith(HTTP_ONLY)] == []


def test_the_sdks_lean_packages_still_give_every_name_they_define() -> None:
    """`unit_mcp` imports the SDK's `mcp` and `mcp.server` packages without their `__init__` (_lazy.lean_packages):
    a submodule import stays lean, and the first name only an `__init__` defines runs it, in the same module."""
    probe = """
import sys
import unit_mcp
import mcp.server.lowlevel
from mcp import types
lean = sorted(m for m in sys.modules if m.startswith(("mcp.client", "mcp.server.mcpserver")))
from mcp import Client, ClientSession
import mcp, mcp.server
from mcp.server import MCPServer, Server
assert mcp.Client is Client and mcp.types is types and Server is mcp.server.lowlevel.Server
assert MCPServer.__module__ == "mcp.server.mcpserver.server" and "Client" in mcp.__all__
print(lean, ClientSession.__name__)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "[] ClientSession\n"
