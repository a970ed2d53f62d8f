"""The SessionStore contract, run over both databases (a SQLite folder and a PostgreSQL database of the test
cluster): CRUD, item order and metadata, paging, crash repair, one writer per session (in this process and across
processes, without /proc), live changes, retiring, the journal importer; and for SQLite the private folder."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agent_cli import main

import unit_mcp.agent
from unit_mcp.agent import AgentError, SessionStore
from unit_mcp.agent.errors import SessionLocked, SessionNotFound
from unit_mcp.agent.items import EventItem, MessageItem, Session, ToolCallItem, ToolResultItem, Usage
from unit_mcp.agent.projections import chat_messages, display_messages
from unit_mcp.paths import UntrustedFolder

Address = str | Path


@pytest.fixture(params=["sqlite", "postgres"])
def address(request: pytest.FixtureRequest, tmp_path: Path) -> Address:
    """A new store: a folder, or a new database of the session's PostgreSQL cluster."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_cluster").new_database())
    return tmp_path / "sessions"


@pytest.fixture
def store(address: Address) -> Iterator[SessionStore]:
    opened = SessionStore(address)
    yield opened
    opened.close()


def test_create_load_save_list_delete(store: SessionStore) -> None:
    session = store.create("unit-agent", title="first", data={"k": 1})
    assert session.id.startswith("ses-") and session.status == "idle"

    store.invalidate()
    loaded = store.load(session.id)
    assert loaded is not None and loaded.model_dump() == session.model_dump()
    assert store.load("ses-0000000000000000") is None
    with pytest.raises(SessionNotFound):
        store.require("ses-0000000000000000")

    other = store.create("helper", session_id="my-session")
    assert [meta.id for meta in store.list()] == [other.id, session.id]
    assert store.meta(session.id) == session.meta() and store.meta("ses-nope") is None

    loaded.title = "renamed"
    store.save(loaded)
    store.invalidate()
    assert store.require(session.id).title == "renamed"

    assert store.delete(session.id) is True
    assert store.delete(session.id) is False
    assert store.load(session.id) is None
    assert [meta.id for meta in store.list()] == [other.id]


def test_a_sqlite_store_is_one_private_database_in_a_private_folder(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    session = store.create("a")
    store.append_item(session, MessageItem(role="user", content="secret"))
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    names = sorted(path.name for path in store.root.iterdir())
    assert names[0] == "sessions.db" and set(names) <= {"sessions.db", "sessions.db-wal", "sessions.db-shm"}
    assert {stat.S_IMODE(os.stat(store.root / name).st_mode) for name in names} == {0o600}


def test_a_folder_another_user_made_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)
    with pytest.raises(UntrustedFolder, match="belongs to uid 65534"):
        SessionStore(planted)
    assert list(planted.iterdir()) == []  # nothing was written into it


def test_session_ids_are_checked(store: SessionStore) -> None:
    for bad in ("../x", "a/b", "", ".hidden", "x" * 200):
        with pytest.raises(AgentError):
            store.create("a", session_id=bad)
    store.create("a", session_id="taken")
    with pytest.raises(AgentError, match="already exists"):
        store.create("a", session_id="taken")


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
    assert [m.role for m in display_messages(reloaded.items)] == ["user", "assistant"]
    (meta,) = store.list()
    assert (meta.item_count, meta.updated_at) == (4, answer.created_at)


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


def test_partial_updates_stay_in_memory_until_a_flush(store: SessionStore) -> None:
    session = store.create("a")
    item = store.append_item(session, MessageItem(role="assistant", content="", partial=True))
    reader = SessionStore(store.address, read_only=True)
    before = reader.changes(session.id)
    store.update_item(session, item.id, {"content": "streamed so far"}, persist=False)
    assert reader.changes(session.id) == before  # nothing was written
    store.invalidate()
    assert reader.require(session.id).items[0].content == "streamed so far"  # type: ignore[union-attr]


def test_session_serialises_to_one_json_document(store: SessionStore) -> None:
    session = store.create("a", data={"x": [1, 2]})
    store.append_item(session, MessageItem(role="user", content="hi"))
    document = store.require(session.id).model_dump_json()
    again = Session.model_validate_json(document)
    assert again.items[0].content == "hi" and again.data == {"x": [1, 2]}  # type: ignore[union-attr]


