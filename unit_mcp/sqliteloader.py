"""The SQLite loader: every unit in one database file, every accepted version of every source kept.

Tables: `units` (id, kind), `sources` (the current bytes of each source) and `versions` (an append-only log filled
by triggers on `sources`, so a change made with any other SQLite tool is seen too). WAL journal; each write is one
`BEGIN IMMEDIATE` transaction that checks the expected hash and writes, so two processes sharing the database
cannot lose an update. Changes committed by anyone else are noticed with `PRAGMA data_version` and reloaded.
"""

from __future__ import annotations

import json
import logging
import secrets
import sqlite3
import threading
import time
from collections.abc import Hashable, Mapping
from pathlib import Path

from .changelog import Retention, SqliteChangeLog
from .database import SqliteDatabase, connect_sqlite
from .loader import (
    SQLITE_PREFIX,
    Capabilities,
    ForeignStore,
    Loader,
    MissingSource,
    NotASource,
    PathConflict,
    Source,
    SourceExists,
    SourceInfo,
    SourceTooLarge,
    StaleSource,
    UnitKind,
    UnknownVersion,
    Version,
    WatchTarget,
    Written,
    artifact_kind,
    primary_source_id,
    version_stamps,
)
from .paths import StoredIds, hash_bytes

log = logging.getLogger("unit_mcp.sqliteloader")

