"""Every service operation and every refusal, against real files and real subprocesses."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOADERS, root_of, store_of
from support.processes import running

from unit_mcp import Host, UnitService
from unit_mcp.arguments import ReadSourceArgs
from unit_mcp.errors import UnitError
from unit_mcp.host import KEPT_SNAPSHOTS


@pytest.fixture(params=LOADERS)
def host(request: pytest.FixtureRequest, units_root: Path, tmp_path: Path) -> Iterator[Host]:
    """Tests not about files run over every loader; those about files take `folder_service`."""
    with Host(store_of(request, units_root, tmp_path), tmp_path / "data") as started:
        yield started


@pytest.fixture
def folder_service(units_root: Path, tmp_path: Path) -> Iterator[UnitService]:
    with Host(units_root, tmp_path / "data") as started:
        yield UnitService(started, test_timeout=30)


def refusal(code: str, fn, *args, **kwargs) -> UnitError:  # type: ignore[no-untyped-def]
    with pytest.raises(UnitError) as caught:
        fn(*args, **kwargs)
    assert caught.value.code == code, caught.value
    assert caught.value.hint, "every refusal says what to do"
    return caught.value


def no_host_paths(service: UnitService, value: object) -> None:
    text = json.dumps(value, default=str)
    for root in (root_of(service.host), service.host.data_dir):
        assert str(root) not in text


# -- list / resolve / inspect -------------------------------------------------------------------


def test_list_is_sorted_with_handles_and_capabilities(service: UnitService) -> None:
    units = {u.unit_id: u for u in service.list().units}
    assert list(units) == sorted(units)
    listed = {"primary": True, "size": None, "hash": None}  # size and hash cost a read: unit_inspect has them
    assert units["counter"].source_handle.model_dump() == {"kind": "directory", "source_id": "__init__.py", **listed}
    assert units["greeter"].source_handle.model_dump() == {"kind": "file", "source_id": "greeter.py", **listed}
    assert units["counter"].edit_capabilities == ["read", "patch", "create"]
    assert units["greeter"].edit_capabilities == ["read", "patch"]
    assert units["weather"].test_capabilities == ["broken", "init"]
    history = service.loader.name in ("sqlite", "postgres")  # the folder here is not in a git work tree
    assert (
        units["counter"].loader in ("filesystem", "sqlite", "postgres")
        and units["counter"].commit_capability is history
    )
    assert units["counter"].loader_capabilities == ["read", "write", "create", *(["history"] if history else [])]
    assert not units["broken"].loaded and "SyntaxError" in (units["broken"].load_error or "")
    no_host_paths(service, service.list().model_dump())


@pytest.mark.parametrize(
    ("description", "best"),
    [
        ("click counter", "counter"),
        ("weather forecast for a city", "weather"),
        ("greet people by name", "greeter"),
        ("notes in several languages", "notes"),
        ("the forecast_for function", "weather"),
        ("counter", "counter"),
    ],
)
def test_resolve_ranks_the_right_unit_first(service: UnitService, description: str, best: str) -> None:
    result = service.resolve(description)
    assert result.candidates[0].unit_id == best
    assert 0 < result.candidates[0].confidence <= 1
    assert result.candidates[0].evidence
    confidences = [c.confidence for c in result.candidates]
    assert confidences == sorted(confidences, reverse=True)


def test_resolve_is_deterministic_and_limited(service: UnitService) -> None:
    first = service.resolve("unit with tests", limit=2)
    assert first == service.resolve("unit with tests", limit=2)
    assert len(service.resolve("e", limit=1).candidates) <= 1
    fallback = service.resolve("zzzz qqqq").candidates
    assert fallback and all(e.field == "ranker" for c in fallback for e in c.evidence), "no word or name matches"
    refusal("invalid_argument", service.resolve, "   ")
    refusal("invalid_argument", service.resolve, "counter", limit=0)


def test_inspect_reports_lifecycle_activities_and_artifacts(service: UnitService) -> None:
    result = service.inspect("counter")
    assert result.lifecycle.model_dump() == {
        "init": "init",
        "drop": "drop",
        "snapshot": "snapshot",
        "restore": "restore",
    }
    assert result.activities == ["counter"]
    assert result.module == "units.counter"
    artifacts = {a.source_id: a for a in result.source_artifacts}
    assert set(artifacts) == {"__init__.py", "panel.py", "test_init.py"}
    assert artifacts["__init__.py"].primary and not artifacts["panel.py"].primary
    assert artifacts["__init__.py"].hash == service.read_source("counter", "__init__.py").hash
    handle = result.source_handle
    assert (handle.source_id, handle.primary, handle.hash) == ("__init__.py", True, artifacts["__init__.py"].hash)
    assert handle.size == artifacts["__init__.py"].size > 0
    weather = {a.source_id: a.kind for a in service.inspect("weather").source_artifacts}
    assert weather["data/cities.json"] == "text"
    greeter = service.inspect("greeter")
    assert greeter.lifecycle.init is None and [a.source_id for a in greeter.source_artifacts] == ["greeter.py"]


def test_inspect_lists_binary_files_and_skips_caches_and_hidden_files(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    (root_of(host) / "counter" / "logo.png").write_bytes(b"\x89PNG\x00\x01")
    (root_of(host) / "counter" / ".secret").write_text("x")
    (root_of(host) / "counter" / "__pycache__").mkdir(exist_ok=True)
    (root_of(host) / "counter" / "__pycache__" / "x.pyc").write_bytes(b"\x00")
    kinds = {a.source_id: a.kind for a in service.inspect("counter").source_artifacts}
    assert kinds["logo.png"] == "binary"
    assert ".secret" not in kinds and not any("pycache" in k for k in kinds)
    refusal("binary_source", service.read_source, "counter", "logo.png")
    refusal("binary_source", service.apply_patch, "counter", "logo.png", old="PNG", new="JPG")


def test_inspect_of_a_unit_that_did_not_load(service: UnitService) -> None:
    result = service.inspect("broken")
    assert not result.loaded and result.load_error and "line 3" in result.load_error


def test_unknown_and_invalid_units(service: UnitService) -> None:
    refusal("unknown_unit", service.inspect, "nope")
    refusal("invalid_unit_id", service.inspect, "../counter")
    refusal("invalid_unit_id", service.read_source, "", "__init__.py")


# -- read -----------------------------------------------------------------------------------------


def test_read_source_returns_content_hash_and_line_endings(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    result = service.read_source("notes", "__init__.py")
    raw = (root_of(host) / "notes" / "__init__.py").read_bytes()
    assert result.content == raw.decode("utf-8")
    assert result.hash.startswith("sha256:") and result.size == len(raw)
    assert result.line_ending == "crlf" and "café" in result.content
    assert service.read_source("weather", "data/cities.json").content.startswith("{")


def test_read_source_refusals_name_unit_and_source_only(folder_service: UnitService, tmp_path: Path) -> None:
    service = folder_service
    host = folder_service.host
    refusal("unknown_source", service.read_source, "counter", "missing.py")
    refusal("unknown_source", service.read_source, "weather", "data")
    refusal("unknown_source", service.read_source, "greeter", "other.py")
    refusal("invalid_source_id", service.read_source, "counter", "../greeter.py")
    refusal("invalid_source_id", service.read_source, "counter", "/etc/passwd")
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    (root_of(host) / "counter" / "leak.py").symlink_to(secret)
    error = refusal("invalid_source_id", service.read_source, "counter", "leak.py")
    no_host_paths(service, error.to_dict())
    assert "top secret" not in str(error.to_dict())


# -- patch ----------------------------------------------------------------------------------------


def test_exact_patch_writes_reloads_and_keeps_state(service: UnitService, host: Host) -> None:
    host.activate("counter")
    host.module("counter").increment()
    before = service.read_source("counter", "__init__.py")
    result = service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 10", expected_hash=before.hash)
    assert result.changed and result.replacements == 1 and result.mode == "exact"
    assert result.hash_before == before.hash and result.hash == service.read_source("counter", "__init__.py").hash
    assert "-step = 1\n+step = 10\n" in result.diff
    assert result.reload is not None and result.reload.reloaded
    assert result.reload.activity.active_activity_after == "counter"
    assert host.module("counter").increment() == 11


def test_diff_patch_is_applied(service: UnitService, host: Host) -> None:
    patch = (
        "--- a/greeter.py\n+++ b/greeter.py\n@@ -9,3 +9,3 @@\n"
        '     """Return a friendly greeting."""\n'
        '     log.info("greeting %s", name)\n'
        '-    return f"Hello, {name}!"\n'
        '+    return f"Good day, {name}!"\n'
    )
    result = service.apply_patch("greeter", "greeter.py", patch=patch)
    assert result.mode == "diff" and result.replacements == 1
    assert host.module("greeter").greet("Ada") == "Good day, Ada!"


def test_dry_run_returns_the_diff_and_writes_nothing(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    source = root_of(host) / "greeter.py"
    before = source.read_bytes()
    result = service.apply_patch("greeter", "greeter.py", old="Hello", new="Bonjour", dry_run=True)
    assert result.dry_run and result.changed and result.reload is None
    assert '+    return f"Bonjour, {name}!"' in result.diff
    assert source.read_bytes() == before


def test_a_dry_run_does_not_wait_for_an_edit_in_progress(service: UnitService, host: Host) -> None:
    """A dry run writes nothing, so it takes no unit lock: a slow reload of the unit cannot hold it up (it may run
    on the event loop)."""
    holding, release = threading.Event(), threading.Event()

    def edit_in_progress() -> None:
        with host.unit_lock("greeter"):
            holding.set()
            release.wait(30)

    editor = threading.Thread(target=edit_in_progress)
    editor.start()
    try:
        assert holding.wait(10)
        results: list[bool] = []
        dry = threading.Thread(
            target=lambda: results.append(
                service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi", dry_run=True).changed
            )
        )
        dry.start()
        dry.join(10)
        assert results == [True]
    finally:
        release.set()
        editor.join()


def test_a_stale_hash_is_refused_and_nothing_is_written(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    read = service.read_source("greeter", "greeter.py")
    service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi")
    current = (root_of(host) / "greeter.py").read_bytes()
    error = refusal(
        "stale_hash", service.apply_patch, "greeter", "greeter.py", old="Hi", new="Yo", expected_hash=read.hash
    )
    assert error.details["current_hash"] != read.hash
    assert (root_of(host) / "greeter.py").read_bytes() == current
    refusal("invalid_argument", service.apply_patch, "greeter", "greeter.py", old="Hi", new="Yo", expected_hash="abc")


def test_ambiguous_and_missing_old_are_refused_with_counts(service: UnitService) -> None:
    error = refusal("ambiguous_match", service.apply_patch, "counter", "__init__.py", old="count", new="total")
    assert error.details["matches"] > 1 and error.details["lines"][0] >= 1
    assert "times" in error.message
    error = refusal("no_match", service.apply_patch, "counter", "__init__.py", old="not there", new="x")
    assert error.details["matches"] == 0


def test_a_crlf_file_stays_crlf_after_a_patch(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    service.apply_patch(
        "notes",
        "__init__.py",
        old='    """Return the notes that contain word."""\n',
        new='    """Notes containing word."""\n    word = word.strip()\n',
    )
    raw = (root_of(host) / "notes" / "__init__.py").read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n")
    assert b"    word = word.strip()\r\n" in raw
    assert host.module("notes").search(" café ") == ["café au lait"]


def test_a_syntax_error_is_reported_with_position_and_nothing_is_written(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    before = (root_of(host) / "greeter.py").read_bytes()
    error = refusal(
        "syntax_error", service.apply_patch, "greeter", "greeter.py", old="def greet(name):", new="def greet(name:"
    )
    assert error.details["file"] == "greeter.py" and error.details["line"] == 8 and error.details["column"]
    assert (root_of(host) / "greeter.py").read_bytes() == before
    assert [p.name for p in root_of(host).iterdir() if p.name.endswith(".tmp")] == []  # compiled while it synced
    assert service.change_log.changes(limit=1)[0].outcome == "refused"


def test_a_written_edit_keeps_the_statement_map_and_answers_its_diff(folder_service: UnitService) -> None:
    """The map of top-level statements (what proves a dry run cheaply) follows a chain of written edits: each write
    learns its new source's map beside the file's sync, as it works out the diff it answers with."""
    service = folder_service
    edit = {"old": 'return f"Hello, {name}!"', "new": 'return f"Hi, {name}!"'}
    dry = service.apply_patch("greeter", "greeter.py", **edit, dry_run=True)
    assert service.syntax.knows(dry.hash_before) and not service.syntax.knows(dry.hash)
    written = service.apply_patch("greeter", "greeter.py", **edit)
    assert written.hash == dry.hash and service.syntax.knows(written.hash)
    assert written.diff == dry.diff and '+    return f"Hi, {name}!"' in written.diff
    assert service.host.module("greeter").greet("Ada") == "Hi, Ada!"


def test_a_dry_run_is_refused_a_syntax_error_as_the_write_is(folder_service: UnitService) -> None:
    """`commit` compiles a dry run's edit too (unless its edited statements alone prove it): the same refusal."""
    service = folder_service
    before = (root_of(service.host) / "greeter.py").read_bytes()
    patch = {"old": "def greet(name):", "new": "def greet(name:"}
    error = refusal("syntax_error", service.apply_patch, "greeter", "greeter.py", **patch, dry_run=True)
    assert error.details["file"] == "greeter.py" and error.details["line"] == 8
    fine = service.apply_patch("greeter", "greeter.py", old="def greet(name):", new="def greet(who):", dry_run=True)
    assert fine.dry_run and fine.changed and fine.change_id is None
    assert (root_of(service.host) / "greeter.py").read_bytes() == before
    assert service.changes().changes == []


