"""The change log over every loader: what each write call, refusal and outside change leaves in it, checkpoints and
all-or-nothing rollback across units, one change reverted, the client recorded over real MCP HTTP, a SIGKILL in the
middle of a rollback, and the retention. A loader joins by one line in STORES."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from conftest import REPO, copy_units, postgres_copy
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from test_loaders import external_write, make_store, raw, refusal, wait_for

from unit_mcp import Host, UnitService
from unit_mcp.bridge import Bridge
from unit_mcp.changelog import NOBODY, ChangeLog, Retention, SourceChange, SqliteChangeLog
from unit_mcp.loader import Source
from unit_mcp.paths import hash_bytes
from unit_mcp.pgloader import PostgresChangeLog, PostgresLoader
from unit_mcp.tools import UnitTools
from unit_mcp.units import open_loader

STORES = ["folder", "sqlite", "postgres"]
SHARED = ["sqlite", "postgres"]  # the stores several servers share: their change log lives in the store
EDITS = [  # five patches in three units
    ("counter", "__init__.py", "A click counter", "A counting counter"),
    ("greeter", "greeter.py", "Hello", "Howdy"),
    ("notes", "__init__.py", "café au lait", "café crème"),
    ("counter", "panel.py", "", ""),  # filled in below: panel.py's first line
    ("greeter", "greeter.py", "Howdy", "Good day"),
]
SOURCES = [("counter", "__init__.py"), ("counter", "panel.py"), ("greeter", "greeter.py"), ("notes", "__init__.py")]


def store_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A copy of the example and fixture units as a folder, a SQLite database or a new PostgreSQL database."""
    if kind == "postgres":
        return postgres_copy(request.getfixturevalue("pg_cluster"), copy_units(tmp_path / "units"))
    return make_store(kind, tmp_path)


def log_of(kind: str, request: pytest.FixtureRequest, tmp_path: Path, **options: object) -> ChangeLog:
    """A change log alone: in a private SQLite file, or in a new PostgreSQL database's units schema."""
    if kind == "postgres":
        address = request.getfixturevalue("pg_cluster").new_database()
        PostgresLoader(address).close()  # the loader makes the schema the log's tables go in
        return PostgresChangeLog(address, **options)  # type: ignore[arg-type]
    return SqliteChangeLog(tmp_path / "changes.db", private=True, **options)  # type: ignore[arg-type]


@pytest.fixture(params=STORES)
def host(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Host]:
    with Host(store_of(request.param, request, tmp_path), tmp_path / "data") as started:
        yield started


@pytest.fixture(params=SHARED)
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_of(request.param, request, tmp_path)


@pytest.fixture
def service(host: Host) -> UnitService:
    return UnitService(host)


def hashes(service: UnitService) -> dict[tuple[str, str], str]:
    return {(u, s): hash_bytes(raw(service, u, s)) for u, s in SOURCES}


def five_patches(service: UnitService) -> list[int]:
    """The five edits of EDITS, as one client; their change ids."""
    panel_line = raw(service, "counter", "panel.py").decode().splitlines()[0]
    ids = []
    for unit_id, source_id, old, new in EDITS:
        if source_id == "panel.py":
            old, new = panel_line, panel_line + "  # edited"
        result = service.apply_patch(unit_id, source_id, old=old, new=new)
        assert result.change_id is not None
        ids.append(result.change_id)
    return ids


