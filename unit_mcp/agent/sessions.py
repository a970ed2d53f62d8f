"""SessionStore: agent sessions persisted as one append-only journal per session under a data dir.

Files: `<id>.jsonl` is the journal (a header record with the session's metadata and data, then one record
per appended item, item update or session update; see `journal.py` for crash safety and the durability
policy) and `<id>.meta.json` is a small metadata sidecar rewritten atomically on `update()`, `flush()` and
compaction, so `list()` never reads item histories (its `item_count` may lag by the running turn's items).

Appending costs one line whatever the history length. Updates leave superseded records behind; once they
outnumber the live items the journal is compacted (rewritten whole, atomically) before the next record, so
the amortised cost stays O(1) and the last line of the file is always the newest record.

Loading repairs what a dead turn left: a tool call without a result gets a synthetic error result, a
half-streamed message is marked complete, and a session still marked running is set idle with a
`turn-interrupted` event. The repair is written to the journal, so the session can be sent to a model again.

Housekeeping (`retire`: delete, or archive into `archive/`, a store of its own) is refused while a turn runs
in the session and recorded in the store's audit trail, `audit.log` (one JSON line per action); an archived
session also keeps a `session-archived` event of its own.

One writer per session: a store holds an exclusive lock on every journal it has open (`SessionLocked` for
a second writer, in this process or another). `read_only=True` gives a store that replays journals without
locking or repairing them, to browse sessions that may be live.

All methods are blocking and thread-safe; async callers run them in a worker thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..paths import write_file
from .errors import AgentError, SessionCorrupt, SessionLocked, SessionNotFound
from .items import ITEM, SESSION_ID, EventItem, Item, MessageItem, Session, SessionMeta, ToolCallItem, ToolResultItem
from .journal import Durability, Journal, fsync_dir, read

log = logging.getLogger("unit_mcp.agent.sessions")

FORMAT_VERSION = 1
UPDATABLE = frozenset({"title", "status", "data", "parent_id"})
INTERRUPTED_OUTPUT = "[interrupted] The turn ended before this tool returned a result; it may or may not have run."
ARCHIVE = "archive"
AUDIT_LOG = "audit.log"
Retirement = Literal["delete", "archive"]


def interrupted_result(call: ToolCallItem) -> ToolResultItem:
    """The synthetic result that closes a tool call its turn left open (the call may or may not have run)."""
    return ToolResultItem(
        name=call.name,
        call_id=call.call_id,
        output=INTERRUPTED_OUTPUT,
        is_error=True,
        synthetic=True,
        parent_id=call.id,
        turn_id=call.turn_id,
    )


def new_session_id() -> str:
    return f"ses-{secrets.token_hex(8)}"


def _check_id(session_id: str) -> str:
    """Session ids become file names: only a plain identifier is accepted, never a path."""
    if not SESSION_ID.fullmatch(session_id):
        raise AgentError(f"invalid session id {session_id!r}: use letters, digits, '-' and '_' (max 128)")
    return session_id


def _header(session: Session) -> dict[str, Any]:
    return {"op": "session", "v": FORMAT_VERSION, "session": session.model_dump(mode="json", exclude={"items"})}


def replay(session_id: str, records: list[dict[str, Any]]) -> Session:
    """The session a journal's records describe (read-only readers, like the approval page, use it too)."""
    if not records or records[0].get("op") != "session":
        raise SessionCorrupt(f"{session_id}: the journal has no session header")
    if records[0].get("v") != FORMAT_VERSION:
        raise SessionCorrupt(f"{session_id}: journal format {records[0].get('v')!r} is not {FORMAT_VERSION}")
    try:
        session = Session.model_validate(records[0]["session"])
        positions: dict[str, int] = {}
        for number, record in enumerate(records[1:], start=2):
            op = record.get("op")
            if op == "item":
                item = ITEM.validate_python(record["item"])
                positions[item.id] = len(session.items)
                session.items.append(item)
                session.updated_at = max(session.updated_at, item.created_at)
            elif op == "update_item":
                item = ITEM.validate_python(record["item"])
                session.items[positions[item.id]] = item
            elif op == "update":
                changes = record["changes"]
                probe = Session.model_validate({**session.model_dump(exclude={"items"}), **changes})
                for key in changes:
                    setattr(session, key, getattr(probe, key))
            else:
                raise SessionCorrupt(f"{session_id}: record {number} has an unknown op {op!r}")
    except (KeyError, ValueError) as exc:
        raise SessionCorrupt(f"{session_id}: the journal does not replay ({exc})") from None
    return session


@dataclass
class _Open:
    """A loaded session with its journal writer, its item index and the count of superseded records."""

    session: Session
    journal: Journal
    index: dict[str, int] = field(default_factory=dict)
    garbage: int = 0
    unpersisted: set[str] = field(default_factory=set)


