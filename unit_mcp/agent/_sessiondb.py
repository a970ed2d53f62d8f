"""The two databases a `SessionStore` keeps its tables in, on the shared SQL layer (`unit_mcp.database`): SQLite
(one file per store, WAL) and PostgreSQL (a schema of its own, shared by the machines that point at it). Both hold
the same tables and answer the same SQL (written with `?` placeholders); what differs is here: the tables, creating
or checking them, what orders writers and the audit trail, and the durability settings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from ..database import PostgresDatabase, SqliteDatabase
from ..pgconnect import ForeignSchema, address_problem, schema_is_ours, shown_address
from .errors import AgentError, SessionStoreUnavailable

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


Database = SqliteDatabase | PostgresDatabase
AUDIT_ORDER = {"sqlite": "rowid", "postgresql": "n"}  # the column that orders the audit trail as it was written

# -- SQLite ---------------------------------------------------------------------------------------

SYNCHRONOUS = {"always": "FULL", "flush": "NORMAL", "never": "OFF"}


def sqlite_exists(folder: Path) -> bool:
    return (folder / DATABASE).exists()


def open_sqlite(folder: Path, durability: Durability) -> SqliteDatabase:
    """The store's file, 0600, its tables made or brought to SCHEMA_VERSION."""

    def refused(path: Path) -> Exception:
        return AgentError(f"{path}: the session store needs SQLite's WAL mode, which this file system refuses")

    return SqliteDatabase(
        folder / DATABASE,
        private="create",
        synchronous=SYNCHRONOUS[durability],
        foreign_keys=True,
        schema=SQLITE_TABLES,
        schema_version=SCHEMA_VERSION,
        wal_refused=refused,
    )


def problems(db: Database) -> list[str]:
    """What the database's own check finds wrong with its files (PostgreSQL checks its own pages)."""
    if isinstance(db, SqliteDatabase):
        return [row[0] for row in db.execute("PRAGMA integrity_check") if row[0] != "ok"]
    return []


# -- PostgreSQL -----------------------------------------------------------------------------------

# synchronous_commit: "on" waits for the commit to reach disk; "off" lets the server acknowledge first (a crash of
# the database server, not of the writer, may lose the last acknowledged commits until the next flush point)
SYNCHRONOUS_COMMIT = {"always": "on", "flush": "off", "never": "off"}


def postgres_problem(address: str) -> str | None:
    """Why `address` cannot hold a session store before connecting (a password in it, no database, no driver)."""
    problem = address_problem(address)
    return None if problem is None else f"the session store {shown_address(address)} {problem}"


def open_postgres(address: str, schema: str, durability: Durability, *, create: bool) -> PostgresDatabase | None:
    """The store's schema, checked to be the store's (or created, with `create`); None when there is none yet.
    Every writer takes the clock row first: one at a time."""

    def unavailable(reason: str) -> SessionStoreUnavailable:
        return SessionStoreUnavailable(
            f"the session store {shown_address(address)} is unreachable ({reason}); nothing was written: try again "
            "once the database is back"
        )

    db = PostgresDatabase(
        address,
        name="unit-mcp-sessions",
        unavailable=unavailable,
        size=1,
        settings={"search_path": schema, "synchronous_commit": SYNCHRONOUS_COMMIT[durability]},
        lock="SELECT 1 FROM clock FOR UPDATE",
    )
    try:
        if _prepare(db, schema, create=create):
            return db
    except BaseException:
        db.close()
        raise
    db.close()
    return None


def _prepare(db: PostgresDatabase, schema: str, *, create: bool) -> bool:
    try:
        with db.write(lock=False) as conn:
            if schema_is_ours(conn.raw, schema, PG_MARK, alone=False):
                return True
            if not create:
                return False
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_PG_LOCK,))  # two stores starting at once
            if schema_is_ours(conn.raw, schema, PG_MARK, alone=False):
                return True
            conn.execute(_pg_tables(schema))
            return True
    except ForeignSchema as exc:
        raise AgentError(f"the session store {shown_address(db.address)} {exc}") from None