def test_a_patch_whose_reload_fails_restores_the_original_bytes(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    host.module("counter").increment()
    before = (root_of(host) / "counter" / "__init__.py").read_bytes()
    error = refusal(
        "reload_failed",
        service.apply_patch,
        "counter",
        "__init__.py",
        old="def init(host):\n",
        new="def init(host):\n    1 / 0\n",
    )
    assert error.details["stage"] == "init" and "ZeroDivisionError" in error.details["error"]
    assert error.details["source_restored"] and error.details["previous_version_serving"]
    assert (root_of(host) / "counter" / "__init__.py").read_bytes() == before
    assert host.module("counter").count == 1
    no_host_paths(service, error.to_dict())


def test_python_callers_pass_arguments_or_the_validated_model(service: UnitService) -> None:
    """The tool layer passes the model it validated; a Python caller the arguments, validated against that model."""
    by_position = service.read_source("greeter", "greeter.py")
    assert service.read_source(source_id="greeter.py", unit_id="greeter") == by_position
    assert service.read_source("greeter", source_id="greeter.py") == by_position
    with pytest.raises(TypeError, match="multiple values for argument 'unit_id'"):
        service.read_source("greeter", unit_id="greeter")
    assert service.read_source(ReadSourceArgs(unit_id="greeter", source_id="greeter.py")) == by_position
    wrong = refusal("invalid_argument", service.read_source, "greeter", 7)
    assert wrong.message == "Invalid arguments for unit_read_source: source_id: Input should be a valid string."
    with pytest.raises(TypeError, match="expected_hash"):
        service.read_source("greeter", "greeter.py", expected_hash=by_position.hash)  # not an argument of this tool
    with pytest.raises(TypeError, match="unit_id"):
        service.inspect()


def test_patch_argument_refusals(service: UnitService) -> None:
    refusal("invalid_argument", service.apply_patch, "greeter", "greeter.py")
    refusal("invalid_argument", service.apply_patch, "greeter", "greeter.py", old="Hello")
    refusal("invalid_argument", service.apply_patch, "greeter", "greeter.py", patch="x", old="a", new="b")
    refusal("invalid_argument", service.apply_patch, "greeter", "greeter.py", patch="  ")
    refusal("invalid_patch", service.apply_patch, "greeter", "greeter.py", patch="hello")
    refusal(
        "patch_conflict", service.apply_patch, "greeter", "greeter.py", patch="@@ -1 +1 @@\n-nothing like this\n+x\n"
    )
    refusal("too_large", service.apply_patch, "greeter", "greeter.py", old="Hello", new="x" * (3 * 1024 * 1024))


def test_concurrent_patches_with_one_expected_hash_have_one_winner(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    read = service.read_source("greeter", "greeter.py")
    outcomes: list[str] = []

    def attempt(n: int) -> None:
        try:
            service.apply_patch("greeter", "greeter.py", old="Hello", new=f"Hello{n}", expected_hash=read.hash)
            outcomes.append(f"won{n}")
        except UnitError as exc:
            outcomes.append(exc.code)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1 and outcomes.count("stale_hash") == 11
    assert f"Hello{winners[0][3:]}, " in (root_of(host) / "greeter.py").read_text()


def test_a_read_only_loader_refuses_writes_loudly(units_root: Path, tmp_path: Path) -> None:
    with Host(units_root, tmp_path / "ro", read_only=True) as host:
        service = UnitService(host)
        assert service.read_source("greeter", "greeter.py").content
        refusal("not_supported", service.apply_patch, "greeter", "greeter.py", old="Hello", new="Hi")
        refusal("not_supported", service.create_source, "counter", "x.py", "x = 1\n")
        assert service.apply_patch("greeter", "greeter.py", old="Hello", new="Hi", dry_run=True).changed


# -- create ---------------------------------------------------------------------------------------


def test_create_source_makes_parents_and_reloads(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    result = service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
    assert result.reload.reloaded and result.size == len("BONUS = 3\n")
    assert (root_of(host) / "counter" / "extras" / "bonus.py").read_text() == "BONUS = 3\n"
    assert "extras/bonus.py" in [a.source_id for a in service.inspect("counter").source_artifacts]


def test_a_write_compiles_its_source_once_and_a_reload_only_what_changed(folder_service: UnitService) -> None:
    """The write's compile hands its code to the reload's import: a create (checked first, then written) and a
    patch (compiled while the file syncs, then imported) each compile the source once; the unit's other modules
    keep the code their last reload compiled."""
    service = folder_service
    root = str(root_of(service.host))
    compiled: list[str] = []
    watching = [True]

    def hook(event: str, args: tuple[object, ...]) -> None:
        if watching and event == "compile" and isinstance(args[1], str) and args[1].startswith(root):
            compiled.append(args[1].removeprefix(root))

    sys.addaudithook(hook)  # an audit hook stays for the process: `watching` ends it with this test
    try:
        service.create_source("counter", "extras/bonus.py", "BONUS = 3\n")
        assert compiled.count("/counter/extras/bonus.py") == 1  # the reload compiles the unit's other modules
        service.apply_patch("greeter", "greeter.py", old='"Hello, ', new='"Hi, ')
        assert compiled.count("/greeter.py") == 1 and service.host.module("greeter").greet("Ada") == "Hi, Ada!"
        compiled.clear()  # a reload keeps the code of the modules it did not change for the next one
        service.apply_patch("counter", "__init__.py", old="step = 1", new="step = 2")
        assert compiled == ["/counter/__init__.py"]
    finally:
        watching.clear()


def test_create_source_refusals(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    refusal("exists", service.create_source, "counter", "panel.py", "x = 1\n")
    refusal("not_supported", service.create_source, "greeter", "more.py", "x = 1\n")
    error = refusal("syntax_error", service.create_source, "counter", "bad.py", "def f(:\n")
    assert error.details["line"] == 1
    assert not (root_of(host) / "counter" / "bad.py").exists()
    refusal("invalid_source_id", service.create_source, "counter", "../escape.py", "x = 1\n")
    refusal("invalid_source_id", service.create_source, "counter", ".hidden.py", "x = 1\n")
    refusal("invalid_source_id", service.create_source, "counter", "panel.py/x.py", "x = 1\n")


def test_create_source_removes_the_file_when_the_reload_fails(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    (root_of(host) / "counter" / "__init__.py").write_text(
        (root_of(host) / "counter" / "__init__.py").read_text() + "\nfrom .plugins import hook\n"
    )
    error = refusal(
        "reload_failed", service.create_source, "counter", "plugins/__init__.py", "raise ImportError('no')\n"
    )
    assert error.details["source_restored"]
    assert not (root_of(host) / "counter" / "plugins").exists()


# -- tests, reload, log, snapshot -----------------------------------------------------------------


def test_run_tests_main_and_pytest_runners(service: UnitService) -> None:
    main = service.run_tests("counter")
    assert main.passed and main.exit_code == 0 and main.runner == "main" and not main.timed_out
    pytest_run = service.run_tests("weather")
    assert pytest_run.passed and pytest_run.runner == "pytest" and "2 passed" in pytest_run.stdout
    failed = service.run_tests("weather", "broken")
    assert not failed.passed and failed.exit_code == 1 and "AssertionError" in failed.stdout
    no_host_paths(service, failed.model_dump())


def test_the_test_process_starts_lean_and_logs_to_its_stderr(folder_service: UnitService, units_root: Path) -> None:
    """pydantic doubled the start-up of every test run, tempfile and logging.handlers added a tenth: the host and
    the loader import the result models lazily, the server makes the data folder, and a test writes no app log
    (it would be deleted unread) but logs to its stderr, which the caller sees."""
    service = folder_service
    (units_root / "counter" / "test_probe.py").write_text(
        "import logging\nimport sys\n\n\ndef main(host):\n"
        "    logging.getLogger('units.counter').info('info from the test')\n"
        "    heavy = sorted({'pydantic', 'tempfile', 'logging.handlers', 'subprocess'} & set(sys.modules))\n"
        "    print('counter loaded:', host.is_loaded('counter'), '- imported:', heavy)\n"
    )
    result = service.run_tests("counter", "probe")
    assert result.passed and "counter loaded: True - imported: []" in result.stdout, result
    assert "INFO units.counter: info from the test" in result.stderr, result


def test_run_tests_refusals(service: UnitService) -> None:
    refusal("unknown_source", service.run_tests, "counter", "nope")
    refusal("not_supported", service.run_tests, "greeter")
    refusal("invalid_argument", service.run_tests, "counter", "../x")
    refusal("invalid_argument", service.run_tests, "counter", timeout=0)


def test_an_infinite_loop_is_killed_at_its_timeout(folder_service: UnitService) -> None:
    service = folder_service
    error = refusal("test_timeout", service.run_tests, "looper", "init", timeout=2)
    assert error.details["timed_out"] and error.details["exit_code"] is None
    assert 2000 <= error.details["duration_ms"] < 20000


def test_ten_megabytes_of_output_are_capped(folder_service: UnitService) -> None:
    service = folder_service
    result = service.run_tests("looper", "chatty", timeout=60)
    assert result.passed and result.truncated
    assert len(result.stdout) < 70 * 1024 and "bytes of output dropped" in result.stdout


def test_a_test_that_spawns_children_leaves_none_behind(folder_service: UnitService) -> None:
    service = folder_service
    error = refusal("test_timeout", service.run_tests, "looper", "spawner", timeout=6)
    pid = int(error.details["stdout"].split("child ")[1].split()[0])
    assert not running(pid)


def test_reload_tool_reports_evidence(service: UnitService, host: Host) -> None:
    host.activate("counter")
    result = service.reload("counter")
    assert result.reloaded and result.activity.reactivation_attempted and result.activity.has_active_session_after
    refusal("reload_failed", service.reload, "broken")
    refusal("unknown_unit", service.reload, "nope")


def test_read_log_tail_grep_and_paging(service: UnitService, host: Host) -> None:
    for n in range(30):
        host.module("greeter").greet(f"guest{n}")
    tail = service.read_log(grep="greeting guest", lines=5)
    assert [line.rsplit(" ", 1)[1] for line in tail.lines] == [f"guest{n}" for n in range(25, 30)]
    assert tail.has_more
    everything = service.read_log(grep="greeting guest", lines=1000)
    assert everything.returned == 30 and not everything.has_more
    assert everything.line_numbers[-5:] == tail.line_numbers

    # line numbers are absolute: line N of the result is line N of the file
    on_disk = host.log_path.read_text().splitlines()
    assert all(on_disk[n - 1] == line for n, line in zip(everything.line_numbers, everything.lines, strict=True))
    assert tail.total_lines == len(on_disk)

    # newest first, paging back: before = the first number of the page before
    back = service.read_log(grep="greeting guest", lines=3, before=tail.line_numbers[0])
    assert [line.rsplit(" ", 1)[1] for line in back.lines] == ["guest22", "guest23", "guest24"] and back.has_more
    # forward from an absolute line number (the reference's offset), `limit` lines
    start = everything.line_numbers[10]
    page = service.read_log(grep="greeting guest", offset=start, limit=3)
    assert [line.rsplit(" ", 1)[1] for line in page.lines] == ["guest10", "guest11", "guest12"]
    assert page.line_numbers == everything.line_numbers[10:13] and page.has_more
    last = service.read_log(grep="greeting guest", offset=everything.line_numbers[-2])
    assert last.returned == 2 and not last.has_more
    assert service.read_log(offset=tail.total_lines + 1).lines == []

    assert service.read_log(grep="no such line").lines == []
    refusal("invalid_argument", service.read_log, lines=0)
    refusal("invalid_argument", service.read_log, offset=0)
    refusal("invalid_argument", service.read_log, before=-1)
    refusal("invalid_argument", service.read_log, offset=1, before=5)
    # A Python caller is held to the tool's own argument model: the message names the argument and the tool.
    wrong = refusal("invalid_argument", service.read_log, lines="many")
    assert "unit_read_log" in wrong.message and "lines" in wrong.message
    refusal("invalid_argument", service.read_log, grep=5)


def test_the_log_rotates_by_size_and_reading_pages_back_into_the_backups(units_root: Path, tmp_path: Path) -> None:
    with Host(units_root, tmp_path / "data", log_max_bytes=4096, log_backups=2) as small:
        for n in range(200):
            small.unit_logger("greeter").info("line %03d %s", n, "x" * 40)
        files = [small.log_path, small.log_path.with_name("app.log.1"), small.log_path.with_name("app.log.2")]
        assert all(path.exists() for path in files) and not small.log_path.with_name("app.log.3").exists()
        assert all(path.stat().st_size < 4096 + 200 for path in files), "a file rolls over once it reaches the limit"
        kept = UnitService(small).read_log(grep="line ", lines=1000)
        stream = b"".join(path.read_bytes() for path in reversed(files)).decode().splitlines()  # oldest file first
    numbers = [int(line.split("line ")[1][:3]) for line in kept.lines]
    assert numbers == list(range(numbers[0], 200)) and 100 < len(numbers) < 200  # newest, in order, across files
    assert not kept.has_more
    assert [stream[n - 1] for n in kept.line_numbers] == kept.lines, "numbers run through the backups"


def test_read_log_never_reveals_host_paths(folder_service: UnitService) -> None:
    service = folder_service
    host = folder_service.host
    host.unit_logger("greeter").info("file is at %s", root_of(host) / "greeter.py")
    lines = service.read_log(grep="file is at").lines
    assert lines and "<units>/greeter.py" in lines[-1]
    no_host_paths(service, lines)


def test_snapshot(service: UnitService, host: Host) -> None:
    host.module("counter").increment()
    counter, greeter = service.snapshot("counter").model_dump(), service.snapshot("greeter").model_dump()
    assert counter.pop("snapshot_id").startswith("snap-")
    assert counter == {"unit_id": "counter", "supported": True, "state": {"count": 1}, "truncated": False}
    assert greeter == {"unit_id": "greeter", "supported": False, "state": None, "truncated": False, "snapshot_id": None}
    refusal("not_loaded", service.snapshot, "broken")


VAULT = """\
import os

where = os.path.abspath(__file__)
items = [1]
poison = False


def snapshot():
    return {"where": where, where: "a key", "items": list(items), "poison": poison}


def restore(state):
    items[:] = state["items"]
    if state["poison"]:
        raise ValueError("poisoned at " + where)
"""


def test_a_snapshot_hides_host_paths_and_is_restored_later(folder_service: UnitService) -> None:
    service, host = folder_service, folder_service.host
    (root_of(host) / "vault.py").write_text(VAULT)
    service.reload("vault")
    vault = host.module("vault")
    snap = service.snapshot("vault")
    assert snap.state == {"where": "<units>/vault.py", "<units>/vault.py": "a key", "items": [1], "poison": False}
    no_host_paths(service, snap.model_dump())
    vault.items.append(2)
    assert snap.snapshot_id is not None
    restored = service.restore_snapshot("vault", snap.snapshot_id)
    assert restored.model_dump() == {"unit_id": "vault", "snapshot_id": snap.snapshot_id, "restored": True}
    assert vault.items == [1] and vault.where == str(root_of(host) / "vault.py"), "restore() got the real path"
    refusal("unknown_snapshot", service.restore_snapshot, "counter", snap.snapshot_id)  # another unit's
    refusal("unknown_snapshot", service.restore_snapshot, "vault", "snap-000000000000")
    refusal("invalid_argument", service.restore_snapshot, "vault", "../../etc")
    refusal("unknown_unit", service.restore_snapshot, "nope", snap.snapshot_id)


def test_a_failing_restore_puts_the_state_before_back(folder_service: UnitService) -> None:
    service, host = folder_service, folder_service.host
    (root_of(host) / "vault.py").write_text(VAULT)
    service.reload("vault")
    vault = host.module("vault")
    vault.poison = True
    poisoned = service.snapshot("vault").snapshot_id
    vault.poison, vault.items[:] = False, [7]
    failed = refusal("restore_failed", service.restore_snapshot, "vault", poisoned)
    assert failed.details == {"rolled_back": True} and "poisoned at <units>/vault.py" in failed.message
    assert vault.items == [7] and not vault.poison, "the state before the failed restore is back"
    greeter = service.snapshot("greeter")
    assert greeter.snapshot_id is None, "nothing to restore without snapshot()"
    counter = service.snapshot("counter").snapshot_id
    assert counter is not None
    (root_of(host) / "counter" / "__init__.py").write_text("count = 0\n")
    service.reload("counter")
    refusal("not_supported", service.restore_snapshot, "counter", counter)


def test_kept_snapshots_are_bounded(service: UnitService) -> None:
    first = service.snapshot("counter").snapshot_id
    kept = [service.snapshot("counter").snapshot_id for _ in range(KEPT_SNAPSHOTS)]
    refusal("unknown_snapshot", service.restore_snapshot, "counter", first)
    assert all(service.restore_snapshot("counter", snapshot_id).restored for snapshot_id in kept)


def test_a_hundred_megabytes_of_output_are_capped(folder_service: UnitService) -> None:
    service = folder_service
    result = service.run_tests("looper", "flood", timeout=120)
    assert result.passed and result.truncated
    assert len(result.stdout) < 70 * 1024 and len(result.stderr) < 70 * 1024


def test_a_child_that_ignores_sigterm_is_killed_at_the_timeout(folder_service: UnitService) -> None:
    service = folder_service
    error = refusal("test_timeout", service.run_tests, "looper", "stubborn", timeout=6)
    pid = int(error.details["stdout"].split("child ")[1].split()[0])
    assert not running(pid)


@pytest.mark.parametrize("test_name", ["escape", "escape_exit"])
def test_a_grandchild_in_its_own_session_is_killed_too(folder_service: UnitService, test_name: str) -> None:
    service = folder_service
    try:
        output = service.run_tests("looper", test_name, timeout=6).stdout
    except UnitError as exc:
        assert exc.code == "test_timeout"
        output = exc.details["stdout"]
    pid = int(output.split("grandchild ")[1].split()[0])
    assert not running(pid)
