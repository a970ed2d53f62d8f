"""SessionStore: agent sessions in one SQLite or PostgreSQL database, read and written through this module only.

Every write is one transaction that excludes other writers, with the durability the store was opened with; one
writer claims a session at a time (`SessionLocked` for a second), and loading repairs what a dead turn left.
All methods are blocking and thread-safe. Durability, sharing and retiring: docs/sessions.md.
"""

from __future__ import annotations

import base64
import builtins
import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import TypeAdapter

from ..database import Conn
from ..paths import private_dir
from ..pgconnect import is_postgres
from ._sessiondb import (
    AUDIT_ORDER,
    PG_SCHEMA,
    Database,
    Durability,
    open_postgres,
    open_sqlite,
    postgres_problem,
    problems,
    sqlite_exists,
)
from .approvals import GRANTS_KEY, ApprovalRequest, normalise_risk
from .errors import AgentError, SessionLocked, SessionNotFound
from .items import ITEM, SESSION_ID, EventItem, Item, Session, SessionMeta, SessionStatus
from .paused import REQUESTED, State, repair, waiting

log = logging.getLogger("unit_mcp.agent.sessions")

__all__ = ["Changes", "Durability", "Pending", "SessionPage", "SessionStore"]
UPDATABLE = frozenset({"title", "status", "data", "parent_id"})
ARCHIVE = "archive"  # the folder (PostgreSQL: the schema suffix) of the store archived sessions move to
Retirement = Literal["delete", "archive"]
HEARTBEAT_SECONDS = 5.0  # how often a writer refreshes its claims
STALE_SECONDS = 30.0  # a claim whose heartbeat is older is dead even if its pid exists (reused, or another host)
HOST = socket.gethostname()
# the writable stores of this process by token: a store closed or garbage-collected holds nothing any more
_HELD: weakref.WeakValueDictionary[str, SessionStore] = weakref.WeakValueDictionary()

HEAD = "id, agent_id, title, status, parent_id, created_at, updated_at, item_count"
METAS = TypeAdapter(list[SessionMeta])


def new_session_id() -> str:
    return f"ses-{secrets.token_hex(8)}"


def _check_id(session_id: str) -> str:
    if not SESSION_ID.fullmatch(session_id):
        raise AgentError(f"invalid session id {session_id!r}: use letters, digits, '-' and '_' (max 128)")
    return session_id


def _dump(item: Item) -> str:
    return json.dumps(item.model_dump(mode="json"), ensure_ascii=False, separators=(",", ":"))


def _data(session: Session) -> str:
    return json.dumps(session.model_dump(mode="json", include={"data"})["data"], ensure_ascii=False)


def _asks(item: Item) -> int:
    return int(isinstance(item, EventItem) and item.kind == REQUESTED)


def _metas(rows: builtins.list[Any]) -> builtins.list[SessionMeta]:
    names = HEAD.split(", ")
    return METAS.validate_python([dict(zip(names, row, strict=True)) for row in rows])  # validated at once


def _next(meta: SessionMeta) -> str:
    """The opaque cursor after `meta` in newest-first order."""
    return base64.urlsafe_b64encode(json.dumps([meta.updated_at, meta.id]).encode()).decode().rstrip("=")


def _cursor(cursor: str) -> tuple[float, str]:
    try:
        updated_at, session_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(updated_at, (int, float)) and isinstance(session_id, str):
            return float(updated_at), session_id
    except (ValueError, TypeError):
        pass
    raise AgentError(f"invalid page cursor {cursor[:40]!r}: give the `next` cursor a page of sessions returned")


@dataclass(frozen=True)
class Pending:
    """An approval request that waits for an answer, with the session it waits in (see `paused.waiting`)."""

    request: ApprovalRequest
    session: SessionMeta
    state: State
    writer_pid: int | None  # the other process whose turn asks it ("elsewhere"), else None


@dataclass(frozen=True)
class Changes:
    """What changed in one session after clock value `after`: change records in order (`{"op": "session"}` when
    its title, status, data or parent changed; `"item"` for a new item, `"update_item"` for one changed since it
    was added; each with its clock value `"seq"`), and the cursor to ask from next. `reset`: the session was
    replaced since, so a view built from before must start over."""

    cursor: int
    records: list[dict[str, Any]]
    reset: bool = False


