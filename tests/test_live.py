"""The application's traffic through a reload: uses of a unit, the drain, the short window, migrate, no stale objects.

Every wait here is an event or a join with a generous bound; no assertion depends on how fast the machine is.
"""

from __future__ import annotations

import gc
import sys
import textwrap
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import root_of

from unit_mcp import Host, ReloadError, UnitNotLoaded
from unit_mcp.paths import hash_bytes
from unit_mcp.reloading import DrainTimeout, Reloaded

TALLY = """\
import threading
import time

_lock = threading.Lock()
count = 0
SLOW_SNAPSHOT = 0.005


def add():
    global count
    with _lock:
        count += 1
        return count


def snapshot():
    taken = {"count": count}
    time.sleep(SLOW_SNAPSHOT)  # a snapshot that takes a moment: a write reaching this module now would be lost
    return taken


def restore(state):
    global count
    count = state["count"]
"""


def put_unit(host: Host, unit_id: str, source: str) -> Path:
    path = root_of(host) / f"{unit_id}.py"
    path.write_text(textwrap.dedent(source))
    return path


def loaded(host: Host, unit_id: str, source: str) -> Path:
    path = put_unit(host, unit_id, source)
    host.reload(unit_id)
    return path


def count_of(host: Host, unit_id: str = "tally") -> int:
    with host.use(unit_id) as module:
        return int(module.count)


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run `work` in a thread; the list gets its result or its exception."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def draining(host: Host, unit_id: str) -> threading.Event:
    """Set once a reload of the unit has closed it to new uses (it then waits for the uses in flight)."""
    gate = host._gate(unit_id)
    closed = threading.Event()
    close = gate.close

    def watched(timeout: float) -> bool:
        closed.set()
        return close(timeout)

    gate.close = watched  # type: ignore[method-assign]
    return closed


def test_no_write_through_a_use_is_lost_while_the_unit_reloads(host: Host) -> None:
    """The lost-update race of issue 35: writers in threads, a unit whose snapshot takes a moment, 20 reloads. Each
    write made through a use is in the final count (on the code before uses, writes reaching the old module after
    its snapshot were lost)."""
    loaded(host, "tally", TALLY)
    stop = threading.Event()
    done = [0] * 4

    def writer(slot: int) -> None:
        while not stop.is_set():
            with host.use("tally") as tally:
                tally.add()
            done[slot] += 1

    writers = [threading.Thread(target=writer, args=(slot,)) for slot in range(4)]
    for thread in writers:
        thread.start()
    try:
        results = [host.reload("tally") for _ in range(20)]
    finally:
        stop.set()
        for thread in writers:
            thread.join(30)
    assert sum(done) > 0
    assert count_of(host) == sum(done)
    assert all(result.restored_state for result in results)
    assert all(0 <= result.window_ms <= result.blocked_ms <= result.duration_ms for result in results)


@pytest.mark.anyio
async def test_asyncio_tasks_wait_for_the_window_and_lose_no_write(host: Host) -> None:
    loaded(host, "tally", TALLY)
    done = [0]
    stop = anyio.Event()

    async def writer() -> None:
        while not stop.is_set():
            async with host.use("tally") as tally:
                tally.add()
            done[0] += 1
            await anyio.sleep(0)

    async with anyio.create_task_group() as tasks:
        for _ in range(8):
            tasks.start_soon(writer)
        for _ in range(10):
            await anyio.to_thread.run_sync(host.reload, "tally")
        stop.set()
    assert done[0] > 0
    assert count_of(host) == done[0]


def test_a_use_in_flight_ends_on_the_old_version_and_waiting_uses_go_to_the_new(host: Host) -> None:
    path = loaded(host, "tally", TALLY)
    release = threading.Event()
    entered = threading.Event()

    def long_use() -> types.ModuleType:
        with host.use("tally") as tally:
            entered.set()
            assert release.wait(30)
            tally.add()  # after the reload asked to swap: this write must still move to the new version
            return tally

    first, first_outcome = in_thread(long_use)
    assert entered.wait(30)
    old = host.module("tally")
    path.write_text(TALLY + "\nNEW = True\n")
    closed = draining(host, "tally")
    reloader, reloaded = in_thread(lambda: host.reload("tally"))
    assert closed.wait(30)
    waiting, waited = in_thread(lambda: count_of(host))
    waiting.join(0.2)
    assert waiting.is_alive() and not reloaded, "a new use waits while the reload drains; the reload waits too"
    release.set()
    for thread in (first, reloader, waiting):
        thread.join(30)
    assert first_outcome == [old], "the use in flight ended on the version it started on"
    assert isinstance(reloaded[0], Reloaded)
    assert waited == [1], "the waiting use went to the new version, with the write made by the use in flight"
    assert host.module("tally").NEW


