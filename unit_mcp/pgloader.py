"""The PostgreSQL loader: every unit in one database that several servers (on several machines) share.

The SQLite loader's tables in a schema `unit_mcp`, with a trigger that logs and NOTIFYs each version in number
order; each server LISTENs, catches up after every reconnect and reloads changed units at once. While the
database is unreachable, calls fail with `store_unavailable` (docs/postgres.md).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any, NoReturn

import psycopg

from .changelog import DEFAULT_RETENTION, Retention, SqlChangeLog
from .database import Conn, PgConn, PostgresDatabase, connect_postgres
from .errors import StoreUnavailable
from .loader import (
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
    UnitVersions,
    UnknownVersion,
    Version,
    WatchTarget,
    Written,
    artifact_kind,
    primary_source_id,
    version_stamps,
)
from .paths import StoredIds, hash_bytes, is_unit_id
from .pgconnect import CONNECT_TIMEOUT, ForeignSchema, schema_is_ours

SCHEMA = "unit_mcp"
CHANNEL = "unit_mcp"
MARK = "unit-mcp units store, schema 1"
_LOCK_KEY = 0x756E6974  # the advisory lock that orders versions ('unit')
_HASH = "'sha256:' || encode(sha256({}), 'hex')"
_DDL = f"""
CREATE SCHEMA {SCHEMA};
COMMENT ON SCHEMA {SCHEMA} IS '{MARK}';
CREATE TABLE {SCHEMA}.units (
    unit_id text PRIMARY KEY,
    kind text NOT NULL CHECK (kind IN ('directory', 'file'))
);
CREATE TABLE {SCHEMA}.sources (
    unit_id text NOT NULL REFERENCES {SCHEMA}.units (unit_id) ON DELETE CASCADE,
    source_id text NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (unit_id, source_id)
);
CREATE TABLE {SCHEMA}.versions (
    version bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    unit_id text NOT NULL,
    source_id text NOT NULL,
    data bytea,              -- NULL: the source was removed
    hash text,
    time timestamptz NOT NULL DEFAULT clock_timestamp(),
    tool_call text,          -- the unit tool that wrote it; NULL for other writers
    writer text,             -- the loader instance that wrote it (its own changes are not reloaded twice)
    listed boolean NOT NULL DEFAULT true  -- false: a rollback or a rejected version, not an accepted one
);
CREATE INDEX versions_of_source ON {SCHEMA}.versions (unit_id, source_id, version);
CREATE FUNCTION {SCHEMA}.record_version() RETURNS trigger LANGUAGE plpgsql SET search_path = pg_catalog AS $$
DECLARE
    row_ {SCHEMA}.sources%ROWTYPE;
    data_ bytea;
    number bigint;
BEGIN
    PERFORM pg_advisory_xact_lock({_LOCK_KEY});
    IF TG_OP = 'DELETE' THEN row_ := OLD; data_ := NULL; ELSE row_ := NEW; data_ := NEW.data; END IF;
    INSERT INTO {SCHEMA}.versions (unit_id, source_id, data, hash, tool_call, writer, listed)
    VALUES (row_.unit_id, row_.source_id, data_, {_HASH.format("data_")},
            nullif(current_setting('unit_mcp.tool_call', true), ''),
            nullif(current_setting('unit_mcp.writer', true), ''),
            coalesce(nullif(current_setting('unit_mcp.listed', true), ''), 'true')::boolean)
    RETURNING version INTO number;
    PERFORM pg_notify('{CHANNEL}', row_.unit_id || ':' || number);
    RETURN NULL;
END $$;
CREATE TRIGGER source_changed AFTER INSERT OR UPDATE OR DELETE ON {SCHEMA}.sources
    FOR EACH ROW EXECUTE FUNCTION {SCHEMA}.record_version();
