"""SessionStore against real files: CRUD, item order and metadata, crash repair, compaction, listing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from unit_mcp.agent import AgentError, SessionStore
from unit_mcp.agent._projections import chat_messages, display_messages
from unit_mcp.agent.errors import SessionCorrupt, SessionNotFound
from unit_mcp.agent.items import EventItem, MessageItem, Session, ToolCallItem, ToolResultItem, Usage


def test_create_load_save_list_delete(store: SessionStore) -> None:
    session = store.create("unit-agent", title="first", data={"k": 1})
    assert session.id.startswith("ses-") and session.status == "idle"
    assert store.journal_path(session.id).exists()

    store.invalidate()
    loaded = store.load(session.id)
    assert loaded is not None and loaded.model_dump() == session.model_dump()
    assert store.load("ses-0000000000000000") is None
    with pytest.raises(SessionNotFound):
        store.require("ses-0000000000000000")

    other = store.create("helper", session_id="my-session")
    assert [meta.id for meta in store.list()] == [other.id, session.id]

    loaded.title = "renamed"
    store.save(loaded)
    store.invalidate()
    assert store.require(session.id).title == "renamed"

    assert store.delete(session.id) is True
    assert store.delete(session.id) is False
    assert store.load(session.id) is None
    assert [meta.id for meta in store.list()] == [other.id]
    assert sorted(p.name for p in store.root.iterdir()) == ["my-session.jsonl", "my-session.meta.json"]


def test_session_ids_are_never_paths(store: SessionStore) -> None:
    for bad in ("../x", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(AgentError):
            store.create("a", session_id=bad)
    store.create("a", session_id="taken")
    with pytest.raises(AgentError, match="already exists"):
        store.create("a", session_id="taken")


def test_writes_are_atomic_no_temporary_files_left(store: SessionStore) -> None:
    session = store.create("a")
    for n in range(5):
        store.append_item(session, MessageItem(role="user", content=f"m{n}"))
    store.update(session, title="t")
    store.save(store.require(session.id))
    assert not [p for p in store.root.iterdir() if p.name.startswith(".")]


def test_items_keep_order_ids_and_metadata_across_reload(store: SessionStore) -> None:
    session = store.create("a")
    user = store.append_item(session, MessageItem(role="user", content="draw a red circle"))
    call = store.append_item(
        session, ToolCallItem(name="echo_token", arguments='{"token": "x"}', call_id="call-1", parent_id=user.id)
    )
    result = store.append_item(
        session, ToolResultItem(name="echo_token", output="x", call_id="call-1", parent_id=call.id)
    )
    answer = store.append_item(
        session,
        MessageItem(
            role="assistant",
            content="Done.",
            parent_id=result.id,
            provider="openai",
            model="scripted",
            usage=Usage(input_tokens=12, output_tokens=3),
        ),
    )
    assert [item.id for item in (user, call, result, answer)] == ["itm-1", "itm-2", "itm-3", "itm-4"]
    assert user.created_at <= call.created_at <= answer.created_at

    store.invalidate()
    reloaded = store.require(session.id)
    assert [item.model_dump() for item in reloaded.items] == [
        item.model_dump() for item in (user, call, result, answer)
    ]
    last = reloaded.items[-1]
    assert (
        isinstance(last, MessageItem)
        and last.model == "scripted"
        and last.usage == Usage(input_tokens=12, output_tokens=3)
    )
    assert [m.role for m in display_messages(reloaded.items)] == ["user", "assistant"]


def test_update_item_and_session_updates_persist(store: SessionStore) -> None:
    session = store.create("a")
    item = store.append_item(session, MessageItem(role="assistant", content="He", partial=True))
    store.update_item(session, item.id, {"content": "Hello"}, persist=False)
    assert store.require(session.id).items[0].content == "Hello"  # type: ignore[union-attr]
    store.update_item(session, item.id, {"content": "Hello, world", "partial": False})
    store.update(session, title="greeting", data={"opencode_session_id": "x"})
    with pytest.raises(AgentError, match="cannot be changed"):
        store.update_item(session, item.id, {"id": "itm-9"})
    with pytest.raises(AgentError, match="cannot be updated"):
        store.update(session, agent_id="other")

    store.invalidate()
    reloaded = store.require(session.id)
    assert reloaded.title == "greeting" and reloaded.data == {"opencode_session_id": "x"}
    assert reloaded.items[0].model_dump(include={"content", "partial"}) == {"content": "Hello, world", "partial": False}


def test_partial_updates_are_flushed_at_invalidate(store: SessionStore) -> None:
    session = store.create("a")
    item = store.append_item(session, MessageItem(role="assistant", content="", partial=True))
    store.update_item(session, item.id, {"content": "streamed so far"}, persist=False)
    store.invalidate()
    reloaded = store.require(session.id).items[0]
    assert isinstance(reloaded, MessageItem) and reloaded.content == "streamed so far"


def test_session_serialises_to_one_json_document(store: SessionStore) -> None:
    session = store.create("a", data={"x": [1, 2]})
    store.append_item(session, MessageItem(role="user", content="hi"))
    document = store.require(session.id).model_dump_json()
    again = Session.model_validate_json(document)
    assert again.items[0].content == "hi" and again.data == {"x": [1, 2]}  # type: ignore[union-attr]


def test_list_reads_metadata_without_item_histories(store: SessionStore) -> None:
    session = store.create("a", title="big")
    for n in range(20):
        store.append_item(session, MessageItem(role="user", content=f"message {n}"))
    store.flush()
    store.invalidate()
    path = store.journal_path(session.id)
    lines = path.read_bytes().splitlines(keepends=True)
    # damage every item record: listing must not notice, loading must
    path.write_bytes(lines[0] + b"".join(b"#" + line[1:] for line in lines[1:]))
    (meta,) = store.list()
    assert (meta.id, meta.title, meta.item_count) == (session.id, "big", 20)
    with pytest.raises(SessionCorrupt, match="record 2 is damaged"):
        store.load(session.id)


def test_list_falls_back_to_the_journal_header_without_a_sidecar(store: SessionStore) -> None:
    session = store.create("a", title="no sidecar")
    store.invalidate()
    (store.root / f"{session.id}.meta.json").unlink()
    assert [(m.id, m.title) for m in store.list()] == [(session.id, "no sidecar")]


def test_a_torn_last_write_loses_only_that_item(store: SessionStore) -> None:
    session = store.create("a")
    for n in range(3):
        store.append_item(session, MessageItem(role="user", content=f"m{n}"))
    store.invalidate()
    path = store.journal_path(session.id)
    path.write_bytes(path.read_bytes()[:-7])  # the crash cut the last record short
    reloaded = store.require(session.id)
    assert [item.content for item in reloaded.items] == ["m0", "m1"]  # type: ignore[union-attr]
    store.append_item(reloaded, MessageItem(role="user", content="after the crash"))
    store.invalidate()
    assert [item.content for item in store.require(session.id).items] == ["m0", "m1", "after the crash"]  # type: ignore[union-attr]


def test_damage_before_the_last_line_is_reported_not_skipped(store: SessionStore) -> None:
    session = store.create("a")
    for n in range(3):
        store.append_item(session, MessageItem(role="user", content=f"m{n}"))
    store.invalidate()
    path = store.journal_path(session.id)
    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = b"{garbage\n"
    path.write_bytes(b"".join(lines))
    with pytest.raises(SessionCorrupt):
        store.load(session.id)


def test_orphaned_tool_calls_are_closed_on_load(store: SessionStore) -> None:
    """A turn that died between a tool call and its result: the session can be sent to a model again."""
    session = store.create("a")
    store.append_item(session, MessageItem(role="user", content="go"))
    assistant = store.append_item(session, MessageItem(role="assistant", content="", partial=True))
    store.append_item(session, ToolCallItem(name="unit_run_tests", call_id="c1", parent_id=assistant.id))
    store.update(session, status="running")
    store.invalidate()  # the process "died" here

    repaired = store.require(session.id)
    assert repaired.status == "idle" and repaired.open_tool_calls() == []
    result = next(item for item in repaired.items if isinstance(item, ToolResultItem))
    assert result.call_id == "c1" and result.is_error and result.synthetic
    assert any(isinstance(i, EventItem) and i.kind == "turn-interrupted" for i in repaired.items)
    assert not any(isinstance(i, MessageItem) and i.partial for i in repaired.items)
    messages = chat_messages(repaired.items)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]

    store.invalidate()  # the repair itself was persisted: a second load changes nothing
    assert store.require(session.id).model_dump() == repaired.model_dump()


def test_updates_are_compacted_so_appends_stay_cheap(tmp_path: Path) -> None:
    store = SessionStore(tmp_path, compact_after=8)
    session = store.create("a")
    item = store.append_item(session, MessageItem(role="assistant", content=""))
    for n in range(100):
        store.update_item(session, item.id, {"content": "x" * n})
    records = store.journal_path(session.id).read_text().splitlines()
    assert len(records) <= 2 + 10  # header + item + at most the garbage allowance
    store.invalidate()
    assert store.require(session.id).items[0].content == "x" * 99  # type: ignore[union-attr]


def test_durability_policies_all_replay(tmp_path: Path) -> None:
    for durability in ("always", "flush", "never"):
        store = SessionStore(tmp_path / durability, durability=durability)
        session = store.create("a")
        store.append_item(session, MessageItem(role="user", content=durability))
        store.flush()
        store.close()
        assert SessionStore(tmp_path / durability).require(session.id).items[0].content == durability  # type: ignore[union-attr]


def test_journal_lines_are_plain_json(store: SessionStore) -> None:
    session = store.create("a")
    store.append_item(session, MessageItem(role="user", content="line\nbreak ü"))
    lines = store.journal_path(session.id).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["op"] for line in lines] == ["session", "item"]
    assert oct(os.stat(store.root).st_mode & 0o777) == "0o700"


def test_retire_archives_or_deletes_an_idle_session_and_records_it(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s")
    kept, gone = store.create("a", title="kept"), store.create("a", title="gone")
    store.append_item(kept, MessageItem(role="user", content="hello"))
    archived = store.retire(kept.id, "archive", via="cli")
    assert archived.id == kept.id and archived.item_count == 1
    assert store.retire(gone.id, "delete", via="page").title == "gone"
    assert store.list() == [] and store.load(kept.id) is None and store.load(gone.id) is None
    archive = SessionStore(tmp_path / "s" / "archive", read_only=True)
    (shown,) = archive.list()
    assert shown.id == kept.id and shown.title == "kept"
    events = [item for item in archive.require(kept.id).items if isinstance(item, EventItem)]
    assert [(event.kind, event.data) for event in events] == [("session-archived", {"via": "cli"})]
    audit = store.audit()
    assert [(r["action"], r["via"], r["session"]["id"], r["session"]["title"]) for r in audit] == [
        ("archive", "cli", kept.id, "kept"),
        ("delete", "page", gone.id, "gone"),
    ]
    with pytest.raises(SessionNotFound):
        store.retire(gone.id, "delete", via="cli")
    store.close()


def test_retire_is_refused_while_a_turn_runs_here_or_another_store_holds_the_session(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "s")
    busy = store.create("a")
    store.update(busy, status="running")
    with pytest.raises(AgentError, match="has a running turn; cancel it or wait for it to end first"):
        store.retire(busy.id, "delete", via="cli")
    other = SessionStore(tmp_path / "s")  # a second writer (another process, as far as the lock goes)
    with pytest.raises(AgentError, match="is open in another process"):
        other.retire(busy.id, "archive", via="cli")
    assert [meta.id for meta in store.list()] == [busy.id] and store.audit() == []
    store.update(busy, status="idle")
    store.close()  # the writer lets it go: now it can be removed
    assert other.retire(busy.id, "delete", via="cli").id == busy.id
    other.close()
