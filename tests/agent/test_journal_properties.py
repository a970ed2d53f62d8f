"""Properties of what sessions keep. The store: whatever mix of appends, item updates and session updates was
written, and wherever a writer let go or a new store opened, the session loads to exactly what was acknowledged
and the store keeps working. `sessions import` of old journals: wherever the last write was cut short, a journal
imports to a prefix of what was written (all but a torn last record)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.agent_cli import main

from unit_mcp.agent import SessionStore
from unit_mcp.agent.items import MessageItem, Session

text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=24)
operation = st.one_of(
    st.tuples(st.just("append"), text),
    st.tuples(st.just("update_item"), st.integers(0, 64), text),
    st.tuples(st.just("update"), text),
    st.tuples(st.just("let go"), st.booleans()),  # invalidate the session, or reopen the whole store
)


def state(session: Session) -> tuple[str | None, list[tuple[str, str]]]:
    return session.title, [(item.id, item.content) for item in session.items if isinstance(item, MessageItem)]


def apply(store: SessionStore, session_id: str, op: tuple[Any, ...]) -> None:
    session = store.require(session_id)
    if op[0] == "update":
        store.update(session, title=op[1])
    elif op[0] == "update_item" and session.items:
        target = session.items[op[1] % len(session.items)]
        store.update_item(session, target.id, {"content": op[2]})
    else:
        store.append_item(session, MessageItem(role="user", content=op[-1]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=30), durability=st.sampled_from(["always", "flush", "never"]))
def test_a_session_loads_to_what_was_acknowledged_wherever_its_writer_let_go(
    ops: list[tuple[Any, ...]], durability: Any
) -> None:
    with tempfile.TemporaryDirectory() as root:
        store = SessionStore(root, durability=durability)
        session_id = store.create("a").id
        expected = state(store.require(session_id))
        for op in ops:
            if op[0] == "let go":
                if op[1]:
                    store.close()
                    store = SessionStore(root, durability=durability)
                else:
                    store.invalidate(session_id)
            else:
                apply(store, session_id, op)
                expected = state(store.require(session_id))
            assert state(SessionStore(root, read_only=True).require(session_id)) == expected  # readers see it
        store.close()
        reopened = SessionStore(root)
        assert state(reopened.require(session_id)) == expected
        reopened.append_item(session_id, MessageItem(role="user", content="after"))
        reopened.close()
        title, items = state(SessionStore(root, read_only=True).require(session_id))
        assert (title, items[:-1]) == expected and items[-1][1] == "after"


def old_records(ops: list[tuple[Any, ...]]) -> tuple[list[dict[str, Any]], list[tuple[str | None, list[str]]]]:
    """The records the old file store wrote for `ops`, and the session's state after each of them."""
    head = {"id": "ses-old", "agent_id": "a", "created_at": 1.0, "updated_at": 1.0}
    records: list[dict[str, Any]] = [{"op": "session", "v": 1, "session": head}]
    title: str | None = None
    contents: list[str] = []
    states = [(title, list(contents))]
    for op in ops:
        if op[0] == "update":
            title = op[1]
            records.append({"op": "update", "changes": {"title": title}})
        elif op[0] == "update_item" and contents:
            position = op[1] % len(contents)
            contents[position] = op[2]
            item = {"id": f"itm-{position + 1}", "created_at": 2.0, "type": "message", "role": "user"}
            records.append({"op": "update_item", "item": {**item, "content": op[2]}})
        elif op[0] != "let go":
            contents.append(op[-1])
            item = {"id": f"itm-{len(contents)}", "created_at": 2.0, "type": "message", "role": "user"}
            records.append({"op": "item", "item": {**item, "content": op[-1]}})
        else:
            continue
        states.append((title, list(contents)))
    return records, states


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(operation, min_size=1, max_size=30), cut=st.integers(0, 10_000))
def test_a_torn_old_journal_imports_to_a_prefix_of_what_was_written(ops: list[tuple[Any, ...]], cut: int) -> None:
    records, states = old_records(ops)
    assume(len(records) > 1)  # a journal torn inside its header was never acknowledged: the importer refuses it
    data = b"".join(json.dumps(record, ensure_ascii=False).encode() + b"\n" for record in records)
    last_line = len(data) - data.rstrip(b"\n").rfind(b"\n") - 1
    torn = cut % (last_line + 1)
    with tempfile.TemporaryDirectory() as folder:
        old, data_dir = Path(folder) / "old", Path(folder) / "data"
        old.mkdir()
        (old / "ses-old.jsonl").write_bytes(data[: len(data) - torn])
        assert main(["--data-dir", str(data_dir), "sessions", "import", str(old)]) == 0
        store = SessionStore(data_dir, read_only=True)
        session = store.require("ses-old")
        store.close()
    loaded = (session.title, [item.content for item in session.items if isinstance(item, MessageItem)])
    assert loaded == (states[-2] if torn else states[-1])
