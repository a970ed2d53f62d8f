"""The figures the hardening suite measures, written to `hardening.json` and `hardening.md`.

A test run writes them to `build/hardening/` (ignored by git), so tests leave the work tree as they found
it; `scripts/hardening-report` runs the suite with `UNIT_MCP_REPORT_DIR=reports` to refresh the committed
report. Each test records its own section; a run merges its sections into the existing report, so running
one test module refreshes its figures without dropping the others. Under pytest-xdist each worker hands its
figures to the controller (`payload`, `merge`: tests/conftest.py), which writes the one report.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

TITLES = {
    "paths": "Hostile source ids through the tools over HTTP",
    "paths_race": "A symlink swapped in between check and open",
    "paths_hypothesis": "Hypothesis-generated source ids through the tools",
    "concurrency": "Concurrent edits",
    "reload_faults": "Reload faults through the tools",
    "bad_arguments": "Bad arguments to every tool",
    "transport": "Transport: guards, malformed bodies, bounds",
    "load": "Load: 16 clients against the real server process",
    "session_crashes": "SIGKILL while appending to agent sessions",
    "session_crashes_postgres": "SIGKILL while appending to agent sessions in a PostgreSQL store",
    "round3_attacks": "Security round 3: each reproduced break, replayed",
    "round4_attacks_2456": "Security round 4 (items 2, 4, 5, 6): each reproduced break, replayed",
    "diff_freeze": "Security round 4: a planted worst-case diff and a bystander",
    "token_in_reach": "Security round 4: the token in a test's reach",
    "confirmation_guarantees": "Security round 4: the guarantees --confirm promises",
    "risk_and_bounds": "Security round 4: risks decided per call, messages and checkpoints bounded",
    "approval page": "Approval page: the credential stays on its own port",
    "test_sandbox": "Test runs: descendants, a stopped warm host, scratch folder and environment",
    "rollback_race": "A rollback racing another writer",
    "risks": "Risks that say what they grant",
    "foreign_stores": "Stores that are not ours",
    "huge_source": "An oversized source",
    "pg_chaos": "Seeded faults over three PostgreSQL replicas (scripts/pg_chaos.py)",
    "round4_parents_schemas_workers_stderr": "Security round 4: the folder above the data dir, a schema another "
    "role made, two workers with one identity, an unread stderr (items 1, 3, 7, 8)",
}


class Report:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.sections: dict[str, dict[str, Any]] = {}
        self.findings: dict[str, str | None] = {}  # test id -> why it is expected to fail, or None once it passes
        self.cases: dict[str, dict[str, list[int]]] = {}  # section -> test function -> [cases that held, cases run]

    def outcome(self, test: str, xfail_reason: str | None) -> None:
        """A test of this suite ran: an expected failure is an open finding; a pass closes one."""
        self.findings[test] = xfail_reason

    def record(self, section: str, **figures: Any) -> None:
        """Add figures to a section of this run (later calls for the same section add to it)."""
        self.sections.setdefault(section, {}).update(figures)

    def case(self, section: str, test: str, held: bool) -> None:
        """One case of an attack test ran; the section shows each test as "held in N of M cases"."""
        counts = self.cases.setdefault(section, {}).setdefault(test, [0, 0])
        counts[0] += held
        counts[1] += 1

    def payload(self) -> dict[str, Any]:
        """What this process measured, for the process that writes the report (a pytest-xdist worker's share)."""
        return {"sections": self.sections, "findings": self.findings, "cases": self.cases}

    def merge(self, payload: dict[str, Any]) -> None:
        """Add another process's `payload`: its figures, findings and attack cases (counts are summed)."""
        for section, figures in payload["sections"].items():
            self.record(section, **figures)
        self.findings.update(payload["findings"])
        for section, tests in payload["cases"].items():
            for test, (held, cases) in tests.items():
                counts = self.cases.setdefault(section, {}).setdefault(test, [0, 0])
                counts[0] += held
                counts[1] += cases

    def write(self) -> None:
        for section, tests in self.cases.items():  # by name: under xdist the workers finish in any order
            self.record(
                section, **{test: f"held in {held} of {cases} cases" for test, (held, cases) in sorted(tests.items())}
            )
        if not self.sections and not self.findings:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "hardening.json"
        try:
            merged: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            merged = {}
        sections = merged.setdefault("sections", {})
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for name, figures in self.sections.items():
            sections[name] = {"measured_at": now, **figures}
        merged["machine"] = {
            "python": platform.python_version(),
            "platform": platform.platform(terse=True),
            "cpus": os.cpu_count(),
        }
        merged["sections"] = {name: sections[name] for name in sorted(sections, key=_order)}
        findings = {**merged.get("open_findings", {}), **self.findings}
        merged["open_findings"] = {test: reason for test, reason in sorted(findings.items()) if reason}
        path.write_text(json.dumps(merged, indent=2, ensure_ascii=False) + "\n")
        (self.directory / "hardening.md").write_text(render(merged))


def _order(name: str) -> int:
    return list(TITLES).index(name) if name in TITLES else len(TITLES)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict):
        return ", ".join(f"{key}: {_show(item)}" for key, item in value.items()) or "—"
    if isinstance(value, list):
        return ", ".join(_show(item) for item in value) or "—"
    return str(value)


def render(report: dict[str, Any]) -> str:
    machine = report.get("machine", {})
    lines = [
        "# Hardening figures",
        "",
        "Written by `scripts/hardening-report` (it runs `tests/hardening`); do not edit by hand.",
        f"Last machine: Python {machine.get('python')}, {machine.get('platform')}, {machine.get('cpus')} CPUs.",
    ]
    for name, figures in report.get("sections", {}).items():
        lines += ["", f"## {TITLES.get(name, name)}", "", "| figure | value |", "| --- | --- |"]
        lines += [f"| {key} | {_show(value)} |" for key, value in figures.items()]
    findings = report.get("open_findings", {})
    lines += ["", "## Open findings", ""]
    lines += ["Tests marked as expected failures until the code they point at is fixed:", ""] if findings else ["None."]
    lines += [f"- `{test}`: {reason}" for test, reason in findings.items()]
    lines += [
        "",
        "Proven elsewhere in the suite, not repeated here: SIGKILL during source writes through the service",
        "(`tests/test_crash_safety.py`), test-runner abuse - endless loops, 100 MB of output, children that ignore",
        "SIGTERM, escaped grandchildren (`tests/test_service.py`), and the path validation corpus and containment",
        "property at the paths layer (`tests/test_paths.py`).",
    ]
    return "\n".join(lines) + "\n"


def report_dir() -> Path:
    """`UNIT_MCP_REPORT_DIR`, else `build/hardening` (ignored): a plain test run changes no tracked file."""
    return Path(os.environ.get("UNIT_MCP_REPORT_DIR") or REPO / "build" / "hardening")


REPORT = Report(report_dir())
"""This process's figures: written when the session ends (tests/conftest.py), by the controller under xdist."""
