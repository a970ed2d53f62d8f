"""The headless engine: import under a namespace, lifecycle, activities, transactional reload, watcher, app log."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from conftest import root_of

from unit_mcp import Host, ReloadError, UnitService, paths
from unit_mcp.reloading import version_of


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def wait_for(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_units_load_under_the_namespace_and_do_not_shadow_the_stdlib(host: Host) -> None:
    assert host.module("json") is sys.modules["units.json"]
    assert sys.modules["json"] is json
    assert host.module("json").dumps({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    assert host.module("greeter").greet("Ada") == "Hello, Ada!"


def test_a_unit_that_fails_to_load_is_recorded_not_fatal(host: Host) -> None:
    assert not host.is_loaded("broken")
    error = host.load_error("broken")
    assert error is not None and "SyntaxError" in error and "line 3" in error
    assert str(root_of(host)) not in error


def test_state_survives_a_reload_and_the_activity_is_reactivated(host: Host) -> None:
    counter = host.module("counter")
    assert counter is not None
    session_before = host.activate("counter")
    counter.increment()
    counter.increment()
    result = host.reload("counter")
    new_counter = host.module("counter")
    assert new_counter is not counter
    assert new_counter.count == 2
    assert result.restored_state
    assert result.activity["active_activity_before"] == "counter"
    assert result.activity["active_activity_after"] == "counter"
    assert result.activity["reactivation_attempted"]
    assert result.activity["registered_after"]
    assert result.activity["has_active_session_after"]
    assert result.activity["error"] is None
    assert session_before.closed
    assert host.active_session is not session_before
    assert host.active_session.render() == "Clicks: 2"


def test_reload_purges_sub_modules(host: Host) -> None:
    panel_before = sys.modules["units.counter.panel"]
    host.reload("counter")
    assert sys.modules["units.counter.panel"] is not panel_before


def test_a_same_size_edit_within_the_same_second_is_picked_up(host: Host) -> None:
    source = root_of(host) / "greeter.py"
    edit(source, "Hello", "Howdy")
    host.reload("greeter")
    assert host.module("greeter").greet("Ada") == "Howdy, Ada!"
    edit(source, "Howdy", "Hiyah")
    host.reload("greeter")
    assert host.module("greeter").greet("Ada") == "Hiyah, Ada!"


@pytest.mark.parametrize(
    ("old", "new", "stage"),
    [
        ("step = 1", "step = (", "import"),
        ("step = 1", "step = 1\nimport units.counter.missing_module", "import"),
        (
            '    host.register_activity("counter"',
            '    raise RuntimeError("init exploded")\n    host.register_activity("counter"',
            "init",
        ),
        ("    count = int(state", "    raise ValueError('bad state')\n    count = int(state", "restore"),
    ],
)
def test_a_failed_reload_leaves_the_old_version_serving_with_its_state(
    host: Host, old: str, new: str, stage: str
) -> None:
    counter = host.module("counter")
    host.activate("counter")
    counter.increment()
    edit(root_of(host) / "counter" / "__init__.py", old, new)
    with pytest.raises(ReloadError) as caught:
        host.reload("counter")
    assert caught.value.stage == stage
    evidence = caught.value.evidence
    assert evidence["rolled_back"] and evidence["previous_version_serving"]
    assert not evidence["source_restored"]
    assert str(root_of(host)) not in json.dumps(evidence)
    assert host.module("counter") is counter
    assert counter.count == 1
    assert counter.increment() == 2
    assert host.active_activity == "counter"
    assert host.active_session.render() == "Clicks: 2"
    assert "counter" in host.activities("counter")


def test_a_unit_that_exits_at_import_does_not_stop_the_host(host: Host) -> None:
    edit(root_of(host) / "greeter.py", "import logging", "import sys\nsys.exit(3)")
    with pytest.raises(ReloadError):
        host.reload("greeter")
    assert host.module("greeter").greet("x") == "Hello, x!"


def test_rollback_source_is_called_when_a_reload_after_a_write_fails(host: Host) -> None:
    source = root_of(host) / "greeter.py"
    original = source.read_text()
    source.write_text(original + "\nraise RuntimeError('nope')\n")
    with pytest.raises(ReloadError) as caught:
        host.reload("greeter", rollback_source=lambda: source.write_text(original))
    assert caught.value.evidence["source_restored"]
    assert source.read_text() == original


def test_a_namespace_is_held_by_one_open_host(host: Host, tmp_path: Path) -> None:
    other = Host(root_of(host), tmp_path / "other")
    with pytest.raises(RuntimeError, match="already used"):
        other.start()
    with Host(root_of(host), tmp_path / "third", namespace="units_third") as third:
        assert third.module("greeter") is sys.modules["units_third.greeter"]


def test_close_drops_units_and_releases_the_namespace(units_root: Path, tmp_path: Path) -> None:
    host = Host(units_root, tmp_path / "data").start()
    host.activate("counter")
    session = host.active_session
    host.close()
    assert session.closed
    assert "units" not in sys.modules and "units.counter" not in sys.modules
    assert "counter ready" in (tmp_path / "data" / "logs" / "app.log").read_text()
    with Host(units_root, tmp_path / "again"):
        pass


def test_units_log_into_the_app_log(host: Host) -> None:
    host.module("greeter").greet("Grace")
    assert "units.greeter: greeting Grace" in host.log_path.read_text()


def test_activities_register_only_once_across_units(host: Host) -> None:
    (root_of(host) / "thief.py").write_text("def init(host):\n    host.register_activity('counter', object)\n")
    with pytest.raises(ReloadError, match="already registered"):
        host.reload("thief")
    assert host.activities("counter") == ["counter"]
    assert host.activities("thief") == []


def test_the_watcher_reloads_an_edit_on_disk_and_keeps_the_old_version_on_a_bad_one(host: Host) -> None:
    host.start_watching(debounce_ms=50)
    source = root_of(host) / "greeter.py"
    edit(source, "Hello", "Howdy")
    assert wait_for(lambda: host.module("greeter").greet("A") == "Howdy, A!")
    serving = host.module("greeter")
    edit(source, "def greet(name):", "def greet(name:")
    assert wait_for(lambda: "change of unit greeter not loaded" in host.log_path.read_text())
    assert host.module("greeter") is serving
    assert "def greet(name:" in source.read_text(), "the human's file is never reverted"


def test_the_watcher_loads_a_new_unit_and_unloads_a_deleted_one(host: Host) -> None:
    host.start_watching(debounce_ms=50)
    (root_of(host) / "fresh.py").write_text("VALUE = 7\n")
    assert wait_for(lambda: host.is_loaded("fresh"))
    (root_of(host) / "fresh.py").unlink()
    assert wait_for(lambda: not host.is_loaded("fresh"))


def test_writes_through_the_service_are_not_reloaded_twice_by_the_watcher(host: Host) -> None:
    host.start_watching(debounce_ms=50)
    service = UnitService(host)
    service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
    time.sleep(1.0)
    log = host.log_path.read_text()
    assert log.count("unit greeter reloaded in") == 1  # the patch (the start logs one line for all units)
    assert log.count("started: ") == 1
    assert "greeter reloaded after a change in the store" not in log


def test_a_unit_that_hangs_at_import_is_bounded_and_the_old_version_keeps_serving(host: Host) -> None:
    """The hung import cannot be killed (it holds the import lock of its module name until it returns),
    so it sleeps for a bounded time here; the host gives up waiting after reload_timeout."""
    host.reload_timeout = 1.0
    serving = host.module("greeter")
    edit(root_of(host) / "greeter.py", "import logging", "import logging\nimport time\ntime.sleep(4)")
    started = time.monotonic()
    with pytest.raises(ReloadError) as caught:
        host.reload("greeter")
    assert time.monotonic() - started < 3
    assert caught.value.stage == "import" and "did not finish within 1 s" in caught.value.error
    assert host.module("greeter") is serving and serving.greet("x") == "Hello, x!"
    assert host.module("counter").increment() == 1, "the host keeps serving other units"
    assert wait_for(lambda: "import of unit greeter returned late" in host.log_path.read_text(), timeout=15)
    assert sys.modules["units.greeter"] is serving, "a late import does not replace the served module"
    assert host.reload("counter").unit_id == "counter", "a fresh worker serves the next reload"


def test_unit_code_may_call_the_host_during_init(host: Host) -> None:
    init = "def init(host):\n    host.register_activity('starter', dict)\n    host.activate('starter')\n"
    (root_of(host) / "starter.py").write_text(init)
    result = host.reload("starter")
    assert result.unit_id == "starter" and host.active_activity == "starter"


def test_a_unit_that_removes_itself_from_sys_modules_fails_cleanly(host: Host) -> None:
    serving = host.module("greeter")
    edit(root_of(host) / "greeter.py", "import logging", "import logging\nimport sys\ndel sys.modules[__name__]")
    with pytest.raises(ReloadError) as caught:
        host.reload("greeter")
    assert caught.value.stage == "import"
    assert host.module("greeter") is serving and sys.modules["units.greeter"] is serving


def test_the_start_loads_every_unit_in_one_batch_and_reports_the_broken_ones(tmp_path: Path) -> None:
    """Start-up loads all units in one job of the reload worker: each still runs its init, a broken one is recorded
    with its error, a hanging one is given up on after the reload timeout and the units after it still load."""
    root = tmp_path / "units"
    root.mkdir()
    (root / "a_ok.py").write_text("STARTED = []\n\ndef init(host):\n    STARTED.append(True)\n")
    (root / "b_broken.py").write_text("raise RuntimeError('no start for me')\n")
    (root / "c_hangs.py").write_text("import time\n\ndef init(host):\n    time.sleep(30)\n")
    (root / "d_after.py").write_text("def init(host):\n    host.register_activity('after', lambda: object())\n")
    with Host(root, tmp_path / "data", reload_timeout=1.0) as host:
        assert host.module("a_ok").STARTED == [True]
        assert not host.is_loaded("b_broken") and "no start for me" in (host.load_error("b_broken") or "")
        assert not host.is_loaded("c_hangs") and "did not finish within 1 s" in (host.load_error("c_hangs") or "")
        assert host.is_loaded("d_after") and host.activities() == ["after"]
        log = host.log_path.read_text()
        assert "reloading" not in log  # a first load that fails is a failed load, not a reload
        (root / "a_ok.py").write_text("raise RuntimeError('broken on reload')\n")
        with pytest.raises(ReloadError):
            host.reload("a_ok")
        reloaded = host.log_path.read_text()[len(log) :]
    assert "started: 2 units loaded in" in log and "2 failed: b_broken, c_hangs" in log
    assert "loading unit b_broken failed at import" in log and "loading unit c_hangs failed" in log
    assert "reloading unit a_ok failed at import" in reloaded


def test_a_full_start_reuses_the_code_compiled_at_the_last_one_and_never_for_changed_source(tmp_path: Path) -> None:
    """The bytecode cache in the data dir is keyed by the source's content hash: a restart runs the cached code of
    an unchanged unit, and a same-size edit with the old modification time is compiled afresh."""
    import importlib.util
    import marshal
    import os

    root = tmp_path / "units"
    root.mkdir()
    unit = root / "cached.py"
    unit.write_text("VALUE = 1\n")
    cache = tmp_path / "data" / "bytecode" / "units"
    with Host(root, tmp_path / "data") as host:
        assert host.module("cached").VALUE == 1
    blob = cache.read_bytes()
    assert blob.startswith(importlib.util.MAGIC_NUMBER)
    entries = marshal.loads(blob[len(importlib.util.MAGIC_NUMBER) :])
    [key] = entries
    assert key[0] == str(unit.resolve()) and key[1].startswith("sha256:")
    # What runs at the next start is the cached code (here deliberately other code for the same key); each entry
    # is the marshalled code, unmarshalled only when its module runs.
    assert isinstance(entries[key], bytes)
    entries[key] = marshal.dumps(compile("VALUE = 'from the cache'\n", key[0], "exec"))
    cache.write_bytes(importlib.util.MAGIC_NUMBER + marshal.dumps(entries))
    with Host(root, tmp_path / "data") as host:
        assert host.module("cached").VALUE == "from the cache"
    stat = unit.stat()
    unit.write_text("VALUE = 2\n")
    os.utime(unit, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with Host(root, tmp_path / "data") as host:
        assert host.module("cached").VALUE == 2
    entries = marshal.loads(cache.read_bytes()[len(importlib.util.MAGIC_NUMBER) :])
    assert len(entries) == 1 and next(iter(entries))[1] != key[1]  # only this start's entries are kept


def test_a_bytecode_cache_of_the_older_form_is_compiled_again_and_rewritten(tmp_path: Path) -> None:
    """Entries used to be code objects; now each is its marshalled bytes (unmarshalled only when its module runs):
    an older file's entry is never run, the source is compiled and the file rewritten in the new form."""
    import importlib.util
    import marshal

    root = tmp_path / "units"
    root.mkdir()
    (root / "plain.py").write_text("VALUE = 3\n")
    cache = tmp_path / "data" / "bytecode" / "units"
    with Host(root, tmp_path / "data") as host:
        assert host.module("plain").VALUE == 3
    magic = importlib.util.MAGIC_NUMBER
    entries = marshal.loads(cache.read_bytes()[len(magic) :])
    older = {key: compile("VALUE = 'old form'\n", key[0], "exec") for key in entries}
    cache.write_bytes(magic + marshal.dumps(older))
    with Host(root, tmp_path / "data") as host:
        assert host.module("plain").VALUE == 3
    rewritten = marshal.loads(cache.read_bytes()[len(magic) :])
    assert rewritten.keys() == entries.keys() and all(isinstance(v, bytes) for v in rewritten.values())