def test_a_use_that_outlasts_the_drain_timeout_refuses_the_reload_and_the_old_version_serves_on(host: Host) -> None:
    path = loaded(host, "tally", TALLY)
    host.drain_timeout = 0.5
    serving = host.module("tally")
    original = path.read_text()
    path.write_text(original + "\nNEW = True\n")
    with host.use("tally") as tally:
        reloader, outcome = in_thread(lambda: host.reload("tally", rollback_source=lambda: path.write_text(original)))
        reloader.join(60)
        tally.add()
    error = outcome[0]
    assert isinstance(error, ReloadError)
    assert error.stage == "drain" and "drain timeout" in error.error
    assert error.evidence["previous_version_serving"] and error.evidence["source_restored"]
    assert path.read_text() == original
    assert host.module("tally") is serving
    assert count_of(host) == 1
    assert host.reload("tally").unit_id == "tally", "the next reload goes through once the use has ended"
    assert count_of(host) == 1


def test_a_failed_or_slow_prepare_blocks_no_use(host: Host, tmp_path: Path) -> None:
    path = loaded(host, "tally", TALLY)
    host.drain_timeout = 60
    release = threading.Event()
    entered = threading.Event()

    def in_flight() -> None:  # a use in flight: a reload that reached the drain would wait for it
        with host.use("tally"):
            entered.set()
            release.wait(60)

    holder, _ = in_thread(in_flight)
    assert entered.wait(30)
    path.write_text("def broken(:\n")
    with pytest.raises(ReloadError) as caught:
        host.reload("tally")
    assert caught.value.stage == "import"
    release.set()
    holder.join(30)
    started, go = tmp_path / "import-started", tmp_path / "import-go"
    path.write_text(
        TALLY + f"\nimport pathlib\npathlib.Path({str(started)!r}).touch()\n"
        f"while not pathlib.Path({str(go)!r}).exists():\n    time.sleep(0.01)\n"
    )
    reloader, outcome = in_thread(lambda: host.reload("tally"))
    try:
        assert _wait_for_path(started)
        with host.use("tally") as tally:  # the new version is importing: uses go on with the old one
            assert tally.add() == 1
        assert not outcome, "the reload was still importing"
    finally:
        go.touch()  # never leave an import hanging: it would hold the module's import lock
    reloader.join(30)
    assert isinstance(outcome[0], Reloaded)
    assert count_of(host) == 1
    assert sys.modules["units"].tally is host.module("tally") is sys.modules["units.tally"]


def _wait_for_path(path: Path) -> bool:
    event = threading.Event()
    for _ in range(3000):
        if path.exists():
            return True
        event.wait(0.01)
    return False


def test_a_hanging_snapshot_is_given_up_on_and_waiting_uses_go_on_with_the_old_version(host: Host) -> None:
    loaded(host, "tally", TALLY)
    host.reload_timeout = 1.0
    with host.use("tally") as tally:
        tally.add()
        tally.SLOW_SNAPSHOT = 3
    serving = host.module("tally")
    with pytest.raises(ReloadError) as caught:
        host.reload("tally")
    assert caught.value.stage == "snapshot" and "did not finish within 1 s" in caught.value.error
    assert caught.value.evidence["previous_version_serving"]
    with host.use("tally") as tally:
        assert tally is serving
        assert tally.add() == 2


def test_a_hanging_drop_is_given_up_on_and_the_new_version_serves_with_the_state(host: Host) -> None:
    loaded(host, "tally", TALLY + "\nHANG = 0\n\ndef drop():\n    time.sleep(HANG)\n")
    host.reload_timeout = 1.0
    with host.use("tally") as tally:
        tally.add()
        tally.HANG = 3
    serving = host.module("tally")
    result = host.reload("tally")
    assert result.restored_state
    with host.use("tally") as tally:
        assert tally is not serving
        assert tally.add() == 2
    assert "drop() of unit tally failed" in host.log_path.read_text()


def test_a_use_nested_in_a_use_never_waits_for_the_reload_waiting_for_it(host: Host) -> None:
    loaded(host, "tally", TALLY)
    with host.use("tally") as outer:
        closed = draining(host, "tally")
        reloader, outcome = in_thread(lambda: host.reload("tally"))
        assert closed.wait(30)
        with host.use("tally") as inner:
            assert inner is outer
            inner.add()
        with pytest.raises(ReloadError) as caught:
            host.reload("tally")
        assert caught.value.stage == "drain" and "inside a use of it" in caught.value.error
    reloader.join(30)
    assert isinstance(outcome[0], Reloaded)
    assert count_of(host) == 1


