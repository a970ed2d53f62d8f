"""The two databases a `SessionStore` keeps its tables in: SQLite (one file per store, WAL) and PostgreSQL (a schema
of its own, shared by the machines that point at it). Both hold the same tables and answer the same SQL (written
with `?` placeholders); what differs is here: connecting, creating or checking the tables, a write transaction
that excludes every other writer, a read transaction that sees one snapshot, and the durability settings.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ..pgconnect import CONNECT_OPTIONS, ForeignSchema, address_problem, first_line, schema_is_ours, shown_address
from .errors import AgentError, SessionStoreUnavailable

if TYPE_CHECKING:
    import psycopg

Durability = Literal["always", "flush", "never"]
DATABASE = "sessions.db"
SCHEMA_VERSION = 2  # 2: the paging index (a store of version 1 gets it when it is next opened for writing)
PG_SCHEMA = "unit_mcp_sessions"
PG_MARK = "unit-mcp session store, schema 1"
_PG_LOCK = 0x73657373  # the advisory lock two stores creating the schema at once take ('sess')

SQLITE_TABLES = f"""
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, agent_id TEXT NOT NULL, title TEXT, status TEXT NOT NULL, parent_id TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, data TEXT NOT NULL, item_count INTEGER NOT NULL,
    asks INTEGER NOT NULL DEFAULT 0, created_seq INTEGER NOT NULL, head_seq INTEGER NOT NULL, seq INTEGER NOT NULL);
