"""A rollback races another writer: a patch's reload fails while someone else (a human's editor on the folder,
another server on the database) writes the same source. The rollback is a hash-checked write: their version
stays, the result says so, and the history does not list the rejected version."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conftest import sqlite_copy

from unit_mcp import Host, UnitService
from unit_mcp.bridge import Bridge
from unit_mcp.loader import Source
from unit_mcp.paths import hash_bytes
from unit_mcp.sqliteloader import SqliteLoader
from unit_mcp.tools import UnitTools

from .clients import call, connect
from .report import Report

pytestmark = pytest.mark.anyio

ORIGINAL = b'"""A unit another writer edits while its reload fails."""\n\nVERSION = "original"\n'
THEIRS = b'"""A unit another writer edits while its reload fails."""\n\nVERSION = "theirs"\n'


def rejected(gate: Path) -> str:
    """A version whose init() says it started, waits until the test opens the gate, then fails."""
    return (
        "import pathlib\nimport time\n\n"
        f"GATE = pathlib.Path({str(gate)!r})\n\n\n"
        "def init(host):\n"
        "    (GATE / 'entered').touch()\n"
        "    deadline = time.monotonic() + 60\n"
        "    while not (GATE / 'open').exists() and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
        "    raise RuntimeError('rejected version')\n"
    )


@pytest.fixture(params=["folder", "sqlite"])
def store(request: pytest.FixtureRequest, units_root: Path, tmp_path: Path) -> Iterator[tuple[str, Host]]:
    (units_root / "contested").mkdir()
    (units_root / "contested" / "__init__.py").write_bytes(ORIGINAL)
    units = str(units_root) if request.param == "folder" else sqlite_copy(units_root, tmp_path / "units.db")
    with Host(units, tmp_path / "data") as host:
        yield request.param, host


def write_theirs(kind: str, host: Host) -> None:
    """The other writer: a human's editor saving the file, or a second server on the same database."""
    source = Source("contested", "directory", "__init__.py")
    if kind == "folder":
        (Path(host.loader.location) / "contested" / "__init__.py").write_bytes(THEIRS)
        return
    other = SqliteLoader(host.loader.location)
    try:
        other.write(source, THEIRS, expected_hash=hash_bytes(other.read(source)), tool_call="unit_apply_patch")
    finally:
        other.close()


async def test_rollback_does_not_overwrite_a_concurrent_write(
    store: tuple[str, Host], tmp_path: Path, figures: Report
) -> None:
    kind, host = store
    gate = tmp_path / "gate"
    gate.mkdir()
    tools = UnitTools(UnitService(host))
    patch = {
        "unit_id": "contested",
        "source_id": "__init__.py",
        "old": ORIGINAL.decode(),
        "new": rejected(gate),
        "expected_hash": hash_bytes(ORIGINAL),
    }
    outcome = []
    async with Bridge(tools.server()) as bridge, connect(bridge.url or "", bridge.token) as client:

        async def patching() -> None:
            outcome.append(await call(client, "unit_apply_patch", patch))

        async with anyio.create_task_group() as group:
            group.start_soon(patching)
            with anyio.fail_after(60):
                while not (gate / "entered").exists():
                    await anyio.sleep(0.01)
            await anyio.to_thread.run_sync(write_theirs, kind, host)  # while the rejected version's init runs
            (gate / "open").touch()
        (result,) = outcome
        assert result.is_error and result.code == "reload_failed", result.text
        evidence = result.raw["_meta"]["unit_mcp/error"]["details"]
        assert evidence["superseded_by"] == hash_bytes(THEIRS), evidence
        assert evidence["source_restored"] is False and evidence["stage"] == "init"
        assert "their version was kept, not overwritten" in result.text
        assert "unit_read_source" in result.raw["_meta"]["unit_mcp/error"]["hint"]

        read = await call(client, "unit_read_source", {"unit_id": "contested", "source_id": "__init__.py"})
        assert read.structured is not None and read.structured["content"] == THEIRS.decode(), "their edit stays"
        if kind == "sqlite":
            history = await call(client, "unit_history", {"unit_id": "contested", "source_id": "__init__.py"})
            assert history.structured is not None
            hashes = [version["hash"] for version in history.structured["versions"]]
            assert hashes[0] == hash_bytes(THEIRS), "the newest version listed is what the store holds"
            assert hash_bytes(rejected(gate).encode()) not in hashes, "the rejected version is not listed"
    assert host.module("contested").VERSION == "original", "the previous version keeps serving"
    figures.record("rollback_race", **{kind: {"superseded_by_kept": True, "source_restored": False}})