def test_orphaned_tool_calls_are_closed_on_load(store: SessionStore) -> None:
    """A turn that died between a tool call and its result: the session can be sent to a model again."""
    session = store.create("a")
    store.append_item(session, MessageItem(role="user", content="go"))
    assistant = store.append_item(session, MessageItem(role="assistant", content="", partial=True))
    store.append_item(session, ToolCallItem(name="unit_run_tests", call_id="c1", parent_id=assistant.id))
    store.update(session, status="running")
    store.invalidate()  # the process "died" here

    as_stored = SessionStore(store.address, read_only=True).require(session.id)
    assert as_stored.status == "running" and as_stored.open_tool_calls()  # readers only read

    repaired = store.require(session.id)
    assert repaired.status == "idle" and repaired.open_tool_calls() == []
    result = next(item for item in repaired.items if isinstance(item, ToolResultItem))
    assert result.call_id == "c1" and result.is_error and result.synthetic
    assert any(isinstance(i, EventItem) and i.kind == "turn-interrupted" for i in repaired.items)
    assert not any(isinstance(i, MessageItem) and i.partial for i in repaired.items)
    assert [m["role"] for m in chat_messages(repaired.items)] == ["user", "assistant", "tool"]

    store.invalidate()  # the repair itself was stored: a second load changes nothing
    assert store.require(session.id).model_dump() == repaired.model_dump()


def test_durability_policies_all_reload(address: Address) -> None:
    for durability in ("always", "flush", "never"):
        store = SessionStore(address, durability=durability)
        session = store.create("a")
        store.append_item(session, MessageItem(role="user", content=durability))
        store.flush()
        store.close()
        again = SessionStore(address)
        assert again.require(session.id).items[0].content == durability  # type: ignore[union-attr]
        again.close()


def test_a_second_writer_in_this_process_is_refused_until_the_first_lets_go(store: SessionStore) -> None:
    session = store.create("a")
    other = SessionStore(store.address)
    with pytest.raises(SessionLocked, match="open for writing elsewhere"):
        other.load(session.id)
    assert SessionStore(store.address, read_only=True).require(session.id).id == session.id  # readers never wait
    store.invalidate(session.id)
    other.append_item(session.id, MessageItem(role="user", content="mine now"))
    with pytest.raises(SessionLocked):
        store.append_item(session.id, MessageItem(role="user", content="not yours"))
    store.close()  # closing a store releases what it holds; a closed store writes nothing
    with pytest.raises(AgentError, match="closed"):
        store.create("a")