DROP INDEX IF EXISTS sessions_by_update;
CREATE INDEX IF NOT EXISTS sessions_by_page ON sessions (updated_at DESC, id);
CREATE TABLE IF NOT EXISTS items (
    session_id TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE, position INTEGER NOT NULL,
    body TEXT NOT NULL, created_seq INTEGER NOT NULL, seq INTEGER NOT NULL,
    PRIMARY KEY (session_id, position)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS items_by_seq ON items (session_id, seq);
CREATE TABLE IF NOT EXISTS writers (
    session_id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL, token TEXT NOT NULL,
    heartbeat REAL NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
    at REAL NOT NULL, action TEXT NOT NULL, via TEXT NOT NULL, session TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clock (one INTEGER PRIMARY KEY CHECK (one = 1), seq INTEGER NOT NULL);
INSERT OR IGNORE INTO clock VALUES (1, 0);
PRAGMA user_version = {SCHEMA_VERSION};
"""


def _pg_tables(schema: str) -> str:
    return f"""
CREATE SCHEMA {schema};
COMMENT ON SCHEMA {schema} IS '{PG_MARK}';
CREATE TABLE {schema}.sessions (
    id text PRIMARY KEY, agent_id text NOT NULL, title text, status text NOT NULL, parent_id text,
    created_at double precision NOT NULL, updated_at double precision NOT NULL, data text NOT NULL,
    item_count bigint NOT NULL, asks bigint NOT NULL DEFAULT 0, created_seq bigint NOT NULL,
    head_seq bigint NOT NULL, seq bigint NOT NULL);
CREATE INDEX sessions_by_page ON {schema}.sessions (updated_at DESC, id);
CREATE TABLE {schema}.items (
    session_id text NOT NULL REFERENCES {schema}.sessions (id) ON DELETE CASCADE, position bigint NOT NULL,
    body text NOT NULL, created_seq bigint NOT NULL, seq bigint NOT NULL, PRIMARY KEY (session_id, position));
CREATE INDEX items_by_seq ON {schema}.items (session_id, seq);
CREATE TABLE {schema}.writers (
    session_id text PRIMARY KEY, host text NOT NULL, pid bigint NOT NULL, token text NOT NULL,
    heartbeat double precision NOT NULL);
CREATE TABLE {schema}.audit (
    at double precision NOT NULL, action text NOT NULL, via text NOT NULL, session text NOT NULL,
    n bigint GENERATED ALWAYS AS IDENTITY);
CREATE TABLE {schema}.clock (one integer PRIMARY KEY CHECK (one = 1), seq bigint NOT NULL);
INSERT INTO {schema}.clock VALUES (1, 0);
"""


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    def execute(self, sql: str, args: Sequence[Any] = ..., /) -> Cursor: ...
    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> Any: ...


class Database(Protocol):
    """A store's connection and the few statements that differ between the two databases."""

    conn: Conn
    audit_order: str  # the column that orders the audit trail as it was written
    errors: tuple[type[Exception], ...]  # what a failed statement raises

    def begin_write(self) -> None:
        """Begin a transaction no other writer of the store runs beside (they wait for it)."""

    def begin_read(self) -> None:
        """Begin a transaction whose reads all see one snapshot."""

    def commit(self) -> None: ...
    def rollback(self) -> None: ...

    def synchronous(self) -> contextlib.AbstractContextManager[None]:
        """Commits made inside are durable with every commit before them (a flush point)."""

    def problems(self) -> list[str]:
        """What the database's own check finds wrong with its files."""

    def close(self) -> None: ...


# -- SQLite ---------------------------------------------------------------------------------------

SYNCHRONOUS = {"always": "FULL", "flush": "NORMAL", "never": "OFF"}


class SqliteDatabase:
    audit_order = "rowid"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, folder: Path, durability: Durability) -> None:
        path = folder / DATABASE
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, flags, 0o600))
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
        if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
            raise AgentError(f"{path}: the session store needs SQLite's WAL mode, which this file system refuses")
        if conn.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
            conn.executescript(f"BEGIN IMMEDIATE;{SQLITE_TABLES}COMMIT;")
        self.durability = durability
        self._sqlite = conn
        self.conn: Conn = conn  # type: ignore[assignment]  # sqlite3's cursor is the protocol's

    @staticmethod
    def exists(folder: Path) -> bool:
        return (folder / DATABASE).exists()

    def begin_write(self) -> None:
        self._sqlite.execute("BEGIN IMMEDIATE")

    def begin_read(self) -> None:
        self._sqlite.execute("BEGIN")

    def commit(self) -> None:
        self._sqlite.execute("COMMIT")

    def rollback(self) -> None:
        self._sqlite.execute("ROLLBACK")

    @contextlib.contextmanager
    def synchronous(self) -> Iterator[None]:
        """A FULL commit syncs the write-ahead log, with every commit before it."""
        self._sqlite.execute("PRAGMA synchronous = FULL")
        try:
            yield
        finally:
            self._sqlite.execute(f"PRAGMA synchronous = {SYNCHRONOUS[self.durability]}")

    def problems(self) -> list[str]:
        return [row[0] for row in self._sqlite.execute("PRAGMA integrity_check") if row[0] != "ok"]

    def close(self) -> None:
        self._sqlite.close()


# -- PostgreSQL -----------------------------------------------------------------------------------

# synchronous_commit: "on" waits for the commit to reach disk; "off" lets the server acknowledge first (a crash of
# the database server, not of the writer, may lose the last acknowledged commits until the next flush point)
SYNCHRONOUS_COMMIT = {"always": "on", "flush": "off", "never": "off"}


def postgres_problem(address: str) -> str | None:
    """Why `address` cannot hold a session store before connecting (a password in it, no database, no driver)."""
    problem = address_problem(address)
    return None if problem is None else f"the session store {shown_address(address)} {problem}"


class _PgConn:
    """psycopg behind the store's SQL: `?` placeholders, an outage as `SessionStoreUnavailable` (one line), and a new
    connection on the next transaction after one was lost."""

    def __init__(self, database: PostgresDatabase) -> None:
        self._database = database
        self._sql: dict[str, str] = {}

    def _text(self, sql: str) -> str:
        text = self._sql.get(sql)
        if text is None:
            text = self._sql[sql] = sql.replace("?", "%s")
        return text

    def execute(self, sql: str, args: Sequence[Any] = (), /) -> Cursor:
        import psycopg

        try:
            cursor = self._database.connection().execute(self._text(sql), args or None)  # type: ignore[arg-type]
            return cursor  # type: ignore[return-value]
        except psycopg.OperationalError as exc:
            raise self._database.lost(exc) from None

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]], /) -> None:
        import psycopg

        try:
            with self._database.connection().cursor() as cursor:
                cursor.executemany(self._text(sql), rows)  # type: ignore[arg-type]
        except psycopg.OperationalError as exc:
            raise self._database.lost(exc) from None