SCHEMA_VERSION = 1
_NOW = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS units (
    unit_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL CHECK (kind IN ('directory', 'file'))
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sources (
    unit_id TEXT NOT NULL REFERENCES units (unit_id) ON DELETE CASCADE,
    source_id TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (unit_id, source_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS versions (
    version INTEGER PRIMARY KEY AUTOINCREMENT,
    unit_id TEXT NOT NULL,
    source_id TEXT NOT NULL,
    data BLOB,              -- NULL: the source was removed
    hash TEXT,              -- NULL when written by another tool (computed when read)
    time TEXT NOT NULL,
    tool_call TEXT,         -- the unit tool that wrote it; NULL for other writers
    writer TEXT,            -- the loader instance that wrote it (its own changes are not reloaded twice)
    listed INTEGER NOT NULL DEFAULT 1  -- 0: a rollback, not an accepted version
);
CREATE INDEX IF NOT EXISTS versions_of_source ON versions (unit_id, source_id, version);
CREATE TRIGGER IF NOT EXISTS source_added AFTER INSERT ON sources BEGIN
    INSERT INTO versions (unit_id, source_id, data, time) VALUES (NEW.unit_id, NEW.source_id, NEW.data, {_NOW});
END;
CREATE TRIGGER IF NOT EXISTS source_changed AFTER UPDATE ON sources BEGIN
    INSERT INTO versions (unit_id, source_id, data, time) VALUES (NEW.unit_id, NEW.source_id, NEW.data, {_NOW});
END;
CREATE TRIGGER IF NOT EXISTS source_removed AFTER DELETE ON sources BEGIN
    INSERT INTO versions (unit_id, source_id, data, time) VALUES (OLD.unit_id, OLD.source_id, NULL, {_NOW});
END;
PRAGMA user_version = {SCHEMA_VERSION};
"""
_OURS = {"units", "sources", "versions"}
_PRIMARY = "CASE u.kind WHEN 'directory' THEN '__init__.py' ELSE u.unit_id || '.py' END"


def _key(source: Source) -> tuple[str, str]:
    """A source's primary key in `sources` (and its columns in `versions`)."""
    return source.unit_id, source.source_id


def _blob(value: bytes | str) -> bytes:
    """A stored source as bytes: another SQLite tool may have stored it as TEXT (UTF-8)."""
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def units_database_problem(path: Path) -> str | None:
    """Why the file at `path` must not be opened as a units database, as the end of a sentence naming it, or None
    (absent, or a units database). Reads only: another file (an empty one too) is refused untouched; a new units
    database is never seen empty (`database.create_private` makes it whole, then links it in place)."""
    instead = "nothing was written to it. Give a new file, or a database made by --units sqlite:PATH"
    try:
        with path.open("rb") as handle:
            header = handle.read(16)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return "is a folder, not a database file"
    if not header:
        return f"is an empty file, not a units database; {instead}"
    if header != b"SQLite format 3\x00":
        return f"is not a units database (not SQLite); {instead}"
    try:
        conn = connect_sqlite(path, read_only=True)
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return f"cannot be read as a SQLite database ({exc})"
    tables.discard("sqlite_sequence")
    ours = tables >= _OURS
    if (not tables and version == 0) or (ours and version == SCHEMA_VERSION):
        return None
    if ours and version > SCHEMA_VERSION:
        return f"was made by a newer unit-mcp (schema {version}, this one knows {SCHEMA_VERSION}); upgrade unit-mcp"
    shown = ", ".join(ascii(name) for name in sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    return f"is not a units database (it holds the tables {shown or 'none'} and user_version {version}); {instead}"


def _refuse_foreign(path: Path) -> None:
    problem = units_database_problem(path)
    if problem is not None:
        raise ForeignStore(f"{path} {problem}")


class SqliteLoader(Loader):
    """Units as rows of one SQLite database (created if missing unless read-only)."""

    name = "sqlite"

    def __init__(self, path: str | Path, *, read_only: bool = False, poll_interval: float = 0.05) -> None:
        self.path = Path(path).expanduser().resolve()
        self.address = SQLITE_PREFIX + str(self.path)
        self.location = str(self.path)
        self.read_only = read_only
        self.capabilities = Capabilities(write=not read_only, create=not read_only, history=True)
        self.poll_interval = poll_interval
        self.writer = secrets.token_hex(8)
        self._ids = StoredIds(log)
        if read_only and not self.path.is_file():
            raise FileNotFoundError(f"units database {self.path} does not exist")
        self._db = SqliteDatabase(
            self.path,
            read_only=read_only,
            private="create",
            foreign_keys=True,
            schema=SCHEMA,
            schema_version=SCHEMA_VERSION,
            check=_refuse_foreign,
        )

    # -- connection -----------------------------------------------------------------------

    def connect(self) -> sqlite3.Connection:
        """A new connection of its own (a watcher's): WAL, waiting up to 30 s for a lock."""
        return self._db.connect()

    def close(self) -> None:
        self._db.close()

    # -- discovery ------------------------------------------------------------------------

    def discover(self) -> dict[str, UnitKind]:
        rows = self._db.query(
            f"SELECT u.unit_id, u.kind FROM units u WHERE EXISTS (SELECT 1 FROM sources s "
            f"WHERE s.unit_id = u.unit_id AND s.source_id = {_PRIMARY}) ORDER BY u.unit_id"
        )
        return {str(unit_id): kind for unit_id, kind in rows if self._ids.unit(unit_id)}

    def kind(self, unit_id: str) -> UnitKind | None:
        if not self._ids.unit(unit_id):
            return None
        rows = self._db.query(
            f"SELECT u.kind FROM units u WHERE u.unit_id = ? AND EXISTS (SELECT 1 FROM sources s "
            f"WHERE s.unit_id = u.unit_id AND s.source_id = {_PRIMARY})",
            (unit_id,),
        )
        return rows[0][0] if rows else None

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        if kind == "file":
            return [f"{unit_id}.py"]
        rows = self._db.query("SELECT source_id FROM sources WHERE unit_id = ? ORDER BY 1", (unit_id,))
        return [str(r[0]) for r in rows if self._ids.source(unit_id, str(r[0]))]

    def sources(self, unit_id: str, kind: UnitKind) -> list[SourceInfo]:
        primary = primary_source_id(unit_id, kind)
        wanted = set(self.source_ids(unit_id, kind))
        rows = self._db.query("SELECT source_id, data FROM sources WHERE unit_id = ? ORDER BY 1", (unit_id,))
        return [
            SourceInfo(sid, len(data), hash_bytes(data), sid == primary, artifact_kind(sid, data))
            for sid, data in ((sid, _blob(value)) for sid, value in rows)
            if sid in wanted
        ]

    def source_stamps(self, units: Mapping[str, UnitKind]) -> dict[str, dict[str, Hashable | None]] | None:
        """Each source's newest version number: the triggers add a version for every change of `sources` (whoever
        makes it) and numbers are never reused. None if a trigger is gone (a change could leave no version)."""
        with self._db.read() as conn:
            triggers = conn.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'sources' "
                "AND name IN ('source_added', 'source_changed', 'source_removed')"
            ).fetchone()[0]
            if triggers != 3:
                return None
            rows = conn.execute(
                "SELECT s.unit_id, s.source_id, (SELECT max(v.version) FROM versions v WHERE v.unit_id = s.unit_id "
                "AND v.source_id = s.source_id) FROM sources s WHERE s.unit_id IN (SELECT value FROM json_each(?))",
                (json.dumps(list(units)),),
            ).fetchall()
        return version_stamps(units, rows, self._ids.source)

    # -- sources --------------------------------------------------------------------------

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            rows = self._db.query("SELECT data FROM sources WHERE unit_id = ? AND source_id = ?", _key(source))
        else:  # the size first, without the bytes (a BLOB's length is in its header); then the bytes if they fit
            rows = self._db.query(
                "SELECT size, CASE WHEN size <= ? THEN data END FROM (SELECT data, CASE typeof(data) WHEN 'blob' "
                "THEN length(data) ELSE length(CAST(data AS BLOB)) END AS size FROM sources "
                "WHERE unit_id = ? AND source_id = ?)",
                (max_bytes, *_key(source)),
            )
            if rows and rows[0][1] is None:
                raise SourceTooLarge(int(rows[0][0]))
            rows = [(row[1],) for row in rows]
        if not rows:
            self._missing(self._db.get(), source)
        return _blob(rows[0][0])

    def _missing(self, conn: sqlite3.Connection, source: Source) -> None:
        """Raise why there is no such source, as the folder loader would say it."""
        if conn.execute(
            "SELECT 1 FROM sources WHERE unit_id = ? AND substr(source_id, 1, ?) = ? LIMIT 1",
            (source.unit_id, len(source.source_id) + 1, source.source_id + "/"),
        ).fetchone():
            raise NotASource()
        raise MissingSource()

    def origin(self, source: Source) -> str:
        unit_id, source_id = _key(source)
        return f"{self.path}/{unit_id}/{source_id}" if source.kind == "directory" else f"{self.path}/{source_id}"

    def write(self, source: Source, data: bytes, *, expected_hash: str, tool_call: str) -> Written:
        with self._db.write() as conn:
            row = conn.execute("SELECT data FROM sources WHERE unit_id = ? AND source_id = ?", _key(source)).fetchone()
            if row is None:
                self._missing(conn, source)
            previous = _blob(row[0])
            if hash_bytes(previous) != expected_hash:
                raise StaleSource(hash_bytes(previous))
            conn.execute("UPDATE sources SET data = ? WHERE unit_id = ? AND source_id = ?", (data, *_key(source)))
            version = self._sign(conn, data, tool_call)
        return Written(source, data, previous, tool_call, token=version)

    def create(self, source: Source, data: bytes, *, tool_call: str) -> Written:
        unit_id, source_id = _key(source)
        with self._db.write() as conn:
            if conn.execute(
                "SELECT 1 FROM sources WHERE unit_id = ? AND (source_id = ? OR substr(source_id, 1, ?) = ?)",
                (unit_id, source_id, len(source_id) + 1, source_id + "/"),
            ).fetchone():
                raise SourceExists()
            folders = ["/".join(source_id.split("/")[:n]) for n in range(1, source_id.count("/") + 1)]
            if (
                folders
                and conn.execute(
                    f"SELECT 1 FROM sources WHERE unit_id = ? AND source_id IN ({','.join('?' * len(folders))})",
                    (unit_id, *folders),
                ).fetchone()
            ):
                raise PathConflict()
            conn.execute("INSERT INTO sources (unit_id, source_id, data) VALUES (?, ?, ?)", (unit_id, source_id, data))
            version = self._sign(conn, data, tool_call)
        return Written(source, data, None, tool_call, token=version)

    def _sign(self, conn: sqlite3.Connection, data: bytes | None, tool_call: str | None, *, listed: int = 1) -> int:
        """Complete the version row the trigger just added (same transaction): hash, tool call, this writer."""
        version = int(conn.execute("SELECT max(version) FROM versions").fetchone()[0])
        conn.execute(
            "UPDATE versions SET hash = ?, tool_call = ?, writer = ?, listed = ? WHERE version = ?",
            (None if data is None else hash_bytes(data), tool_call, self.writer, listed, version),
        )
        return version

    def accept(self, written: Written) -> None:
        """Nothing to do: the version was recorded with the write."""

    def rollback(self, written: Written) -> None:
        """Put the previous bytes back if the source still holds the rejected ones (one transaction), and drop the
        rejected version from the history either way."""
        key = _key(written.source)
        with self._db.write() as conn:
            if written.token:  # a `Written` the service makes to remove a source has no version row
                conn.execute("DELETE FROM versions WHERE version = ?", (written.token,))
            row = conn.execute("SELECT data FROM sources WHERE unit_id = ? AND source_id = ?", key).fetchone()
            current = None if row is None else hash_bytes(_blob(row[0]))
            superseded = current != hash_bytes(written.data)
            if not superseded:
                if written.previous is None:
                    conn.execute("DELETE FROM sources WHERE unit_id = ? AND source_id = ?", key)
                else:
                    conn.execute(
                        "UPDATE sources SET data = ? WHERE unit_id = ? AND source_id = ?", (written.previous, *key)
                    )
                self._sign(conn, written.previous, None, listed=0)
        if superseded:  # after the commit: the rejected version is out of the history, their version stays
            raise StaleSource(current)

    # -- history --------------------------------------------------------------------------

    def history(self, source: Source, limit: int) -> list[Version]:
        rows = self._db.query(
            "SELECT version, hash, data, time, tool_call FROM versions WHERE unit_id = ? AND source_id = ? "
            "AND listed = 1 AND data IS NOT NULL ORDER BY version DESC LIMIT ?",
            (*_key(source), limit),
        )
        versions = []
        for version, digest, value, when, tool_call in rows:
            data = _blob(value)
            versions.append(
                Version(int(version), str(digest) if digest else hash_bytes(data), len(data), str(when), tool_call)
            )
        return versions

    def version_data(self, source: Source, version: int) -> bytes:
        rows = self._db.query(
            "SELECT data FROM versions WHERE version = ? AND unit_id = ? AND source_id = ? AND listed = 1 "
            "AND data IS NOT NULL",
            (version, *_key(source)),
        )
        if not rows:
            raise UnknownVersion(version)
        return _blob(rows[0][0])

    def change_log(self, retention: Retention) -> SqliteChangeLog | None:
        """The change log in this database (every server on it sees every change); None when read-only."""
        return None if self.read_only else SqliteChangeLog(self.path, retention)

    # -- watching and copying ---------------------------------------------------------------

    def watch(self, target: WatchTarget, *, debounce_ms: int) -> _Poller:
        return _Poller(self, target, debounce_ms / 1000)

    def put_unit(self, unit_id: str, kind: UnitKind, files: dict[str, bytes], *, replace: bool) -> None:
        with self._db.write() as conn:
            if conn.execute("SELECT 1 FROM units WHERE unit_id = ?", (unit_id,)).fetchone():
                if not replace:
                    raise SourceExists()
                conn.execute("DELETE FROM units WHERE unit_id = ?", (unit_id,))  # its sources go too (cascade)
                conn.execute(
                    "UPDATE versions SET writer = ? WHERE unit_id = ? AND writer IS NULL", (self.writer, unit_id)
                )
            conn.execute("INSERT INTO units (unit_id, kind) VALUES (?, ?)", (unit_id, kind))
            for source_id, data in sorted(files.items()):
                conn.execute(
                    "INSERT INTO sources (unit_id, source_id, data) VALUES (?, ?, ?)", (unit_id, source_id, data)
                )
                self._sign(conn, data, None)


class _Poller:
    """Reloads units changed in the database by another connection: `PRAGMA data_version` every poll interval,
    then the new `versions` rows not written by this loader; debounced like the file watcher."""

    def __init__(self, loader: SqliteLoader, target: WatchTarget, debounce: float) -> None:
        self._loader = loader
        self._target = target
        self._debounce = debounce
        self._conn = loader.connect()
        self._data_version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        self._seen = self._conn.execute("SELECT coalesce(max(version), 0) FROM versions").fetchone()[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unit-mcp-sqlite-watch", daemon=True)
        self._thread.start()  # armed already: anything committed after __init__ has a larger version

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _changed_units(self) -> dict[str, set[str]]:
        """Each unit another connection changed, with the sources changed by something other than a unit tool
        (another server's tool call is in the shared change log already)."""
        version = self._conn.execute("PRAGMA data_version").fetchone()[0]
        if version == self._data_version:
            return {}
        self._data_version = version
        rows = self._conn.execute(
            "SELECT version, unit_id, source_id, writer, tool_call FROM versions WHERE version > ? ORDER BY version",
            (self._seen,),
        ).fetchall()
        if rows:
            self._seen = rows[-1][0]
        changed: dict[str, set[str]] = {}
        for _, unit_id, source_id, writer, tool_call in rows:
            if writer != self._loader.writer:
                outside = changed.setdefault(unit_id, set())
                if tool_call is None and writer is None:
                    outside.add(source_id)
        return changed

    def _run(self) -> None:
        pending: dict[str, set[str]] = {}
        last_change = 0.0
        try:
            while not self._stop.wait(self._loader.poll_interval):
                try:
                    changed = self._changed_units()
                except sqlite3.Error:
                    self._target.logger.exception("watching the units database failed; retrying")
                    continue
                now = time.monotonic()
                if changed:
                    for unit_id, sources in changed.items():
                        pending.setdefault(unit_id, set()).update(sources)
                    last_change = now
                if pending and now - last_change >= self._debounce:
                    for unit_id in sorted(pending):
                        self._target.reload_changed(unit_id, pending[unit_id])
                    pending.clear()
        finally:
            self._conn.close()