HOLDER = """
import sys
import time
from unit_mcp.agent.sessions import SessionStore
store = SessionStore(sys.argv[1])
store.require(sys.argv[2])
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_writer_in_another_process_is_refused_and_its_death_is_seen_without_proc(store: SessionStore) -> None:
    session = store.create("a")
    store.close()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(store.address), session.id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        reader = SessionStore(store.address, read_only=True)
        alive = reader.version()
        assert f"{session.id}={holder.pid}" in alive
        second = SessionStore(store.address)
        with pytest.raises(SessionLocked, match="open for writing elsewhere"):
            second.load(session.id)
        holder.send_signal(signal.SIGKILL)
        holder.wait(30)
        assert reader.version() != alive and f"{session.id}=0" in reader.version()  # no heartbeat wait needed
        second.append_item(session.id, MessageItem(role="user", content="taken over"))
        second.close()
    finally:
        holder.kill()
        holder.wait(30)


def test_changes_give_what_changed_after_a_cursor(store: SessionStore) -> None:
    session = store.create("a", session_id="ses-live")
    first = store.append_item(session, MessageItem(role="user", content="first"))
    reader = SessionStore(store.address, read_only=True)
    everything = reader.changes(session.id)
    assert everything is not None and not everything.reset
    assert [record["op"] for record in everything.records] == ["session", "item"]

    store.append_item(session, MessageItem(role="assistant", content="second"))
    store.update_item(session, first.id, {"content": "first, edited"})
    later = reader.changes(session.id, everything.cursor)
    assert later is not None and later.cursor > everything.cursor
    assert [(r["op"], r["item"]["content"]) for r in later.records if r["op"] != "session"] == [
        ("item", "second"),
        ("update_item", "first, edited"),
    ]
    assert reader.changes(session.id, later.cursor).records == []  # type: ignore[union-attr]

    store.delete(session.id)
    assert reader.changes(session.id, later.cursor) is None
    store.create("a", session_id="ses-live")  # a new session under the old id: a view must start over
    assert reader.changes(session.id, later.cursor).reset  # type: ignore[union-attr]


def journal(folder: Path, session_id: str, records: list[dict], tail: bytes = b"") -> Path:
    """A journal of the old file store, written the way it wrote them (one JSON object a line)."""
    path = folder / f"{session_id}.jsonl"
    path.write_bytes(b"".join(json.dumps(record).encode() + b"\n" for record in records) + tail)
    return path


def old_session(session_id: str, status: str = "idle") -> dict:
    head = {"id": session_id, "agent_id": "unit-agent", "title": "old", "status": status}
    return {"op": "session", "v": 1, "session": {**head, "created_at": 1.0, "updated_at": 1.0, "data": {}}}


def item(number: int, content: str) -> dict:
    return {"id": f"itm-{number}", "created_at": 1.0 + number, "type": "message", "role": "user", "content": content}


def test_sessions_import_brings_old_journals_in_and_refuses_a_damaged_one_by_name(
    tmp_path: Path, address: Address, capsys: pytest.CaptureFixture[str]
) -> None:
    old = tmp_path / "old"
    old.mkdir()
    journal(old, "ses-a", [old_session("ses-a"), {"op": "item", "item": item(1, "one")}])
    running = [old_session("ses-b", "running"), {"op": "item", "item": item(1, "two")}]
    running.append({"op": "update_item", "item": item(1, "two, edited")})
    journal(old, "ses-b", running, tail=b'{"op": "item", "item": {"id": "itm-2"')  # a crash tore the last line
    bad = journal(old, "ses-c", [old_session("ses-c"), *({"op": "item", "item": item(n, "x")} for n in (1, 2))])
    bad.write_bytes(bad.read_bytes().replace(b'"op": "item"', b'"op": "item"}}', 1))
    data = ["--data-dir", str(tmp_path / "data"), "--sessions", str(address)]

    assert main([*data, "sessions", "import", str(old)]) == 1
    assert capsys.readouterr().err.startswith(f"unit-mcp agent: error: {bad}: record 2 is damaged (Extra data")
    assert SessionStore(address, read_only=True).list() == []  # all or nothing

    bad.unlink()
    assert main([*data, "sessions", "import", str(old)]) == 0
    store = SessionStore(address)
    assert sorted(meta.id for meta in store.list()) == ["ses-a", "ses-b"]
    assert [i.content for i in store.require("ses-b").items if isinstance(i, MessageItem)] == ["two, edited"]
    assert store.require("ses-b").status == "idle"  # repaired on its first load for writing
    store.close()
    assert main([*data, "sessions", "import", str(old)]) == 1
    assert "already holds ses-a, ses-b; nothing was imported" in capsys.readouterr().err


def test_only_the_importer_knows_the_old_files_and_the_page_reads_through_the_store() -> None:
    agent = Path(unit_mcp.agent.__file__).parent
    sources = [path for path in agent.rglob("*") if path.suffix in (".py", ".html", ".js")]
    knowing = sorted(
        str(path.relative_to(agent)) for path in sources if re.search(r"jsonl|/proc/locks", path.read_text())
    )
    assert knowing == ["_import.py"]
    for path in (agent / "ui").glob("*.py"):  # no file reading, no SQL, no process table: only SessionStore calls
        found = re.findall(
            r"sqlite3|read_bytes|read_text|os\.(?:scandir|stat|open)|\.glob\(|SELECT |/proc", path.read_text()
        )
        assert found == [], f"ui/{path.name} reads the store behind its back: {found}"


def test_retire_archives_or_deletes_an_idle_session_and_records_it(address: Address) -> None:
    store = SessionStore(address)
    kept, gone = store.create("a", title="kept"), store.create("a", title="gone")
    store.append_item(kept, MessageItem(role="user", content="hello"))
    archived = store.retire(kept.id, "archive", via="cli")
    assert archived.id == kept.id and archived.item_count == 1
    assert store.retire(gone.id, "delete", via="page").title == "gone"
    assert store.list() == [] and store.load(kept.id) is None and store.load(gone.id) is None
    archive = SessionStore(address, read_only=True, archive=True)
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


def test_retire_is_refused_while_a_turn_runs_here_or_another_store_holds_the_session(address: Address) -> None:
    store = SessionStore(address)
    busy = store.create("a")
    store.update(busy, status="running")
    with pytest.raises(AgentError, match="has a running turn; cancel it or wait for it to end first"):
        store.retire(busy.id, "delete", via="cli")
    other = SessionStore(address)  # a second writer (another process, as far as the lock goes)
    with pytest.raises(AgentError, match="is open in another process"):
        other.retire(busy.id, "archive", via="cli")
    assert [meta.id for meta in store.list()] == [busy.id] and store.audit() == []
    store.update(busy, status="idle")
    store.close()  # the writer lets it go: now it can be removed
    assert other.retire(busy.id, "delete", via="cli").id == busy.id
    other.close()


STOPPED_WRITER = """
import sys
import time
from unit_mcp.agent.errors import SessionLocked
from unit_mcp.agent.items import MessageItem
from unit_mcp.agent.sessions import SessionStore
store = SessionStore(sys.argv[1])
store.require(sys.argv[2])
print("holding", flush=True)
sys.stdin.readline()
try:
    store.append_item(sys.argv[2], MessageItem(role="user", content="too late"))
    print("wrote", flush=True)
