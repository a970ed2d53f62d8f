"""The suite-wide check that no tool result holds a host path (issue 37).

At the start of a run (in the controller, before any xdist worker starts) recording is turned on
(`unit_mcp.resultlog`: every result of `UnitTools` and of a `UnitService` method, in this process, in the workers and
in the servers the tests start, one file per process) into a fresh folder. At the end the controller greps every
recorded result for the host's paths: the checkout (absolute, or relative as `../<checkout name>/`), the venv, the
run's temporary folders and $HOME. A hit fails the run with the tool, the test and the text around the path; the
results folder is kept for a look, and removed when clean. Set `UNIT_MCP_RESULTS_DIR` yourself to keep the results
(they are then never removed)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from unit_mcp import resultlog

REPO = Path(__file__).resolve().parent.parent.parent
CONTEXT = 60
AS_SENT = {
    "tests/hardening/test_risks.py::test_approving_filesystem_write_does_not_grant_code_execution": (
        "the attack's patch writes to a file in the test's tmp_path: the dry run's diff shows the patch as sent"
    ),
    "tests/opencode/test_local_access.py::test_local_access_on_the_real_opencode": (
        "local access hands OpenCode a real folder by design: the grant's result and its change-log record name it"
    ),
}
"""Tests whose own arguments put a host path into a unit's text: a result shows a unit's text as it is (a diff, a
source), so the path comes back; the test id and why."""
MAX_SHOWN = 20


@dataclass(frozen=True)
class Leak:
    tool: str
    via: str
    test: str | None
    path: str
    around: str

    def __str__(self) -> str:
        return f"{self.tool} ({self.via}) in {self.test or 'no test'}: {self.path!r} in …{self.around}…"


def host_paths(temp_roots: list[Path]) -> list[str]:
    """What a result must never hold: the checkout, the venv, the run's temporary folders, $HOME (absolute, and
    their real paths), and the relative way up to the checkout."""
    roots = {REPO, Path(sys.prefix), *temp_roots}
    home = Path.home()
    if len(home.parts) > 1:
        roots.add(home)
    found: set[str] = set()
    for root in roots:
        for variant in {str(root), os.path.realpath(root)}:
            if len(variant) > 1:
                found.add(variant)
    found.add(f"../{REPO.name}/")
    found.add("/.venv/lib/")
    return sorted(found, key=len, reverse=True)


def leaks(folder: Path, paths: list[str]) -> Iterator[Leak]:
    """Every recorded result in `folder` that holds one of `paths`."""
    for file in sorted(folder.glob("results-*.jsonl")):
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:  # a process killed mid-write leaves a cut last line
                continue
            test = entry.get("test") or ""
            if any(test.startswith(node) for node in AS_SENT):
                continue
            text = entry["text"]
            for path in paths:
                at = text.find(path)
                if at >= 0:
                    around = text[max(0, at - CONTEXT) : at + len(path) + CONTEXT]
                    yield Leak(entry["tool"], entry["via"], entry.get("test"), path, around)
                    break


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _controller(config):
        return  # a worker inherited the folder in its environment (resultlog read it at import)
    given = os.environ.get(resultlog.ENV)
    folder = Path(given) if given else Path(tempfile.mkdtemp(prefix="unit-mcp-results-"))
    folder.mkdir(parents=True, exist_ok=True)
    config.stash[_FOLDER] = (folder, not given)
    resultlog.start(folder)


_FOLDER = pytest.StashKey[tuple[Path, bool]]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if not _controller(config) or _FOLDER not in config.stash:
        return
    folder, ours = config.stash[_FOLDER]
    temp = [config._tmp_path_factory.getbasetemp()] if hasattr(config, "_tmp_path_factory") else []
    found = list(leaks(folder, host_paths(temp)))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if found:
        lines = [f"{len(found)} tool result(s) hold a host path (results kept in {folder}):"]
        lines += [f"  {leak}" for leak in found[:MAX_SHOWN]]
        if reporter is not None:
            reporter.write_sep("=", "host paths in tool results", red=True)
            reporter.write_line("\n".join(lines))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif ours:
        shutil.rmtree(folder, ignore_errors=True)
