"""The turn checkpoint reuses a source's hash while the store's stamp of it (a file's inode, size, mtime and ctime; a
database row's newest version) stays the same, and reads everything else. These tests pin the cases where a
cheaper stamp would go stale silently: a same-size edit that keeps the mtime, an edit in the same clock tick as the
checkpoint, a database written by another tool, a database whose version trigger was dropped. Each checks the
checkpoint's tree against the bytes in the store, and that a rollback to the older checkpoint puts the old bytes
back (so a missed edit would lose it)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOADERS, sqlite_copy, store_of

from unit_mcp import Host, UnitService
from unit_mcp.folderloader import RECENT_NS, FilesystemLoader
from unit_mcp.loader import Source
from unit_mcp.paths import hash_bytes

UNITS = ("alpha", "beta")
HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


def make_units(root: Path) -> Path:
    for unit_id in UNITS:
        folder = root / unit_id
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text(f"NAME = {unit_id!r}\n")
        (folder / "data.txt").write_text("value = aaaa\n")
    return root


def age(root: Path) -> None:
    """Every file's mtime an hour back (its ctime is now: the stamp still waits RECENT_NS before it vouches)."""
    for path in root.rglob("*"):
        if path.is_file():
            os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))


def tree(svc: UnitService, checkpoint_id: int) -> dict[tuple[str, str], str]:
    got = svc.change_log.checkpoint_tree(checkpoint_id)
    assert got is not None
    return {(u, s): h for u, (_, sources) in got.units.items() for s, h in sources.items()}


def stored(svc: UnitService) -> dict[tuple[str, str], str]:
    """(unit, source) -> hash of the bytes the store holds now, read in full."""
    found = {}
    for unit_id in UNITS:
        kind = svc.loader.kind(unit_id)
        assert kind is not None
        for info in svc.loader.sources(unit_id, kind):
            found[(unit_id, info.source_id)] = info.hash
    return found


class CountingLoader(FilesystemLoader):
    """The folder loader, counting the sources it reads in full."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, git_history="off")
        self.reads = 0

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            self.reads += 1
        return super().read(source, max_bytes=max_bytes)


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[tuple[Path, CountingLoader, UnitService]]:
    root = make_units(tmp_path / "units")
    loader = CountingLoader(root)
    with Host(loader, tmp_path / "data", app_log=False) as host:
        yield root, loader, UnitService(host)


def wait_past_recent() -> None:
    time.sleep(RECENT_NS / 1e9 + 0.1)


def test_an_unchanged_source_is_not_read_again_and_a_changed_one_is(
    folder: tuple[Path, CountingLoader, UnitService],
) -> None:
    root, loader, svc = folder
    age(root)
    wait_past_recent()  # the ctimes the utime set are old enough to vouch for
    first = svc.checkpoint(label="first")
    loader.reads = 0
    second = svc.checkpoint(label="second")
    assert loader.reads == 0, "nothing changed: every hash comes from its stamp"
    assert tree(svc, second.checkpoint_id) == tree(svc, first.checkpoint_id) == stored(svc)
    (root / "beta" / "data.txt").write_text("value = a longer one\n")
    loader.reads = 0
    third = svc.checkpoint(label="third")
    assert loader.reads == 1, "only the edited source is read"
    assert tree(svc, third.checkpoint_id) == stored(svc) != tree(svc, first.checkpoint_id)


def test_a_same_size_edit_that_keeps_the_mtime_is_still_checkpointed(
    folder: tuple[Path, CountingLoader, UnitService],
) -> None:
    """An edit that keeps size and mtime (`cp -p`, `rsync -t`, or two edits in one tick of a coarse clock) changes
    the ctime, which no one can set back: a stamp of size and mtime alone would keep the old hash here."""
    root, _, svc = folder
    age(root)
    wait_past_recent()
    before = svc.checkpoint(label="before")
    path = root / "alpha" / "data.txt"
    with path.open("r+b") as f:
        f.write(b"value = bbbb\n")
    os.utime(path, ns=(HOUR_AGO_NS, HOUR_AGO_NS))
    assert path.stat().st_mtime_ns == HOUR_AGO_NS and path.stat().st_size == len(b"value = aaaa\n")
    wait_past_recent()  # even with the ctime old enough to vouch again, it is not the ctime of the stamp
    after = svc.checkpoint(label="after")
    assert tree(svc, after.checkpoint_id)[("alpha", "data.txt")] == hash_bytes(b"value = bbbb\n")
    assert tree(svc, after.checkpoint_id) == stored(svc)
    svc.rollback(before.checkpoint_id, force=True)
    assert path.read_bytes() == b"value = aaaa\n"


def test_a_same_size_edit_in_the_same_tick_as_the_checkpoint_is_still_checkpointed(
    folder: tuple[Path, CountingLoader, UnitService],
) -> None:
    """A file changed just before its stamp is taken gets none (its time could be shared by an edit to come)."""
    root, _, svc = folder
    path = root / "beta" / "data.txt"
    for n in range(5):
        text = f"value = {n:04d}\n".encode()
        path.write_bytes(text)
        made = svc.checkpoint(label=f"tick {n}")
        assert tree(svc, made.checkpoint_id)[("beta", "data.txt")] == hash_bytes(text)
    stamps = svc.loader.source_stamps({"beta": "directory"})
    assert stamps is not None and stamps["beta"]["data.txt"] is None


@pytest.mark.parametrize("trigger", ["kept", "dropped"])
def test_a_database_written_by_another_tool_is_still_checkpointed(tmp_path: Path, trigger: str) -> None:
    """The row's newest version changes with every write, whoever makes it; with the version trigger dropped (no
    version for the next write) the checkpoint hashes every source again."""
    store = sqlite_copy(make_units(tmp_path / "units"), tmp_path / "units.db")
    with Host(store, tmp_path / "data", app_log=False) as host:
        svc = UnitService(host)
        before = svc.checkpoint(label="before")
        svc.checkpoint(label="stamps taken")
        with sqlite3.connect(tmp_path / "units.db") as conn:
            if trigger == "dropped":
                conn.execute("DROP TRIGGER source_changed")
            conn.execute("UPDATE sources SET data = ? WHERE unit_id = 'alpha' AND source_id = 'data.txt'", (b"x" * 13,))
        conn.close()
        assert (svc.loader.source_stamps({"alpha": "directory"}) is None) == (trigger == "dropped")
        after = svc.checkpoint(label="after")
        assert tree(svc, after.checkpoint_id)[("alpha", "data.txt")] == hash_bytes(b"x" * 13)
        assert tree(svc, after.checkpoint_id) == stored(svc) != tree(svc, before.checkpoint_id)


@pytest.fixture(params=LOADERS)
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    store = store_of(request, make_units(tmp_path / "units"), tmp_path)
    with Host(store, tmp_path / "data", app_log=False) as host:
        yield UnitService(host)


def test_stamps_follow_every_tool_write_and_rollback(any_store: UnitService) -> None:
    """Over every loader: checkpoints between tool writes, creates and a rollback each hold what the store holds."""
    svc = any_store
    first = svc.checkpoint(label="first")
    svc.apply_patch("alpha", "data.txt", old="aaaa", new="bbbb")
    assert tree(svc, svc.checkpoint(label="patched").checkpoint_id) == stored(svc)
    svc.create_source("beta", "more.txt", source="more\n")
    assert tree(svc, svc.checkpoint(label="created").checkpoint_id) == stored(svc)
    svc.rollback(first.checkpoint_id)
    assert tree(svc, svc.checkpoint(label="rolled back").checkpoint_id) == stored(svc) == tree(svc, first.checkpoint_id)
