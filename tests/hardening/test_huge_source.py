"""An oversized source: a 150 MB text file in a folder unit was read whole on the event loop (4.4 s, 1.25 GB of
memory, every other client stalled). A read is refused by size before the bytes are read, and every call's
storage work runs in a worker thread, never on the loop."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from support.server_process import ServerProcess

from unit_mcp import Host, UnitService
from unit_mcp.folderloader import FilesystemLoader
from unit_mcp.loader import Source
from unit_mcp.service import QUICK_READ_BYTES
from unit_mcp.tools import UnitTools

from .clients import call, connect
from .report import Report

pytestmark = pytest.mark.anyio

MB = 1024 * 1024
HUGE = {"unit_id": "big", "source_id": "data.txt"}


def vm_hwm(pid: int) -> int:
    """The peak resident memory of a process, in bytes (`VmHWM` of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def big_unit(units: Path, megabytes: int) -> None:
    """A directory unit with a text source of `megabytes` MB, written a megabyte at a time."""
    (units / "big").mkdir(parents=True)
    (units / "big" / "__init__.py").write_text('"""A unit with a huge data file."""\n')
    line = ("the quick brown fox jumps over the lazy dog " * 2)[:87] + "\n"
    chunk = (line * (MB // len(line) + 1))[:MB].encode()
    with (units / "big" / "data.txt").open("wb") as handle:
        for _ in range(megabytes):
            handle.write(chunk)


async def test_huge_source_does_not_stall_other_clients(tmp_path: Path, figures: Report) -> None:
    units = tmp_path / "units"
    big_unit(units, 150)
    server = ServerProcess("--units", str(units), "--no-watch", "--no-auth", tmp=tmp_path)
    try:
        url = server.ready()["MCP_URL"]
        async with connect(url, None) as reader, connect(url, None) as other:
            assert not (await call(other, "unit_list", {})).is_error  # warmed up: its own peak is in the baseline
            baseline = vm_hwm(server.proc.pid)
            refusals: list[Any] = []
            listed: list[Any] = []
            started = time.perf_counter()

            async def read_huge() -> None:
                for _ in range(3):
                    refusals.append(await call(reader, "unit_read_source", HUGE))

            async def list_units() -> None:
                for _ in range(3):
                    listed.append(await call(other, "unit_list", {}))

            async with anyio.create_task_group() as group:
                group.start_soon(read_huge)
                group.start_soon(list_units)
            elapsed = time.perf_counter() - started
            grown = vm_hwm(server.proc.pid) - baseline
    finally:
        server.stop()
    assert [result.code for result in refusals] == ["too_large"] * 3, refusals[0].text
    assert "157286400 bytes" in refusals[0].text and "up to 2097152 bytes" in refusals[0].text
    assert "Split it into smaller sources" in refusals[0].raw["_meta"]["unit_mcp/error"]["hint"]
    assert all(not result.is_error and result.structured["units"][0]["unit_id"] == "big" for result in listed)
    assert grown < 64 * MB, f"the server's peak memory grew by {grown / MB:.0f} MB: the source was read"
    figures.record(
        "huge_source",
        size_mb=150,
        code="too_large",
        peak_memory_growth_mb=round(grown / MB, 1),
        three_reads_and_three_lists_seconds=round(elapsed, 2),
    )


class RecordingLoader(FilesystemLoader):
    """A folder loader that notes the thread and the byte limit of every read."""

    reads: list[tuple[int, int | None]]

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        self.reads.append((threading.get_ident(), max_bytes))
        return super().read(source, max_bytes=max_bytes)


async def test_only_reads_of_one_page_run_on_the_event_loop(units_root: Path, tmp_path: Path) -> None:
    """A read of a folder's source, or a dry run of an exact replacement in a small text source, may be answered on
    the loop (cheaper than a thread hop), but never reading more than one page: a larger source is read in a worker
    thread."""
    (units_root / "weather" / "large.txt").write_text("x" * 100 + "\n" * (2 * QUICK_READ_BYTES))
    loader = RecordingLoader(units_root)
    with Host(loader, tmp_path / "data") as host:
        tools = UnitTools(UnitService(host))
        async with Client(tools.server()) as client:
            loader.reads = []
            read = await client.call_tool("unit_read_source", {"unit_id": "weather", "source_id": "data/cities.json"})
            large = await client.call_tool("unit_read_source", {"unit_id": "weather", "source_id": "large.txt"})
            dry_run = {"unit_id": "weather", "source_id": "data/cities.json", "old": "{", "new": "{ "}
            previewed = await client.call_tool("unit_apply_patch", {**dry_run, "replace_all": True, "dry_run": True})
            loop = threading.get_ident()
    assert not read.is_error and not large.is_error and not previewed.is_error, (read.content, previewed.content)
    on_loop = [limit for thread, limit in loader.reads if thread == loop]
    in_threads = [limit for thread, limit in loader.reads if thread != loop]
    # the small source, the large one refused unread, and the text dry run answered at once
    assert on_loop == [QUICK_READ_BYTES] * 3, loader.reads
    assert len(in_threads) == 1 and all(limit is None or limit > QUICK_READ_BYTES for limit in in_threads)
