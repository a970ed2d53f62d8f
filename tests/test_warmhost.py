"""The warm test host: each test run is forked from a process started ahead, and still sees the unit as stored now.

Runs through the real service on both loaders, with real processes (the warm host, its forked children)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import LOADERS, store_of

from unit_mcp import Host, UnitService
from unit_mcp.loader import Source
from unit_mcp.paths import hash_bytes
from unit_mcp.proctree import stopped
from unit_mcp.testrun import STARTUP_TIMEOUT, WARM, WarmTestHost, run_test_process, sandbox_env

CRASHES = {
    "exit": "import os\n\n\ndef main():\n    print('leaving', flush=True)\n    os._exit(3)\n",
    "sigkill": "import os\nimport signal\n\n\ndef main():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "segfault": "import ctypes\n\n\ndef main():\n    ctypes.string_at(0)\n",
}


@pytest.fixture(params=LOADERS)
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[UnitService]:
    folder = tmp_path / "units" / "probe"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("VALUE = 0\n")
    (folder / "test_init.py").write_text("from units import probe\n\n\ndef main():\n    print('value', probe.VALUE)\n")
    for name, source in CRASHES.items():
        (folder / f"test_{name}.py").write_text(source)
    with Host(store_of(request, tmp_path / "units", tmp_path), tmp_path / "data") as host:
        yield UnitService(host, test_timeout=30)


def test_every_run_sees_the_edit_made_just_before(service: UnitService) -> None:
    """Written to the store directly, without a reload of the server's copy: the test imports from the store."""
    loader, probe = service.loader, Source("probe", "directory", "__init__.py")
    for n in range(1, 51):
        current = loader.read(probe)
        loader.write(probe, f"VALUE = {n}\n".encode(), expected_hash=hash_bytes(current), tool_call="test")
        result = service.run_tests("probe")
        assert result.passed and f"value {n}\n" in result.stdout, (n, result)
    assert WARM.pid is not None, "the runs went through the warm host"


def test_a_test_crashing_its_child_does_not_break_the_next_run(service: UnitService) -> None:
    service.run_tests("probe")
    warm = WARM.pid
    for name, exit_code in (("exit", 3), ("sigkill", -signal.SIGKILL), ("segfault", -signal.SIGSEGV)):
        crashed = service.run_tests("probe", name)
        assert not crashed.passed and crashed.exit_code == exit_code, (name, crashed)
        after = service.run_tests("probe")
        assert after.passed and "value 0" in after.stdout, (name, after)
    assert WARM.pid == warm, "the warm host itself survived its children's crashes"
    assert "leaving" in service.run_tests("probe", "exit").stdout


def test_a_killed_warm_host_is_started_again(service: UnitService) -> None:
    service.run_tests("probe")
    first = WARM.pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while WARM.pid == first and time.monotonic() < deadline:
        time.sleep(0.01)
    result = service.run_tests("probe")
    assert result.passed and "value 0" in result.stdout
    assert WARM.pid not in (None, first)


def test_the_warm_host_never_opens_the_units_store(service: UnitService) -> None:
    """Unit code and the loader live only in the forked children: the warm process has no descriptor on the
    store, so nothing of a unit can be cached there."""
    assert service.run_tests("probe").passed
    assert WARM.pid is not None
    store = service.loader.location
    opened = [os.readlink(fd) for fd in Path(f"/proc/{WARM.pid}/fd").iterdir()]
    assert opened and not [target for target in opened if target.startswith(store)], opened


