"""A units database served by real `python -m unit_mcp.server --units sqlite:PATH` processes, over HTTP with the
SDK's client: the same units as the folder it was copied from, the whole edit workflow with history and revert,
two servers on one database (changes seen by the other, one winner among fifty same-hash patches), and a
writer killed with SIGKILL mid-write leaving the database whole."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from conftest import copy_units
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from support.server_process import ServerProcess
from support.warm_cli import warm_cli

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def connect(printed: dict[str, str]) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {printed['MCP_TOKEN']}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(streamable_http_client(printed["MCP_URL"], http_client=http)) as client,
    ):
        yield client


async def ok(client: Client, name: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    return dict(result.structured_content or {})


async def refused(client: Client, name: str, **arguments: Any) -> str:
    result = await client.call_tool(name, arguments)
    assert result.is_error and result.meta is not None
    return str(result.meta["unit_mcp/error"]["code"])


def comparable(listed: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (u["unit_id"], u["source_handle"], u["loaded"], u["test_capabilities"], u["edit_capabilities"])
        for u in listed["units"]
    ]


async def test_a_database_served_by_two_servers(tmp_path: Path, server_processes: list[ServerProcess]) -> None:
    folder = copy_units(tmp_path / "units")
    db = f"sqlite:{tmp_path / 'db' / 'units.db'}"
    subprocess.run([sys.executable, "-m", "unit_mcp.units", "copy", str(folder), db], check=True, capture_output=True)
    for units in (str(folder), db, db):
        server_processes.append(ServerProcess("--units", units, tmp=tmp_path))
    printed = [process.ready() for process in server_processes]
    async with AsyncExitStack() as stack:
        on_folder, first, second = [await stack.enter_async_context(connect(p)) for p in printed]
        assert comparable(await ok(first, "unit_list")) == comparable(await ok(on_folder, "unit_list"))
        names = {tool.name for tool in (await first.list_tools()).tools}
        assert {"unit_history", "unit_revert"} <= names
        assert not {"unit_history", "unit_revert"} & {tool.name for tool in (await on_folder.list_tools()).tools}
        assert await refused(on_folder, "unit_history", unit_id="counter", source_id="__init__.py") == "not_supported"

        original = await ok(first, "unit_read_source", unit_id="counter", source_id="__init__.py")
        await ok(
            first, "unit_apply_patch", unit_id="counter", source_id="__init__.py", old="step = 1", new="step = 2",
            expected_hash=original["hash"],
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not (await ok(second, "unit_read_log", grep="unit counter reloaded after a change in the store"))[
            "lines"
        ]:
            assert time.monotonic() < deadline, "the second server did not notice the change"
            await anyio.sleep(0.1)
        code = await refused(
            first, "unit_apply_patch", unit_id="counter", source_id="__init__.py", old="def init(host):\n",
            new="def init(host):\n    1 / 0\n",
        )  # fmt: skip
        assert code == "reload_failed"
        assert (await ok(first, "unit_run_tests", unit_id="counter"))["passed"]
        versions = (await ok(first, "unit_history", unit_id="counter", source_id="__init__.py"))["versions"]
        assert [v["tool_call"] for v in versions] == ["unit_apply_patch", None]
        reverted = await ok(
            first, "unit_revert", unit_id="counter", source_id="__init__.py", version=versions[-1]["version"]
        )
        assert reverted["mode"] == "revert" and reverted["reload"]["reloaded"] and reverted["hash"] == original["hash"]
        again = await ok(second, "unit_read_source", unit_id="counter", source_id="__init__.py")
        assert again["content"] == original["content"]

        read = await ok(first, "unit_read_source", unit_id="greeter", source_id="greeter.py")
        outcomes: list[str] = []

        async def attempt(client: Client, n: int) -> None:
            result = await client.call_tool(
                "unit_apply_patch",
                {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": f"Hello{n}",
                 "expected_hash": read["hash"]},
            )  # fmt: skip
            outcomes.append(result.meta["unit_mcp/error"]["code"] if result.is_error and result.meta else "won")

        async with anyio.create_task_group() as group:
            for n in range(50):
                group.start_soon(attempt, (first, second)[n % 2], n)
        assert sorted(outcomes) == ["stale_hash"] * 49 + ["won"]
    for process in server_processes:
        assert process.stop() == 0


WRITER = r"""
import sys
from unit_mcp import Host, UnitService

