"""Several stores in one server (`--units` given more than once): each unit is served from the store that holds it,
a unit id held by two stores is refused at start, and every tool, the change log, checkpoints and rollback work
across them (a rollback across two stores is all or nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import copy_units, postgres_copy, sqlite_copy

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.loader import Source, stores_address

LEDGER_V1 = """\"\"\"A ledger whose state only its own version can restore.\"\"\"

VERSION = 1
total = 0


def snapshot():
    return {"v": VERSION, "total": total}


def restore(state):
    global total
    if state.get("v") != VERSION:
        raise ValueError("a state of another version")
    total = state["total"]
"""
LEDGER_V2 = LEDGER_V1.replace("VERSION = 1", "VERSION = 2").replace(
    '    if state.get("v") != VERSION:\n        raise ValueError("a state of another version")\n', ""
)
LEDGER_TEST = "import units.ledger as ledger\n\n\ndef main():\n    assert ledger.VERSION >= 1\n"


def second_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A store beside the examples folder, holding the unit `ledger`."""
    folder = tmp_path / "second"
    (folder / "ledger").mkdir(parents=True)
    (folder / "ledger" / "__init__.py").write_text(LEDGER_V1)
    (folder / "ledger" / "test_init.py").write_text(LEDGER_TEST)
    if kind == "sqlite":
        return sqlite_copy(folder, tmp_path / "second.db")
    return postgres_copy(request.getfixturevalue("pg_cluster"), folder)


@pytest.fixture(params=["sqlite", "postgres"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    examples = copy_units(tmp_path / "units", fixtures=False)
    address = stores_address([str(examples), second_store(request.param, tmp_path, request)])
    with Host(address, tmp_path / "data") as host:
        yield UnitService(host, test_timeout=60)


def test_each_unit_is_served_from_its_store_and_edited_there(service: UnitService, tmp_path: Path) -> None:
    listed = {unit.unit_id for unit in service.list().units}
    assert listed == {"counter", "greeter", "notes", "weather", "ledger"}
    assert service.host.module("ledger").VERSION == 1
    service.apply_patch("ledger", "__init__.py", old="total = 0\n", new="total = 5\n")
    service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
    assert "step = 2" in (tmp_path / "units" / "counter" / "__init__.py").read_text()
    assert not (tmp_path / "units" / "ledger").exists(), "the ledger lives in the second store only"
    assert b"total = 5" in service.loader.read(Source("ledger", "directory", "__init__.py"))
    assert service.run_tests("ledger").passed, "the test host opens both stores"
    assert str(tmp_path) not in service.inspect("ledger").model_dump_json(), "every store's path is redacted"


def test_a_rollback_across_two_stores_is_all_or_nothing(service: UnitService) -> None:
    mark = service.checkpoint("before")
    service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
    service.apply_patch("ledger", "__init__.py", old=LEDGER_V1, new=LEDGER_V2)
    patched = {unit: service.read_source(unit, "__init__.py").hash for unit in ("counter", "ledger")}
    with pytest.raises(UnitError) as caught:  # ledger v1 cannot restore v2's state: its reload fails
        service.rollback(mark.checkpoint_id)
    assert caught.value.code == "reload_failed" and "nothing changed" in caught.value.message
    assert {unit: service.read_source(unit, "__init__.py").hash for unit in ("counter", "ledger")} == patched
    assert service.host.module("counter").step == 2 and service.host.module("ledger").VERSION == 2
    (record,) = service.changes(limit=1).changes
    assert record.tool == "unit_rollback" and record.outcome == "rolled_back"


def test_a_rollback_across_two_stores_puts_both_back_in_one_record(service: UnitService) -> None:
    mark = service.checkpoint("before")
    service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
    service.apply_patch("ledger", "__init__.py", old="total = 0\n", new="total = 7\n")
    done = service.rollback(mark.checkpoint_id)
    assert sorted(done.reloaded) == ["counter", "ledger"] and not done.conflicts
    assert {(s.unit_id, s.action) for s in done.sources} == {("counter", "restored"), ("ledger", "restored")}
    assert service.host.module("counter").step == 1 and b"total = 0" in service.loader.read(
        Source("ledger", "directory", "__init__.py")
    )
    (record,) = service.changes(limit=1).changes
    assert record.change_id == done.change_id and record.sources_total == 2


def test_a_unit_id_held_by_two_stores_is_refused_at_start_in_one_line(tmp_path: Path) -> None:
    first, second = copy_units(tmp_path / "a", fixtures=False), copy_units(tmp_path / "b", fixtures=False)
    done = subprocess.run(
        [sys.executable, "-m", "unit_mcp.server", "--no-watch", "--units", str(first), "--units", str(second)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        stdin=subprocess.DEVNULL,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert "counter" in lines[0] and "one store only" in lines[0] and "Traceback" not in done.stderr


def test_a_start_over_two_folders_holds_each_root_and_refuses_a_linked_module(tmp_path: Path) -> None:
    """`Stores.reading_all` holds every member's root for the start's reads: each unit is read from its own
    store, a linked module is refused there as in a single folder, and both roots are closed after the start."""
    first, second, outside = tmp_path / "first", tmp_path / "second", tmp_path / "outside"
    for folder in (first, second, outside):
        folder.mkdir()
    (first / "alpha.py").write_text(
        "import contextlib\nimport os\n\nWHERE = 'first'\nHELD = set()\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    with contextlib.suppress(OSError):\n        HELD.add(os.readlink(f'/proc/self/fd/{fd}'))\n"
    )
    (second / "beta.py").write_text("WHERE = 'second'\n")
    (outside / "leak.py").write_text("SECRET = 1\n")
    (second / "gamma").mkdir()
    (second / "gamma" / "__init__.py").write_text("from . import leak\n")
    (second / "gamma" / "leak.py").symlink_to(outside / "leak.py")
    open_before = len(os.listdir("/proc/self/fd"))
    with Host(stores_address([str(first), str(second)]), tmp_path / "data", app_log=False) as host:
        assert [host.module(u).WHERE for u in ("alpha", "beta")] == ["first", "second"]  # type: ignore[union-attr]
        assert {str(first.resolve()), str(second.resolve())} <= host.module("alpha").HELD  # type: ignore[union-attr]
        assert "linked, irregular or outside source refused" in (host.load_error("gamma") or "")
    assert len(os.listdir("/proc/self/fd")) == open_before
