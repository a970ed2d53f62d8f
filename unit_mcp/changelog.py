"""The change log: one record per write a tool made or tried, and per change made outside the tools, kept with the
bytes before and after each source it changed (so undo needs no git), and checkpoints to roll back to.

`ChangeLog` is the interface a store implements; `SqlChangeLog` implements it in SQL, kept by `SqliteChangeLog` in a
SQLite file (the units database itself, so every server on it sees every change, or a private `changes.db` in the
data dir for the folder loader) and by `pgloader.PostgresChangeLog` in the units database. One transaction per
record, so a SIGKILL loses at most the record being written. Bounded by a `Retention`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NotRequired, Protocol, TypedDict, Unpack

from . import blobstore
from .blobstore import DEFAULT_BLOB_RETENTION, BlobRetention, Tree
from .database import Conn, PostgresDatabase, SqliteDatabase
from .paths import hash_bytes
from .wire import Risk

Outcome = Literal[
    "applied", "refused", "rolled_back", "failed", "outside", "asked", "approved", "declined", "unanswered", "withdrawn"
]
"""applied: written (and reloaded); refused: nothing written (with its code); rolled_back: written, the reload failed
and the previous bytes were put back; failed: an unexpected error; outside: a change made outside the tools. A call
that waits for a person's yes (`--confirm`) adds asked, then approved, declined, unanswered or withdrawn (its client
went away); these change no source."""
Action = Literal["modified", "created", "removed", "unknown"]
"""What happened to one source; `unknown`: an outside change whose previous bytes the log never saw."""

PRUNE_EVERY = 64
"""Records between two retention passes (each pass is one indexed DELETE)."""


@dataclass(frozen=True)
class Retention:
    """How much of the log is kept: records younger than `days`, at most `records` of them."""

    days: float = 30.0
    records: int = 10_000


@dataclass(frozen=True)
class Caller:
    """Who made a tool call: the MCP client's `clientInfo` and its session, where there is one."""

    name: str | None = None
    version: str | None = None
    session_id: str | None = None


PAGE = Caller(name="unit-mcp page")
"""The unit server's page as a caller; an MCP client cannot take this name (`tools` renames one that claims it)."""

DEFAULT_RETENTION = Retention()
NOBODY = Caller()
"""The caller of a change made outside MCP (a Python caller of the service, a human's editor)."""


@dataclass(frozen=True)
class SourceChange:
    """One source in a change set; `data_before`/`data_after` are None when absent (created, removed, not kept)."""

    unit_id: str
    source_id: str
    action: Action
    hash_before: str | None
    hash_after: str | None
    data_before: bytes | None = None
    data_after: bytes | None = None


@dataclass(frozen=True)
class Change:
    """One record. `unit_id`/`source_id` name the call's target (None for a call across units, e.g. a rollback);
    `sources` is the change set (without bytes unless asked for)."""

    id: int
    time: str
    caller: Caller
    tool: str | None
    unit_id: str | None
    source_id: str | None
    outcome: Outcome
    error_code: str | None
    message: str | None
    duration_ms: float
    sources: tuple[SourceChange, ...] = field(default=())

    @property
    def hash_before(self) -> str | None:
        return self.sources[0].hash_before if len(self.sources) == 1 else None

    @property
    def hash_after(self) -> str | None:
        return self.sources[0].hash_after if len(self.sources) == 1 else None


@dataclass(frozen=True)
class Checkpoint:
    id: int
    time: str
    label: str | None
    after_change: int
    """The newest change id when the checkpoint was taken: a rollback undoes every change after it."""
    caller: Caller = NOBODY
    """Who took it (a label says nothing: anyone can copy one)."""
    content: bool = False
    """It holds every source's bytes (and maybe state) in the blob store (`blobstore.py`); False for a checkpoint of
    the change log alone (taken before the store existed)."""
    bytes_added: int = 0
    """Bytes its taking added to the blob store (0 when every blob was stored already)."""


