"""What each tool's annotations promise, pinned once and stated once: the README's tools table says what a
real client sees in `tools/list` (risk, read-only, destructive), for every tool including the history ones."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import sqlite_copy
from mcp import Client

from unit_mcp import Host, UnitService
from unit_mcp.tools import RISK_META_KEY, UnitTools
from unit_mcp.wire import DRY_RUN_RISK_META_KEY

pytestmark = pytest.mark.anyio
README = Path(__file__).resolve().parent.parent / "README.md"
ROW = re.compile(r"^\| `(unit_\w+)` \| ([\w-]+)(?: \(a dry run: ([\w-]+)\))? \| (yes|no) \| (yes|no) \|", re.MULTILINE)


@pytest.fixture
def history_tools(units_root: Path, tmp_path: Path) -> Iterator[UnitTools]:
    """A loader that keeps history, so every tool is listed."""
    with Host(sqlite_copy(units_root, tmp_path / "units.db"), tmp_path / "data") as started:
        yield UnitTools(UnitService(started, test_timeout=30))


def readme_table() -> dict[str, tuple[str, str | None, bool, bool]]:
    section = README.read_text(encoding="utf-8").split("## The tools\n", 1)[1].split("\n## ", 1)[0]
    return {name: (risk, dry or None, ro == "yes", de == "yes") for name, risk, dry, ro, de in ROW.findall(section)}


async def test_unit_reload_is_destructive(history_tools: UnitTools) -> None:
    """A reload drops the running module and its state is only restored if the unit's snapshot/restore work."""
    async with Client(history_tools.server()) as client:
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    annotations = listed["unit_reload"].annotations
    assert annotations is not None
    assert annotations.destructive_hint is True and annotations.read_only_hint is False


async def test_readme_tools_table_matches_the_listed_annotations(history_tools: UnitTools) -> None:
    async with Client(history_tools.server()) as client:
        listed = (await client.list_tools()).tools
    table = readme_table()
    assert sorted(table) == sorted(tool.name for tool in listed), "the README table lists exactly the tools"
    for tool in listed:
        assert tool.annotations is not None and tool.meta is not None
        hints = tool.annotations
        risks = (tool.meta[RISK_META_KEY], tool.meta.get(DRY_RUN_RISK_META_KEY))
        seen = (*risks, bool(hints.read_only_hint), bool(hints.destructive_hint))
        assert table[tool.name] == seen, f"README's row for {tool.name} says {table[tool.name]}, the server {seen}"
