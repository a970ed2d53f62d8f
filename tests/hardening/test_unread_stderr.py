"""A server whose stderr is a pipe nobody reads (security round 4, item 8): a unit that logs 5 MB at WARNING
filled the pipe, and the write blocked the reload, then everything waiting for the logging lock. What goes to
stderr is bounded (each record clipped, records that do not fit dropped and counted): the server never blocks on
it, and the app log has every record whole."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import anyio
import pytest
from support.server_process import ServerProcess

from unit_mcp.server import EXAMPLE_UNITS

from .clients import call, connect
from .conftest import ROUND4_PARENTS_SCHEMAS_WORKERS_STDERR
from .report import Report

pytestmark = pytest.mark.anyio

LOUD = 5 * 1024 * 1024
SHOUT = f'\nlog.warning("%s", "x" * {LOUD})\n'


async def test_unit_logging_5_mb_to_an_unread_stderr_does_not_block_the_server(tmp_path: Path, figures: Report) -> None:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "data"
    server = ServerProcess(
        "--units", str(units), "--data-dir", str(data), "--no-watch", "--confirm", "none", tmp=tmp_path
    )  # its stderr is a pipe this test never reads until the server has exited
    try:
        printed = server.ready()
        async with connect(printed["MCP_URL"], printed["MCP_TOKEN"]) as client:
            started = time.perf_counter()
            for round in range(3):  # each record alone is 80 times what the pipe holds
                old = 'return f"Hello, {name}!"' + SHOUT * round
                with anyio.fail_after(20):
                    patched = await call(
                        client,
                        "unit_apply_patch",
                        {"unit_id": "greeter", "source_id": "greeter.py", "old": old, "new": old + SHOUT},
                    )
                assert not patched.is_error, patched.text
                assert patched.structured is not None and patched.structured["reload"]["reloaded"], patched.structured
            reloads_s = time.perf_counter() - started
            bystander = time.perf_counter()
            with anyio.fail_after(10):
                listed = await call(client, "unit_list", {})
            assert not listed.is_error, listed.text
            bystander_s = time.perf_counter() - bystander
    finally:
        assert server.stop() == 0
    said = server.stderr()
    assert len(said) < 256 * 1024, len(said)
    assert "more characters in the app log" in said, said[-2000:]
    logged = "".join(path.read_text() for path in (data / "logs").glob("app.log*"))
    assert "x" * LOUD in logged, "the app log has the records whole"
    figures.record(
        ROUND4_PARENTS_SCHEMAS_WORKERS_STDERR,
        unread_stderr=f"3 reloads each logging 5 MB at WARNING: {reloads_s:.2f} s; unit_list after: "
        f"{bystander_s * 1000:.0f} ms; stderr got {len(said):,} characters, the app log each record whole",
    )
