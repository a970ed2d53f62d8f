"""Replay-safe tools, over every loader: a durable turn's tool step that its worker died in runs again, so a repeated
write (`unit_apply_patch`, `unit_create_source`, `unit_revert`, `unit_rollback`, `unit_revert_change`: every tool
that ends in the service's one write transaction) whose result is in place answers `already_applied` (nothing
written, no second change-log record) when the caller declares it may be repeating (`wire.REPLAY_META_KEY`, as
durable workers do); anyone else still gets `stale_hash` / `exists`; `unit_reload` / `unit_run_tests` may simply run
twice.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from conftest import LOADERS, copy_units, store_of
from mcp import Client

from unit_mcp import Host, UnitService, UnitTools
from unit_mcp.changelog import NOBODY
from unit_mcp.errors import UnitError
from unit_mcp.loader import Source
from unit_mcp.paths import hash_bytes
from unit_mcp.service import call_as
from unit_mcp.wire import ERROR_META_KEY, REPLAY_META_KEY

R = TypeVar("R")


@pytest.fixture(params=LOADERS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    store = store_of(request, copy_units(tmp_path / "units"), tmp_path)
    with Host(store, tmp_path / "data") as host:
        yield UnitService(host, test_timeout=60)


@pytest.fixture(params=["git", "sqlite", "postgres"])
def history_service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    """A service over each loader that keeps history (a folder does so in a git work tree)."""
    folder = copy_units(tmp_path / "units")
    if request.param == "git":
        git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(folder)]
        for step in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "units"]):
            subprocess.run([*git, *step], check=True)
        store = str(folder)
    else:
        store = store_of(request, folder, tmp_path)
    with Host(store, tmp_path / "data") as host:
        yield UnitService(host, test_timeout=60)


def raw(service: UnitService, unit_id: str, source_id: str) -> bytes:
    kind = service.loader.kind(unit_id)
    assert kind is not None
    return service.loader.read(Source(unit_id, kind, source_id))


def applied(service: UnitService, unit_id: str, source_id: str) -> list[int]:
    changes = service.change_log.changes(unit_id=unit_id, source_id=source_id, limit=100)
    return [change.id for change in changes if change.outcome == "applied"]


EXACT = {"old": "step = 1", "new": "step = 5"}


def replayed(call: Callable[[], R]) -> R:
    """`call` made by a caller that declared it may be repeating a call (`_meta["unit_mcp/replay"]`)."""
    return call_as(NOBODY, call, replay=True)


def diff_of(service: UnitService) -> dict[str, str]:
    """A diff-mode edit of counter/__init__.py making the same change as EXACT."""
    preview = service.apply_patch("counter", "__init__.py", **EXACT, dry_run=True)
    return {"patch": preview.diff}


@pytest.mark.parametrize("mode", ["exact", "diff"])
def test_a_repeated_patch_answers_already_applied_with_the_first_ones_result(service: UnitService, mode: str) -> None:
    edit = EXACT if mode == "exact" else diff_of(service)
    read = service.read_source("counter", "__init__.py")
    first = service.apply_patch("counter", "__init__.py", **edit, expected_hash=read.hash)
    after, records = raw(service, "counter", "__init__.py"), applied(service, "counter", "__init__.py")
    assert not first.already_applied and records == [first.change_id]

    again = replayed(lambda: service.apply_patch("counter", "__init__.py", **edit, expected_hash=read.hash))
    assert again.already_applied and again.changed and again.mode == mode
    assert (again.hash_before, again.hash, again.diff) == (first.hash_before, first.hash, first.diff)
    assert (again.replacements, again.change_id) == (first.replacements, first.change_id)
    assert again.reload is not None and again.reload.reloaded
    assert raw(service, "counter", "__init__.py") == after
    assert applied(service, "counter", "__init__.py") == records
    assert service.host.module("counter").step == 5


@pytest.mark.parametrize("mode", ["exact", "diff"])
def test_a_patch_whose_writer_died_before_the_reload_is_recognised_and_reloaded(
    service: UnitService, mode: str
) -> None:
    """The worker wrote the source and died before the reload and the change-log record: the repeat finds the bytes
    it started from by undoing the edit (the expected hash proves them), reloads, and writes nothing."""
    edit = EXACT if mode == "exact" else diff_of(service)
    read = service.read_source("counter", "__init__.py")
    before = raw(service, "counter", "__init__.py")
    patched = before.replace(b"step = 1", b"step = 5")
    src = Source("counter", "directory", "__init__.py")
    service.loader.write(src, patched, expected_hash=read.hash, tool_call="unit_apply_patch")
    assert service.host.module("counter").step == 1  # the dead worker never reloaded

    again = replayed(lambda: service.apply_patch("counter", "__init__.py", **edit, expected_hash=read.hash))
    assert again.already_applied and again.hash_before == read.hash and again.hash == hash_bytes(patched)
    assert again.reload is not None and again.reload.reloaded
    assert service.host.module("counter").step == 5
    assert raw(service, "counter", "__init__.py") == patched
    assert applied(service, "counter", "__init__.py") == []


def test_a_patch_against_a_source_someone_else_changed_differently_is_still_stale(service: UnitService) -> None:
    read = service.read_source("counter", "__init__.py")
    service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 7", expected_hash=read.hash)
    moved = raw(service, "counter", "__init__.py")
    with pytest.raises(UnitError) as caught:
        replayed(lambda: service.apply_patch("counter", "__init__.py", **EXACT, expected_hash=read.hash))
    assert caught.value.code == "stale_hash"
    assert raw(service, "counter", "__init__.py") == moved and service.host.module("counter").step == 7


def test_a_repeated_create_answers_already_applied_and_different_bytes_are_refused(service: UnitService) -> None:
    first = service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
    again = replayed(lambda: service.create_source("counter", "extras/bonus.py", "BONUS = 3\n"))
    assert again.already_applied and not first.already_applied and again.reload.reloaded
    assert (again.hash, again.size, again.change_id) == (first.hash, first.size, first.change_id)
    assert applied(service, "counter", "extras/bonus.py") == [first.change_id]
    with pytest.raises(UnitError) as caught:
        replayed(lambda: service.create_source("counter", "extras/bonus.py", "BONUS = 4\n"))
    assert caught.value.code == "exists"
    assert raw(service, "counter", "extras/bonus.py") == b"BONUS = 3\n"


def test_reload_and_run_tests_run_twice_with_the_same_outcome(service: UnitService) -> None:
    module = service.host.module("counter")
    module.increment()
    before = raw(service, "counter", "__init__.py")
    reloads = [service.reload("counter") for _ in range(2)]
    assert all(r.reloaded and r.restored_state for r in reloads)
    assert service.host.module("counter").count == 1
    runs = [service.run_tests("counter") for _ in range(2)]
    assert [r.passed for r in runs] == [True, True]
    assert raw(service, "counter", "__init__.py") == before


def test_a_caller_that_does_not_declare_a_replay_gets_stale_hash_for_the_same_edit(service: UnitService) -> None:
    """Two clients making the same edit from the same base (two increments of one counter) must not both succeed:
    without the declaration the second is `stale_hash` and a same-bytes create is `exists`, as before."""
    read = service.read_source("counter", "__init__.py")
    service.apply_patch("counter", "__init__.py", **EXACT, expected_hash=read.hash)
    with pytest.raises(UnitError) as caught:
        service.apply_patch("counter", "__init__.py", **EXACT, expected_hash=read.hash)
    assert caught.value.code == "stale_hash"
    service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
    with pytest.raises(UnitError) as caught:
        service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
    assert caught.value.code == "exists"


@pytest.mark.anyio
async def test_over_mcp_the_replay_is_declared_in_the_calls_meta(service: UnitService) -> None:
    tools = UnitTools(service)
    async with Client(tools.server()) as client:
        read = await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
        assert read.structured_content is not None
        edit = {
            "unit_id": "counter",
            "source_id": "__init__.py",
            **EXACT,
            "expected_hash": read.structured_content["hash"],
        }
        first = await client.call_tool("unit_apply_patch", edit)
        plain = await client.call_tool("unit_apply_patch", edit)
        again = await client.call_tool("unit_apply_patch", edit, meta={REPLAY_META_KEY: True})
    assert not first.is_error and first.structured_content is not None
    assert plain.is_error and plain.meta is not None and plain.meta[ERROR_META_KEY]["code"] == "stale_hash"
    assert not again.is_error and again.structured_content is not None
    assert again.structured_content["already_applied"] is True
    assert again.structured_content["change_id"] == first.structured_content["change_id"]


def test_a_repeated_revert_answers_already_applied_with_the_first_ones_result(history_service: UnitService) -> None:
    service = history_service
    service.apply_patch("counter", "__init__.py", **EXACT)
    oldest = service.history("counter", "__init__.py").versions[-1]
    read = service.read_source("counter", "__init__.py")
    first = service.revert("counter", "__init__.py", oldest.version, expected_hash=read.hash)
    after, records = raw(service, "counter", "__init__.py"), applied(service, "counter", "__init__.py")
    again = replayed(lambda: service.revert("counter", "__init__.py", oldest.version, expected_hash=read.hash))
    assert again.already_applied and not first.already_applied and again.change_id == first.change_id
    assert (again.hash_before, again.hash, again.diff) == (first.hash_before, first.hash, first.diff)
    assert again.reload is not None and again.reload.reloaded
    assert raw(service, "counter", "__init__.py") == after and applied(service, "counter", "__init__.py") == records
    with pytest.raises(UnitError) as caught:  # not declared a repeat: the source moved on since it was read
        service.revert("counter", "__init__.py", oldest.version, expected_hash=read.hash)
    assert caught.value.code == "stale_hash"


def test_a_repeated_rollback_answers_already_applied_with_the_first_ones_record(service: UnitService) -> None:
    mark = service.checkpoint("before")
    service.apply_patch("counter", "__init__.py", **EXACT)
    service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
    service.apply_patch("greeter", "greeter.py", old="Hello", new="Good day")
    first = service.rollback(mark.checkpoint_id)
    after = {s: raw(service, "greeter", s) for s in ("greeter.py",)}
    again = replayed(lambda: service.rollback(mark.checkpoint_id))
    assert again.already_applied and not first.already_applied and again.change_id == first.change_id
    assert {(s.unit_id, s.source_id, s.action) for s in again.sources} == {
        (s.unit_id, s.source_id, s.action) for s in first.sources
    }
    assert sorted(again.reloaded) == sorted(first.reloaded) == ["counter", "greeter"]
    assert {s: raw(service, "greeter", s) for s in ("greeter.py",)} == after
    assert [c.id for c in service.change_log.changes(limit=100) if c.tool == "unit_rollback"] == [first.change_id]
    plain = service.rollback(mark.checkpoint_id)  # not declared a repeat: nothing to put back, a new record
    assert not plain.already_applied and plain.sources == [] and plain.change_id != first.change_id


def test_a_repeated_revert_change_answers_already_applied_and_a_plain_repeat_is_stale(service: UnitService) -> None:
    patched = service.apply_patch("counter", "__init__.py", **EXACT)
    assert patched.change_id is not None
    first = service.revert_change(patched.change_id)
    assert service.host.module("counter").step == 1
    again = replayed(lambda: service.revert_change(patched.change_id))
    assert again.already_applied and not first.already_applied and again.change_id == first.change_id
    assert [(s.source_id, s.hash_before, s.hash) for s in again.sources] == [
        (s.source_id, s.hash_before, s.hash) for s in first.sources
    ]
    assert [c.id for c in service.change_log.changes(limit=100) if c.tool == "unit_revert_change"] == [first.change_id]
    with pytest.raises(UnitError) as caught:
        service.revert_change(patched.change_id)
    assert caught.value.code == "stale_hash"