@pytest.mark.parametrize("content", [b"", b"not a cache at all", b"\x00" * 64])
def test_a_damaged_or_foreign_bytecode_cache_is_ignored_and_replaced(tmp_path: Path, content: bytes) -> None:
    import importlib.util

    root = tmp_path / "units"
    root.mkdir()
    (root / "plain.py").write_text("VALUE = 3\n")
    cache = tmp_path / "data" / "bytecode" / "units"
    cache.parent.mkdir(parents=True)
    cache.write_bytes(content)
    with Host(root, tmp_path / "data") as host:
        assert host.module("plain").VALUE == 3
    cache.write_bytes(importlib.util.MAGIC_NUMBER + b"\xff\x00 truncated marshal data")
    with Host(root, tmp_path / "data") as host:
        assert host.module("plain").VALUE == 3
    assert cache.read_bytes().startswith(importlib.util.MAGIC_NUMBER) and len(cache.read_bytes()) > 40


def test_a_partial_start_neither_reads_nor_writes_the_bytecode_cache(tmp_path: Path) -> None:
    """The test host starts one unit: reading the whole cache would cost it more than compiling that unit, and
    saving would drop every other unit's entry."""
    root = tmp_path / "units"
    root.mkdir()
    (root / "one.py").write_text("VALUE = 1\n")
    with Host(root, tmp_path / "data").start(["one"]) as host:
        assert host.module("one").VALUE == 1
    assert not (tmp_path / "data" / "bytecode").exists()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_start_pauses_the_cyclic_gc_and_leaves_it_as_it_found_it(tmp_path: Path, enabled: bool) -> None:
    import gc

    root = tmp_path / "units"
    root.mkdir()
    (root / "probe.py").write_text("import gc\nGC_DURING_START = gc.isenabled()\n")
    (root / "raises.py").write_text("raise RuntimeError('broken at start')\n")
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with Host(root, tmp_path / "data") as host:
            assert host.module("probe").GC_DURING_START is False
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_the_start_imports_each_unit_as_an_import_would(tmp_path: Path) -> None:
    """The start builds each unit's module itself (not through `importlib.import_module`), with what an import
    gives: the module bound to its package and set in sys.modules before it runs (a unit it imports may import it
    back), what a module leaves in sys.modules served, and its import lock held (another thread importing it
    meanwhile waits for the whole module). The attributes match a reload's, and `__cached__` is not set: no
    `.pyc` file exists for a unit."""
    import importlib
    import inspect

    root = tmp_path / "units"
    root.mkdir()
    (root / "a_first.py").write_text("from units_imp import b_second\n\nB_AT_IMPORT = b_second\n")
    (root / "b_second.py").write_text("from units_imp import a_first\n\nFIRST = a_first\n")
    (root / "c_replaces.py").write_text(
        "import sys\nimport types\n\n\nclass Replacement(types.ModuleType):\n    VALUE = 3\n\n\n"
        "sys.modules[__name__] = Replacement(__name__)\n"
    )
    (root / "d_slow.py").write_text(
        "import importlib\nimport threading\nimport time\n\nSEEN = []\n\n\n"
        "def other():\n    SEEN.append(importlib.import_module(__name__).DONE)\n\n\n"
        "OTHER = threading.Thread(target=other)\nOTHER.start()\ntime.sleep(0.3)\nDONE = True\n"
    )
    with Host(root, tmp_path / "data", namespace="units_imp") as host:
        package = sys.modules["units_imp"]
        first, second = host.module("a_first"), host.module("b_second")
        assert first is not None and second is not None
        assert second.FIRST is first and package.a_first is first and package.b_second is second
        replaced = host.module("c_replaces")
        assert replaced is not None and replaced.VALUE == 3 and package.c_replaces is replaced
        assert sys.modules["units_imp.c_replaces"] is replaced
        slow = host.module("d_slow")
        assert slow is not None
        slow.OTHER.join(10)
        assert slow.SEEN == [True]
        started = {
            name: getattr(first, name)
            for name in ("__name__", "__file__", "__package__", "__path__")
            if hasattr(first, name)
        }
        assert started == {
            "__name__": "units_imp.a_first",
            "__file__": str(root.resolve() / "a_first.py"),
            "__package__": "units_imp",
        }
        assert first.__loader__ is first.__spec__.loader and first.__spec__.origin == first.__file__
        assert not hasattr(first, "__cached__") and first.__spec__.cached is None
        assert inspect.getsource(first).startswith("from units_imp import b_second")
        host.reload("a_first")
        reloaded = host.module("a_first")
        assert reloaded is not first and reloaded is not None and not hasattr(reloaded, "__cached__")
        assert {name: getattr(reloaded, name) for name in started} == started
        assert importlib.import_module("units_imp.a_first") is reloaded