def test_concurrent_runs_each_get_their_own_child(service: UnitService) -> None:
    results: list[object] = []

    def run() -> None:
        results.append(service.run_tests("probe"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and all(r.passed and "value 0" in r.stdout for r in results)  # type: ignore[attr-defined]


def test_the_cold_path_still_runs_a_test(service: UnitService) -> None:
    """What runs when the warm host cannot be started: a new interpreter per test."""
    run = run_test_process(service.loader.address, service.host.namespace, "probe", "init", timeout=30, warm=False)
    assert run.exit_code == 0 and "value 0" in run.stdout


def test_the_cold_path_reports_a_crash_as_the_warm_one_does(service: UnitService) -> None:
    """A cold run's first process outlives the test host (to kill what it left behind) and ends as it did."""
    for name, exit_code in (("exit", 3), ("sigkill", -signal.SIGKILL), ("segfault", -signal.SIGSEGV)):
        run = run_test_process(service.loader.address, service.host.namespace, "probe", name, timeout=30, warm=False)
        assert run.exit_code == exit_code, (name, run)


def test_a_warm_host_that_cannot_start_gives_way_to_cold_runs(tmp_path: Path) -> None:
    """An interpreter that cannot start (here: a PYTHONHOME that does not exist) fails both attempts; spawn says so
    (the caller then runs the test cold) and does not try again on every call."""
    warm = WarmTestHost()
    env = {**sandbox_env(), "PYTHONHOME": str(tmp_path / "no-such-python")}
    try:
        started = time.monotonic()
        assert warm.spawn(["--units", str(tmp_path)], env, tmp_path) is None
        assert time.monotonic() - started < STARTUP_TIMEOUT, "a dead warm host ends the wait for its answer"
        assert warm.spawn(["--units", str(tmp_path)], env, tmp_path) is None
        assert warm.pid is None
    finally:
        warm.stop()


def test_the_child_runs_where_a_cold_run_would(service: UnitService) -> None:
    """In a scratch folder of its own, which is also first on sys.path, as for `python -m unit_mcp.testhost` there."""
    where = "import os\nimport sys\n\n\ndef main():\n    print(os.getcwd(), sys.path[0], os.environ['HOME'])\n"
    service.create_source("probe", "test_where.py", where)
    warm = service.run_tests("probe", "where").stdout.split()
    cold = run_test_process(service.loader.address, service.host.namespace, "probe", "where", timeout=30, warm=False)
    for folders in (warm, cold.stdout.split()):
        assert len(set(folders)) == 1 and "unit-mcp-test-" in folders[0], folders
    assert warm != cold.stdout.split(), "each run has a folder of its own"


def test_a_stopped_warm_host_is_replaced(service: UnitService) -> None:
    """A warm host stopped between runs (SIGSTOP) would answer nothing: the next run replaces it at once."""
    service.run_tests("probe")
    first = WARM.pid
    assert first is not None
    os.kill(first, signal.SIGSTOP)
    deadline = time.monotonic() + 10  # a signal is delivered asynchronously
    while not stopped(first) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stopped(first)
    result = service.run_tests("probe")
    assert result.passed and "value 0" in result.stdout
    assert WARM.pid not in (None, first)
    assert not Path(f"/proc/{first}").exists(), "the stopped host was killed and reaped"


def test_a_stopped_warm_host_does_not_outlive_its_server() -> None:
    """A stopped warm host cannot see the end of its control socket: the server kills it when it exits."""
    stop_then_exit = "import os, signal\nfrom unit_mcp.testrun import WARM\n\nWARM.start()\nprint(WARM.pid)\n" \
        "os.kill(WARM.pid, signal.SIGSTOP)\n"  # fmt: skip
    done = subprocess.run([sys.executable, "-c", stop_then_exit], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not Path(f"/proc/{int(done.stdout)}").exists()


@pytest.mark.parametrize(("name", "why"), [("A B", "is not an environment variable name"), ("HOME", "scratch folder")])
def test_test_env_takes_only_a_variable_name(name: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    from unit_mcp.server import parse_args

    assert parse_args(["--test-env", "OPENAI_API_KEY", "--test-env", "SSL_CERT_FILE"]).test_env == [
        "OPENAI_API_KEY",
        "SSL_CERT_FILE",
    ]
    with pytest.raises(SystemExit):
        parse_args(["--test-env", name])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("unit-mcp serve: error: argument --test-env:") and why in error, error


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_pytest_output_has_no_relative_host_path_and_no_anyio_rewrite_warning(tmp_path: Path, warm: bool) -> None:
    """pytest showed paths relative to the scratch folder (`../<checkout>/.venv/...`: no redaction finds them) and
    warned that it could not rewrite anyio, which the host imports first. It now starts in the unit's folder (its
    summary names `probe/test_fails.py`), the tests run in the scratch folder, and tracebacks show whole paths."""
    folder = tmp_path / "units" / "probe"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("import anyio\n\n\ndef add(a, b):\n    return a + b\n")
    (folder / "test_fails.py").write_text(
        "import os\n\n\ndef test_add(unit):\n    print('cwd', os.getcwd())\n    assert unit.add(1, 2) == 4\n"
    )
    run = run_test_process(tmp_path / "units", "units", "probe", "fails", timeout=60, warm=warm)
    assert run.exit_code == 1, run
    assert "PytestAssertRewriteWarning" not in run.stdout + run.stderr
    assert "../" not in run.stdout + run.stderr, run.stdout
    assert f"{folder / 'test_fails.py'}:6: AssertionError" in run.stdout
    assert "FAILED probe/test_fails.py::test_add" in run.stdout
    cwd = next(line for line in run.stdout.splitlines() if line.startswith("cwd "))
    assert str(tmp_path / "units") not in cwd  # the test body ran in its scratch folder, not in the unit's


PARSER = "import json\n\n\ndef settings(text):\n    return json.loads(text)\n"  # line 5: the unit's frame


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_failing_pytest_test_shows_the_units_frames_first_and_counts_the_rest(tmp_path: Path, warm: bool) -> None:
    """The failure reaches into json's decoder: pytest printed its frames after the unit's, long. Now the test's and
    the unit's frames are shown, in order, and the others only counted."""
    folder = tmp_path / "units" / "parser"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PARSER)
    (folder / "test_bad.py").write_text("def test_settings(unit):\n    assert unit.settings('{') == {}\n")
    run = run_test_process(tmp_path / "units", "units", "parser", "bad", timeout=60, warm=warm)
    assert run.exit_code == 1, run
    out = run.stdout
    test_frame, unit_frame = out.find("assert unit.settings('{') == {}"), out.find("return json.loads(text)")
    assert 0 <= test_frame < unit_frame, out
    assert "json/decoder.py" not in out and "json/__init__.py" not in out, out
    assert "frames not shown" in out and "outside the unit" in out, out
    assert "JSONDecodeError" in out
    assert f"{folder / '__init__.py'}:5: JSONDecodeError" in out, out


@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_a_failing_main_test_shows_the_units_frames_only(tmp_path: Path, warm: bool) -> None:
    """A test module with main(): the traceback began with the test host's own frame (`unit_mcp/testhost.py`)."""
    folder = tmp_path / "units" / "parser"
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(PARSER)
    (folder / "test_bad.py").write_text("from units import parser\n\n\ndef main():\n    parser.settings('{')\n")
    run = run_test_process(tmp_path / "units", "units", "parser", "bad", timeout=60, warm=warm)
    assert run.exit_code == 1, run
    trace = run.stderr
    assert "testhost" not in trace and "json/decoder.py" not in trace, trace
    frames = [line for line in trace.splitlines() if line.strip().startswith("File ")]
    assert "test_bad.py" in frames[0] and "__init__.py" in frames[1] and len(frames) == 2, trace
    assert "not shown" in trace and "JSONDecodeError" in trace