class PostgresDatabase:
    audit_order = "n"

    def __init__(self, address: str, schema: str, durability: Durability) -> None:
        import psycopg

        self.address = address
        self.schema = schema
        self.durability = durability
        self.errors: tuple[type[Exception], ...] = (psycopg.Error,)
        self.conn: Conn = _PgConn(self)
        self._psycopg: psycopg.Connection[Any] | None = None
        self._in_transaction = False

    def connection(self) -> psycopg.Connection[Any]:
        import psycopg

        if self._psycopg is not None and not self._psycopg.closed:
            return self._psycopg
        if self._in_transaction:
            raise self.lost(psycopg.OperationalError("the connection was lost during a transaction"))
        try:
            conn = psycopg.connect(self.address, application_name="unit-mcp-sessions", **CONNECT_OPTIONS)
        except psycopg.OperationalError as exc:
            raise self.lost(exc) from None
        conn.execute(f"SET search_path = {self.schema}")
        conn.execute("SELECT set_config('synchronous_commit', %s, false)", (SYNCHRONOUS_COMMIT[self.durability],))
        self._psycopg = conn
        return conn

    def lost(self, exc: BaseException) -> SessionStoreUnavailable:
        if self._psycopg is not None:
            self._psycopg.close()
        return SessionStoreUnavailable(
            f"the session store {shown_address(self.address)} is unreachable ({first_line(exc)}); nothing was "
            "written: try again once the database is back"
        )

    def prepare(self, *, create: bool) -> bool:
        """Check that the schema is the store's (or create it, with `create`); False when there is none yet."""
        import psycopg

        conn = self.connection()
        try:
            with conn.transaction():
                if schema_is_ours(conn, self.schema, PG_MARK, alone=False):
                    return True
                if not create:
                    return False
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PG_LOCK,))  # two stores starting at once
                if schema_is_ours(conn, self.schema, PG_MARK, alone=False):
                    return True
                conn.execute(_pg_tables(self.schema))  # type: ignore[arg-type]
                return True
        except ForeignSchema as exc:
            raise AgentError(f"the session store {shown_address(self.address)} {exc}") from None
        except psycopg.OperationalError as exc:
            raise self.lost(exc) from None

    def begin_write(self) -> None:
        self.conn.execute("BEGIN")
        self._in_transaction = True
        self.conn.execute("SELECT 1 FROM clock FOR UPDATE")  # every writer takes this row first: one at a time

    def begin_read(self) -> None:
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        self._in_transaction = True

    def commit(self) -> None:
        try:
            self.conn.execute("COMMIT")
        finally:
            self._in_transaction = False

    def rollback(self) -> None:
        self._in_transaction = False
        if self._psycopg is not None and not self._psycopg.closed:
            with contextlib.suppress(*self.errors):
                self._psycopg.execute("ROLLBACK")

    @contextlib.contextmanager
    def synchronous(self) -> Iterator[None]:
        """A commit with synchronous_commit on waits for the log up to it, every earlier commit included."""
        self.conn.execute("SET synchronous_commit = on")
        try:
            yield
        finally:
            with contextlib.suppress(SessionStoreUnavailable):
                self.conn.execute(f"SET synchronous_commit = {SYNCHRONOUS_COMMIT[self.durability]}")

    def problems(self) -> list[str]:
        return []  # PostgreSQL checks its own pages; the store's own consistency is checked by `verify`

    def close(self) -> None:
        if self._psycopg is not None:
            self._psycopg.close()
            self._psycopg = None
