"""scripts/bench_peers.py cannot rot: its own side (the bare loop and this runner) runs a smoke round for real."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_peer_benchmark_runs_its_own_side_and_reports_every_plan() -> None:
    """Real processes throughout: the MCP server, the scripted model, one worker per client; the script itself
    fails when a client got fewer tool results than its plan asked for, so a table means the calls were made."""
    done = subprocess.run(
        [sys.executable, "scripts/bench_peers.py", "--quick", "--only", "ours"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (bare|ours|ours-flush) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", done.stdout, re.M)
    assert sorted((name, int(plan)) for name, plan, *_ in rows) == sorted(
        (name, plan) for name in ("bare", "ours", "ours-flush") for plan in (0, 1, 21)
    )
    for name, plan, median_ms, p95_ms, cpu_ms in rows:
        assert 0 < float(median_ms) <= float(p95_ms) and float(cpu_ms) > 0, (name, plan)
    assert re.search(
        r"^\| first turn in a fresh process \(ours\) <= 300 ms \| \d+ ms \| (True|False) \|$", done.stdout, re.M
    )
    assert "pydantic-ai" not in done.stdout.split("Peers:")[1].split("\n", 1)[1]  # no peer ran