def test_the_start_reads_from_one_held_root_and_still_refuses_a_linked_module(tmp_path: Path) -> None:
    """The start's reads walk from one descriptor of the units root (`FilesystemLoader.reading_all`), which is
    closed when the start ends: a unit's module that is a symbolic link is still refused, and so is one reached
    through a linked folder."""
    import os

    root = tmp_path / "units"
    (root / "pkg").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "leak.py").write_text("SECRET = 1\n")
    (root / "pkg" / "__init__.py").write_text("from . import leak\n")
    (root / "pkg" / "leak.py").symlink_to(tmp_path / "outside" / "leak.py")
    (root / "deep").mkdir()
    (root / "deep" / "__init__.py").write_text("from .via import leak\n")
    (root / "deep" / "via").symlink_to(tmp_path / "outside")
    (root / "plain.py").write_text("VALUE = 1\n")
    open_before = len(os.listdir("/proc/self/fd"))
    with Host(root, tmp_path / "data", app_log=False) as host:
        assert host.module("plain").VALUE == 1
        assert "linked, irregular or outside source refused" in (host.load_error("pkg") or "")
        assert "linked, irregular or outside source refused" in (host.load_error("deep") or "")
    assert len(os.listdir("/proc/self/fd")) == open_before  # the held root was closed (and the host's files)