def test_a_use_of_a_unit_that_is_not_loaded_is_refused(host: Host) -> None:
    with pytest.raises(UnitNotLoaded), host.use("broken"):
        pass
    with host.use("greeter") as greeter:
        assert greeter.greet("Ada") == "Hello, Ada!"
    host.unload("greeter")
    with pytest.raises(UnitNotLoaded), host.use("greeter"):
        pass


VERSIONED = """\
VERSION = {version}
count = 0
seen = None
{migrate}

def snapshot():
    return {{"count": count}}


def restore(state):
    global count, seen
    seen = state
    count = state["count"]
"""

MIGRATE = """
def migrate(state, from_version):
    return {"count": state["count"] * 10, "from": from_version}
"""


def test_migrate_gets_the_state_and_the_version_it_comes_from_when_the_version_changed(host: Host) -> None:
    path = loaded(host, "vers", VERSIONED.format(version=1, migrate=""))
    with host.use("vers") as vers:
        vers.count = 3
    path.write_text(VERSIONED.format(version=2, migrate=MIGRATE))
    host.reload("vers")
    with host.use("vers") as vers:
        assert vers.seen == {"count": 30, "from": 1}
    host.reload("vers")  # the same VERSION: no migrate
    with host.use("vers") as vers:
        assert vers.seen == {"count": 30}


def test_without_a_declared_version_migrate_gets_the_previous_source_hash(host: Host) -> None:
    source = VERSIONED.replace("VERSION = {version}\n", "")
    path = loaded(host, "vers", source.format(migrate=""))
    before = path.read_bytes()
    path.write_text(source.format(migrate=MIGRATE))
    host.reload("vers")
    with host.use("vers") as vers:
        assert vers.seen == {"count": 0, "from": hash_bytes(before)}


def test_a_failing_migrate_rolls_back_and_the_old_version_was_never_dropped(host: Host) -> None:
    path = loaded(
        host,
        "vers",
        VERSIONED.format(version=1, migrate="drops = 0\n\ndef drop():\n    global drops\n    drops += 1\n"),
    )
    original = path.read_text()
    serving = host.module("vers")
    with host.use("vers") as vers:
        vers.count = 3
    path.write_text(
        VERSIONED.format(version=2, migrate="def migrate(state, from_version):\n    raise KeyError('total')\n")
    )
    with pytest.raises(ReloadError) as caught:
        host.reload("vers", rollback_source=lambda: path.write_text(original) is not None)
    assert caught.value.stage == "migrate" and "KeyError" in caught.value.error
    assert caught.value.evidence["rolled_back"] and caught.value.evidence["source_restored"]
    assert "raise KeyError('total')" in caught.value.evidence["traceback"]
    with host.use("vers") as vers:
        assert vers is serving and vers.count == 3 and vers.drops == 0


STALE = """\
import time

class Item:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


class Handler:
    pass


count = 0


def add():
    global count
    count += 1


def init(host):
    host.register_activity("items", Item)


def snapshot():
    return {"count": count}


def restore(state):
    global count
    count = state["count"]
"""


def _reachable(roots: list[Any]) -> Iterator[Any]:
    """Objects reachable from `roots` through references, not descending into modules or classes (a module's
    globals are what serves now; walking sys.modules would reach everything)."""
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        if isinstance(item, (types.ModuleType, type)):
            continue
        stack.extend(gc.get_referents(item))


def test_fifty_reloads_under_traffic_leave_no_superseded_object_in_the_host(host: Host) -> None:
    path = loaded(host, "stale", STALE)
    host.activate("items")
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            with host.use("stale") as stale:
                stale.add()

    writer = threading.Thread(target=traffic)
    writer.start()
    superseded: list[type] = []
    try:
        for version in range(50):
            superseded += [host.module("stale").Item, host.module("stale").Handler]
            path.write_text(STALE + f"\nVERSION_MARK = {version}\n")
            host.reload("stale")
    finally:
        stop.set()
        writer.join(30)
    current = host.module("stale")
    assert isinstance(host.active_session, current.Item)
    gc.collect()
    stale_ids = {id(cls) for cls in superseded}
    roots = [host._loaded, host._activities, host._gates, host._load_errors, host._snapshots, host._finder]
    found = [
        item
        for item in _reachable(roots)
        if id(item) in stale_ids
        or id(type(item)) in stale_ids
        or (
            isinstance(item, types.FunctionType)
            and item.__globals__ is not current.__dict__
            and item.__globals__.get("__name__") == "units.stale"
        )
    ]
    assert found == []
    assert "units.stale" in sys.modules and sys.modules["units.stale"] is current