"""
# What a store made by this loader has: table -> column -> type (checked at every start).
_COLUMNS = {
    "units": {"unit_id": "text", "kind": "text"},
    "sources": {"unit_id": "text", "source_id": "text", "data": "bytea"},
    "versions": {
        "version": "bigint",
        "unit_id": "text",
        "source_id": "text",
        "data": "bytea",
        "hash": "text",
        "time": "timestamp with time zone",
        "tool_call": "text",
        "writer": "text",
        "listed": "boolean",
    },
}
_PRIMARY = "CASE u.kind WHEN 'directory' THEN '__init__.py' ELSE u.unit_id || '.py' END"
_UNITS = (
    f"SELECT u.unit_id, u.kind FROM {SCHEMA}.units u WHERE EXISTS (SELECT 1 FROM {SCHEMA}.sources s "
    f"WHERE s.unit_id = u.unit_id AND s.source_id = {_PRIMARY})"
)

log = logging.getLogger("unit_mcp.pgloader")


def _key(source: Source) -> tuple[str, str]:
    return source.unit_id, source.source_id


def _check_tables(conn: Conn, expected: dict[str, dict[str, str]], *, present_only: bool = False) -> None:
    """`ForeignStore` unless each table of `expected` in our schema (each one there, with `present_only`) has
    exactly these columns and types."""
    found: dict[str, dict[str, str]] = {}
    for table, column, kind in conn.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns WHERE table_schema = ? "
        "AND table_name = ANY(?)",
        (SCHEMA, list(expected)),
    ):
        found.setdefault(table, {})[column] = kind
    for table, columns in expected.items():
        if found.get(table) != columns and (table in found or not present_only):
            raise ForeignStore(f"has a table {SCHEMA}.{table} unlike unit-mcp's; give another database")


def _unavailable(reason: str) -> StoreUnavailable:
    return StoreUnavailable(f"The units database is unreachable or held up ({reason}).")


class PostgresLoader(Loader):
    """Units as rows of a PostgreSQL database; the tables are created in an empty database, and a database holding
    anything else is refused at start."""

    name = "postgres"

    def __init__(self, address: str, *, read_only: bool = False, poll_interval: float = 2.0) -> None:
        self.address = address
        self.location = address
        self.read_only = read_only
        self.capabilities = Capabilities(write=not read_only, create=not read_only, history=True)
        self.poll_interval = poll_interval
        self.writer = secrets.token_hex(8)
        self._db = PostgresDatabase(address, name="unit-mcp", unavailable=_unavailable)
        self._versions_lock = threading.Lock()
        self._served: dict[str, int] = {}
        self._stored: dict[str, int] = {}
        self._errors: dict[str, str] = {}
        self._ids = StoredIds(log)
        self._unsettled: set[str] = set()  # units whose failed write could not be rolled back: reload them
        self._prepare()

    # -- the schema -------------------------------------------------------------------------

    def _prepare(self) -> None:
        """Check the schema (or create it in an empty database) before anything else is written."""
        with self._transaction() as conn:
            if not self._ours(conn):
                if self.read_only:
                    raise FileNotFoundError("holds no units store yet")
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_LOCK_KEY,))  # two servers starting at once
                if not self._ours(conn):  # made meanwhile by another server, or by another role: checked again
                    conn.execute(_DDL)
                    return
            _check_tables(conn, _COLUMNS)
            _check_tables(conn, _LOG_COLUMNS, present_only=True)  # made by the change log on first use
            if not conn.execute(
                f"SELECT 1 FROM pg_trigger WHERE tgname = 'source_changed' AND tgrelid = '{SCHEMA}.sources'::regclass "
                "AND tgenabled <> 'D'"
            ).fetchone():
                raise ForeignStore(f"has lost the trigger on {SCHEMA}.sources that records versions; restore it")

    @staticmethod
    def _ours(conn: PgConn) -> bool:
        try:
            return schema_is_ours(conn.raw, SCHEMA, MARK, alone=True)
        except ForeignSchema as exc:
            raise ForeignStore(str(exc)) from None

    @contextlib.contextmanager
    def _transaction(self, tool_call: str | None = None, *, listed: bool = True) -> Iterator[PgConn]:
        """One transaction; the trigger signs its version rows with this writer and `tool_call`. A lock held longer
        than 5 s by a stuck writer elsewhere ends it with `store_unavailable` rather than a hang."""
        with self._db.write() as conn:
            conn.execute(
                "SELECT set_config('unit_mcp.writer', ?, true), set_config('unit_mcp.tool_call', ?, true), "
                "set_config('unit_mcp.listed', ?, true), set_config('lock_timeout', '5s', true)",
                (self.writer, tool_call or "", "true" if listed else "false"),
            )
            yield conn

    def _query(self, sql: str, args: tuple[object, ...] = ()) -> list[Any]:
        return self._db.query(sql, args)

    def close(self) -> None:
        self._db.close()

    # -- discovery --------------------------------------------------------------------------

    def discover(self) -> dict[str, UnitKind]:
        found: dict[str, UnitKind] = {}
        for unit_id, kind in self._query(f"{_UNITS} ORDER BY u.unit_id"):
            if self._ids.unit(unit_id):
                found[unit_id] = kind
        return found

    def kind(self, unit_id: str) -> UnitKind | None:
        if not is_unit_id(unit_id):
            return None
        rows = self._query(f"{_UNITS} AND u.unit_id = ?", (unit_id,))
        return rows[0][1] if rows else None

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        if kind == "file":
            return [f"{unit_id}.py"]
        rows = self._query(f"SELECT source_id FROM {SCHEMA}.sources WHERE unit_id = ? ORDER BY 1", (unit_id,))
        return [str(r[0]) for r in rows if self._ids.source(unit_id, str(r[0]))]

    def sources(self, unit_id: str, kind: UnitKind) -> list[SourceInfo]:
        primary = primary_source_id(unit_id, kind)
        wanted = set(self.source_ids(unit_id, kind))
        rows = self._query(f"SELECT source_id, data FROM {SCHEMA}.sources WHERE unit_id = ? ORDER BY 1", (unit_id,))
        return [
            SourceInfo(sid, len(data), hash_bytes(data), sid == primary, artifact_kind(sid, data))
            for sid, data in rows
            if sid in wanted
        ]

    def source_stamps(self, units: Mapping[str, UnitKind]) -> dict[str, dict[str, Hashable | None]] | None:
        """Each source's newest version number: the trigger adds one for every change of `sources`, whoever makes
        it, and numbers are never reused. None if the trigger is gone or disabled (a change could leave none)."""
        with self._db.read() as conn:
            if not conn.execute(
                f"SELECT 1 FROM pg_trigger WHERE tgname = 'source_changed' AND tgrelid = '{SCHEMA}.sources'::regclass "
                "AND tgenabled <> 'D'"
            ).fetchone():
                return None
            rows = conn.execute(
                f"SELECT s.unit_id, s.source_id, (SELECT max(v.version) FROM {SCHEMA}.versions v WHERE v.unit_id = "
                f"s.unit_id AND v.source_id = s.source_id) FROM {SCHEMA}.sources s WHERE s.unit_id = ANY(?)",
                (list(units),),
            ).fetchall()
        return version_stamps(units, rows, self._ids.source)

    # -- sources ----------------------------------------------------------------------------

    def read_python_sources(self) -> dict[tuple[str, str], bytes]:
        """Every unit's Python sources by (unit id, source id), in one query: the host's start imports them all."""
        rows = self._query(f"SELECT unit_id, source_id, data FROM {SCHEMA}.sources WHERE source_id LIKE '%.py'")
        return {(unit_id, source_id): bytes(data) for unit_id, source_id, data in rows}

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        """With `max_bytes`, `SourceTooLarge` for a bigger source, whose bytes are not fetched."""
        rows = self._query(
            f"SELECT length(data), CASE WHEN ?::bigint IS NULL OR length(data) <= ? THEN data END "
            f"FROM {SCHEMA}.sources WHERE unit_id = ? AND source_id = ?",
            (max_bytes, max_bytes, *_key(source)),
        )
        if not rows:
            self._missing(source)
        size, data = rows[0]
        if data is None:
            raise SourceTooLarge(int(size))
        return bytes(data)

    def _missing(self, source: Source, conn: PgConn | None = None) -> NoReturn:
        """Raise why there is no such source, as the folder loader would say it."""
        sql = f"SELECT 1 FROM {SCHEMA}.sources WHERE unit_id = ? AND starts_with(source_id, ?) LIMIT 1"
        args = (source.unit_id, source.source_id + "/")
        if (conn.execute(sql, args).fetchall() if conn is not None else self._query(sql, args)) != []:
            raise NotASource()
        raise MissingSource()

    def origin(self, source: Source) -> str:
        unit_id, source_id = _key(source)
        folder = f"{self.location}/{unit_id}" if source.kind == "directory" else self.location
        return f"{folder}/{source_id}"

    def write(self, source: Source, data: bytes, *, expected_hash: str, tool_call: str) -> Written:
        with self._transaction(tool_call) as conn:
            previous = self._locked(conn, source, expected_hash)
            version = self._store(conn, source, data)
        return Written(source, data, previous, tool_call, token=version)

    def _locked(self, conn: PgConn, source: Source, expected_hash: str) -> bytes:
        """The source's bytes, row-locked until the transaction ends, if they still hash to `expected_hash`."""
        row = conn.execute(
            f"SELECT data FROM {SCHEMA}.sources WHERE unit_id = ? AND source_id = ? FOR UPDATE", _key(source)
        ).fetchone()
        if row is None:
            self._missing(source, conn)
        current = bytes(row[0])
        if hash_bytes(current) != expected_hash:
            raise StaleSource(hash_bytes(current))
        return current

    def _store(self, conn: PgConn, source: Source, data: bytes) -> int:
        conn.execute(f"UPDATE {SCHEMA}.sources SET data = ? WHERE unit_id = ? AND source_id = ?", (data, *_key(source)))
        return self._last_version(conn, source.unit_id)

    def _last_version(self, conn: PgConn, unit_id: str) -> int:
        """The version the trigger just recorded in this transaction (the advisory lock makes it the newest)."""
        row = conn.execute(f"SELECT max(version) FROM {SCHEMA}.versions WHERE unit_id = ?", (unit_id,)).fetchone()
        assert row is not None
        return int(row[0])

    def create(self, source: Source, data: bytes, *, tool_call: str) -> Written:
        unit_id, source_id = _key(source)
        with self._transaction(tool_call) as conn:
            conn.execute(f"SELECT 1 FROM {SCHEMA}.units WHERE unit_id = ? FOR UPDATE", (unit_id,))
            if conn.execute(
                f"SELECT 1 FROM {SCHEMA}.sources WHERE unit_id = ? AND (source_id = ? OR starts_with(source_id, ?))",
                (unit_id, source_id, source_id + "/"),
            ).fetchone():
                raise SourceExists()
            folders = ["/".join(source_id.split("/")[:n]) for n in range(1, source_id.count("/") + 1)]
            if (
                folders
                and conn.execute(
                    f"SELECT 1 FROM {SCHEMA}.sources WHERE unit_id = ? AND source_id = ANY(?)", (unit_id, folders)
                ).fetchone()
            ):
                raise PathConflict()
            conn.execute(
                f"INSERT INTO {SCHEMA}.sources (unit_id, source_id, data) VALUES (?, ?, ?)",
                (unit_id, source_id, data),
            )
            version = self._last_version(conn, unit_id)
        return Written(source, data, None, tool_call, token=version)

    def accept(self, written: Written) -> None:
        """The version was recorded with the write; this process serves it now."""
        self._served_now(written.source.unit_id, written.token)

    def rollback(self, written: Written) -> None:
        """Put the previous bytes back, only if the source is still what the write left (else `StaleSource`: the
        newer bytes of another writer stay), and unlist the rejected version. When that fails (an outage), the
        watch reloads the unit from the database once it can, so this server ends up serving what is stored."""
        try:
            self._roll_back(written)
        except BaseException:
            with self._versions_lock:
                self._unsettled.add(written.source.unit_id)
            raise

    def _roll_back(self, written: Written) -> None:
        unit_id = written.source.unit_id
        with self._transaction(None, listed=False) as conn:
            self._locked(conn, written.source, hash_bytes(written.data))
            if written.previous is None:
                conn.execute(f"DELETE FROM {SCHEMA}.sources WHERE unit_id = ? AND source_id = ?", _key(written.source))
                version = self._last_version(conn, unit_id)
            else:
                version = self._store(conn, written.source, written.previous)
            if written.token:  # a `Written` the service makes to remove a source has no version of its own
                conn.execute(f"UPDATE {SCHEMA}.versions SET listed = false WHERE version = ?", (written.token,))
        self._served_now(unit_id, version)  # the bytes put back are the ones still served

    # -- history ----------------------------------------------------------------------------

    def history(self, source: Source, limit: int) -> list[Version]:
        rows = self._query(
            f"SELECT version, hash, length(data), to_char(time AT TIME ZONE 'UTC', "
            f'\'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"\'), tool_call FROM {SCHEMA}.versions WHERE unit_id = ? '
            "AND source_id = ? AND listed AND data IS NOT NULL ORDER BY version DESC LIMIT ?",
            (*_key(source), limit),
        )
        return [Version(int(v), str(h), int(size), str(when), call) for v, h, size, when, call in rows]

    def version_data(self, source: Source, version: int) -> bytes:
        rows = self._query(
            f"SELECT data FROM {SCHEMA}.versions WHERE version = ? AND unit_id = ? AND source_id = ? AND listed "
            "AND data IS NOT NULL",
            (version, *_key(source)),
        )
        if not rows:
            raise UnknownVersion(version)
        return bytes(rows[0][0])

    # -- what this process serves -------------------------------------------------------------

    def _served_now(self, unit_id: str, version: int) -> None:
        with self._versions_lock:
            if version >= self._served.get(unit_id, 0):
                self._served[unit_id] = version
                self._errors.pop(unit_id, None)
            self._stored[unit_id] = max(version, self._stored.get(unit_id, 0))

    def unit_versions(self, unit_ids: list[str]) -> dict[str, UnitVersions]:
        """Per unit, the version this process serves (as far as its watch has seen; None without one) and the newest
        stored, with the reload error while behind."""
        rows = self._query(
            f"SELECT unit_id, max(version) FROM {SCHEMA}.versions WHERE unit_id = ANY(?) GROUP BY unit_id",
            (unit_ids,),
        )
        stored = {unit_id: int(version) for unit_id, version in rows}
        with self._versions_lock:
            out = {unit_id: UnitVersions(self._served.get(unit_id), stored.get(unit_id)) for unit_id in unit_ids}
            for unit_id, versions in out.items():
                versions.error = self._errors.get(unit_id) if versions.behind else None
            return out

    def change_log(self, retention: Retention) -> PostgresChangeLog | None:
        """The change log in this database (every replica sees every change); None when read-only."""
        return None if self.read_only else PostgresChangeLog(self.address, retention)

    # -- watching and copying -------------------------------------------------------------------

    def watch(self, target: WatchTarget, *, debounce_ms: int) -> _Listener:
        """`debounce_ms` is not used: a committed version is whole, so each is applied as soon as it is seen."""
        return _Listener(self, target)

    def put_unit(self, unit_id: str, kind: UnitKind, files: dict[str, bytes], *, replace: bool) -> None:
        with self._transaction() as conn:
            if conn.execute(f"SELECT 1 FROM {SCHEMA}.units WHERE unit_id = ? FOR UPDATE", (unit_id,)).fetchone():
                if not replace:
                    raise SourceExists()
                conn.execute(f"DELETE FROM {SCHEMA}.units WHERE unit_id = ?", (unit_id,))  # sources go too
            conn.execute(f"INSERT INTO {SCHEMA}.units (unit_id, kind) VALUES (?, ?)", (unit_id, kind))
            conn.executemany(
                f"INSERT INTO {SCHEMA}.sources (unit_id, source_id, data) VALUES (?, ?, ?)",
                [(unit_id, source_id, data) for source_id, data in sorted(files.items())],
            )


