"""The blob store behind checkpoints (issue 36 item 1): content shared between checkpoints, the retention (count and
bytes: the oldest unreferenced blobs first; a checkpoint whose blobs are gone says so), and a truncated or missing
blob refusing the rollback with a clear error, writing nothing."""

from __future__ import annotations

import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOADERS, copy_units, store_of
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from unit_mcp import Host, UnitService, blobstore
from unit_mcp.blobstore import BlobRetention, Tree
from unit_mcp.changelog import NOBODY, SqliteChangeLog
from unit_mcp.errors import UnitError
from unit_mcp.paths import hash_bytes

# -- retention, as a property ---------------------------------------------------------------------------------

CONTENTS = [bytes([65 + i]) * (10 + 7 * i) for i in range(12)]
"""The sources the property's checkpoints pick from: 12 blobs of different sizes."""
checkpoints = st.lists(
    st.dictionaries(st.sampled_from(["a.py", "b.py", "c.py", "d.txt"]), st.sampled_from(range(len(CONTENTS)))),
    min_size=1,
    max_size=8,
)


def take(log: SqliteChangeLog, picked: dict[str, int], now: float) -> int:
    sources = {name: hash_bytes(CONTENTS[i]) for name, i in picked.items()}
    log.clock = lambda: now
    made = log.checkpoint(None, NOBODY, Tree({"u": ("directory", sources)}), {hash_bytes(c): c for c in CONTENTS})
    return made.id


def state_of(log: SqliteChangeLog) -> tuple[dict[str, tuple[float, int]], dict[int, set[str]]]:
    """(hash → (stored, size)) of every blob, and each listed checkpoint's blobs (tree and sources)."""
    conn = sqlite3.connect(log.path)
    try:
        blobs = {h: (t, n) for h, t, n in conn.execute("SELECT hash, stored, size FROM blobs")}
        refs: dict[int, set[str]] = {}
        for checkpoint_id, tree in conn.execute("SELECT checkpoint_id, tree FROM checkpoint_trees"):
            row = conn.execute("SELECT data FROM blobs WHERE hash = ?", (tree,)).fetchone()
            units = Tree.decode(row[0]) if row else {}
            refs[checkpoint_id] = {tree, *(h for _, s in units.values() for h in s.values())}
        return blobs, refs
    finally:
        conn.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(taken=checkpoints, keep=st.integers(1, 8), bound=st.integers(0, 1500))
