"""The recorder behind the suite-wide check that no tool result holds a host path (issue 37): what it records,
that it costs nothing when off, and that the check finds a planted path (tests/support/resultcheck.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client
from support.resultcheck import AS_SENT, REPO, host_paths, leaks

import unit_mcp
from unit_mcp import Host, UnitService, resultlog
from unit_mcp.redact import Redactor
from unit_mcp.tools import UnitTools


def recorded(folder: Path) -> list[dict[str, str]]:
    return [json.loads(line) for file in folder.glob("results-*.jsonl") for line in file.read_text().splitlines()]


def test_off_it_hands_back_the_call_itself_and_records_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(resultlog, "recorder", None)

    async def call(*args: object) -> str:
        return "result"

    assert resultlog.recording(call, lambda *args: "tool") is call
    resultlog.record("unit_list", "python", "text")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.anyio
async def test_on_it_records_each_wire_result_and_each_python_result_in_this_processs_file(
    monkeypatch: pytest.MonkeyPatch, units_root: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    monkeypatch.setattr(resultlog, "recorder", resultlog.ResultLog(folder))
    with Host(units_root, tmp_path / "data") as host:
        service = UnitService(host)
        async with Client(UnitTools(service).server()) as client:
            await client.call_tool("unit_read_source", {"unit_id": "counter", "source_id": "__init__.py"})
            refused = await client.call_tool("unit_read_source", {"unit_id": "nosuch", "source_id": "x.py"})
        service.list()
    assert refused.is_error
    assert [file.name for file in folder.iterdir()] == [f"results-{os.getpid()}.jsonl"]
    entries = [(entry["tool"], entry["via"]) for entry in recorded(folder)]
    assert ("unit_read_source", "mcp") in entries and ("unit_list", "python") in entries
    assert entries.count(("unit_read_source", "mcp")) == 2, "a refusal is a result too"
    wire = next(entry for entry in recorded(folder) if entry["via"] == "mcp")
    assert "def increment" in wire["text"] and wire["test"] and "test_resultlog.py" in wire["test"]


def test_a_process_started_with_the_folder_records_into_a_file_of_its_own(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    code = "from unit_mcp import resultlog; resultlog.record('unit_list', 'python', 'from the child')"
    env = {**os.environ, resultlog.ENV: str(folder)}
    child = subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert child.returncode == 0
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name != f"results-{os.getpid()}.jsonl"
    assert recorded(folder)[0]["text"] == "from the child"


def test_the_check_finds_a_host_path_absolute_or_relative_and_passes_clean_text(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    log = resultlog.ResultLog(folder)
    log.write("unit_read_log", "mcp", "clean: <units>/counter/__init__.py and ~/notes")
    log.write("unit_run_tests", "mcp", f"File {REPO}/unit_mcp/host.py, line 3")
    log.write("unit_run_tests", "mcp", f"../{REPO.name}/.venv/lib/python3.11/site-packages/_pytest/x.py")
    log.write("unit_inspect", "python", f"at {tmp_path / 'units'}")
    found = list(leaks(folder, host_paths([tmp_path])))
    assert [(leak.tool, leak.via) for leak in found] == [
        ("unit_run_tests", "mcp"),
        ("unit_run_tests", "mcp"),
        ("unit_inspect", "python"),
    ]
    assert str(REPO) in found[0].around and "line 3" in str(found[0])


def test_the_folder_unit_mcp_is_imported_from_is_redacted_as_a_tests_pythonpath_names_it() -> None:
    """Found by the suite-wide check: a unit test printing its environment showed PYTHONPATH=<the checkout>."""
    parent = Path(unit_mcp.__file__).resolve().parent.parent
    shown = Redactor([])(f"PYTHONPATH={parent}:{parent / 'unit_mcp' / 'host.py'}")
    assert str(parent) not in shown and shown in (
        "PYTHONPATH=<unit_mcp>/..:<unit_mcp>/host.py",
        "PYTHONPATH=<site-packages>:<unit_mcp>/host.py",  # installed from a wheel
    ), shown


def test_a_test_that_sends_a_host_path_itself_is_left_out_of_the_check(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "results-1.jsonl").write_text(
        json.dumps(
            {"tool": "unit_apply_patch", "via": "mcp", "test": f"{next(iter(AS_SENT))} (call)", "text": str(REPO)}
        )
        + "\n"
    )
    assert list(leaks(folder, host_paths([]))) == []
