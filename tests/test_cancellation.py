"""A client that cancels a call stops the work on the server: the SDK's real client against the real server
process, over Streamable HTTP (both protocol eras: the 2026 client closes the request, the handshake-era one
sends `notifications/cancelled`) and over stdio."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from support.processes import running
from support.server_process import ServerProcess

pytestmark = pytest.mark.anyio

SLEEPER_TEST = """\
import os
import subprocess
import sys
import time
from pathlib import Path

PIDS = {pids!r}


def main():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    Path(PIDS + ".tmp").write_text(f"{os.getpid()} {child.pid}")
    os.replace(PIDS + ".tmp", PIDS)  # an absolute path: the test runs in a scratch folder of its own
    time.sleep(300)
"""


@pytest.fixture
def units(units_root: Path) -> Path:
    (units_root / "sleeper").mkdir()
    (units_root / "sleeper" / "__init__.py").write_text('"""Its test sleeps, with a child process."""\n')
    pids = str(units_root.parent / "test-pids")
    (units_root / "sleeper" / "test_init.py").write_text(SLEEPER_TEST.replace("{pids!r}", repr(pids)))
    return units_root


Connect = Callable[[Path, Path], Any]


@asynccontextmanager
async def over_http(units: Path, data: Path, mode: Literal["auto", "legacy"]) -> AsyncIterator[Client]:
    server = ServerProcess("--units", str(units), "--data-dir", str(data), "--no-watch", tmp=data.parent)
    try:
        printed = server.ready()
        headers = {"Authorization": f"Bearer {printed['MCP_TOKEN']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
            Client(streamable_http_client(printed["MCP_URL"], http_client=http), mode=mode) as client,
        ):
            yield client
    finally:
        assert server.stop() == 0


@asynccontextmanager
async def over_stdio(units: Path, data: Path, mode: Literal["auto", "legacy"]) -> AsyncIterator[Client]:
    args = ["-m", "unit_mcp.server", "--stdio", "--units", str(units), "--data-dir", str(data), "--no-watch"]
    async with Client(stdio_client(StdioServerParameters(command=sys.executable, args=args)), mode=mode) as client:
        yield client


TRANSPORTS = [
    pytest.param(over_http, "auto", id="http-2026"),
    pytest.param(over_http, "legacy", id="http-handshake"),
    pytest.param(over_stdio, "legacy", id="stdio-handshake"),
    pytest.param(over_stdio, "auto", id="stdio-2026"),
]


@pytest.mark.parametrize(("transport", "mode"), TRANSPORTS)
async def test_cancelling_a_test_run_kills_its_process_group(
    units: Path, tmp_path: Path, transport: Any, mode: Literal["auto", "legacy"]
) -> None:
    data = tmp_path / "data"
    pids_file = tmp_path / "test-pids"
    async with transport(units, data, mode) as client:
        outcome: list[Any] = []
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()

            async def run_tests() -> None:
                with scope:
                    outcome.append(await client.call_tool("unit_run_tests", {"unit_id": "sleeper", "timeout": 300}))

            tg.start_soon(run_tests)
            with anyio.fail_after(60):
                while not pids_file.exists():
                    await anyio.sleep(0.05)
            pids = [int(pid) for pid in pids_file.read_text().split()]
            assert all(running(pid) for pid in pids)
            scope.cancel()
            cancelled_at = time.monotonic()
        assert outcome == [], "the call ended cancelled, with no result"

        with anyio.fail_after(10):  # the test's own timeout is 300 s: only the cancel can have killed it
            while any(running(pid) for pid in pids):
                await anyio.sleep(0.02)
        killed_after = time.monotonic() - cancelled_at
        print(f"test process group gone {killed_after * 1000:.0f} ms after the cancel ({transport.__name__}, {mode})")

        after = await client.call_tool("unit_snapshot", {"unit_id": "counter"})  # the session serves on
        assert not after.is_error
    assert "call cancelled by the client" in (data / "logs" / "app.log").read_text()


async def test_cancelling_a_reload_stuck_in_unit_code_frees_the_server(units: Path, tmp_path: Path) -> None:
    """The hung import itself cannot be stopped (a thread cannot be killed; it holds that module's import lock
    until it returns): the reload stops waiting for it, puts the previous version back, and the host's reload
    lock is free at once instead of after reload_timeout (30 s)."""
    data = tmp_path / "data"
    source = units / "greeter.py"
    async with over_http(units, data, "auto") as client:
        source.write_text("import time\ntime.sleep(40)\n" + source.read_text())
        async with anyio.create_task_group() as tg:
            scope = anyio.CancelScope()
            outcome: list[Any] = []

            async def reload() -> None:
                with scope:
                    outcome.append(await client.call_tool("unit_reload", {"unit_id": "greeter"}))

            tg.start_soon(reload)
            await anyio.sleep(1.0)  # the import is sleeping by now
            scope.cancel()
        assert outcome == []

        with anyio.fail_after(15):  # well inside the 30 s the stuck reload would otherwise hold the host
            other = await client.call_tool("unit_reload", {"unit_id": "counter"})
        assert not other.is_error, other.content
        listed = await client.call_tool("unit_list", {})
        assert listed.structured_content is not None
        greeter = next(u for u in listed.structured_content["units"] if u["unit_id"] == "greeter")
        assert greeter["loaded"], "the previous version serves on"
    log = (data / "logs" / "app.log").read_text()
    assert "import of unit greeter was still running when the caller cancelled" in log, log[-3000:]