with Host(sys.argv[1], sys.argv[2]) as host:
    service = UnitService(host)
    print("ready", flush=True)
    while True:
        current = service.read_source("bulk", "table.py").content
        marker = "VERSION = 'a'" if "VERSION = 'a'" in current else "VERSION = 'b'"
        flipped = "VERSION = 'b'" if marker.endswith("'a'") else "VERSION = 'a'"
        service.apply_patch("bulk", "table.py", old=marker, new=flipped)
        print("wrote", flush=True)
"""


def test_sigkill_during_database_writes_leaves_it_whole(tmp_path: Path) -> None:
    from unit_mcp.units import open_loader

    body = "".join(
        f"ROW_{n} = {n!r}  # a line of padding so that the write takes a while ......\n" for n in range(4000)
    )
    allowed = (f"VERSION = 'a'\n{body}".encode(), f"VERSION = 'b'\n{body}".encode())
    path = tmp_path / "units.db"
    store = open_loader(f"sqlite:{path}")
    store.put_unit(
        "bulk", "directory", {"__init__.py": b"from . import table\n", "table.py": allowed[0]}, replace=False
    )
    store.close()
    rng = random.Random(7)
    script = tmp_path / "writer.py"  # each writer a fork of the warm interpreter: unit_mcp's imports made once
    script.write_text(WRITER)
    reported = 0  # writes the writer said were done (each printed after its apply_patch returned)
    for kill in range(1, 16):
        arguments = [f"sqlite:{path}", str(tmp_path / "data")]
        writer = warm_cli().popen(arguments, env=os.environ, cwd=tmp_path, script=script)
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        if kill % 3 == 0:  # killed after a whole write too (a loaded machine writes slower than the longest pause)
            assert writer.stdout.readline().strip() == "wrote"
            reported += 1
        time.sleep(rng.uniform(0.0, 0.25))
        writer.send_signal(signal.SIGKILL)
        writer.wait()
        reported += writer.stdout.read().split().count("wrote")
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            (now,) = conn.execute(
                "SELECT data FROM sources WHERE unit_id = 'bulk' AND source_id = 'table.py'"
            ).fetchone()
            kept = conn.execute("SELECT data FROM versions WHERE source_id = 'table.py' AND listed = 1").fetchall()
        assert now in allowed, f"torn write after kill {kill}: {len(now)} bytes"
        assert all(data in allowed for (data,) in kept)
        assert len(kept) >= reported, f"a write reported done was lost to kill {kill}"


async def test_a_missing_database_is_created_and_served_empty(
    tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    path = tmp_path / "new" / "units.db"
    server_processes.append(ServerProcess("--units", f"sqlite:{path}", "--no-watch", tmp=tmp_path))
    async with connect(server_processes[0].ready()) as client:
        assert (await ok(client, "unit_list"))["units"] == []
        assert await refused(client, "unit_inspect", unit_id="counter") == "unknown_unit"
    assert server_processes[0].stop() == 0
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")} >= {
            "units",
            "sources",
            "versions",
        }


def test_units_that_cannot_be_served_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from unit_mcp.server import parse_args

    (tmp_path / "notes.db").write_text("not a database\n")
    (tmp_path / "empty.db").write_bytes(b"")
    instead = "nothing was written to it. Give a new file, or a database made by --units sqlite:PATH"
    for units, problem in [
        (f"sqlite:{tmp_path / 'notes.db'}", f"is not a units database (not SQLite); {instead}"),
        (f"sqlite:{tmp_path / 'empty.db'}", f"is an empty file, not a units database; {instead}"),
        (f"sqlite:{tmp_path}", "is a folder, not a database file"),
        (str(tmp_path / "missing"), "is not a folder (a units database is given as sqlite:PATH)"),
    ]:
        with pytest.raises(SystemExit) as exited:
            parse_args(["--units", units])
        assert exited.value.code == 2
        assert capsys.readouterr().err.strip().endswith(f"--units {units} {problem}")
    assert parse_args(["--units", f"sqlite:{tmp_path / 'new.db'}"]).units == f"sqlite:{tmp_path / 'new.db'}"
    assert (tmp_path / "notes.db").read_text() == "not a database\n" and (tmp_path / "empty.db").read_bytes() == b""
