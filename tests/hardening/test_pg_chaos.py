"""The seeded fault run over three PostgreSQL replicas (scripts/pg_chaos.py): listeners ended, the cluster restarted
and replicas SIGKILLed while clients patch with expected hashes; its checker must find nothing, and the run's seed
and figures go into the hardening report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .report import REPO, Report

SEED = 29
SECONDS = 30


@pytest.mark.slow
def test_a_seeded_fault_run_over_three_replicas_passes_its_checker(figures: Report) -> None:
    command = ["scripts/pg_chaos.py", "--seed", str(SEED), "--seconds", str(SECONDS)]
    load_before = os.getloadavg()[0]
    done = subprocess.run([sys.executable, *command], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["failures"] == [] and result["acknowledged"] > 0, result
    assert sum(result["faults"].values()) > 0, result  # which ones, and how many, depends on the timing
    figures.record(
        "pg_chaos",
        reproduce=f"python {' '.join(command)}",
        seed=SEED,
        seconds=SECONDS,
        writes_acknowledged=result["acknowledged"],
        versions_in_history=result["history_versions"],
        call_outcomes=result["outcomes"],
        faults=result["faults"],
        replica_processes_observed=result["replica_processes_observed"],
        checker_failures=len(result["failures"]),
        load_average=f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after (2 cores shared with other runs)",
    )
