"""The loader contract: the same service and tool behaviour over every loader (a units folder, a SQLite database, a
PostgreSQL database), history and revert where a loader keeps history (the databases, a folder in a git work tree),
and the copy between stores.

Tests about files as such (symlinks, descriptors, modes) stay in test_service.py and test_paths.py.
"""

from __future__ import annotations

import importlib.resources
import inspect
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import LOADERS, copy_units, sqlite_copy, store_of

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.loader import Loader, Source, UnsafeSource
from unit_mcp.paths import hash_bytes
from unit_mcp.units import open_loader

REPO = Path(__file__).resolve().parent.parent
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "init.defaultBranch=main"]


def make_store(kind: str, tmp_path: Path) -> str:
    """A copy of the example and fixture units as a units folder, a git work tree or a SQLite database."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    folder = copy_units(tmp_path / "units")
    if kind == "sqlite":
        return sqlite_copy(folder, tmp_path / "units.db")
    if kind == "git":
        subprocess.run([*GIT, "init", "-q", str(folder)], check=True)
        subprocess.run([*GIT, "-C", str(folder), "add", "-A"], check=True)
        subprocess.run([*GIT, "-C", str(folder), "commit", "-qm", "units"], check=True)
    return str(folder)


def store_for(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The parametrized store, git work tree included, as a `--units` value."""
    if request.param == "git":
        return make_store("git", tmp_path)
    return store_of(request, copy_units(tmp_path / "units"), tmp_path)


