"""`sessions import DIR`: bring the journals of the old file store (`<id>.jsonl`, one JSON record per line: a
session header, then `item`, `update_item` and `update` records) into a `SessionStore`. The only reader of
that format left: every journal is read before anything is written, and one that cannot be read is refused by
name (a torn last line is what a crash leaves and is dropped, as the old store did).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .errors import AgentError, SessionCorrupt
from .items import ITEM, SESSION_ID, Session
from .sessions import SessionStore

FORMAT_VERSION = 1


def read_journal(path: Path) -> Session:
    """The session a journal describes; SessionCorrupt (naming the file) for one that does not replay."""
    records: list[dict[str, Any]] = []
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is a torn write
    for number, line in enumerate(complete, start=1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if number == len(complete) and not lines[-1]:
                break  # a torn last line that happens to end in a newline (zero-filled blocks)
            raise SessionCorrupt(f"{path}: record {number} is damaged ({exc})") from None
        records.append(record)
    return _replay(path, records)


def _replay(path: Path, records: list[dict[str, Any]]) -> Session:
    if not records or records[0].get("op") != "session" or records[0].get("v") != FORMAT_VERSION:
        raise SessionCorrupt(f"{path}: not a session journal of format {FORMAT_VERSION} (no header)")
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
                raise SessionCorrupt(f"{path}: record {number} has an unknown op {op!r}")
    except (KeyError, ValueError) as exc:
        raise SessionCorrupt(f"{path}: the journal does not replay ({exc})") from None
    if not SESSION_ID.fullmatch(session.id) or path.name != f"{session.id}.jsonl":
        raise SessionCorrupt(f"{path}: its header names session {session.id!r}, not the file's")
    return session


def import_journals(store: SessionStore, folder: Path) -> list[str]:
    """Import every `*.jsonl` journal of `folder` (all or none); the ids imported. The store repairs what a dead
    turn left when a session is next loaded for writing."""
    if not folder.is_dir():
        raise AgentError(f"{folder} is not a folder; give the old session store's folder")
    sessions = [read_journal(path) for path in sorted(folder.glob("*.jsonl"))]
    known = {meta.id for meta in store.list()}
    clashes = [session.id for session in sessions if session.id in known]
    if clashes:
        raise AgentError(f"the store already holds {', '.join(clashes)}; nothing was imported (delete those first)")
    for session in sessions:
        store.save(session)
        store.invalidate(session.id)
    return [session.id for session in sessions]
