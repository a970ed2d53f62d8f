"""The opt-in per-test CPU report (support.cpu_report): a test's own CPU and that of the children it waited for."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support.cpu_report import summary

TESTS = Path(__file__).resolve().parent
BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass\n"


def test_the_report_counts_a_childs_cpu_and_sums_it_by_file(tmp_path: Path) -> None:
    (tmp_path / "test_burn.py").write_text(
        "import subprocess, sys\n\n\n"
        f"def test_child_burns():\n    subprocess.run([sys.executable, '-c', {BURN!r}], check=True)\n\n\n"
        "def test_idle():\n    pass\n"
    )
    report = tmp_path / "report"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own, no worker
    env |= {"PYTHONPATH": str(TESTS), "UNIT_MCP_CPU_REPORT": str(report)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "support.cpu_report", "-p", "no:cacheprovider", "test_burn.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["id"]: row for row in map(json.loads, (report / "main.jsonl").read_text().splitlines())}
    assert set(rows) == {"test_burn.py::test_child_burns", "test_burn.py::test_idle"}
    assert rows["test_burn.py::test_child_burns"]["children"] >= 0.25
    assert rows["test_burn.py::test_idle"]["children"] < 0.1
    shown = summary(report)
    assert shown.startswith("2 tests, ") and "test_burn.py" in shown.splitlines()[2], shown