class Entry(TypedDict):
    """What `ChangeLog.record` writes: one call (or outside change) and the sources it changed."""

    caller: Caller
    tool: str | None
    unit_id: str | None
    source_id: str | None
    outcome: Outcome
    error_code: NotRequired[str | None]
    message: NotRequired[str | None]
    duration_ms: NotRequired[float]
    sources: NotRequired[Sequence[SourceChange]]


class Wanted(TypedDict, total=False):
    """Which records `ChangeLog.changes` lists (at most `limit`, 50 unless given): of a unit (and source), of a
    client name, at or after the ISO time `since`, with ids in (after_id, before_id)."""

    unit_id: str | None
    source_id: str | None
    client: str | None
    since: str | None
    after_id: int
    before_id: int | None
    limit: int


class ChangeLog(Protocol):
    """What the service and the host need of a change log; a loader whose store is a database returns one from
    `change_log(retention)` (see `SqliteChangeLog`), else the host keeps one in its data dir."""

    def record(self, **entry: Unpack[Entry]) -> int:
        """Write one record (one transaction) and return its change id."""
        ...

    def changes(self, **wanted: Unpack[Wanted]) -> list[Change]:
        """Records newest first (change sets without bytes), as `Wanted` says."""
        ...

    def change(self, change_id: int) -> Change | None:
        """One record with its change set and bytes."""
        ...

    def latest_id(self) -> int:
        """The newest change id (0 when empty): a page follows the log by asking for anything newer."""
        ...

    def changes_after(self, change_id: int) -> list[Change]:
        """Every record after `change_id`, oldest first, with bytes (what a rollback undoes)."""
        ...

    def record_outside(
        self,
        unit_id: str,
        found: Sequence[tuple[str, bytes | None]],
        error: str | None = None,
        caller: Caller = NOBODY,
    ) -> int | None:
        """Record sources changed outside the tools, as (source id, bytes now or None when gone), each with the
        bytes the log's newest record left it with as its bytes before. A source the log already shows with these
        bytes (another server on the same store recorded it) is left out, in the same transaction; None when
        nothing is left to record. `caller` is who made it where that is known (a local-access grant)."""
        ...

    def checkpoint(
        self, label: str | None, caller: Caller, tree: Tree | None = None, blobs: dict[str, bytes] | None = None
    ) -> Checkpoint:
        """A checkpoint; with `tree`, holding its content: `blobs` has the bytes of every hash of the tree the
        store may not hold yet (`missing_blobs`)."""
        ...

    def missing_blobs(self, digests: Sequence[str]) -> set[str]:
        """Which of `digests` the blob store does not hold."""
        ...

    def checkpoint_tree(self, checkpoint_id: int) -> Tree | None:
        """What a content checkpoint holds (None: a checkpoint of the log alone); `blobstore.BlobMissing` when its
        tree or state is gone or damaged."""
        ...

    def blobs(self, digests: Sequence[str]) -> dict[str, bytes]:
        """The bytes of `digests`, each checked against its hash (`blobstore.BlobMissing` otherwise)."""
        ...

    def blob_usage(self) -> tuple[int, int]:
        """(blobs, bytes) the blob store holds."""
        ...

    def get_checkpoint(self, checkpoint_id: int) -> Checkpoint | None: ...

    def checkpoints(self, limit: int = 50, *, caller: Caller | None = None) -> list[Checkpoint]:
        """The newest checkpoints first (the unit server's page lists them), of one `caller` if given."""
        ...

    def prune(self) -> int:
        """Apply the retention now; returns the records dropped."""
        ...

    def close(self) -> None: ...


