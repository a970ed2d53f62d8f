"""The content-addressed store behind checkpoints: every source's bytes kept once, by hash, shared between checkpoints.

A checkpoint's *tree* is itself a blob (JSON: each unit in its scope, with its kind and each source's hash), and so
is its optional *state* (JSON: each unit's `snapshot()` state); `checkpoint_trees` ties a checkpoint to both. Two
checkpoints of unchanged units therefore share every blob, the tree included: the second adds one row.

The functions here take `run(sql, args)` from the change log's transaction (`changelog.SqlChangeLog`), so they are
written once for SQLite and PostgreSQL (`?` parameters; the change log puts them in the database's dialect), and
live in the change log's database: the data dir's `changes.db` for a folder of units, the units database itself for
SQLite and PostgreSQL stores. Bounded by a `BlobRetention` (see `prune`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .paths import hash_bytes

Run = Callable[[str, Sequence[object]], Any]
"""Runs one statement in the caller's transaction and returns its cursor (fetchone/fetchall)."""

SQLITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS blobs (
    hash TEXT NOT NULL UNIQUE,
    size INTEGER NOT NULL,
    stored REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS blobs_by_age ON blobs (stored, hash);
CREATE TABLE IF NOT EXISTS checkpoint_trees (
    checkpoint_id INTEGER PRIMARY KEY,
    tree TEXT NOT NULL,
    state TEXT
);
"""
BLOB_TABLES = ("blobs", "checkpoint_trees")
MAX_IN = 500
"""Hashes per `IN (...)` list."""


@dataclass(frozen=True)
class BlobRetention:
    """How much the blob store keeps: the newest `checkpoints` checkpoints with content, and at most `bytes` of blobs.
    Over `bytes`, the blobs no kept checkpoint references go first (oldest first); if that is not enough, the blobs
    only the oldest checkpoints need (the newest checkpoint keeps all of its own): such a checkpoint is still listed
    and says its content is gone."""

    checkpoints: int = 200
    bytes: int = 1 << 30


DEFAULT_BLOB_RETENTION = BlobRetention()


class BlobMissing(Exception):
    """A blob a checkpoint needs is gone or does not hash to its name (truncated, altered)."""

    def __init__(self, digest: str, why: str) -> None:
        super().__init__(f"blob {digest} {why}")
        self.digest = digest
        self.why = why


@dataclass(frozen=True)
class Tree:
    """What a checkpoint holds: unit id → (kind, {source id: hash}), and unit id → state (JSON value) if kept."""

    units: dict[str, tuple[str, dict[str, str]]]
    states: dict[str, Any] | None = None

    def encode(self) -> bytes:
        return _json({u: {"kind": k, "sources": s} for u, (k, s) in self.units.items()})

    @staticmethod
    def decode(data: bytes) -> dict[str, tuple[str, dict[str, str]]]:
        raw = json.loads(data)
        return {u: (str(v["kind"]), {str(s): str(h) for s, h in v["sources"].items()}) for u, v in raw.items()}


class Fetched:
    """Rows already read, as the cursor `Run` returns (for reads outside a transaction)."""

    def __init__(self, rows: list[Any]) -> None:
        self.rows = rows

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows

    def __iter__(self) -> Any:
        return iter(self.rows)


def _json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def to_bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def present(run: Run, digests: Iterable[str]) -> set[str]:
    """Which of `digests` the store holds."""
    wanted, found = sorted(set(digests)), set[str]()
    for start in range(0, len(wanted), MAX_IN):
        chunk = wanted[start : start + MAX_IN]
        rows = run(f"SELECT hash FROM blobs WHERE hash IN ({','.join('?' * len(chunk))})", chunk).fetchall()
        found.update(str(row[0]) for row in rows)
    return found


def put(run: Run, blobs: Mapping[str, bytes], now: float) -> int:
    """Store `blobs` (hash → bytes) not stored yet; returns the bytes added."""
    added = 0
    have = present(run, blobs)
    for digest, data in sorted(blobs.items()):
        if digest in have:
            continue
        if hash_bytes(data) != digest:
            raise ValueError(f"blob {digest} does not hash to its name")
        run("INSERT INTO blobs (hash, size, stored, data) VALUES (?, ?, ?, ?)", (digest, len(data), now, data))
        added += len(data)
    return added


def get(run: Run, digests: Iterable[str]) -> dict[str, bytes]:
    """The bytes of `digests`, each checked against its hash; `BlobMissing` for the first gone or altered."""
    wanted = sorted(set(digests))
    found: dict[str, bytes] = {}
    for start in range(0, len(wanted), MAX_IN):
        chunk = wanted[start : start + MAX_IN]
        for digest, data in run(
            f"SELECT hash, data FROM blobs WHERE hash IN ({','.join('?' * len(chunk))})", chunk
        ).fetchall():
            found[str(digest)] = to_bytes(data)
    for digest in wanted:
        if digest not in found:
            raise BlobMissing(digest, "is gone from the store (its retention dropped it, or it was deleted)")
        if hash_bytes(found[digest]) != digest:
            raise BlobMissing(digest, f"is damaged: its {len(found[digest])} bytes do not hash to its name")
    return found


def add_checkpoint(run: Run, checkpoint_id: int, tree: Tree, blobs: Mapping[str, bytes], now: float) -> int:
    """The checkpoint's tree (and state) with the blobs it needs that are not stored yet; returns bytes added."""
    encoded = tree.encode()
    extra = {hash_bytes(encoded): encoded}
    state_hash = None
    if tree.states is not None:
        state = _json(tree.states)
        state_hash = hash_bytes(state)
        extra[state_hash] = state
    added = put(run, {**blobs, **extra}, now)
    run(
        "INSERT INTO checkpoint_trees (checkpoint_id, tree, state) VALUES (?, ?, ?)",
        (checkpoint_id, hash_bytes(encoded), state_hash),
    )
    return added


def tree_of(run: Run, checkpoint_id: int) -> tuple[str, str | None] | None:
    """(tree hash, state hash) of a checkpoint; None for one taken without content (before this store)."""
    row = run("SELECT tree, state FROM checkpoint_trees WHERE checkpoint_id = ?", (checkpoint_id,)).fetchone()
    return None if row is None else (str(row[0]), None if row[1] is None else str(row[1]))


def _references(run: Run, ids: Sequence[int]) -> dict[int, set[str]]:
    """Each checkpoint's blobs (tree, state, sources), as far as its tree is still stored."""
    out: dict[int, set[str]] = {}
    trees: dict[str, set[str]] = {}
    for checkpoint_id, tree, state in run(
        "SELECT checkpoint_id, tree, state FROM checkpoint_trees ORDER BY checkpoint_id", ()
    ).fetchall():
        if int(checkpoint_id) not in ids:
            continue
        tree = str(tree)
        if tree not in trees:
            row = run("SELECT data FROM blobs WHERE hash = ?", (tree,)).fetchone()
            try:
                units = Tree.decode(to_bytes(row[0])) if row is not None else {}
            except (ValueError, KeyError, TypeError, AttributeError):
                units = {}
            trees[tree] = {h for _, sources in units.values() for h in sources.values()}
        out[int(checkpoint_id)] = {tree, *trees[tree], *([str(state)] if state is not None else [])}
    return out


def prune(run: Run, retention: BlobRetention) -> list[str]:
    """Apply the retention (see `BlobRetention`) in the caller's transaction; returns the hashes removed."""
    run("DELETE FROM checkpoint_trees WHERE checkpoint_id NOT IN (SELECT id FROM checkpoints)", ())
    ids = [int(r[0]) for r in run("SELECT checkpoint_id FROM checkpoint_trees ORDER BY checkpoint_id DESC", ())]
    for old in ids[retention.checkpoints :]:
        run("DELETE FROM checkpoint_trees WHERE checkpoint_id = ?", (old,))
        run("DELETE FROM checkpoints WHERE id = ?", (old,))
    ids = ids[: retention.checkpoints]
    total = int(run("SELECT coalesce(sum(size), 0) FROM blobs", ()).fetchone()[0])
    if total <= retention.bytes:
        return []
    refs = _references(run, ids)
    kept = set().union(*refs.values()) if refs else set()
    removed: list[str] = []
    for digest, size in run("SELECT hash, size FROM blobs ORDER BY stored, hash", ()).fetchall():
        if total <= retention.bytes:
            break
        if str(digest) not in kept:
            removed.append(str(digest))
            total -= int(size)
    for oldest in sorted(ids)[:-1]:  # still over: what only the oldest checkpoints need (never the newest's)
        if total <= retention.bytes:
            break
        newer = set().union(*(refs[i] for i in refs if i > oldest))
        for digest in sorted(refs.get(oldest, set()) - newer - set(removed)):
            row = run("SELECT size FROM blobs WHERE hash = ?", (digest,)).fetchone()
            if row is not None:
                removed.append(digest)
                total -= int(row[0])
    for start in range(0, len(removed), MAX_IN):
        chunk = removed[start : start + MAX_IN]
        run(f"DELETE FROM blobs WHERE hash IN ({','.join('?' * len(chunk))})", chunk)
    return removed


def stored_bytes(run: Run) -> tuple[int, int]:
    """(blobs, bytes) the store holds."""
    row = run("SELECT count(*), coalesce(sum(size), 0) FROM blobs", ()).fetchone()
    return int(row[0]), int(row[1])