@dataclass(frozen=True)
class SessionPage:
    """Sessions newest first, and the cursor that asks for the ones after them (None: there are no more)."""

    sessions: list[SessionMeta]
    next: str | None


@dataclass
class _Open:
    """A session this store holds for writing: its state, its item index and the partials not yet stored."""

    session: Session
    index: dict[str, int] = field(default_factory=dict)
    unpersisted: set[str] = field(default_factory=set)


class Writer(NamedTuple):
    """The process holding a session for writing, and when it last said it lives."""

    host: str
    pid: int
    heartbeat: float

    def alive(self) -> bool:
        """Whether it still lives: it beat within `STALE_SECONDS` and, on this host, its process exists."""
        if time.time() - self.heartbeat > STALE_SECONDS:
            return False
        if self.host == HOST:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                pass
        return True


class SessionStore:
    """Create, load, update and list sessions in the store at `address` (a folder, or `postgresql://…`; `archive`:
    the store archived sessions move to); loaded sessions are held (claimed and cached) until `invalidate()` or
    `close()`."""

    def __init__(
        self,
        address: str | os.PathLike[str],
        *,
        durability: Durability = "always",
        read_only: bool = False,
        archive: bool = False,
    ) -> None:
        self.address: str | os.PathLike[str] = address
        self.archive = archive
        self.read_only = read_only
        self.durability: Durability = durability
        self._lock = threading.RLock()
        self._open: dict[str, _Open] = {}
        self._token = secrets.token_hex(16)
        self._db: Database | None = None
        self._conn: Conn | None = None
        self._beat: threading.Thread | None = None
        self._closed = threading.Event()
        self._pending: dict[str, tuple[object, builtins.list[Pending]]] = {}
        self._folder: Path | None = None
        if is_postgres(address):
            problem = postgres_problem(str(address))
            if problem:
                raise AgentError(problem)
        else:
            self._folder = Path(address) / ARCHIVE if archive else Path(address)
            if not read_only:
                self._folder = private_dir(self._folder)
        if not read_only:
            self._connect()

    @property
    def root(self) -> Path:
        """The folder of a SQLite store."""
        if self._folder is None:
            raise AgentError("a PostgreSQL session store has no folder")
        return self._folder

    @property
    def name(self) -> str:
        """The store as it may be shown (a folder, or an address without a password)."""
        from ..pgconnect import shown_address

        return str(self._folder) if self._folder is not None else shown_address(str(self.address))

    # -- CRUD -----------------------------------------------------------------------------------

    def create(
        self,
        agent_id: str,
        *,
        title: str | None = None,
        data: dict[str, Any] | None = None,
        parent_id: str | None = None,
        session_id: str | None = None,
    ) -> Session:
        with self._lock:
            self._writable()
            sid = _check_id(new_session_id() if session_id is None else session_id)
            now = time.time()
            session = Session(
                id=sid,
                agent_id=agent_id,
                title=title,
                parent_id=parent_id,
                created_at=now,
                updated_at=now,
                data=dict(data or {}),
            )
            with self._write() as (conn, seq):
                if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (sid,)).fetchone():
                    raise AgentError(f"session {sid} already exists")
                self._insert_session(conn, session, seq)
                self._claim(conn, sid)
            self._hold(_Open(session))
            return session

    def load(self, session_id: str) -> Session | None:
        """The session (held: from the cache, or read, claimed and repaired), or None if there is none."""
        with self._lock:
            _check_id(session_id)
            if self.read_only:
                return self._read(session_id)
            opened = self._load(session_id)
            return None if opened is None else opened.session

    def require(self, session_id: str) -> Session:
        session = self.load(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id}")
        return session

    def save(self, session: Session) -> Session:
        """Store `session` whole as the new state of its id (also how `sessions import` brings journals in)."""
        with self._lock:
            self._writable()
            _check_id(session.id)
            with self._write() as (conn, seq):
                self._claim(conn, session.id)
                row = conn.execute("SELECT created_seq FROM sessions WHERE id = ?", (session.id,)).fetchone()
                conn.execute("DELETE FROM items WHERE session_id = ?", (session.id,))
                conn.execute("DELETE FROM sessions WHERE id = ?", (session.id,))
                self._insert_session(conn, session, seq, created_seq=row[0] if row else seq)
                conn.executemany(
                    "INSERT INTO items VALUES (?, ?, ?, ?, ?)",
                    [(session.id, n, _dump(item), seq, seq) for n, item in enumerate(session.items)],
                )
            self._hold(_Open(session))
            return session

    def delete(self, session_id: str) -> bool:
        with self._lock:
            self._writable()
            _check_id(session_id)
            self.invalidate(session_id)
            with self._write() as (conn, _):
                conn.execute("DELETE FROM writers WHERE session_id = ?", (session_id,))
                return conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

    def retire(self, session_id: str, action: Retirement, *, via: str) -> SessionMeta:
        """Delete or archive a session on someone's request (`via`: the CLI, the page): refused (AgentError)
        while a turn runs in it, here or in another process holding it, and recorded in the store's audit. An
        archived session moves to the store in `ARCHIVE` with a `session-archived` event of its own."""
        with self._lock:
            try:
                opened = self._require_open(session_id)
            except SessionLocked:
                raise AgentError(
                    f"session {session_id} is open in another process (a turn may run there); stop that turn, or "
                    "retry once the process has let the session go"
                ) from None
            if opened.session.status == "running":
                raise AgentError(f"session {session_id} has a running turn; cancel it or wait for it to end first")
            meta = opened.session.meta()
            if action == "archive" and self.archive:
                raise AgentError(f"session {session_id} is archived already; delete it from the archive instead")
            if action == "archive":  # copied first: a crash in between leaves it in both stores, never in none
                self.append_item(opened.session, EventItem(kind="session-archived", data={"via": via}))
                archive = SessionStore(self.address, durability=self.durability, archive=True)
                try:
                    archive.save(opened.session)
                finally:
                    archive.close()
            self.invalidate(session_id)
            with self._write() as (conn, _):
                conn.execute("DELETE FROM writers WHERE session_id = ?", (session_id,))
                conn.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
                record = (time.time(), action, via, meta.model_dump_json())
                conn.execute("INSERT INTO audit (at, action, via, session) VALUES (?, ?, ?, ?)", record)
            return meta

    def audit(self) -> builtins.list[dict[str, Any]]:
        """The store's audit trail, oldest first: every session deleted or archived, when and from where."""
        with self._lock:
            conn = self._reader()
            if conn is None or self._db is None:
                return []
            rows = conn.execute(f"SELECT at, action, via, session FROM audit ORDER BY {AUDIT_ORDER[self._db.dialect]}")
            return [
                {"at": at, "action": action, "via": via, "session": json.loads(session)}
                for at, action, via, session in rows
            ]

    def list(self, *, parent_id: str | None = None) -> builtins.list[SessionMeta]:
        """Metadata of every session (or every child of `parent_id`), newest first, never the items (a page or the
        CLI asks for `page`s)."""
        where, args = ("WHERE parent_id = ? ", (parent_id,)) if parent_id is not None else ("", ())
        with self._lock:
            conn = self._reader()
            if conn is None:
                return []
            rows = conn.execute(f"SELECT {HEAD} FROM sessions {where}ORDER BY updated_at DESC, id", args).fetchall()
        return _metas(rows)

    def running(self) -> builtins.list[tuple[Session, Writer | None]]:
        """Every session marked running, oldest change first, with the process holding it for writing (None: no
        claim): who is doing what (`agent status`). Sessions are read as stored, never claimed."""
        with self._lock, self._snapshot() as conn:
            if conn is None:
                return []
            ids = conn.execute("SELECT id FROM sessions WHERE status = 'running' ORDER BY updated_at, id").fetchall()
            rows = conn.execute("SELECT session_id, host, pid, heartbeat FROM writers").fetchall()
        writers = {sid: Writer(host, int(pid), float(beat)) for sid, host, pid, beat in rows}
        found = []
        for (sid,) in ids:
            session = self._read(sid)
            if session is not None and session.status == "running":
                found.append((session, writers.get(sid)))
        return found

    def page(self, limit: int = 50, cursor: str | None = None) -> SessionPage:
        """Up to `limit` sessions, newest first, after `cursor` (the `next` of the page before): one index range,
        as quick in a store of 10,000 sessions as in one of 10."""
        if limit < 1:
            raise AgentError(f"a page holds at least one session (limit {limit})")
        where: str = ""
        args: tuple[Any, ...] = ()
        if cursor is not None:  # keyset paging: one range of the (updated_at DESC, id) index however deep the page
            updated_at, last = _cursor(cursor)
            where, args = "WHERE updated_at <= ? AND (updated_at < ? OR id > ?) ", (updated_at, updated_at, last)
        with self._lock:
            conn = self._reader()
            if conn is None:
                return SessionPage([], None)
            rows = conn.execute(
                f"SELECT {HEAD} FROM sessions {where}ORDER BY updated_at DESC, id LIMIT ?", (*args, limit + 1)
            ).fetchall()
        metas = _metas(rows[:limit])
        last_shown = metas[-1] if len(rows) > limit else None
        return SessionPage(metas, None if last_shown is None else _next(last_shown))

    def meta(self, session_id: str) -> SessionMeta | None:
        """One session's metadata, or None if there is none."""
        with self._lock:
            conn = self._reader()
            row = None if conn is None else conn.execute(f"SELECT {HEAD} FROM sessions WHERE id = ?", (session_id,))
            found = None if row is None else row.fetchone()
        return None if found is None else SessionMeta.model_validate(dict(zip(HEAD.split(", "), found, strict=True)))

    # -- items and updates ----------------------------------------------------------------------

    def append_item(
        self, session: Session | str, item: Item, *, status: SessionStatus | None = None, grant: str | None = None
    ) -> Item:
        """Persist `item` at the end of the stream; the store assigns its `id` and `created_at`. `status` sets the
        session's status in the same transaction (a turn's start and end: one commit instead of two); `grant` adds
        a risk the user allowed for the rest of the session to its data (with the decision that allowed it)."""
        with self._lock:
            opened = self._require_open(session)
            current = opened.session
            position = len(current.items)
            stored = item.model_copy(update={"id": f"itm-{position + 1}", "created_at": item.created_at or time.time()})
            updated_at = max(current.updated_at, stored.created_at)
            with self._write(current.id) as (conn, seq):
                conn.execute(
                    "INSERT INTO items VALUES (?, ?, ?, ?, ?)", (current.id, position, _dump(stored), seq, seq)
                )
                conn.execute(
                    "UPDATE sessions SET item_count = ?, updated_at = ?, asks = asks + ?, seq = ? WHERE id = ?",
                    (position + 1, updated_at, _asks(stored), seq, current.id),
                )
                if status is not None and status != current.status:
                    conn.execute("UPDATE sessions SET status = ?, head_seq = ? WHERE id = ?", (status, seq, current.id))
                if grant is not None:
                    granted = sorted({*current.data.get(GRANTS_KEY, []), normalise_risk(grant)})
                    data = {**current.data, GRANTS_KEY: granted}
                    conn.execute(
                        "UPDATE sessions SET data = ?, head_seq = ? WHERE id = ?",
                        (json.dumps(data, ensure_ascii=False), seq, current.id),
                    )
            if grant is not None:
                current.data = data
            opened.index[stored.id] = position
            current.items.append(stored)
            current.updated_at = updated_at
            if status is not None:
                current.status = status
            return stored

    def update_item(
        self, session: Session | str, item_id: str, changes: dict[str, Any], *, persist: bool = True
    ) -> Item:
        """Change fields of an item. `persist=False` is for streaming partials: memory only until the next
        persisted update of that item or `flush()`."""
        with self._lock:
            opened = self._require_open(session)
            position = opened.index.get(item_id)
            if position is None:
                raise AgentError(f"session {opened.session.id} has no item {item_id}")
            frozen = {"id", "type", "created_at"} & changes.keys()
            if frozen:
                raise AgentError(f"item fields {sorted(frozen)} cannot be changed")
            new = ITEM.validate_python({**opened.session.items[position].model_dump(), **changes})
            if persist:
                self._store_item(opened.session.id, position, new)
                opened.unpersisted.discard(item_id)
            else:
                opened.unpersisted.add(item_id)
            opened.session.items[position] = new
            return new

    def update(self, session: Session | str, **changes: Any) -> Session:
        """Change session metadata or agent data (`title`, `status`, `data`, `parent_id`)."""
        with self._lock:
            unknown = changes.keys() - UPDATABLE
            if unknown:
                raise AgentError(f"session fields {sorted(unknown)} cannot be updated (allowed: {sorted(UPDATABLE)})")
            opened = self._require_open(session)
            changes["updated_at"] = time.time()
            probe = Session.model_validate({**opened.session.model_dump(exclude={"items"}), **changes})
            with self._write(probe.id) as (conn, seq):
                conn.execute(
                    "UPDATE sessions SET title = ?, status = ?, data = ?, parent_id = ?, updated_at = ?, head_seq = ?, "
                    "seq = ? WHERE id = ?",
                    (probe.title, probe.status, _data(probe), probe.parent_id, probe.updated_at, seq, seq, probe.id),
                )
            for key in changes:
                setattr(opened.session, key, getattr(probe, key))
            return opened.session

    # -- readers ----------------------------------------------------------------------------------

    def pending(
        self, session_id: str | None = None, live_turn: Callable[[str], str | None] = lambda _: None
    ) -> builtins.list[Pending]:
        """Approval requests that wait for an answer (in one session, or all), oldest first, by the one rule
        (`paused.waiting`); `live_turn` names the turn this process runs in a session. A session is read again
        only when it or its writer changed."""
        with self._lock:
            conn = self._reader()
            if conn is None:
                return []
            query = "SELECT id, seq FROM sessions WHERE asks > 0" + (" AND id = ?" if session_id else "")
            rows = conn.execute(query, (session_id,) if session_id else ()).fetchall()
            found: dict[str, tuple[object, builtins.list[Pending]]] = {}
            for sid, seq in rows:
                live, writer = live_turn(sid), self._writer_pid(conn, sid)
                key = (seq, live, writer, sid in self._open)
                cached = self._pending.get(sid)
                if cached is None or cached[0] != key:
                    opened = self._open.get(sid)
                    session = opened.session if opened is not None else self._read(sid)
                    entries = [] if session is None else self._waiting(session, live, writer)
                    cached = (key, entries)
                found[sid] = cached
            if session_id is None:
                self._pending = found
            else:
                self._pending.update(found)
        entries = [entry for _, listed in found.values() for entry in listed]
        return sorted(entries, key=lambda entry: entry.request.created_at)

    def changes(self, session_id: str, after: int = 0) -> Changes | None:
        """What changed in a session after clock value `after` (everything with 0), or None if there is none."""
        with self._lock, self._snapshot() as conn:
            if conn is None:
                return None
            cursor = conn.execute("SELECT seq FROM clock").fetchone()[0]
            row = conn.execute(
                f"SELECT {HEAD}, data, created_seq, head_seq FROM sessions WHERE id = ?", (session_id,)
            ).fetchone()
            if row is None:
                return None
            items = conn.execute(
                "SELECT body, created_seq, seq FROM items WHERE session_id = ? AND seq > ? ORDER BY seq, position",
                (session_id, after),
            ).fetchall()
        *head, data, created_seq, seq = row
        records: builtins.list[dict[str, Any]] = []
        if seq > after:
            meta = dict(zip(HEAD.split(", "), head, strict=True))
            records.append({"op": "session", "session": {**meta, "data": json.loads(data)}, "seq": seq})
        for body, made, changed in items:
            op = "item" if made == changed else "update_item"
            records.append({"op": op, "item": json.loads(body), "seq": changed})
        records.sort(key=lambda record: record["seq"])
        return Changes(cursor, records, reset=0 < after < created_seq)

    def version(self) -> str:
        """Changes whenever anything in the store changed, and when a writer's process ended."""
        with self._lock:
            conn = self._reader()
            if conn is None:
                return "empty"
            clock = conn.execute("SELECT seq FROM clock").fetchone()[0]
            sids = [row[0] for row in conn.execute("SELECT session_id FROM writers ORDER BY session_id")]
            alive = ",".join(f"{sid}={self._writer_pid(conn, sid)}" for sid in sids)
        return f"{clock}:{alive}"

    # -- cache and durability ---------------------------------------------------------------------

    def flush(self, session_id: str | None = None) -> None:
        """A flush point: store pending partial updates and make every write durable (unless "never")."""
        with self._lock:
            if self._conn is None:
                return
            sids = list(self._open) if session_id is None else [session_id]
            for opened in (self._open[sid] for sid in sids if sid in self._open):
                for item_id in sorted(opened.unpersisted):
                    position = opened.index[item_id]
                    self._store_item(opened.session.id, position, opened.session.items[position])
                opened.unpersisted.clear()
            if self.durability == "flush" and self._db is not None:
                with self._db.durable(), self._write(tick=False) as (conn, _):
                    conn.execute("UPDATE clock SET seq = seq")  # a write, so that the commit waits for the log

    def invalidate(self, session_id: str | None = None) -> None:
        """Release held sessions (all, or one) so that others may write them; pending partials are stored."""
        with self._lock:
            sids = [session_id] if session_id is not None else list(self._open)
            sids = [sid for sid in sids if sid in self._open]
            if not sids:
                return
            self.flush(session_id)
            with self._write(tick=False) as (conn, _):
                conn.executemany(
                    "DELETE FROM writers WHERE session_id = ? AND token = ?", [(sid, self._token) for sid in sids]
                )
            for sid in sids:
                self._open.pop(sid)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None and not self.read_only:
                self.invalidate()
            self._closed.set()
            _HELD.pop(self._token, None)
            if self._db is not None:
                self._db.close()
                self._db = self._conn = None

    def verify(self) -> builtins.list[str]:
        """What is wrong with the stored data, if anything: the database's own check (SQLite), and per session
        that its items are numbered without gaps and counted in its row. Empty for a whole store."""
        with self._lock:
            conn = self._reader()
            if conn is None or self._db is None:
                return []
            trouble = problems(self._db)
            rows = conn.execute(
                "SELECT s.id, s.item_count, count(i.position), coalesce(max(i.position) + 1, 0) FROM sessions s "
                "LEFT JOIN items i ON i.session_id = s.id GROUP BY s.id, s.item_count"
            ).fetchall()
        for sid, count, found, span in rows:
            if not count == found == span:
                trouble.append(f"session {sid} counts {count} items, holds {found} numbered up to {span}")
        return trouble

    # -- internals ------------------------------------------------------------------------------

    def _connect(self) -> Conn | None:
        """Open the database (a writable store creates its tables; a reader finds None while there are none)."""
        if self._folder is not None:
            if self.read_only and not sqlite_exists(self._folder):
                return None
            self._db = open_sqlite(self._folder, self.durability)
        else:
            schema = f"{PG_SCHEMA}_{ARCHIVE}" if self.archive else PG_SCHEMA
            self._db = open_postgres(str(self.address), schema, self.durability, create=not self.read_only)
            if self._db is None:
                return None
        self._conn = self._db
        return self._conn

    def _reader(self) -> Conn | None:
        """The connection, opened on first use by a read-only store (None while there is no store)."""
        if self._conn is None and self.read_only and not self._closed.is_set():
            self._connect()
        return self._conn

    @contextlib.contextmanager
    def _write(self, session_id: str | None = None, *, tick: bool = True) -> Iterator[tuple[Conn, int]]:
        """One write transaction with the next clock value (`tick`; claims and heartbeats change no data and
        take none); for `session_id` only while this store holds it."""
        db = self._db
        if db is None:
            raise AgentError("this session store is closed")
        with db.write() as conn:
            if session_id is not None:
                row = conn.execute("SELECT token FROM writers WHERE session_id = ?", (session_id,)).fetchone()
                if row is None or row[0] != self._token:
                    self._open.pop(session_id, None)
                    raise SessionLocked(f"{session_id} is no longer held by this store (another writer took it over)")
            seq = conn.execute("UPDATE clock SET seq = seq + 1 RETURNING seq").fetchone()[0] if tick else 0
            yield conn, seq

    @contextlib.contextmanager
    def _snapshot(self) -> Iterator[Conn | None]:
        """Reads that all see one state of the store (None: there is no store yet)."""
        conn, db = self._reader(), self._db
        if conn is None or db is None:
            yield None
            return
        with db.read() as snapshot:
            yield snapshot

    def _claim(self, conn: Conn, session_id: str) -> None:
        """Make this store the session's writer (inside a write transaction), unless a live one holds it."""
        row = conn.execute("SELECT token FROM writers WHERE session_id = ?", (session_id,)).fetchone()
        if row is not None and row[0] != self._token and self._writer_pid(conn, session_id):
            raise SessionLocked(f"{session_id} is open for writing elsewhere (another store or process)")
        conn.execute(
            "INSERT INTO writers VALUES (?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET host = excluded.host, "
            "pid = excluded.pid, token = excluded.token, heartbeat = excluded.heartbeat",
            (session_id, HOST, os.getpid(), self._token, time.time()),
        )
        _HELD[self._token] = self
        if self._beat is None:
            args = (weakref.ref(self), self._closed)
            self._beat = threading.Thread(target=_heartbeat, args=args, name="session-store-heartbeat", daemon=True)
            self._beat.start()

    def _writer_pid(self, conn: Conn, session_id: str) -> int:
        """The pid of the live writer holding the session (this store's included), 0 when none does."""
        row = conn.execute("SELECT host, pid, token, heartbeat FROM writers WHERE session_id = ?", (session_id,))
        found = row.fetchone()
        if found is None:
            return 0
        host, pid, token, heartbeat = found
        if host == HOST and pid == os.getpid():
            return pid if token in _HELD else 0
        return int(pid) if Writer(host, int(pid), float(heartbeat)).alive() else 0

    def _heartbeat(self) -> None:
        with self._lock, contextlib.suppress(AgentError, *(() if self._db is None else self._db.errors)):
            if self._open:
                with self._write(tick=False) as (conn, _):
                    conn.execute("UPDATE writers SET heartbeat = ? WHERE token = ?", (time.time(), self._token))

    def _writable(self) -> None:
        if self.read_only:
            raise AgentError("this session store is read-only")

    def _hold(self, opened: _Open) -> None:
        opened.index = {item.id: position for position, item in enumerate(opened.session.items)}
        self._open[opened.session.id] = opened

    def _insert_session(self, conn: Conn, session: Session, seq: int, created_seq: int = 0) -> None:
        conn.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                session.id,
                session.agent_id,
                session.title,
                session.status,
                session.parent_id,
                session.created_at,
                session.updated_at,
                _data(session),
                len(session.items),
                sum(_asks(item) for item in session.items),
                created_seq or seq,
                seq,
                seq,
            ),
        )

    def _store_item(self, session_id: str, position: int, item: Item) -> None:
        with self._write(session_id) as (conn, seq):
            conn.execute(
                "UPDATE items SET body = ?, seq = ? WHERE session_id = ? AND position = ?",
                (_dump(item), seq, session_id, position),
            )
            conn.execute("UPDATE sessions SET seq = ? WHERE id = ?", (seq, session_id))

    def _read(self, session_id: str) -> Session | None:
        """The session as stored (one read transaction), without claiming or repairing it."""
        with self._snapshot() as conn:
            if conn is None:
                return None
            row = conn.execute(f"SELECT {HEAD}, data FROM sessions WHERE id = ?", (session_id,)).fetchone()
            bodies = conn.execute(
                "SELECT body FROM items WHERE session_id = ? ORDER BY position", (session_id,)
            ).fetchall()
        if row is None:
            return None
        *head, data = row
        fields = dict(zip(HEAD.split(", "), head, strict=True))
        del fields["item_count"]
        items = ",".join(body for (body,) in bodies)  # one JSON document validated at once: long sessions load fast
        return Session.model_validate_json(f'{json.dumps(fields)[:-1]}, "data": {data}, "items": [{items}]}}')

    def _require_open(self, session: Session | str) -> _Open:
        self._writable()
        session_id = session if isinstance(session, str) else session.id
        opened = self._load(session_id)
        if opened is None:
            raise SessionNotFound(f"no session {session_id}")
        return opened

    def _load(self, session_id: str) -> _Open | None:
        opened = self._open.get(session_id)
        if opened is not None:
            return opened
        with self._write(tick=False) as (conn, _):
            if conn.execute("SELECT 1 FROM sessions WHERE id = ?", (session_id,)).fetchone() is None:
                return None
            self._claim(conn, session_id)
        session = self._read(session_id)
        if session is None:  # deleted between the claim and the read
            return None
        opened = _Open(session)
        self._hold(opened)
        self._repair(opened)
        return opened

    def _repair(self, opened: _Open) -> None:
        """Store what `paused.repair` finds a dead turn left."""
        session = opened.session
        fix = repair(session)
        for item_id in fix.finals:
            self.update_item(session, item_id, {"partial": False})
        for item in fix.appended:
            self.append_item(session, item)
        if fix.idle:
            self.update(session, status="idle")
        if fix:
            log.info("session %s: repaired what its last turn left open", session.id)

    def _waiting(self, session: Session, live: str | None, writer: int) -> builtins.list[Pending]:
        meta = session.meta()
        return [
            Pending(request, meta, state, writer if state == "elsewhere" else None)
            for request, state in waiting(session, live, writer)
        ]


def _heartbeat(ref: weakref.ref[SessionStore], closed: threading.Event) -> None:
    """Refresh a store's claims until it is closed or gone (the thread does not keep it alive)."""
    while not closed.wait(HEARTBEAT_SECONDS):
        store = ref()
        if store is None:
            return
        store._heartbeat()
        del store