class _Listener:
    """One LISTEN connection per loader: after each (re)connect it catches up on every version newer than the last
    one seen, then wakes on each notification (or every poll interval, as a backstop: a LISTEN can go quiet) and
    reloads each unit changed by another writer once, at its newest version."""

    def __init__(self, loader: PostgresLoader, target: WatchTarget) -> None:
        self._loader = loader
        self._target = target
        self._stop = threading.Event()
        self._wake = f"{CHANNEL}_{loader.writer}"
        rows = loader._query(f"SELECT unit_id, max(version) FROM {SCHEMA}.versions GROUP BY unit_id")
        for unit_id, version in rows:
            loader._served_now(unit_id, int(version))  # the host serves what it loaded at start
        self._seen = max((int(v) for _, v in rows), default=0)
        self._armed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="unit-mcp-postgres-listen", daemon=True)
        self._thread.start()
        self._armed.wait(CONNECT_TIMEOUT + 2)  # listening (or retrying); anything committed later is caught up

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(StoreUnavailable, psycopg.Error):
            self._loader._query("SELECT pg_notify(?, '')", (self._wake,))
        self._thread.join(CONNECT_TIMEOUT + 2)

    def _run(self) -> None:
        down_since: float | None = None
        while not self._stop.is_set():
            try:
                with connect_postgres(self._loader.address, name=f"unit-mcp-listen-{self._loader.writer}") as raw:
                    conn = PgConn(raw)
                    conn.execute(f"LISTEN {CHANNEL}")
                    conn.execute(f'LISTEN "{self._wake}"')
                    if down_since is not None:
                        outage = time.monotonic() - down_since
                        log.warning("units database reachable again after %.1f s; catching up", outage)
                        down_since = None
                    self._armed.set()
                    while not self._stop.is_set():
                        self._catch_up(conn)
                        for _ in raw.notifies(timeout=self._loader.poll_interval, stop_after=1):
                            pass
            except (psycopg.Error, StoreUnavailable) as exc:
                self._armed.set()
                if down_since is None:
                    down_since = time.monotonic()
                    log.warning("listening to the units database failed (%s); reconnecting", str(exc).strip()[:200])
                self._stop.wait(0.2)
            except Exception:  # never let the watch die: log, reconnect, catch up
                self._armed.set()
                log.exception("watching the units database failed; reconnecting")
                self._stop.wait(1)

    def _catch_up(self, conn: PgConn) -> None:
        loader = self._loader
        with loader._versions_lock:
            unsettled, loader._unsettled = loader._unsettled, set()
        try:
            rows = conn.execute(
                f"SELECT version, unit_id, source_id, writer, tool_call FROM {SCHEMA}.versions WHERE version > ? "
                "ORDER BY version",
                (self._seen,),
            ).fetchall()
            changed: dict[str, set[str]] = {unit_id: set() for unit_id in sorted(unsettled)}
            with loader._versions_lock:
                for version, unit_id, source_id, writer, tool_call in rows:
                    loader._stored[unit_id] = max(int(version), loader._stored.get(unit_id, 0))
                    if writer != loader.writer:
                        outside = changed.setdefault(unit_id, set())
                        if writer is None and tool_call is None:  # not a loader's: psql, another application
                            outside.add(source_id)
                newest = {unit_id: loader._stored.get(unit_id, 0) for unit_id in changed}
            for unit_id, sources in changed.items():
                if is_unit_id(unit_id):
                    self._apply(conn, unit_id, newest[unit_id], sources)
                    unsettled.discard(unit_id)
        except BaseException:
            with loader._versions_lock:
                loader._unsettled |= unsettled
            raise
        if rows:
            self._seen = int(rows[-1][0])

    def _apply(self, conn: PgConn, unit_id: str, version: int, sources: set[str]) -> None:
        error = self._target.reload_changed(unit_id, sources)
        if error is None:
            self._loader._served_now(unit_id, version)
            return
        conn.execute("SELECT 1")  # the database went away meanwhile: raise, reconnect and catch up again
        with self._loader._versions_lock:
            self._loader._errors[unit_id] = error