SCHEMA = """
CREATE TABLE IF NOT EXISTS changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL,
    client_name TEXT,
    client_version TEXT,
    session_id TEXT,
    tool TEXT,
    unit_id TEXT,
    source_id TEXT,
    outcome TEXT NOT NULL,
    error_code TEXT,
    message TEXT,
    duration_ms REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS changes_by_time ON changes (time);
CREATE INDEX IF NOT EXISTS changes_by_unit ON changes (unit_id, source_id, id);
CREATE TABLE IF NOT EXISTS change_sources (
    change_id INTEGER NOT NULL,
    unit_id TEXT NOT NULL,
    source_id TEXT NOT NULL,
    action TEXT NOT NULL,
    hash_before TEXT,
    hash_after TEXT,
    data_before BLOB,
    data_after BLOB,
    PRIMARY KEY (change_id, unit_id, source_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS change_sources_by_source ON change_sources (unit_id, source_id, change_id);
CREATE TABLE IF NOT EXISTS checkpoints (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL,
    label TEXT,
    after_change INTEGER NOT NULL,
    client_name TEXT,
    session_id TEXT
);
"""
TABLES = frozenset({"changes", "change_sources", "checkpoints", *blobstore.BLOB_TABLES})


def iso_time(seconds: float) -> str:
    """UTC with milliseconds, e.g. 2026-12-04T13:02:07.123Z: sorts as text."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


MAX_MESSAGE = 2000
"""Characters kept of a record's message (a reload error can be megabytes): on writing, and on reading a record
written before."""
MAX_NAME = 1100
"""Characters kept of a record's client name, version, session, tool and target (a source id is at most 1,024)."""
_COLUMNS = (
    "id, time, client_name, client_version, session_id, tool, unit_id, source_id, outcome, error_code, "
    f"substr(message, 1, {MAX_MESSAGE}), duration_ms"
)
_SOURCE_COLUMNS = "change_id, unit_id, source_id, action, hash_before, hash_after"


GRANT_PREFIX = "la-"
"""The ids of local-access grants (`localaccess.py`), which stand as the session of the outside changes made through
them: shown on the page and in results already, the key of nothing, so the log keeps them as they are."""


def session_tag(session_id: str | None) -> str | None:
    """What the log keeps of an MCP session id: a digest that tells sessions apart but cannot be presented as one
    (a session id is the key of a page grant; every client reads the change log). A local-access grant's id is kept."""
    if session_id is None:
        return None
    if session_id.startswith(GRANT_PREFIX) and len(session_id) == len(GRANT_PREFIX) + 12:
        return session_id
    return "s-" + hashlib.sha256(session_id.encode(errors="replace")).hexdigest()[:12]


def _stored_tag(value: object) -> str | None:
    """A stored session as a tag: records written before tags were stored hold the session id itself."""
    text = _text(value)
    return text if text is None or (text.startswith("s-") and len(text) == 14) else session_tag(text)


def _clip(text: str | None, limit: int) -> str | None:
    return text if text is None or len(text) <= limit else text[: limit - 1] + "…"


MAX_CHECKPOINTS_PER_CLIENT = 20
"""Checkpoints kept of one client (its name and session); taking another drops its oldest."""
_CHECKPOINT_COLUMNS = (
    "id, time, label, after_change, client_name, session_id, "
    "EXISTS (SELECT 1 FROM checkpoint_trees t WHERE t.checkpoint_id = id)"
)
_SAME_CLIENT = "coalesce(client_name, '') = ? AND coalesce(session_id, '') = ?"


def _client_key(caller: Caller) -> tuple[str, str]:
    return _clip(caller.name, MAX_NAME) or "", session_tag(caller.session_id) or ""


def _checkpoint(row: Sequence[Any]) -> Checkpoint:
    id_, when, label, after, name, session, content = row
    return Checkpoint(
        int(id_), str(when), _text(label), int(after), Caller(_text(name), None, _stored_tag(session)), bool(content)
    )


UNDOING_TOOLS = frozenset({"unit_rollback", "unit_revert_change", "unit_revert"})
"""Tools whose change undoes others: reverting it redoes what they undid."""


def undo_risk(log: ChangeLog, change_id: int) -> Risk | None:
    """`destructive` when reverting the change undoes many at once (it has several sources, or was itself a
    rollback or a revert: a person's, perhaps), else None. Reads one record without its bytes."""
    found = log.changes(after_id=change_id - 1, before_id=change_id + 1, limit=1)
    if found and (len(found[0].sources) > 1 or found[0].tool in UNDOING_TOOLS):
        return "destructive"
    return None