def test_a_failed_reload_shows_the_line_that_was_attempted(host: Host) -> None:
    path = put_unit(host, "lines", "".join(f"value_{n} = {n}\n" for n in range(1, 20)))
    host.reload("lines")
    original = path.read_text()
    attempted = original.replace("value_10 = 10\n", "value_10 = undefined_name + 1\n")
    path.write_text(attempted)
    with pytest.raises(ReloadError) as caught:
        host.reload("lines", rollback_source=lambda: path.write_text(original) is not None)
    trace = caught.value.evidence["traceback"]
    assert "line 10" in trace and "value_10 = undefined_name + 1" in trace
    assert "NameError: name 'undefined_name' is not defined" in trace
    assert "frames of the host and importlib not shown" in trace
    assert "importlib" not in trace.split("\n", 1)[1], "only the unit's own frames are printed"
    assert path.read_text() == original


def test_restoring_a_snapshot_waits_for_the_uses_in_flight_and_holds_new_ones(host: Host) -> None:
    """restore_snapshot swaps the unit's state as a reload does: a write made through a use in flight is in the state
    restore() replaces (not overwritten half-way), and a use that starts meanwhile sees the restored state."""
    loaded(host, "tally", TALLY)
    with host.use("tally") as tally:
        closed = draining(host, "tally")
        restorer, restored = in_thread(lambda: host.restore_snapshot("tally", {"count": 100}))
        assert closed.wait(30)
        writer, written = in_thread(lambda: count_after_add(host))
        assert restorer.is_alive() and writer.is_alive(), "both wait for this use"
        assert tally.add() == 1
    restorer.join(30)
    writer.join(30)
    assert restored == [True]
    assert written == [101], "the use that waited saw the restored state"


def count_after_add(host: Host) -> int:
    with host.use("tally") as tally:
        return int(tally.add())


def test_restoring_a_snapshot_is_refused_after_the_drain_timeout_and_inside_a_use(host: Host) -> None:
    loaded(host, "tally", TALLY)
    host.drain_timeout = 0.3
    with host.use("tally") as tally:
        tally.add()
        restorer, outcome = in_thread(lambda: host.restore_snapshot("tally", {"count": 100}))
        restorer.join(60)
        with pytest.raises(DrainTimeout, match="inside a use"):
            host.restore_snapshot("tally", {"count": 100})
    assert isinstance(outcome[0], DrainTimeout) and "nothing was restored" in str(outcome[0])
    assert count_of(host) == 1
    assert host.restore_snapshot("tally", {"count": 7}) is True
    assert count_of(host) == 7


def test_a_released_use_no_longer_lets_a_new_use_past_a_reload_window(host: Host) -> None:
    """After release() (a response that started streaming), a new use in the same thread is a use of its own: it
    waits for a reload's window instead of entering as if nested in the released one."""
    loaded(host, "tally", TALLY)
    use = host.use("tally")
    with use:
        use.release()
        closed = draining(host, "tally")
        gate = host._gate("tally")
        gate.close(30)  # what a reload's window does: the unit is closed to new uses
        assert closed.is_set()
        opener = threading.Timer(0.2, gate.open)
        opener.start()
        with host.use("tally"):
            assert not gate._closed, "the new use entered only once the window was over"
        opener.join(30)


def test_reloads_of_two_units_at_once_all_succeed_and_their_uses_go_on(host: Host) -> None:
    """A reload's window job takes the host lock itself, without its caller holding it: reloads of other units at
    the same time (each holding the lock for its prepare) must neither fail nor see the other's worker as theirs."""
    loaded(host, "tally", TALLY)
    loaded(host, "other", TALLY)
    stop = threading.Event()

    def use_both() -> int:
        uses = 0
        while not stop.is_set():
            for unit_id in ("tally", "other"):
                with host.use(unit_id) as unit:
                    unit.add()
                    uses += 1
        return uses

    def reload_often(unit_id: str) -> list[Reloaded]:
        return [host.reload(unit_id) for _ in range(40)]

    user, used = in_thread(use_both)
    runs = [in_thread(lambda unit_id=unit_id: reload_often(unit_id)) for unit_id in ("tally", "other")]
    for thread, _ in runs:
        thread.join(120)
    stop.set()
    user.join(30)
    for _, outcome in runs:
        assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
        assert len(outcome[0]) == 40
    assert used and used[0] > 0
    assert count_of(host, "tally") + count_of(host, "other") == used[0]