except SessionLocked as exc:
    print("refused:", exc, flush=True)
"""


def test_a_writer_whose_heartbeat_went_stale_loses_the_session_and_its_next_write_is_refused(
    store: SessionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A live pid is not enough (a stopped process, a pid reused, another host): the heartbeat must be fresh."""
    session = store.create("a")
    store.close()
    writer = subprocess.Popen(
        [sys.executable, "-c", STOPPED_WRITER, str(store.address), session.id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline().strip() == "holding"
        writer.send_signal(signal.SIGSTOP)
        monkeypatch.setattr("unit_mcp.agent.sessions.STALE_SECONDS", 0.5)
        time.sleep(1.0)  # longer than the patched staleness: the stopped writer cannot have beaten since
        second = SessionStore(store.address)
        second.append_item(session.id, MessageItem(role="user", content="taken over"))
        writer.send_signal(signal.SIGCONT)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline().startswith(f"refused: {session.id} is no longer held by this store")
        contents = [item.content for item in second.require(session.id).items if isinstance(item, MessageItem)]
        assert contents == ["taken over"]
        second.close()
    finally:
        writer.kill()
        writer.wait(30)


def test_pages_of_sessions_come_newest_first_and_a_cursor_skips_nothing(store: SessionStore) -> None:
    made = [store.create("a", title=f"s{n}").id for n in range(7)]
    seen, cursor, sizes = [], None, []
    while True:
        listed = store.page(3, cursor)
        sizes.append(len(listed.sessions))
        seen += [meta.id for meta in listed.sessions]
        if listed.next is None:
            break
        cursor = listed.next
        store.create("a", title="newer")  # a session made meanwhile is on the first page, not in the pages after
    assert sizes == [3, 3, 1] and seen == made[::-1] == [meta.id for meta in store.list() if meta.title != "newer"]
    with pytest.raises(AgentError, match="invalid page cursor 'nonsense': give the `next` cursor"):
        store.page(3, "nonsense")
    assert [meta.title for meta in store.list(parent_id=made[0])] == []
    child = store.create("a", title="child", parent_id=made[0])
    assert [meta.id for meta in store.list(parent_id=made[0])] == [child.id]
    assert store.verify() == []


def test_the_cli_lists_a_page_and_prints_the_cursor_of_the_next(
    tmp_path: Path, address: Address, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SessionStore(address)
    made = [store.create("a").id for _ in range(3)]
    store.close()
    data = ["--data-dir", str(tmp_path / "data"), "--sessions", str(address)]
    assert main([*data, "sessions", "list", "--limit", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert [meta["id"] for meta in json.loads(out)] == made[:0:-1]
    (cursor,) = re.findall(r"more: sessions list --after (\S+)", err)
    assert main([*data, "sessions", "list", "--limit", "2", "--after", cursor, "--json"]) == 0
    out, err = capsys.readouterr()
    assert [meta["id"] for meta in json.loads(out)] == made[:1] and "more:" not in err


def test_a_postgres_store_lives_in_its_own_schema_and_refuses_a_foreign_one(pg_cluster: Any) -> None:
    import psycopg

    address = pg_cluster.new_database()
    with psycopg.connect(address, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.orders (id int)")  # a database used by something else too is fine
    store = SessionStore(address)
    store.create("a", session_id="ses-one")
    store.close()
    with psycopg.connect(address, autocommit=True) as conn:
        schemas = conn.execute("SELECT table_schema FROM information_schema.tables WHERE table_name = 'sessions'")
        assert schemas.fetchall() == [("unit_mcp_sessions",)]

    foreign = pg_cluster.new_database()
    with psycopg.connect(foreign, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA unit_mcp_sessions")
        conn.execute("CREATE TABLE unit_mcp_sessions.sessions (id int)")
    for read_only in (False, True):
        with pytest.raises(AgentError) as refused:
            SessionStore(foreign, read_only=read_only).list()
        assert str(refused.value) == (
            f"the session store {foreign} has a schema unit_mcp_sessions that unit-mcp did not make; give another "
            "database"
        )
    assert SessionStore(pg_cluster.new_database(), read_only=True).page().sessions == []  # none yet: empty


def test_a_postgres_address_with_a_password_or_without_the_driver_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(AgentError) as refused:
        SessionStore("postgresql://me:hunter2@127.0.0.1:5432/db")
    assert "hunter2" not in str(refused.value) and "carries a password; leave it out" in str(refused.value)
    without_driver = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from unit_mcp.cli import main\n"
        f"sys.exit(main(['agent', '--data-dir', {str(tmp_path / 'data')!r}, '--sessions', "
        "'postgresql://me@127.0.0.1:5432/db', 'sessions', 'list']))"
    )
    done = subprocess.run([sys.executable, "-c", without_driver], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        1,
        "unit-mcp agent: error: the session store postgresql://me@127.0.0.1:5432/db needs the PostgreSQL driver: "
        "pip install 'unit-mcp[postgres]'\n",
    )


def test_a_lost_connection_fails_one_write_in_one_line_and_the_next_reconnects(pg_cluster: Any) -> None:
    import psycopg
    from support.pgcluster import free_port

    from unit_mcp.agent.errors import SessionStoreUnavailable

    unreachable = r"^the session store postgresql://\S+ is unreachable \(.*\); nothing was written"
    with pytest.raises(SessionStoreUnavailable, match=unreachable):
        SessionStore(f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    address = pg_cluster.new_database()
    store = SessionStore(address)
    session = store.create("a")
    store.append_item(session, MessageItem(role="user", content="one"))
    with psycopg.connect(address, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'unit-mcp-sessions'"
            " AND datname = current_database()"
        ).fetchall()
        assert killed == [(True,)]
    with pytest.raises(SessionStoreUnavailable, match="is unreachable"):
        store.append_item(session, MessageItem(role="user", content="lost with the connection"))
    store.append_item(session, MessageItem(role="user", content="two"))  # a new connection
    store.close()
    reader = SessionStore(address, read_only=True)
    contents = [item.content for item in reader.require(session.id).items if isinstance(item, MessageItem)]
    assert contents == ["one", "two"] and reader.verify() == []


def test_the_units_store_and_the_session_store_share_one_database(pg_cluster: Any) -> None:
    from unit_mcp.units import open_loader

    address = pg_cluster.new_database()
    store = SessionStore(address)
    store.create("a", session_id="ses-beside-units")
    loader = open_loader(address)  # the units loader accepts a database that holds only unit-mcp's stores
    try:
        assert loader.discover() == {}
    finally:
        loader.close()
    assert [meta.id for meta in store.page().sessions] == ["ses-beside-units"]
    store.close()


def test_a_postgres_address_given_as_the_data_folder_is_refused_with_the_option_to_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a folder named "postgresql:" would be made here if the address were taken for a path
    assert main(["--data-dir", "postgresql://me@127.0.0.1:5432/db", "sessions", "list"]) == 2
    assert capsys.readouterr().err == (
        "unit-mcp agent: error: --data-dir takes a folder; give a PostgreSQL session store with --sessions postgresql://…\n"
    )
    assert list(tmp_path.iterdir()) == []