@example(taken=[{"a.py": 0, "b.py": 0, "c.py": 1}, {"a.py": 0, "b.py": 0}], keep=2, bound=491)  # over by the older tree
def test_retention_removes_the_oldest_unreferenced_blobs_and_nothing_else(
    taken: list[dict[str, int]], keep: int, bound: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log = SqliteChangeLog(Path(tmp) / "changes.db")
        try:
            log.blob_retention = BlobRetention(checkpoints=10**6, bytes=10**9)  # no retention while they are taken
            for i, picked in enumerate(taken):
                take(log, picked, 1000.0 + i)
            log.blob_retention = BlobRetention(checkpoints=keep, bytes=bound)
            blobs, refs = state_of(log)  # what each checkpoint needs, read before the pruning removes any of it
            ids_before = sorted(refs)
            removed = set(log.prune_blobs())
            after, refs_after = state_of(log)
            kept_ids = sorted(refs_after)
            assert kept_ids == ids_before[-keep:]  # the newest `keep` checkpoints stay listed
            referenced = set().union(*(refs[i] for i in kept_ids))
            assert removed == blobs.keys() - after.keys()  # it says what it removed
            total = sum(n for _, n in after.values())
            unreferenced_before = blobs.keys() - referenced
            if sum(blobs[h][1] for h in referenced) <= bound:
                # enough room for what is referenced: only unreferenced blobs go, oldest first, until under the bound
                assert removed <= unreferenced_before
                assert total <= bound
                left = unreferenced_before - removed
                if left and removed:  # oldest first: every one removed is older than every one left
                    assert max((blobs[h][0], h) for h in removed) < min((blobs[h][0], h) for h in left)
                if sum(n for _, n in blobs.values()) <= bound:
                    assert not removed  # under the bound nothing goes
            else:
                # not enough room: every unreferenced blob goes, then what only older checkpoints need; the newest
                # checkpoint keeps all of its own, and one that lost a blob says so
                assert not (after.keys() & unreferenced_before)
                assert refs[kept_ids[-1]] <= after.keys()
                for checkpoint_id in kept_ids:
                    if not refs[checkpoint_id] <= after.keys():
                        with pytest.raises(blobstore.BlobMissing):
                            tree = log.checkpoint_tree(checkpoint_id)
                            assert tree is not None
                            log.blobs([h for _, s in tree.units.values() for h in s.values()])
        finally:
            log.close()


def test_a_checkpoint_of_unchanged_sources_shares_every_blob(tmp_path: Path) -> None:
    log = SqliteChangeLog(tmp_path / "changes.db")
    try:
        first = take(log, {"a.py": 1, "b.py": 2}, 1.0)
        size = log.blob_usage()
        second = take(log, {"a.py": 1, "b.py": 2}, 2.0)
        assert log.blob_usage() == size and first != second
        assert log.checkpoint_tree(first) == log.checkpoint_tree(second)
    finally:
        log.close()


# -- 1,000 unchanged units ------------------------------------------------------------------------------------


def db_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = int(conn.execute("PRAGMA page_count").fetchone()[0])
        return pages * int(conn.execute("PRAGMA page_size").fetchone()[0])
    finally:
        conn.close()


def test_two_checkpoints_of_1000_unchanged_units_add_at_most_1_percent(tmp_path: Path) -> None:
    root = tmp_path / "units"
    root.mkdir()
    for i in range(1000):
        body = "".join(f"def f{j}(x):\n    return x + {i * 100 + j}\n\n" for j in range(30))
        (root / f"u{i:04d}.py").write_text(f'"""Unit {i}."""\n\n{body}')
    with Host(root, tmp_path / "data", app_log=False) as host:
        svc = UnitService(host)
        first = svc.checkpoint(label="first")
        assert first.units == 1000 and first.bytes_added > 1000 * 900
        blobs, stored = host.changes.blob_usage()  # type: ignore[attr-defined]
        before = db_bytes(tmp_path / "data" / "changes.db")
        second = svc.checkpoint(label="second")
        third = svc.checkpoint(label="third")
        after = db_bytes(tmp_path / "data" / "changes.db")
        assert second.bytes_added == third.bytes_added == 0
        assert host.changes.blob_usage() == (blobs, stored)  # type: ignore[attr-defined]
        growth = (after - before) / before
        print(f"\nstore {before} bytes after the first checkpoint, +{after - before} ({growth:.4%}) after two more")
        assert growth <= 0.01


# -- a damaged checkpoint refuses, writing nothing -------------------------------------------------------------


@pytest.fixture(params=LOADERS)
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    store = store_of(request, copy_units(tmp_path / "units"), tmp_path)
    with Host(store, tmp_path / "data", app_log=False) as host:
        yield UnitService(host)


def damage(svc: UnitService, digest: str, how: str) -> None:
    log = svc.change_log
    with log._transaction() as conn:  # type: ignore[attr-defined]
        if how == "missing":
            log._run(conn, "DELETE FROM blobs WHERE hash = ?", (digest,))  # type: ignore[attr-defined]
        else:
            log._run(conn, "UPDATE blobs SET data = substr(data, 1, 5) WHERE hash = ?", (digest,))  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["missing", "truncated"])
def test_a_missing_or_truncated_blob_refuses_the_rollback_and_writes_nothing(served: UnitService, how: str) -> None:
    svc = served
    mark = svc.checkpoint(label="before")
    svc.apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
    svc.apply_patch("notes", "__init__.py", old="café au lait", new="café crème")
    tree = svc.change_log.checkpoint_tree(mark.checkpoint_id)
    assert tree is not None
    damage(svc, tree.units["notes"][1]["__init__.py"], how)
    now = {u: svc.read_source(u, s).hash for u, s in [("greeter", "greeter.py"), ("notes", "__init__.py")]}
    latest = svc.change_log.latest_id()
    with pytest.raises(UnitError) as refused:
        svc.rollback(mark.checkpoint_id)
    assert refused.value.code == "checkpoint_incomplete"
    said = refused.value.message
    assert f"Checkpoint {mark.checkpoint_id} cannot be rolled back to" in said and "nothing was written" in said
    assert ("gone from the store" if how == "missing" else "damaged") in said
    assert {u: svc.read_source(u, s).hash for u, s in [("greeter", "greeter.py"), ("notes", "__init__.py")]} == now
    refusal = svc.change_log.changes(after_id=latest)
    assert [(c.tool, c.outcome, c.error_code, c.sources) for c in refusal] == [
        ("unit_rollback", "refused", "checkpoint_incomplete", ())
    ]
    # the tree itself gone: the same refusal
    damage(svc, hash_bytes(tree.encode()), how)
    with pytest.raises(UnitError, match="cannot be rolled back to"):
        svc.rollback(mark.checkpoint_id, dry_run=True)
