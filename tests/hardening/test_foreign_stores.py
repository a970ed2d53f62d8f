"""Stores that are not ours: an application's own database given as `--units sqlite:`, unit ids in a database
that no folder could hold, a version number past any integer, and who may read a new units database."""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import sqlite_copy

from unit_mcp import Host, UnitService
from unit_mcp.bridge import Bridge
from unit_mcp.loader import ForeignStore
from unit_mcp.sqliteloader import SqliteLoader
from unit_mcp.tools import UnitTools

from .clients import call, connect
from .report import Report

pytestmark = pytest.mark.anyio


def fingerprint(folder: Path) -> dict[str, str]:
    """Every file in `folder` with the hash of its bytes."""
    return {path.name: hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(folder.iterdir())}


def test_an_applications_own_database_is_refused_before_anything_is_written(tmp_path: Path, figures: Report) -> None:
    app = tmp_path / "app"
    app.mkdir()
    db = app / "app.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO users (name) VALUES ('ada')")
    conn.close()
    before = fingerprint(app)

    server = subprocess.run(
        [sys.executable, "-m", "unit_mcp.server", "--units", f"sqlite:{db}", "--no-watch"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert server.returncode != 0 and "Traceback" not in server.stderr, server.stderr
    (error,) = [line for line in server.stderr.splitlines() if "error:" in line]
    assert f"--units sqlite:{db} is not a units database (it holds the tables 'users'" in error, error
    assert "nothing was written to it" in error
    with pytest.raises(ForeignStore, match="is not a units database"):
        SqliteLoader(db)
    with pytest.raises(ForeignStore):
        Host(f"sqlite:{db}", tmp_path / "data").start()
    assert fingerprint(app) == before, "no table, trigger, user_version, WAL or -shm file was added"
    figures.record("foreign_stores", application_database="refused untouched")


@pytest.mark.parametrize(
    ("content", "problem"),
    [(b"", "is an empty file, not a units database"), (b"notes\n", "is not a units database (not SQLite)")],
)
def test_a_file_that_is_not_a_units_database_is_refused_untouched_in_one_line(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    """An existing file (empty, or anything else) given as `--units sqlite:PATH` never becomes a database."""
    db = tmp_path / "kept" / "notes.db"
    db.parent.mkdir()
    db.write_bytes(content)
    server = subprocess.run(
        [sys.executable, "-m", "unit_mcp.server", "--units", f"sqlite:{db}", "--no-watch"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert server.returncode != 0 and len(server.stderr.splitlines()) == 1, server.stderr
    assert f"--units sqlite:{db} {problem}; nothing was written to it. Give a new file" in server.stderr
    with pytest.raises(ForeignStore, match=problem.replace("(", r"\(").replace(")", r"\)")):
        SqliteLoader(db)
    assert [p.name for p in db.parent.iterdir()] == ["notes.db"] and db.read_bytes() == content


def test_loaders_opening_one_new_database_at_once_all_open_it(tmp_path: Path) -> None:
    """A new units database is never seen half made (an empty file would be refused): eight loaders at once."""
    db = tmp_path / "new.db"
    opened: list[SqliteLoader] = []
    failed: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(SqliteLoader(db))
        except BaseException as exc:  # reported below
            failed.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for loader in opened:
        loader.close()
    assert not failed and len(opened) == 8, failed
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("new.db-")) == ["new.db"]
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


BAD_IDS = ["has space", "class", "../../x", "ok.evil", "new\nline"]


async def test_unit_ids_the_folder_loader_would_refuse_are_skipped_not_loaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, figures: Report
) -> None:
    db = tmp_path / "units.db"
    marker = tmp_path / "imported"
    loader = SqliteLoader(db)
    loader.put_unit("fine", "file", {"fine.py": b"X = 1\n"}, replace=False)
    loader.close()
    planted = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n".encode()
    with sqlite3.connect(db) as conn:  # another tool writes hostile rows straight into the tables
        for index, unit_id in enumerate(BAD_IDS):  # directory and file units, each with its primary source
            kind, primary = ("directory", "__init__.py") if index % 2 else ("file", unit_id + ".py")
            conn.execute("INSERT INTO units (unit_id, kind) VALUES (?, ?)", (unit_id, kind))
            conn.execute("INSERT INTO sources VALUES (?, ?, ?)", (unit_id, primary, planted))
    conn.close()

    with caplog.at_level(logging.WARNING, "unit_mcp.sqliteloader"), Host(f"sqlite:{db}", tmp_path / "data") as host:
        assert list(host.unit_kinds()) == ["fine"]
        assert host.is_loaded("fine") and not marker.exists(), "no hostile unit was imported"
        tools = UnitTools(UnitService(host))
        async with Bridge(tools.server()) as bridge, connect(bridge.url or "", bridge.token) as client:
            listed = await call(client, "unit_list", {})
            assert listed.structured is not None and [u["unit_id"] for u in listed.structured["units"]] == ["fine"]
            for unit_id in BAD_IDS:
                refused = await call(client, "unit_inspect", {"unit_id": unit_id})
                assert refused.code == "invalid_unit_id", refused.text
    skipped = [record.getMessage() for record in caplog.records if "skipped" in record.getMessage()]
    assert len(skipped) == len(BAD_IDS), skipped  # each logged once, however often the units are listed
    assert all("\n" not in line for line in skipped), "a hostile id cannot start a log line of its own"
    figures.record("foreign_stores", hostile_unit_ids_skipped=len(skipped))


async def test_a_version_number_past_any_integer_is_an_invalid_argument(units_root: Path, tmp_path: Path) -> None:
    with Host(sqlite_copy(units_root, tmp_path / "units.db"), tmp_path / "data") as host:
        tools = UnitTools(UnitService(host))
        async with Bridge(tools.server()) as bridge, connect(bridge.url or "", bridge.token) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            schema = listed["unit_revert"].input_schema["properties"]["version"]
            assert schema["maximum"] == 2**63 - 1, schema
            arguments = {"unit_id": "greeter", "source_id": "greeter.py", "version": 99999999999999999999}
            result = await call(client, "unit_revert", arguments)
            assert result.code == "invalid_argument" and "version" in result.text, result.text


def test_a_new_units_database_is_private_to_its_owner(tmp_path: Path) -> None:
    db = tmp_path / "new.db"
    umask = os.umask(0o022)
    try:
        loader = SqliteLoader(db)
        loader.put_unit("fine", "file", {"fine.py": b"X = 1\n"}, replace=False)
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in tmp_path.glob("new.db*")}
        loader.close()
    finally:
        os.umask(umask)
    assert modes == {"new.db": 0o600, "new.db-wal": 0o600, "new.db-shm": 0o600}, modes