@pytest.fixture(params=LOADERS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_for(request, tmp_path)


@pytest.fixture
def host(store: str, tmp_path: Path) -> Iterator[Host]:
    with Host(store, tmp_path / "data") as started:
        yield started


@pytest.fixture
def service(host: Host) -> UnitService:
    return UnitService(host, test_timeout=60)


def raw(service: UnitService, unit_id: str, source_id: str) -> bytes:
    """A source's bytes straight from the loader."""
    kind = service.loader.kind(unit_id)
    assert kind is not None
    return service.loader.read(Source(unit_id, kind, source_id))


def refusal(code: str, call: object, *args: object, **kwargs: object) -> UnitError:
    with pytest.raises(UnitError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    assert caught.value.code == code, caught.value
    return caught.value


def no_host_paths(service: UnitService, text: str) -> None:
    assert service.loader.location not in text and str(service.host.data_dir) not in text, text


# -- the contract, over every loader --------------------------------------------------------------------


def test_list_and_inspect_report_units_handles_and_capabilities(service: UnitService) -> None:
    units = {u.unit_id: u for u in service.list().units}
    assert list(units) == ["broken", "counter", "greeter", "json", "looper", "notes", "weather"]
    assert units["counter"].source_handle.kind == "directory" and units["greeter"].source_handle.kind == "file"
    assert units["weather"].loaded and units["weather"].test_capabilities == ["broken", "init"]
    assert not units["broken"].loaded and "line 3" in (units["broken"].load_error or "")
    no_host_paths(service, units["broken"].load_error or "")
    history = service.loader.name in ("sqlite", "postgres")
    assert units["counter"].commit_capability is history
    assert units["counter"].loader_capabilities == ["read", "write", "create", *(["history"] if history else [])]
    inspected = service.inspect("counter")
    artifacts = {a.source_id: a for a in inspected.source_artifacts}
    assert set(artifacts) == {"__init__.py", "panel.py", "test_init.py"}
    handle = inspected.source_handle
    assert handle.primary and handle.hash == service.read_source("counter", "__init__.py").hash
    assert handle.size == len(raw(service, "counter", "__init__.py")) == artifacts["__init__.py"].size
    assert inspected.lifecycle.snapshot == "snapshot" and inspected.activities == ["counter"]
    weather = {a.source_id: a.kind for a in service.inspect("weather").source_artifacts}
    assert weather["data/cities.json"] == "text" and weather["forecast.py"] == "python"


def test_a_patch_reloads_keeps_state_and_keeps_crlf_and_non_ascii(service: UnitService, host: Host) -> None:
    host.module("counter").increment()
    read = service.read_source("counter", "__init__.py")
    result = service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 5", expected_hash=read.hash)
    assert result.reload is not None and result.reload.restored_state
    assert host.module("counter").step == 5 and host.module("counter").count == 1
    assert result.hash == service.read_source("counter", "__init__.py").hash
    service.apply_patch(
        "notes",
        "__init__.py",
        old='    """Return the notes that contain word."""\n',
        new='    """Notes: «word»."""\n    word = word.strip()\n',
    )
    data = raw(service, "notes", "__init__.py")
    assert data.count(b"\r\n") == data.count(b"\n") and "«word»".encode() in data
    assert host.module("notes").search(" café ") == ["café au lait"]


def test_refused_writes_leave_the_bytes_alone(service: UnitService, host: Host) -> None:
    before = raw(service, "greeter", "greeter.py")
    stale = "sha256:" + "0" * 64
    refusal("stale_hash", service.apply_patch, "greeter", "greeter.py", old="Hello", new="Hi", expected_hash=stale)
    refusal("syntax_error", service.apply_patch, "greeter", "greeter.py", old="def greet(name):", new="def greet(:")
    error = refusal(
        "reload_failed", service.apply_patch, "greeter", "greeter.py", old="import logging", new="import nothing_x"
    )
    assert error.details["source_restored"] and error.details["previous_version_serving"]
    no_host_paths(service, str(error.to_dict()))
    assert raw(service, "greeter", "greeter.py") == before
    refusal("unknown_source", service.read_source, "counter", "nothing.py")
    refusal("unknown_source", service.read_source, "weather", "data")
    refusal("unknown_unit", service.inspect, "nobody")


def test_create_makes_a_source_and_removes_it_when_the_reload_fails(service: UnitService, host: Host) -> None:
    created = service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
    assert created.reload.reloaded and raw(service, "counter", "extras/bonus.py") == b"BONUS = 3\n"
    assert "extras/bonus.py" in [a.source_id for a in service.inspect("counter").source_artifacts]
    refusal("exists", service.create_source, "counter", "extras/bonus.py", "X = 1\n")
    refusal("invalid_source_id", service.create_source, "counter", "extras/bonus.py/deeper.py", "X = 1\n")
    late = "try:\n    from . import late\nexcept ImportError:\n    pass\n"
    service.apply_patch("counter", "__init__.py", old="import logging\n", new=f"import logging\n{late}")
    assert host.is_loaded("counter")
    refusal("reload_failed", service.create_source, "counter", "late.py", "raise RuntimeError('no')\n")
    refusal("unknown_source", service.read_source, "counter", "late.py")


def test_imported_units_give_tracebacks_and_getsource_real_lines(service: UnitService, host: Host) -> None:
    service.apply_patch(
        "greeter",
        "greeter.py",
        old="import logging\n",
        new="import logging\n\n\ndef fail():\n    raise KeyError('ow')\n",
    )
    module = host.module("greeter")
    assert inspect.getsource(module).encode() == raw(service, "greeter", "greeter.py")
    try:
        module.fail()
    except KeyError:
        shown = host.redact(traceback.format_exc())
    line = raw(service, "greeter", "greeter.py").split(b"\n").index(b"    raise KeyError('ow')") + 1
    assert "raise KeyError('ow')" in shown and f'"<units>/greeter.py", line {line}' in shown


def test_run_tests_load_the_unit_from_the_same_store(service: UnitService) -> None:
    service.apply_patch("counter", "test_init.py", old="def main():\n", new="def main():\n    print('edited test')\n")
    result = service.run_tests("counter")
    assert result.passed and "edited test" in result.stdout, result
    assert service.run_tests("weather").passed
    broken = service.run_tests("weather", "broken")
    assert not broken.passed and "test_oslo_is_warm" in broken.stdout


def test_fifty_patches_with_one_expected_hash_have_one_winner(service: UnitService) -> None:
    read = service.read_source("greeter", "greeter.py")
    outcomes: list[str] = []

    def attempt(n: int) -> None:
        try:
            service.apply_patch("greeter", "greeter.py", old="Hello", new=f"Hello{n}", expected_hash=read.hash)
            outcomes.append("won")
        except UnitError as exc:
            outcomes.append(exc.code)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["stale_hash"] * 49 + ["won"]


def external_write(host: Host, unit_id: str, source_id: str, data: bytes) -> None:
    """Change a source the way someone else would: an editor on the file, or another database connection."""
    loader = host.loader
    if loader.name == "postgres":  # as psql would
        with psycopg.connect(loader.address, autocommit=True) as conn:
            conn.execute(
                "UPDATE unit_mcp.sources SET data = %s WHERE unit_id = %s AND source_id = %s",
                (data, unit_id, source_id),
            )
    elif loader.name == "sqlite":  # as the sqlite3 shell would: the new source stored as TEXT
        with sqlite3.connect(loader.location) as conn:
            conn.execute(
                "UPDATE sources SET data = ? WHERE unit_id = ? AND source_id = ?", (data.decode(), unit_id, source_id)
            )
    else:
        target = Path(loader.location) / source_id
        target.write_bytes(data)


def wait_for(condition: object, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "not reloaded in time"
        time.sleep(0.05)


def test_a_change_made_by_someone_else_is_reloaded_and_a_bad_one_keeps_the_old_version(
    service: UnitService, host: Host
) -> None:
    host.start_watching(debounce_ms=50)
    source = raw(service, "greeter", "greeter.py")
    external_write(host, "greeter", "greeter.py", source + b"\nEXTERNAL = 1\n")
    wait_for(lambda: getattr(host.module("greeter"), "EXTERNAL", None) == 1)
    external_write(host, "greeter", "greeter.py", source + b"\nEXTERNAL = (\n")
    wait_for(lambda: "greeter" in "".join(service.read_log(grep="previous version kept").lines))
    assert getattr(host.module("greeter"), "EXTERNAL", None) == 1
    assert raw(service, "greeter", "greeter.py").endswith(b"EXTERNAL = (\n")  # the other writer's bytes stay
    if service.loader.capabilities.history:  # recorded as versions written outside the tools
        latest = service.history("greeter", "greeter.py").versions[0]
        assert latest.tool_call is None and latest.size == len(source) + len(b"\nEXTERNAL = (\n")


def test_writes_through_the_tools_are_not_reloaded_again_by_the_watch(service: UnitService, host: Host) -> None:
    host.start_watching(debounce_ms=50)
    service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
    refusal("reload_failed", service.apply_patch, "greeter", "greeter.py", old="import logging", new="import nothing_x")
    service.create_source("counter", "extra.py", "X = 1\n")
    time.sleep(1.0)  # ten debounce periods: a watch that saw these writes as someone else's would have reloaded
    log = host.log_path.read_text()
    assert log.count("unit greeter reloaded in") == 1  # the patch (the start logs one line for all units)
    assert log.count("unit counter reloaded in") == 1  # the create
    assert "after a change in the store" not in log and "after an edit on disk" not in log


def test_a_loader_without_history_refuses_history_and_revert(tmp_path: Path) -> None:
    with Host(make_store("folder", tmp_path), tmp_path / "data") as host:
        service = UnitService(host)
        assert not host.loader.capabilities.history
        refusal("not_supported", service.history, "greeter", "greeter.py")
        refusal("not_supported", service.revert, "greeter", "greeter.py", 1)


# -- history and revert: the databases natively, a folder inside a git work tree ----------------------------


@pytest.fixture(params=["sqlite", "git-ref", "git-branch", "postgres"])
def history_service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    kind, _, mode = request.param.partition("-")
    store = make_store("git", tmp_path) if kind == "git" else store_for(request, tmp_path)
    with Host(store, tmp_path / "data", git_history=mode or "ref") as host:
        yield UnitService(host)


def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, check=True).stdout


def test_history_lists_accepted_versions_and_revert_puts_one_back(history_service: UnitService) -> None:
    service, host = history_service, history_service.host
    assert service.loader.capabilities.history
    original = raw(service, "counter", "__init__.py")
    service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
    refusal("reload_failed", service.apply_patch, "counter", "__init__.py", old="count = 0", new="count = 1 / 0")
    service.apply_patch("counter", "__init__.py", old="step = 2", new="step = 3")
    versions = service.history("counter", "__init__.py").versions
    assert [v.tool_call for v in versions] == ["unit_apply_patch", "unit_apply_patch", None]  # no rejected one
    assert versions[0].version > versions[1].version > versions[2].version
    assert versions[0].hash == service.read_source("counter", "__init__.py").hash
    assert versions[2].hash == hash_bytes(original)
    assert service.history("counter", "__init__.py", limit=1).versions == versions[:1]
    first = versions[-1].version

    dry = service.revert("counter", "__init__.py", first, dry_run=True)
    assert dry.dry_run and "-step = 3" in dry.diff and raw(service, "counter", "__init__.py") != original
    refusal("stale_hash", service.revert, "counter", "__init__.py", first, expected_hash="sha256:" + "1" * 64)
    refusal("unknown_version", service.revert, "counter", "__init__.py", 999999)
    host.module("counter").increment()
    reverted = service.revert("counter", "__init__.py", first, expected_hash=versions[0].hash)
    assert reverted.mode == "revert" and reverted.reload is not None and reverted.reload.restored_state
    assert raw(service, "counter", "__init__.py") == original and host.module("counter").step == 1
    assert host.module("counter").count == 3  # one increment of step 3, carried over the revert
    latest = service.history("counter", "__init__.py").versions
    assert latest[0].tool_call == "unit_revert" and latest[0].hash == versions[-1].hash and len(latest) == 4


def test_a_revert_that_does_not_load_is_rolled_back(history_service: UnitService) -> None:
    service = history_service
    first = service.history("counter", "__init__.py").versions[-1].version
    service.apply_patch("counter", "__init__.py", old="from .panel import Panel\n", new="Panel = object\n")
    service.apply_patch("counter", "panel.py", old="class Panel:", new="class Board:")
    before = raw(service, "counter", "__init__.py")
    count = len(service.history("counter", "__init__.py").versions)
    error = refusal("reload_failed", service.revert, "counter", "__init__.py", first)
    assert error.details["source_restored"] and "Panel" in error.details["error"]
    assert raw(service, "counter", "__init__.py") == before
    assert len(service.history("counter", "__init__.py").versions) == count


def user_changes(folder: Path) -> None:
    """A change of the user's own in the work tree, and one staged."""
    (folder / "notes" / "__init__.py").write_bytes((folder / "notes" / "__init__.py").read_bytes() + b"# mine\n")
    (folder / "greeter.py").write_bytes((folder / "greeter.py").read_bytes() + b"# staged\n")
    git(folder, "add", "greeter.py")


def test_git_history_on_its_own_ref_leaves_the_branch_index_and_work_tree_alone(tmp_path: Path) -> None:
    folder = Path(make_store("git", tmp_path))
    user_changes(folder)
    head, index = git(folder, "rev-parse", "HEAD"), git(folder, "ls-files", "-s")
    branch = git(folder, "branch", "--show-current")
    assert sorted(git(folder, "status", "--porcelain").splitlines()) == [" M notes/__init__.py", "M  greeter.py"]
    with Host(str(folder), tmp_path / "data") as host:
        service = UnitService(host)
        service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
        service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")  # a new folder: a new tree
        assert [v.tool_call for v in service.history("counter", "__init__.py").versions] == ["unit_apply_patch", None]
    assert git(folder, "rev-parse", "HEAD") == head and git(folder, "branch", "--show-current") == branch
    assert git(folder, "ls-files", "-s") == index  # the index (the staged change) as it was
    assert sorted(git(folder, "status", "--porcelain").splitlines()) == [  # only the writes themselves added
        " M counter/__init__.py",
        " M notes/__init__.py",
        "?? counter/extras/",
        "M  greeter.py",
    ]
    log = git(folder, "log", "--format=%s", "refs/unit-mcp/history", "-3").splitlines()
    assert log == ["unit_create_source: counter/extras/bonus.py", "unit_apply_patch: counter/__init__.py", "units"]
    shown = git(folder, "show", "--name-only", "--format=%b", "refs/unit-mcp/history~1")
    assert "Tool-Call: unit_apply_patch" in shown and shown.strip().endswith("counter/__init__.py")
    assert "step = 2" in git(folder, "show", "refs/unit-mcp/history:counter/__init__.py")
    assert git(folder, "show", "refs/unit-mcp/history:counter/extras/bonus.py") == "BONUS = 3\n"
    assert "# staged" not in git(folder, "show", "refs/unit-mcp/history:greeter.py")  # the index is not recorded


def test_git_history_on_the_branch_commits_only_the_written_file(tmp_path: Path) -> None:
    folder = Path(make_store("git", tmp_path))
    user_changes(folder)
    with Host(str(folder), tmp_path / "data", git_history="branch") as host:
        UnitService(host).apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
    shown = git(folder, "show", "--name-only", "--format=%s%n%b", "HEAD")
    assert shown.split("\n")[0] == "unit_apply_patch: counter/__init__.py" and "Tool-Call: unit_apply_patch" in shown
    assert shown.strip().endswith("counter/__init__.py") and "greeter.py" not in shown
    assert sorted(git(folder, "status", "--porcelain").splitlines()) == [" M notes/__init__.py", "M  greeter.py"]
    assert subprocess.run(["git", "-C", str(folder), "rev-parse", "-q", "--verify", "refs/unit-mcp/history"]).returncode


def test_git_history_off_records_nothing(tmp_path: Path) -> None:
    folder = Path(make_store("git", tmp_path))
    with Host(str(folder), tmp_path / "data", git_history="off") as host:
        assert not host.loader.capabilities.history
        UnitService(host).apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
    assert git(folder, "status", "--porcelain") == " M counter/__init__.py\n"
    assert git(folder, "for-each-ref", "refs/unit-mcp") == ""


def test_a_folder_git_ignores_gets_no_history(tmp_path: Path) -> None:
    folder = Path(make_store("git", tmp_path))
    (folder / ".gitignore").write_text("weather/\n")
    (folder / "weather" / "nested").mkdir()
    assert open_loader(folder).capabilities.history
    assert not open_loader(folder / "weather" / "nested").capabilities.history


def test_handles_made_below_the_service_stay_inside_the_unit_folder(tmp_path: Path) -> None:
    """The service checks the ids clients send; a handle made elsewhere (a unit's own resource reader) is kept
    inside the unit's folder by the folder loader itself, and what would leave it is simply not there."""
    folder = copy_units(tmp_path / "units")
    (tmp_path / "secret.txt").write_text("not a unit's\n")
    with Host(folder, tmp_path / "data") as host:
        files = importlib.resources.files(host.module("counter"))
        assert files.joinpath("__init__.py").read_bytes() == (folder / "counter" / "__init__.py").read_bytes()
        for outside in ("../greeter.py", "../../secret.txt", "./__init__.py", "a//b.py"):
            with pytest.raises(FileNotFoundError):
                files.joinpath(*outside.split("/")).read_bytes()
            with pytest.raises(UnsafeSource):
                host.loader.read(Source("counter", "directory", outside))
        with pytest.raises(UnsafeSource):
            host.loader.read(Source("../units/counter", "directory", "__init__.py"))


# -- copying between stores ------------------------------------------------------------------------------


def units_copy(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unit_mcp.units", "copy", *args], capture_output=True, text=True)


def snapshot_of(loader: Loader) -> dict[str, dict[str, bytes]]:
    return {
        unit_id: {sid: loader.read(Source(unit_id, kind, sid)) for sid in loader.source_ids(unit_id, kind)}
        for unit_id, kind in loader.discover().items()
    }


def test_copy_is_bytes_exact_both_ways_and_refuses_to_overwrite(tmp_path: Path) -> None:
    folder = copy_units(tmp_path / "units")
    (folder / "counter" / "logo.png").write_bytes(b"\x89PNG\x00\xff\r\n")
    db = f"sqlite:{tmp_path / 'store' / 'units.db'}"
    done = units_copy(str(folder), db)
    assert done.returncode == 0 and "copied 7 units" in done.stdout, done.stderr
    back = tmp_path / "back"
    back.mkdir()
    assert units_copy(db, str(back)).returncode == 0
    expected = snapshot_of(open_loader(folder, read_only=True))
    assert snapshot_of(open_loader(db, read_only=True)) == expected == snapshot_of(open_loader(back, read_only=True))
    assert b"\r\n" in expected["notes"]["__init__.py"] and "é".encode() in expected["notes"]["__init__.py"]

    refused = units_copy(str(folder), str(back))
    assert refused.returncode == 1 and "already has units" in refused.stderr and "Traceback" not in refused.stderr
    (folder / "greeter.py").write_bytes(b"CHANGED = 1\n")
    assert units_copy(str(folder), db).returncode == 1
    assert open_loader(db, read_only=True).read(Source("greeter", "file", "greeter.py")) != b"CHANGED = 1\n"
    assert units_copy(str(folder), db, "--replace").returncode == 0
    assert open_loader(db, read_only=True).read(Source("greeter", "file", "greeter.py")) == b"CHANGED = 1\n"
    missing = units_copy(f"sqlite:{tmp_path / 'none.db'}", str(back))
    assert missing.returncode == 2 and "neither a units folder nor an existing" in missing.stderr


# -- the history tools on the MCP surface ------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_history_tools_are_listed_with_their_risks_only_where_history_is_kept(
    history_service: UnitService, tmp_path: Path, anyio_backend: str
) -> None:
    import jsonschema
    from mcp import Client

    from unit_mcp.tools import RISK_META_KEY, UnitTools, tool_risks

    tools = UnitTools(history_service, prefix="space_")
    assert {spec.name for spec in tools.specs.values()} >= {"unit_history", "unit_revert"}
    async with Client(tools.server()) as client:
        listed = (await client.list_tools()).tools
        assert {t.name: (t.meta or {}).get(RISK_META_KEY) for t in listed} == tool_risks("space_", history=True)
        schemas = {t.name: t.output_schema for t in listed}
        result = await client.call_tool("space_unit_history", {"unit_id": "greeter", "source_id": "greeter.py"})
        assert not result.is_error and len(result.structured_content["versions"]) == 1
        jsonschema.validate(result.structured_content, schemas["space_unit_history"])
        version = result.structured_content["versions"][0]["version"]
        result = await client.call_tool(
            "space_unit_revert", {"unit_id": "greeter", "source_id": "greeter.py", "version": version}
        )
        assert not result.is_error and not result.structured_content["changed"]
        jsonschema.validate(result.structured_content, schemas["space_unit_revert"])
    plain_store = make_store("folder", tmp_path / "plain")
    with Host(plain_store, tmp_path / "plain-data", namespace="plain_units") as plain:
        folder_tools = UnitTools(UnitService(plain))
        async with Client(folder_tools.server()) as client:
            assert {t.name for t in (await client.list_tools()).tools} == set(tool_risks())
            refused = await client.call_tool(
                "unit_revert", {"unit_id": "greeter", "source_id": "greeter.py", "version": 1}
            )
            assert refused.is_error and refused.meta is not None
            assert refused.meta["unit_mcp/error"]["code"] == "not_supported"


def test_ids_a_sqlite_database_lists_that_the_folder_loader_would_refuse_are_skipped_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As the PostgreSQL loader does (test_postgres.py): a hostile row names no module and no path out of a unit."""
    store = make_store("sqlite", tmp_path)
    hostile = ["../escape.py", "/etc/passwd", "line\nbreak.py"]
    with sqlite3.connect(store.removeprefix("sqlite:")) as conn:
        conn.execute("INSERT INTO units VALUES ('bad-id', 'file')")
        conn.execute("INSERT INTO sources VALUES ('bad-id', 'bad-id.py', 'X = 1')")
        conn.executemany("INSERT INTO sources VALUES ('counter', ?, 'X = 1')", [(s,) for s in hostile])
    loader = open_loader(store)
    try:
        assert "bad-id" not in loader.discover() and "counter" in loader.discover()
        for _ in range(2):
            assert loader.source_ids("counter", "directory") == ["__init__.py", "panel.py", "test_init.py"]
    finally:
        loader.close()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().endswith(": skipped")]
    assert lines[0] == "unit id 'bad-id' in the units database is not a valid unit id: skipped"
    assert lines[1:] == [
        f"source id {s!a} of unit 'counter' in the units database is not a valid source id: skipped"
        for s in sorted(hostile)
    ]  # once each, however often listed; escaped on one line