def test_a_rollback_puts_five_patches_in_three_units_back_to_the_checkpoint(service: UnitService) -> None:
    before = hashes(service)
    checkpoint = service.checkpoint(label="before the turn")
    ids = five_patches(service)
    assert ids == sorted(ids) and hashes(service) != before
    assert [c.change_id for c in service.changes(limit=5).changes] == ids[::-1]
    assert service.host.module("greeter").greet("x") == "Good day, x!"  # type: ignore[union-attr]

    preview = service.rollback(checkpoint.checkpoint_id, dry_run=True)
    assert preview.dry_run and not preview.conflicts and preview.change_id is None
    assert {(s.unit_id, s.source_id) for s in preview.sources} == set(SOURCES)
    greeter = next(s for s in preview.sources if s.unit_id == "greeter")
    assert (
        greeter.diff is not None and '-    return f"Good day' in greeter.diff and '+    return f"Hello' in greeter.diff
    )
    assert hashes(service) != before  # a dry run writes nothing

    service.create_source("counter", "extra_x.py", "X = 1\n")
    done = service.rollback(checkpoint.checkpoint_id)
    assert hashes(service) == before
    assert "extra_x.py" not in service.loader.source_ids("counter", "directory")  # created since: removed
    assert sorted(done.reloaded) == ["counter", "greeter", "notes"]
    assert service.host.module("greeter").greet("x") == "Hello, x!"  # type: ignore[union-attr]
    record = service.changes(limit=1).changes[0]
    assert record.change_id == done.change_id and record.tool == "unit_rollback" and record.outcome == "applied"
    assert {(s.unit_id, s.source_id) for s in record.sources} == {*SOURCES, ("counter", "extra_x.py")}