class SqlChangeLog:
    """The change log over a SQL database (`database.SqliteDatabase` or `PostgresDatabase`), in the tables of
    `SCHEMA` (or the same tables in another dialect). `_transaction` is one write transaction, taken before anything
    is read, so records and checkpoints are numbered in the order they commit; SQL is written with `?`."""

    def __init__(self, db: SqliteDatabase | PostgresDatabase, retention: Retention, clock: Callable[[], float]) -> None:
        self._db = db
        self.retention = retention
        self.clock = clock
        self.blob_retention: BlobRetention = DEFAULT_BLOB_RETENTION

    def _transaction(self) -> contextlib.AbstractContextManager[Conn]:
        return self._db.write()

    def _query(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        return self._db.query(sql, args)

    def close(self) -> None:
        self._db.close()

    @staticmethod
    def _run(conn: Conn, sql: str, args: Sequence[object] = ()) -> Any:
        return conn.execute(sql, args)

    def _rows(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        return self._db.query(sql, args)

    # -- writing ----------------------------------------------------------------------------

    def record(self, **entry: Unpack[Entry]) -> int:
        with self._transaction() as conn:
            return self._insert(conn, entry)

    def _insert(self, conn: Any, entry: Entry) -> int:
        """One record, in the caller's transaction; every PRUNE_EVERY records the retention is applied too."""
        caller = entry["caller"]
        row = self._run(
            conn,
            "INSERT INTO changes (time, client_name, client_version, session_id, tool, unit_id, source_id, "
            "outcome, error_code, message, duration_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (
                iso_time(self.clock()),
                _clip(caller.name, MAX_NAME),
                _clip(caller.version, MAX_NAME),
                session_tag(caller.session_id),
                _clip(entry["tool"], MAX_NAME),
                _clip(entry["unit_id"], MAX_NAME),
                _clip(entry["source_id"], MAX_NAME),
                entry["outcome"],
                _clip(entry.get("error_code"), MAX_NAME),
                _clip(entry.get("message"), MAX_MESSAGE),
                entry.get("duration_ms", 0.0),
            ),
        ).fetchone()
        change_id = int(row[0])
        conn.executemany(
            "INSERT INTO change_sources (change_id, unit_id, source_id, action, hash_before, hash_after, "
            "data_before, data_after) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (change_id, unit_id, "
            "source_id) DO UPDATE SET action = excluded.action, hash_before = excluded.hash_before, "
            "hash_after = excluded.hash_after, data_before = excluded.data_before, data_after = excluded.data_after",
            [
                (
                    change_id,
                    s.unit_id,
                    s.source_id,
                    s.action,
                    s.hash_before,
                    s.hash_after,
                    s.data_before,
                    s.data_after,
                )
                for s in entry.get("sources", ())
            ],
        )
        if change_id % PRUNE_EVERY == 0:
            self._prune(conn)
        return change_id

    def checkpoint(
        self, label: str | None, caller: Caller, tree: Tree | None = None, blobs: dict[str, bytes] | None = None
    ) -> Checkpoint:
        now = self.clock()
        when = iso_time(now)
        added = 0
        with self._transaction() as conn:
            after = int(self._run(conn, "SELECT coalesce(max(id), 0) FROM changes").fetchone()[0])
            row = self._run(
                conn,
                "INSERT INTO checkpoints (time, label, after_change, client_name, session_id) VALUES (?, ?, ?, ?, ?) "
                "RETURNING id",
                (when, label, after, _clip(caller.name, MAX_NAME), session_tag(caller.session_id)),
            ).fetchone()
            self._run(  # a client keeps its newest few: a burst of them pushes out only its own
                conn,
                f"DELETE FROM checkpoints WHERE {_SAME_CLIENT} AND id NOT IN (SELECT id FROM checkpoints WHERE "
                f"{_SAME_CLIENT} ORDER BY id DESC LIMIT ?)",
                (*_client_key(caller), *_client_key(caller), MAX_CHECKPOINTS_PER_CLIENT),
            )
            if tree is not None:
                run = self._runner(conn)
                added = blobstore.add_checkpoint(run, int(row[0]), tree, blobs or {}, now)
                blobstore.prune(run, self.blob_retention)
        return Checkpoint(int(row[0]), when, label, after, caller, tree is not None, added)

    # -- the blob store (blobstore.py: its SQL, over this log's connection) -------------------

    def _runner(self, conn: Any) -> blobstore.Run:
        return lambda sql, args: self._run(conn, sql, args)

    def _reader(self) -> blobstore.Run:
        return lambda sql, args: blobstore.Fetched(self._rows(sql, args))

    def missing_blobs(self, digests: Sequence[str]) -> set[str]:
        return set(digests) - blobstore.present(self._reader(), digests)

    def checkpoint_tree(self, checkpoint_id: int) -> Tree | None:
        read = self._reader()
        found = blobstore.tree_of(read, checkpoint_id)
        if found is None:
            return None
        tree, state = found
        got = blobstore.get(read, [tree] + ([state] if state else []))
        units = Tree.decode(got[tree])
        return Tree(units, None if state is None else json.loads(got[state]))

    def blobs(self, digests: Sequence[str]) -> dict[str, bytes]:
        return blobstore.get(self._reader(), digests)

    def blob_usage(self) -> tuple[int, int]:
        return blobstore.stored_bytes(self._reader())

    def prune_blobs(self) -> list[str]:
        """Apply the blob retention now; returns the hashes removed."""
        with self._transaction() as conn:
            return blobstore.prune(self._runner(conn), self.blob_retention)

    def prune(self) -> int:
        with self._transaction() as conn:
            return self._prune(conn)

    def _prune(self, conn: Any) -> int:
        """Drop records past the retention (by count, then by age) and the checkpoints that would need them."""
        newest = int(self._run(conn, "SELECT coalesce(max(id), 0) FROM changes").fetchone()[0])
        upto = newest - self.retention.records
        cutoff = iso_time(self.clock() - self.retention.days * 86400)
        old = self._run(conn, "SELECT max(id) FROM changes WHERE time < ?", (cutoff,)).fetchone()[0]
        if old is not None:
            upto = max(upto, int(old))
        if upto <= 0:
            return 0
        dropped = self._run(conn, "DELETE FROM changes WHERE id <= ?", (upto,)).rowcount
        self._run(conn, "DELETE FROM change_sources WHERE change_id <= ?", (upto,))
        self._run(conn, "DELETE FROM checkpoints WHERE after_change < ?", (upto,))
        return int(dropped)

    # -- reading ----------------------------------------------------------------------------

    def latest_id(self) -> int:
        return int(self._rows("SELECT coalesce(max(id), 0) FROM changes")[0][0])

    def changes(self, **wanted: Unpack[Wanted]) -> list[Change]:
        unit_id, source_id = wanted.get("unit_id"), wanted.get("source_id")
        since, client, before_id = wanted.get("since"), wanted.get("client"), wanted.get("before_id")
        where: list[str] = ["c.id > ?"]
        args: list[object] = [wanted.get("after_id", 0)]
        if before_id is not None:
            where.append("c.id < ?")
            args.append(before_id)
        if since is not None:
            where.append("c.time >= ?")
            args.append(since)
        if client is not None:
            where.append("c.client_name = ?")
            args.append(client)
        if unit_id is not None:  # the call's target, or a source in its change set (a rollback's): two indexes
            named = "unit_id = ?" + (" AND source_id = ?" if source_id is not None else "")
            where.append(
                f"c.id IN (SELECT id FROM changes WHERE {named} "
                f"UNION SELECT change_id FROM change_sources WHERE {named})"
            )
            pair = [unit_id] + ([source_id] if source_id is not None else [])
            args.extend(pair + pair)
        rows = self._rows(
            f"SELECT {_COLUMNS} FROM changes c WHERE {' AND '.join(where)} ORDER BY c.id DESC LIMIT ?",
            [*args, wanted.get("limit", 50)],
        )
        return self._with_sources(rows, data=False)

    def change(self, change_id: int) -> Change | None:
        rows = self._rows(f"SELECT {_COLUMNS} FROM changes WHERE id = ?", (change_id,))
        found = self._with_sources(rows, data=True)
        return found[0] if found else None

    def changes_after(self, change_id: int) -> list[Change]:
        rows = self._rows(f"SELECT {_COLUMNS} FROM changes WHERE id > ? ORDER BY id", (change_id,))
        return self._with_sources(rows, data=True)

    def record_outside(
        self,
        unit_id: str,
        found: Sequence[tuple[str, bytes | None]],
        error: str | None = None,
        caller: Caller = NOBODY,
    ) -> int | None:
        with self._transaction() as conn:
            sources = []
            for source_id, data in found:
                digest = None if data is None else hash_bytes(data)
                row = self._run(
                    conn,
                    "SELECT s.hash_after, s.data_after FROM change_sources s JOIN changes c ON c.id = s.change_id "
                    "WHERE s.unit_id = ? AND s.source_id = ? AND c.outcome IN ('applied', 'outside') "
                    "ORDER BY s.change_id DESC LIMIT 1",
                    (unit_id, source_id),
                ).fetchone()
                if (row is None and data is None) or (row is not None and row[0] == digest):
                    continue  # never seen and gone (a folder), or recorded already
                action: Action = "removed" if data is None else "unknown" if row is None else "modified"
                before, before_data = (None, None) if row is None else (_text(row[0]), _bytes(row[1]))
                sources.append(SourceChange(unit_id, source_id, action, before, digest, before_data, data))
            if not sources:
                return None
            return self._insert(
                conn,
                Entry(
                    caller=caller,
                    tool=None,
                    unit_id=unit_id,
                    source_id=sources[0].source_id if len(sources) == 1 else None,
                    outcome="outside",
                    error_code=None if error is None else "reload_failed",
                    message=error,
                    sources=sources,
                ),
            )

    def get_checkpoint(self, checkpoint_id: int) -> Checkpoint | None:
        rows = self._rows(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE id = ?", (checkpoint_id,))
        return _checkpoint(rows[0]) if rows else None

    def checkpoints(self, limit: int = 50, *, caller: Caller | None = None) -> list[Checkpoint]:
        mine, args = ("", ()) if caller is None else (f"WHERE {_SAME_CLIENT} ", _client_key(caller))
        rows = self._rows(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints {mine}ORDER BY id DESC LIMIT ?", (*args, limit)
        )
        return [_checkpoint(row) for row in rows]

    def _with_sources(self, rows: list[Any], *, data: bool) -> list[Change]:
        if not rows:
            return []
        ids = [row[0] for row in rows]
        columns = _SOURCE_COLUMNS + (", data_before, data_after" if data else "")
        found: dict[object, list[SourceChange]] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for row in self._rows(
                f"SELECT {columns} FROM change_sources WHERE change_id IN ({','.join('?' * len(chunk))}) "
                "ORDER BY change_id, unit_id, source_id",
                chunk,
            ):
                found.setdefault(row[0], []).append(
                    SourceChange(
                        str(row[1]),
                        str(row[2]),
                        row[3],
                        _text(row[4]),
                        _text(row[5]),
                        _bytes(row[6]) if data else None,
                        _bytes(row[7]) if data else None,
                    )
                )
        return [
            Change(
                id=int(r[0]),
                time=str(r[1]),
                caller=Caller(_text(r[2]), _text(r[3]), _stored_tag(r[4])),
                tool=_text(r[5]),
                unit_id=_text(r[6]),
                source_id=_text(r[7]),
                outcome=r[8],
                error_code=_text(r[9]),
                message=_text(r[10]),
                duration_ms=float(r[11]),
                sources=tuple(found.get(r[0], ())),
            )
            for r in rows
        ]


class SqliteChangeLog(SqlChangeLog):
    """The change log in a SQLite file (created if missing; a `private` file is checked as
    `database.check_private`)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        retention: Retention = DEFAULT_RETENTION,
        *,
        private: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        super().__init__(
            SqliteDatabase(self.path, private="check" if private else None, schema=SCHEMA + blobstore.SQLITE_SCHEMA),
            retention,
            clock,
        )


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)