def test_lifecycle_functions_and_version_are_found_as_getattr_finds_them(tmp_path: Path) -> None:
    """The start reads a plain module's exports from its dict (no AttributeError per missing name), and asks
    `getattr` where that would find more: a module `__getattr__` (PEP 562) or a module of another class."""
    root = tmp_path / "units"
    root.mkdir()
    (root / "plain.py").write_text("CALLS = []\nVERSION = 7\n\ndef init(host):\n    CALLS.append('init')\n")
    (root / "lazy.py").write_text(
        "CALLS = []\n\n\ndef __getattr__(name):\n    if name == 'init':\n"
        "        return lambda host: CALLS.append(name)\n"
        "    if name == 'VERSION':\n        return 'lazy-1'\n    raise AttributeError(name)\n"
    )
    (root / "classy.py").write_text(
        "import sys\nimport types\n\nCALLS = []\n\n\nclass Classy(types.ModuleType):\n    VERSION = 'classy-1'\n\n"
        "    def init(self, host):\n        CALLS.append('init')\n\n\nsys.modules[__name__].__class__ = Classy\n"
    )
    (root / "bare.py").write_text("VALUE = 1\n")
    with Host(root, tmp_path / "data") as host:
        modules = {unit_id: host.module(unit_id) for unit_id in ("plain", "lazy", "classy", "bare")}
        versions = {u: version_of(m, {f"units.{u}": m}) for u, m in modules.items()}  # type: ignore[arg-type]
        assert [host.module(u).CALLS for u in ("plain", "lazy", "classy")] == [["init"]] * 3  # type: ignore[union-attr]
        assert versions["plain"] == 7 and versions["lazy"] == "lazy-1" and versions["classy"] == "classy-1"
        assert versions["bare"] == paths.hash_bytes((root / "bare.py").read_bytes())