_LOG_LOCK_KEY = 0x756E6963  # the advisory lock that orders change log records and checkpoints ('unic')
_LOG_DDL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.changes (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time text COLLATE "C" NOT NULL,  -- ISO 8601 UTC: sorts as bytes
    client_name text,
    client_version text,
    session_id text,
    tool text,
    unit_id text,
    source_id text,
    outcome text NOT NULL,
    error_code text,
    message text,
    duration_ms double precision NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS changes_by_time ON {SCHEMA}.changes (time);
CREATE INDEX IF NOT EXISTS changes_by_unit ON {SCHEMA}.changes (unit_id, source_id, id);
CREATE TABLE IF NOT EXISTS {SCHEMA}.change_sources (
    change_id bigint NOT NULL,
    unit_id text NOT NULL,
    source_id text NOT NULL,
    action text NOT NULL,
    hash_before text,
    hash_after text,
    data_before bytea,
    data_after bytea,
    PRIMARY KEY (change_id, unit_id, source_id)
);
CREATE INDEX IF NOT EXISTS change_sources_by_source ON {SCHEMA}.change_sources (unit_id, source_id, change_id);
CREATE TABLE IF NOT EXISTS {SCHEMA}.checkpoints (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    time text COLLATE "C" NOT NULL,
    label text,
    after_change bigint NOT NULL,
    client_name text,
    session_id text
);
CREATE TABLE IF NOT EXISTS {SCHEMA}.blobs (
    hash text COLLATE "C" NOT NULL UNIQUE,
    size bigint NOT NULL,
    stored double precision NOT NULL,
    data bytea NOT NULL
);
CREATE INDEX IF NOT EXISTS blobs_by_age ON {SCHEMA}.blobs (stored, hash);
CREATE TABLE IF NOT EXISTS {SCHEMA}.checkpoint_trees (
    checkpoint_id bigint PRIMARY KEY,
    tree text NOT NULL,
    state text
);
"""
_LOG_COLUMNS = {
    "changes": {
        "id": "bigint",
        "time": "text",
        "client_name": "text",
        "client_version": "text",
        "session_id": "text",
        "tool": "text",
        "unit_id": "text",
        "source_id": "text",
        "outcome": "text",
        "error_code": "text",
        "message": "text",
        "duration_ms": "double precision",
    },
    "change_sources": {
        "change_id": "bigint",
        "unit_id": "text",
        "source_id": "text",
        "action": "text",
        "hash_before": "text",
        "hash_after": "text",
        "data_before": "bytea",
        "data_after": "bytea",
    },
    "checkpoints": {
        "id": "bigint",
        "time": "text",
        "label": "text",
        "after_change": "bigint",
        "client_name": "text",
        "session_id": "text",
    },
    "blobs": {"hash": "text", "size": "bigint", "stored": "double precision", "data": "bytea"},
    "checkpoint_trees": {"checkpoint_id": "bigint", "tree": "text", "state": "text"},
}


class PostgresChangeLog(SqlChangeLog):
    """The change log in the units database, in tables of our schema (created when missing). Every record and
    checkpoint is written under one advisory lock, so ids commit in order across replicas and an outside change
    that every replica notices is recorded once."""

    def __init__(
        self, address: str, retention: Retention = DEFAULT_RETENTION, *, clock: Callable[[], float] = time.time
    ) -> None:
        db = PostgresDatabase(
            address,
            name="unit-mcp",
            unavailable=_unavailable,
            size=4,
            settings={"search_path": SCHEMA},  # the log's SQL names its tables as SQLite's does
            lock=f"SELECT pg_advisory_xact_lock({_LOG_LOCK_KEY}), set_config('lock_timeout', '5s', true)",
        )
        super().__init__(db, retention, clock)
        with self._transaction() as conn:
            conn.execute(_LOG_DDL)
            _check_tables(conn, _LOG_COLUMNS)