class SessionStore:
    """Create, load, update and list sessions under `root`; loaded sessions are cached until `invalidate()`."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        durability: Durability = "always",
        compact_after: int = 64,
        read_only: bool = False,
    ) -> None:
        self.root = Path(root)
        self.read_only = read_only
        if not read_only:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.durability: Durability = durability
        self.compact_after = compact_after
        self._lock = threading.RLock()
        self._open: dict[str, _Open] = {}

    # -- paths ----------------------------------------------------------------------------------

    def journal_path(self, session_id: str) -> Path:
        return self.root / f"{_check_id(session_id)}.jsonl"

    def _meta_path(self, session_id: str) -> Path:
        return self.root / f"{_check_id(session_id)}.meta.json"

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
            path = self.journal_path(sid)
            if sid in self._open or path.exists():
                raise AgentError(f"session {sid} already exists")
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
            journal = Journal.create(path, [_header(session)], durability=self.durability)
            self._open[sid] = _Open(session, journal)
            self._write_meta(session)
            return session

    def load(self, session_id: str) -> Session | None:
        """The session (from the cache, or replayed from its journal and repaired), or None if there is none."""
        with self._lock:
            if self.read_only:
                return self._peek(session_id)
            opened = self._load(session_id)
            return None if opened is None else opened.session

    def require(self, session_id: str) -> Session:
        session = self.load(session_id)
        if session is None:
            raise SessionNotFound(f"no session {session_id}")
        return session

    def save(self, session: Session) -> Session:
        """Write `session` as the whole new state of its journal (also the way to compact one explicitly)."""
        with self._lock:
            self._writable()
            opened = self._open.get(session.id)
            path = self.journal_path(session.id)
            records = [
                _header(session),
                *({"op": "item", "item": item.model_dump(mode="json")} for item in session.items),
            ]
            if opened is None:
                journal = Journal.create(path, records, durability=self.durability)
                opened = self._open[session.id] = _Open(session, journal)
            else:
                opened.journal.rewrite(records)
                opened.session = session
            opened.index = {item.id: position for position, item in enumerate(session.items)}
            opened.garbage = 0
            opened.unpersisted.clear()
            self._write_meta(session)
            return session

    def delete(self, session_id: str) -> bool:
        with self._lock:
            self._writable()
            self.invalidate(session_id)
            existed = False
            for path in (self.journal_path(session_id), self._meta_path(session_id)):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    existed = True
            if existed and self.durability != "never":
                fsync_dir(self.root)
            return existed

    def retire(self, session_id: str, action: Retirement, *, via: str) -> SessionMeta:
        """Delete or archive a session on someone's request (`via`: the CLI, the page): refused (AgentError)
        while a turn runs in it, here or in another process holding it, and recorded in `audit.log`."""
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
            if action == "archive":
                self.append_item(opened.session, EventItem(kind="session-archived", data={"via": via}))
                self.invalidate(session_id)
                archive = self.root / ARCHIVE
                archive.mkdir(exist_ok=True, mode=0o700)
                for path in (self.journal_path(session_id), self._meta_path(session_id)):
                    with contextlib.suppress(FileNotFoundError):
                        path.rename(archive / path.name)
                if self.durability != "never":
                    fsync_dir(archive)
                    fsync_dir(self.root)
            else:
                self.delete(session_id)
            record = {"at": time.time(), "action": action, "via": via, "session": meta.model_dump(mode="json")}
            with (self.root / AUDIT_LOG).open("a", encoding="utf-8") as log_file:
                log_file.write(json.dumps(record) + "\n")
                if self.durability != "never":
                    log_file.flush()
                    os.fsync(log_file.fileno())
            return meta

    def audit(self) -> list[dict[str, Any]]:
        """The store's audit trail, oldest first: every session deleted or archived, when and from where."""
        try:
            lines = (self.root / AUDIT_LOG).read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]

    def list(self) -> list[SessionMeta]:
        """Metadata of every session, newest first, from the sidecars (or journal headers), never the items."""
        with self._lock:
            if not self.root.is_dir():
                return []
            metas = [self._read_meta(path) for path in self.root.glob("*.jsonl")]
            return sorted((meta for meta in metas if meta is not None), key=lambda m: m.updated_at, reverse=True)

    # -- items and updates ----------------------------------------------------------------------

    def append_item(self, session: Session | str, item: Item) -> Item:
        """Persist `item` at the end of the stream; the store assigns its `id` and `created_at`."""
        with self._lock:
            opened = self._require_open(session)
            current = opened.session
            stored = item.model_copy(
                update={"id": f"itm-{len(current.items) + 1}", "created_at": item.created_at or time.time()}
            )
            self._write(opened, {"op": "item", "item": stored.model_dump(mode="json")})
            opened.index[stored.id] = len(current.items)
            current.items.append(stored)
            current.updated_at = max(current.updated_at, stored.created_at)
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
            old = opened.session.items[position]
            new = ITEM.validate_python({**old.model_dump(), **changes})
            if persist:
                self._write(opened, {"op": "update_item", "item": new.model_dump(mode="json")})
                opened.garbage += 1
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
            changes = {key: getattr(probe, key) for key in changes}
            self._write(opened, {"op": "update", "changes": probe.model_dump(mode="json", include=set(changes))})
            opened.garbage += 1
            for key, value in changes.items():
                setattr(opened.session, key, value)
            self._write_meta(opened.session)
            return opened.session

    # -- cache and durability ---------------------------------------------------------------------

    def flush(self, session_id: str | None = None) -> None:
        """A flush point: persist pending partial updates, fsync journals, refresh metadata sidecars."""
        with self._lock:
            if session_id is None:
                targets = list(self._open.values())
            else:
                targets = [self._open[session_id]] if session_id in self._open else []
            for opened in targets:
                for item_id in sorted(opened.unpersisted):
                    item = opened.session.items[opened.index[item_id]]
                    self._write(opened, {"op": "update_item", "item": item.model_dump(mode="json")})
                    opened.garbage += 1
                opened.unpersisted.clear()
                opened.journal.sync()
                self._write_meta(opened.session)

    def invalidate(self, session_id: str | None = None) -> None:
        """Forget cached sessions (all, or one) so the next load reads the disk; pending partials are flushed."""
        with self._lock:
            for sid in [session_id] if session_id is not None else list(self._open):
                if sid in self._open:
                    self.flush(sid)
                    self._open.pop(sid).journal.close()

    def close(self) -> None:
        self.invalidate()

    # -- internals ------------------------------------------------------------------------------

    def _writable(self) -> None:
        if self.read_only:
            raise AgentError("this session store is read-only")

    def _peek(self, session_id: str) -> Session | None:
        try:
            records, _ = read(self.journal_path(session_id))
        except FileNotFoundError:
            return None
        return replay(session_id, records)

    def _require_open(self, session: Session | str) -> _Open:
        self._writable()
        session_id = session if isinstance(session, str) else session.id
        opened = self._load(session_id)
        if opened is None:
            raise SessionNotFound(f"no session {session_id}")
        return opened

    def _write(self, opened: _Open, record: dict[str, Any]) -> None:
        if opened.garbage > max(self.compact_after, len(opened.session.items)):
            self._compact(opened)
        opened.journal.append(record)

    def _compact(self, opened: _Open) -> None:
        session = opened.session
        opened.journal.rewrite(
            [_header(session), *({"op": "item", "item": item.model_dump(mode="json")} for item in session.items)]
        )
        opened.garbage = 0
        opened.unpersisted.clear()
        self._write_meta(session)

    def _load(self, session_id: str) -> _Open | None:
        opened = self._open.get(session_id)
        if opened is not None:
            return opened
        path = self.journal_path(session_id)
        try:
            records, valid_size = read(path)
        except FileNotFoundError:
            return None
        opened = _Open(replay(session_id, records), Journal.open(path, valid_size, durability=self.durability))
        self._sweep_temporaries(session_id)
        opened.index = {item.id: position for position, item in enumerate(opened.session.items)}
        opened.garbage = len(records) - 1 - len(opened.session.items)
        self._open[session_id] = opened
        self._repair(opened)
        return opened

    def _repair(self, opened: _Open) -> None:
        session = opened.session
        for item in list(session.items):
            if isinstance(item, MessageItem) and item.partial:
                self.update_item(session, item.id, {"partial": False})
        orphans = session.open_tool_calls()
        for call in orphans:
            self.append_item(session, interrupted_result(call))
        if session.status == "running":
            self.append_item(
                session,
                EventItem(kind="turn-interrupted", data={"reason": "the process ended while a turn was running"}),
            )
            self.update(session, status="idle")
        elif orphans:
            self._write_meta(session)
        if orphans or session.status == "running":
            log.info("session %s: repaired %d unfinished tool call(s)", session.id, len(orphans))

    def _sweep_temporaries(self, session_id: str) -> None:
        """Remove what a writer killed mid-rewrite left (hidden `.<id>.jsonl.*` and `.<id>.meta.json.*` files).
        Called holding the journal's writer lock, and only a writer makes them, so none is in use."""
        for name in (self.journal_path(session_id).name, self._meta_path(session_id).name):
            for leftover in self.root.glob(f".{name}.*"):
                with contextlib.suppress(OSError):
                    leftover.unlink()

    def _write_meta(self, session: Session) -> None:
        meta = session.meta().model_dump_json().encode()
        write_file(self.root, self._meta_path(session.id).name, meta, durable=self.durability == "always")

    def _read_meta(self, journal: Path) -> SessionMeta | None:
        session_id = journal.name.removesuffix(".jsonl")
        if not SESSION_ID.fullmatch(session_id):
            return None
        opened = self._open.get(session_id)
        if opened is not None:
            return opened.session.meta()
        with contextlib.suppress(OSError, ValueError):
            return SessionMeta.model_validate_json(self._meta_path(session_id).read_bytes())
        try:
            with journal.open("rb") as handle:
                header = json.loads(handle.readline())
            return Session.model_validate(header["session"]).meta()
        except (OSError, ValueError, KeyError):
            log.warning("session journal %s has no readable header; left out of the list", journal.name)
            return None
