"""Per-test CPU time, for finding what makes the suite slow: `UNIT_MCP_CPU_REPORT=build/cpu-report scripts/test`.

On the 2-core machines the suite runs on, its three workers keep both cores busy, so a test's wall time
(`--durations`) says more about its neighbours than about itself: only less CPU makes the run shorter. With
`UNIT_MCP_CPU_REPORT` naming a folder (emptied at the start), each worker writes one JSON line per test to
`<folder>/<worker>.jsonl`: the test's id, its wall seconds, the CPU seconds of the test process itself (`self`) and
of the child processes that ended and were waited for during the test (`children`: servers, CLIs, OpenCode; a
process forked by the warm interpreter of `support.warm_cli` is that interpreter's child and is not counted).
`python tests/support/cpu_report.py FOLDER` sums them by file and by test. Unset, the plugin does nothing."""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Generator
from pathlib import Path

import pytest

FOLDER = os.environ.get("UNIT_MCP_CPU_REPORT")


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_sessionstart(session: pytest.Session) -> None:
    if FOLDER and not hasattr(session.config, "workerinput"):  # the controller (or a run without workers)
        for old in Path(FOLDER).glob("*.jsonl"):
            old.unlink()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    if not FOLDER:
        yield
        return
    own, children = _cpu()
    started = time.perf_counter()
    yield
    own_after, children_after = _cpu()
    line = {
        "id": item.nodeid,
        "wall": round(time.perf_counter() - started, 3),
        "self": round(own_after - own, 3),
        "children": round(children_after - children, 3),
    }
    folder = Path(FOLDER)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(line) + "\n")


def summary(folder: Path, top: int = 25) -> str:
    """The CPU seconds of the run in `folder`, by file and by test, largest first."""
    rows = [json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()]
    if not rows:
        return f"no report in {folder}: run `UNIT_MCP_CPU_REPORT={folder} scripts/test` first"
    by_file: collections.Counter[str] = collections.Counter()
    for row in rows:
        by_file[row["id"].partition("::")[0]] += row["self"] + row["children"]
    total = sum(by_file.values())
    lines = [f"{len(rows)} tests, {total:.0f} s of CPU (the test processes and the children they waited for)", ""]
    lines += [f"{seconds:8.1f}  {name}" for name, seconds in by_file.most_common(top)]
    lines.append("")
    ranked = sorted(rows, key=lambda row: -(row["self"] + row["children"]))[:top]
    lines += [f"{r['self'] + r['children']:8.1f}  (wall {r['wall']:.1f})  {r['id']}" for r in ranked]
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/support/cpu_report.py FOLDER (the UNIT_MCP_CPU_REPORT of a run)")
    print(summary(Path(sys.argv[1])))
