"""Long test runs (issue 24): a run outlives the call that started it under a server-minted run_id, which
unit_test_status follows and unit_cancel_test stops; ended runs are kept for a bounded time, then forgotten."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from unit_mcp import Host, UnitService
from unit_mcp.errors import UnitError
from unit_mcp.testrun import TestRun, TestRuns
from unit_mcp.tools import UnitTools

pytestmark = pytest.mark.anyio


@pytest.fixture
def folder_host(units_root: Path, tmp_path: Path) -> Iterator[Host]:
    with Host(units_root, tmp_path / "data") as started:
        yield started


def add_test(units_root: Path, name: str, body: str) -> None:
    (units_root / "counter" / f"test_{name}.py").write_text(f"import os\nimport time\n\n\ndef main():\n{body}")


@asynccontextmanager
async def client_of(service: UnitService) -> AsyncIterator[Client]:
    async with Client(UnitTools(service, progress_interval=0.2).server()) as client:
        yield client


async def ok(client: Client, name: str, arguments: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    result = await client.call_tool(name, arguments, **kwargs)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return dict(result.structured_content)


async def refused(client: Client, name: str, arguments: dict[str, Any]) -> str:
    result = await client.call_tool(name, arguments)
    assert result.is_error and isinstance(result.content[0], types.TextContent)
    return result.content[0].text


async def test_a_run_longer_than_the_clients_timeout_is_picked_up_by_run_id(
    units_root: Path, folder_host: Host
) -> None:
    """The client gives up on a call after 5 s; the server answers 'running' before that (--max-call-s 2) and
    the client follows the run by its id until it passes."""
    add_test(units_root, "long", "    time.sleep(8)\n    print('done')\n")
    async with client_of(UnitService(folder_host, max_call_s=2)) as client:
        arguments = {"unit_id": "counter", "test_name": "long"}
        started = await ok(client, "unit_run_tests", arguments, read_timeout_seconds=5)
        assert started["state"] == "running" and started["run_id"] and not started["passed"]
        status = started
        for _ in range(30):
            status = await ok(
                client, "unit_test_status", {"run_id": started["run_id"], "wait_s": 3}, read_timeout_seconds=5
            )
            if status.get("state", "finished") == "finished":
                break
        assert status.get("state", "finished") == "finished" and status["passed"] and status["stdout"] == "done\n"
        assert status["run_id"] == started["run_id"] and status["duration_ms"] >= 8000
        again = await ok(client, "unit_test_status", {"run_id": started["run_id"]})
        assert again == status, "a finished run answers the same until it is forgotten"


async def test_wait_false_answers_running_at_once_and_cancel_kills_the_run(
    units_root: Path, folder_host: Host, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    add_test(units_root, "hang", f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n    time.sleep(300)\n")
    async with client_of(UnitService(folder_host)) as client:
        started = await ok(client, "unit_run_tests", {"unit_id": "counter", "test_name": "hang", "wait": False})
        assert started["state"] == "running" and started["run_id"]
        for _ in range(300):  # bounded: the test writes its pid once it runs
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        pid = int(pid_file.read_text())
        cancelled = await ok(client, "unit_cancel_test", {"run_id": started["run_id"]})
        assert cancelled == {"run_id": started["run_id"], "cancelled": True, "state": "finished"}
        assert (await refused(client, "unit_test_status", {"run_id": started["run_id"]})).startswith("[cancelled]")
        assert not (await ok(client, "unit_cancel_test", {"run_id": started["run_id"]}))["cancelled"]
        assert (await refused(client, "unit_test_status", {"run_id": "nosuch"})).startswith("[unknown_run]")
    for _ in range(100):  # its warm host reaps it right after the kill
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the cancelled test's process is gone"


async def test_a_quick_run_reports_progress_once_at_least(folder_host: Host) -> None:
    progress: list[str | None] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(message)

    async with client_of(UnitService(folder_host)) as client:
        run = await ok(client, "unit_run_tests", {"unit_id": "counter"}, progress_callback=on_progress)
    assert run["passed"] and run.get("state", "finished") == "finished" and run["run_id"]
    assert progress and all(message and "test_init of unit counter" in message for message in progress)


def test_runs_at_once_are_bounded_and_a_refused_one_starts_nothing(units_root: Path, folder_host: Host) -> None:
    add_test(units_root, "hang", "    time.sleep(300)\n")
    service = UnitService(folder_host, max_running_tests=1)
    first = service.run_tests("counter", "hang", wait=False)
    assert first.state == "running" and first.run_id
    with pytest.raises(UnitError) as caught:
        service.run_tests("counter", "init", wait=False)
    assert caught.value.code == "too_many_runs" and "unit_cancel_test" in caught.value.hint
    assert service.cancel_test(first.run_id).cancelled
    assert service.run_tests("counter", "init").passed


def test_ended_runs_are_forgotten_after_the_retention(folder_host: Host) -> None:
    service = UnitService(folder_host, run_retention_s=0)
    run_id = service.run_tests("counter").run_id
    assert run_id is not None
    with pytest.raises(UnitError) as caught:
        service.test_status(run_id)
    assert caught.value.code == "unknown_run" and caught.value.hint

    kept = UnitService(folder_host)
    first = kept.run_tests("counter")
    assert kept.test_status(first.run_id).passed  # within the retention it answers as the run did


def test_the_registry_keeps_a_bounded_number_of_ended_runs() -> None:
    runs = TestRuns(retention=600, keep=2)
    started: list[TestRun] = []
    for n in range(3):  # one after the other: the registry keeps the runs that ended last, not the last started
        run = runs.start(f"run {n}", lambda n=n: n, limit=8)
        assert run is not None and run.done.wait(10)
        started.append(run)
    last = runs.start("one more", lambda: None, limit=8)
    assert last is not None and last.done.wait(10)
    first, _, third = started
    assert runs.get(first.run_id) is None and runs.get(third.run_id) is not None
    assert runs.get(third.run_id).outcome == 2  # type: ignore[union-attr]