def test_a_reload_failing_midway_through_a_rollback_leaves_everything_as_before(
    service: UnitService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    flag = tmp_path / "notes-may-load"
    flag.touch()
    monkeypatch.setenv("NOTES_MAY_LOAD", str(flag))  # in the unit's text by name: no host path in its results
    guard = "import os\nassert os.path.exists(os.environ['NOTES_MAY_LOAD'])\n"
    service.apply_patch("notes", "__init__.py", old="NOTES = [", new=guard + "NOTES = [")
    checkpoint = service.checkpoint()
    five_patches(service)
    service.create_source("counter", "extra_x.py", "X = 1\n")
    service.apply_patch("notes", "__init__.py", old=guard, new="")
    flag.unlink()  # the checkpoint's notes cannot load any more; notes is the last unit the rollback reloads
    after = {**hashes(service), ("counter", "extra_x.py"): hash_bytes(raw(service, "counter", "extra_x.py"))}
    counter = service.host.module("counter")
    failed = refusal("reload_failed", service.rollback, checkpoint.checkpoint_id)
    assert "nothing changed" in failed.message and failed.details["unit_id"] == "notes"
    assert {**hashes(service), ("counter", "extra_x.py"): hash_bytes(raw(service, "counter", "extra_x.py"))} == after
    assert service.host.module("greeter").greet("x") == "Good day, x!"  # type: ignore[union-attr]
    assert service.host.module("counter") is not counter  # reloaded again from its restored sources
    assert service.host.is_loaded("notes") and service.host.is_loaded("counter")
    record = service.changes(limit=1).changes[0]
    assert record.tool == "unit_rollback" and record.outcome == "rolled_back" and record.error_code == "reload_failed"


def test_an_edit_made_outside_after_the_checkpoint_is_a_conflict_unless_forced(service: UnitService) -> None:
    host = service.host
    host.start_watching(debounce_ms=50)
    before = hashes(service)
    checkpoint = service.checkpoint()
    five_patches(service)
    greeter = raw(service, "greeter", "greeter.py")
    external_write(host, "greeter", "greeter.py", greeter + b"\nHUMAN = 1\n")
    wait_for(lambda: getattr(host.module("greeter"), "HUMAN", None) == 1)
    wait_for(lambda: service.changes(limit=1).changes[0].outcome == "outside")
    outside = service.changes(limit=1).changes[0]
    assert outside.tool is None and outside.client.name is None and outside.unit_id == "greeter"
    assert [(s.source_id, s.action, s.hash_before) for s in outside.sources] == [
        ("greeter.py", "modified", hash_bytes(greeter))
    ]

    kept = service.rollback(checkpoint.checkpoint_id)
    assert [(c.unit_id, c.source_id) for c in kept.conflicts] == [("greeter", "greeter.py")]
    assert raw(service, "greeter", "greeter.py").endswith(b"HUMAN = 1\n")  # left alone
    assert {k: v for k, v in hashes(service).items() if k[0] != "greeter"} == {
        k: v for k, v in before.items() if k[0] != "greeter"
    }

    forced = service.rollback(checkpoint.checkpoint_id, force=True)
    assert not forced.conflicts and [(s.unit_id, s.source_id) for s in forced.sources] == [("greeter", "greeter.py")]
    assert hashes(service) == before


def test_refused_and_failed_calls_are_recorded_with_their_codes_never_as_applied(service: UnitService) -> None:
    current = hash_bytes(raw(service, "greeter", "greeter.py"))
    refusal("no_match", service.apply_patch, "greeter", "greeter.py", old="not there", new="x")
    refusal("syntax_error", service.apply_patch, "greeter", "greeter.py", old="def greet(name):", new="def greet(:")
    refusal("stale_hash", service.apply_patch, "greeter", "greeter.py", old="Hello", new="Hi", expected_hash="0" * 64)
    refusal("reload_failed", service.apply_patch, "greeter", "greeter.py", old="import logging", new="import nope_x")
    refusal("exists", service.create_source, "counter", "panel.py", "X = 1\n")
    service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi", dry_run=True)  # not a write: not recorded
    records = service.changes().changes
    assert [(r.tool, r.outcome, r.error_code) for r in records] == [
        ("unit_create_source", "refused", "exists"),
        ("unit_apply_patch", "rolled_back", "reload_failed"),
        ("unit_apply_patch", "refused", "stale_hash"),
        ("unit_apply_patch", "refused", "syntax_error"),
        ("unit_apply_patch", "refused", "no_match"),
    ]
    rolled_back = records[1]
    assert rolled_back.hash_before == current and rolled_back.hash_after != current
    assert rolled_back.message and "nope_x" in rolled_back.message
    assert all(r.sources == [] for r in records if r.outcome == "refused")
    assert hash_bytes(raw(service, "greeter", "greeter.py")) == current
    full = service.change_log.change(rolled_back.change_id)
    assert full is not None and full.sources[0].data_after is None  # bytes are kept of applied changes only


def test_one_change_is_reverted_and_a_source_that_moved_on_is_stale(service: UnitService) -> None:
    original = raw(service, "greeter", "greeter.py")
    first = service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
    created = service.create_source("counter", "extra_x.py", "X = 1\n")
    second = service.apply_patch("greeter", "greeter.py", old="Hi", new="Hey")
    assert first.change_id and created.change_id and second.change_id
    stale = refusal("stale_hash", service.revert_change, first.change_id)
    assert "nothing was reverted" in stale.message
    preview = service.revert_change(second.change_id, dry_run=True)
    assert preview.sources[0].diff and '+    return f"Hi' in preview.sources[0].diff
    service.revert_change(second.change_id)
    service.revert_change(first.change_id)
    assert raw(service, "greeter", "greeter.py") == original
    removed = service.revert_change(created.change_id)
    assert [s.action for s in removed.sources] == ["removed"]
    assert "extra_x.py" not in service.loader.source_ids("counter", "directory")
    refusal("unknown_change", service.revert_change, 10**9)


def test_changes_pages_newest_first_and_filters_by_unit_source_and_time(service: UnitService) -> None:
    start = service.changes().latest_change_id
    five_patches(service)
    page = service.changes(limit=2)
    assert page.latest_change_id == start + 5 and [c.change_id for c in page.changes] == [start + 5, start + 4]
    rest = service.changes(limit=10, cursor=page.next_cursor)
    assert [c.change_id for c in rest.changes] == [start + 3, start + 2, start + 1] and rest.next_cursor is None
    assert [c.source_id for c in service.changes(unit_id="greeter").changes] == ["greeter.py", "greeter.py"]
    assert [c.change_id for c in service.changes(unit_id="counter", source_id="panel.py").changes] == [start + 4]
    assert service.changes(since="2999-01-01T00:00:00Z").changes == []
    assert len(service.changes(since="2000-01-01T00:00:00+00:00").changes) == 5
    refusal("invalid_argument", service.changes, cursor="bm9wZQ")
    refusal("invalid_argument", service.changes, since="yesterday")
    refusal("unknown_checkpoint", service.rollback, 10**9)


def test_a_page_of_changes_stays_under_80_kb_and_pages_on(service: UnitService) -> None:
    sources = [SourceChange("u", f"s{n}.py", "modified", "sha256:0", "sha256:1") for n in range(100)]
    for _ in range(200):
        service.change_log.record(
            caller=NOBODY, tool="t", unit_id="u", source_id=None, outcome="refused", message="m" * 2000, sources=sources
        )
    page = service.changes(limit=200)
    assert 0 < len(page.changes) < 200 and page.next_cursor is not None
    assert len(page.model_dump_json()) < 80_000
    assert page.changes[0].sources_total == 100 and len(page.changes[0].sources) == 20
    rest = service.changes(limit=200, cursor=page.next_cursor)
    assert rest.changes[0].change_id == page.changes[-1].change_id - 1


def test_a_rollback_preview_stays_under_80_kb(service: UnitService) -> None:
    checkpoint = service.checkpoint()
    for n in range(12):  # created since the checkpoint: the rollback removes them, each diff about 7 KB
        service.create_source("counter", f"big_{n}.py", "X = 1  # " + "x" * 7000 + "\n")
    preview = service.rollback(checkpoint.checkpoint_id, dry_run=True)
    assert [s.action for s in preview.sources] == ["removed"] * 12
    assert len(preview.model_dump_json()) < 80_000
    assert preview.sources[0].diff and "-X = 1" in preview.sources[0].diff
    assert preview.sources[-1].diff and preview.sources[-1].diff.startswith("[diff left out")


def test_every_server_on_a_units_database_sees_every_change(shared_store: str, tmp_path: Path) -> None:
    store = shared_store
    with Host(store, tmp_path / "a") as one, Host(store, tmp_path / "b", namespace="units_b") as two:
        change = UnitService(one).apply_patch("greeter", "greeter.py", old="Hello", new="Hi").change_id
        assert [c.change_id for c in UnitService(two).changes().changes] == [change]
        assert not (tmp_path / "a" / "changes.db").exists()  # the log lives in the database, not the data dir


def test_a_server_reloading_another_servers_tool_write_records_no_outside_change(
    shared_store: str, tmp_path: Path
) -> None:
    store = shared_store
    with Host(store, tmp_path / "a") as one, Host(store, tmp_path / "b", namespace="units_b") as two:
        two.start_watching(debounce_ms=50)
        UnitService(one).apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
        wait_for(lambda: two.module("greeter").greet("x") == "Hi, x!")  # type: ignore[union-attr]
        external_write(one, "greeter", "greeter.py", raw(UnitService(one), "greeter", "greeter.py") + b"\nX = 1\n")
        wait_for(lambda: getattr(two.module("greeter"), "X", None) == 1)
        wait_for(lambda: len(UnitService(two).changes().changes) == 2)
        records = UnitService(two).changes().changes
        assert [(r.tool, r.outcome) for r in records] == [(None, "outside"), ("unit_apply_patch", "applied")]


@pytest.mark.parametrize("kind", SHARED)
def test_an_outside_change_is_recorded_once_whoever_notices_it(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Every server on a store notices the same outside change: the first records it, the others find it there."""
    log = log_of(kind, request, tmp_path)
    first = log.record_outside("u", [("a.py", b"one"), ("gone.py", None)])
    assert first is not None and log.record_outside("u", [("a.py", b"one"), ("gone.py", None)]) is None
    second = log.record_outside("u", [("a.py", b"two")], "SyntaxError: x")
    assert second is not None
    change = log.change(second)
    assert change is not None and change.outcome == "outside" and change.error_code == "reload_failed"
    [source] = change.sources
    assert (source.action, source.hash_before, source.data_before, source.data_after) == (
        "modified",
        hash_bytes(b"one"),
        b"one",
        b"two",
    )
    log.close()


@pytest.mark.parametrize("kind", SHARED)
def test_retention_drops_old_records_and_the_checkpoints_that_need_them(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    now = [1_000_000_000.0]
    log = log_of(kind, request, tmp_path, retention=Retention(days=1, records=5), clock=lambda: now[0])
    one = SourceChange("u", "s.py", "modified", "sha256:a", "sha256:b", b"a", b"b")
    early = log.checkpoint("early", NOBODY)
    ids = [log.record(caller=NOBODY, tool="t", unit_id="u", source_id="s.py", outcome="applied", sources=[one])]
    late = log.checkpoint("late", NOBODY)
    for _ in range(9):
        ids.append(log.record(caller=NOBODY, tool="t", unit_id="u", source_id="s.py", outcome="applied"))
    assert log.prune() == 5
    assert [c.id for c in log.changes(limit=100)] == ids[:4:-1]
    assert log.get_checkpoint(early.id) is None and log.get_checkpoint(late.id) is None
    now[0] += 2 * 86400  # two days later, by the log's clock
    fresh = log.record(caller=NOBODY, tool="t", unit_id="u", source_id="s.py", outcome="applied")
    assert log.prune() == 5
    assert [c.id for c in log.changes(limit=100)] == [fresh]
    if kind == "sqlite":
        assert (tmp_path / "changes.db").stat().st_mode & 0o777 == 0o600
    log.close()


@pytest.mark.parametrize("kind", SHARED)
def test_checkpoints_are_listed_newest_first(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    log = log_of(kind, request, tmp_path)
    first, second = log.checkpoint("first", NOBODY), log.checkpoint(None, NOBODY)
    assert log.checkpoints() == [second, first] and log.checkpoints(limit=1) == [second]
    log.close()


def test_a_private_change_log_refuses_a_link_or_a_file_that_is_not_private(tmp_path: Path) -> None:
    (tmp_path / "elsewhere.db").write_bytes(b"")
    (tmp_path / "linked.db").symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(PermissionError, match="remove it"):
        SqliteChangeLog(tmp_path / "linked.db", private=True)
    (tmp_path / "open.db").write_bytes(b"")
    (tmp_path / "open.db").chmod(0o644)
    with pytest.raises(PermissionError, match="not a private file"):
        SqliteChangeLog(tmp_path / "open.db", private=True)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_mcp_client_name_version_and_session_are_recorded(
    service: UnitService, mode: str, anyio_backend: str
) -> None:
    tools = UnitTools(service)
    info = types.Implementation(name="<script>alert(1)</script>-client", version="9.8.7")
    async with Bridge(tools.server()) as bridge:
        assert bridge.url is not None
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {bridge.token}"}, timeout=30) as http,
            Client(streamable_http_client(bridge.url, http_client=http), mode=mode, client_info=info) as client,
        ):
            done = await client.call_tool(
                "unit_apply_patch", {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Hi"}
            )
            assert not done.is_error and done.structured_content is not None
            change_id = done.structured_content["change_id"]
            listed = await client.call_tool("unit_changes", {"limit": 1})
    assert listed.structured_content is not None
    record = listed.structured_content["changes"][0]
    assert record["change_id"] == change_id and record["tool"] == "unit_apply_patch"
    assert record["client"]["name"] == "<script>alert(1)</script>-client" and record["client"]["version"] == "9.8.7"
    if mode == "legacy":  # the handshake era has a session; the 2026 era is sessionless
        assert record["client"]["session_id"]


ROLLBACK_SCRIPT = textwrap.dedent(
    """
    import sys
    from unit_mcp import Host, UnitService
    store, data, waiting = sys.argv[1], sys.argv[2], sys.argv[3].encode()
    with Host(store, data, reload_timeout=600) as host:
        service = UnitService(host)
        checkpoint = service.checkpoint()
        service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
        service.apply_patch("notes", "__init__.py", old="café au lait", new="café crème")
        # the checkpoint's notes waits for a file that never comes when it loads again: the rollback hangs there
        # (its content is put in the blob store as a checkpoint of those bytes would have it)
        from unit_mcp import blobstore
        from unit_mcp.paths import hash_bytes
        log = service.change_log
        tree = log.checkpoint_tree(checkpoint.checkpoint_id)
        sources = tree.units["notes"][1]
        hanging = waiting + log.blobs([sources["__init__.py"]])[sources["__init__.py"]]
        sources["__init__.py"] = hash_bytes(hanging)
        encoded = tree.encode()
        with log._transaction() as conn:
            blobstore.put(log._runner(conn), {hash_bytes(hanging): hanging, hash_bytes(encoded): encoded}, 0.0)
            log._run(conn, "UPDATE checkpoint_trees SET tree = ? WHERE checkpoint_id = ?",
                     (hash_bytes(encoded), checkpoint.checkpoint_id))
        print("rolling back", flush=True)
        service.rollback(checkpoint.checkpoint_id)
    """
)


def read_source(store: str, unit_id: str, source_id: str) -> bytes:
    """A source's bytes straight from the store, without loading any unit."""
    loader = open_loader(store, read_only=True)
    try:
        kind = loader.kind(unit_id)
        assert kind is not None
        return loader.read(Source(unit_id, kind, source_id))
    finally:
        loader.close()


@pytest.mark.parametrize("kind", STORES)
def test_a_sigkill_during_a_rollback_leaves_old_or_new_bytes_and_a_readable_log(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = store_of(kind, request, tmp_path)
    greeter, notes = read_source(store, "greeter", "greeter.py"), read_source(store, "notes", "__init__.py")
    waiting = f"import pathlib, time\nwhile not pathlib.Path({str(tmp_path / 'never')!r}).exists(): time.sleep(0.05)\n"
    patched = {
        "greeter": greeter.replace(b"Hello", b"Hi"),
        "notes": notes.replace("café au lait".encode(), "café crème".encode()),
    }
    restored = {"greeter": greeter, "notes": waiting.encode() + notes}
    process = subprocess.Popen(
        [sys.executable, "-c", ROLLBACK_SCRIPT, store, str(tmp_path / "data"), waiting],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == "rolling back\n"
        deadline = time.monotonic() + 120
        # both sources written: the rollback is reloading, and hangs in the checkpoint's notes
        while read_source(store, "notes", "__init__.py") != restored["notes"]:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    for unit_id, source_id in [("greeter", "greeter.py"), ("notes", "__init__.py")]:
        assert read_source(store, unit_id, source_id) in (patched[unit_id], restored[unit_id])
    unstarted = Host(store, tmp_path / "data")  # its change log, wherever the loader keeps it; no unit is loaded
    try:
        records = unstarted.changes.changes()
        assert [(r.tool, r.outcome) for r in records] == [("unit_apply_patch", "applied")] * 2  # no rollback record
        assert records[0].sources[0].hash_after == hash_bytes(patched["notes"])
    finally:
        unstarted.changes.close()
        unstarted.loader.close()


def test_the_server_takes_a_change_retention_in_days_above_zero(capsys: pytest.CaptureFixture[str]) -> None:
    from unit_mcp.server import parse_args

    assert parse_args(["--change-retention", "7"]).change_retention == 7
    with pytest.raises(SystemExit):
        parse_args(["--change-retention", "0"])
    assert "--change-retention 0 must be a number of days above 0" in capsys.readouterr().err
