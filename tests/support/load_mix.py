"""The load test's mix of calls, one definition for tests/hardening/test_load.py and scripts/bench_percall.py.

Standard library only: the benchmark's lean client processes import it.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TALLIES = 4
COUNT = re.compile(r"^COUNT = (\d+)$", re.MULTILINE)
TALLY = '''"""A tally the load test moves one step per successful edit."""

COUNT = 0


def snapshot():
    return {"count": COUNT}
'''
READS = [
    ("counter", "__init__.py"),
    ("counter", "panel.py"),
    ("weather", "forecast.py"),
    ("weather", "data/cities.json"),
    ("notes", "__init__.py"),
    ("greeter", "greeter.py"),
]
EDIT = "edit"
"""The step that reads `home`'s tally and patches it one up with the hash it read (`read_tally`, `tally_patch`)."""
KINDS = {
    EDIT: 0.1,
    "read": 0.4,
    "list": 0.6,
    "inspect": 0.7,
    "snapshot": 0.8,
    "log": 0.87,
    "resolve": 0.91,
    "reload": 0.93,
    "dry_run": 0.97,
}
"""Each kind of step, by a draw that picks it in `next_call` (to run one kind alone)."""


def home_of(client: int) -> str:
    """The tally a client edits: four clients share each one, so edits contend."""
    return f"tally{client % TALLIES}"


def copy_units(units: Path) -> None:
    """The example units plus the tallies, into `units` (a fresh folder)."""
    shutil.copytree(REPO / "unit_mcp" / "examples" / "units", units, ignore=shutil.ignore_patterns("__pycache__"))
    for number in range(TALLIES):
        (units / f"tally{number}").mkdir()
        (units / f"tally{number}" / "__init__.py").write_text(TALLY)


def next_call(rng: random.Random, home: str, draw: float | None = None) -> tuple[str, dict[str, Any]]:
    """The next step: a tool and its arguments, or `EDIT` (with the read's arguments) for a read then a patch."""
    choice = rng.random() if draw is None else draw
    if choice < 0.35:
        return EDIT, read_tally(home)
    if choice < 0.55:
        unit, source = rng.choice(READS)
        return "unit_read_source", {"unit_id": unit, "source_id": source}
    if choice < 0.65:
        return "unit_list", {}
    if choice < 0.75:
        return "unit_inspect", {"unit_id": rng.choice(["counter", "weather", "notes", home])}
    if choice < 0.85:
        return "unit_snapshot", {"unit_id": rng.choice(["counter", home])}
    if choice < 0.90:
        return "unit_read_log", {"grep": "reloaded", "lines": 20}
    if choice < 0.92:
        return "unit_resolve", {"description": "weather forecast for a city"}
    if choice < 0.95:  # a reload racing the edits of the same unit
        return "unit_reload", {"unit_id": home}
    patch = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 2"}
    return "unit_apply_patch", patch | {"dry_run": True}


def read_tally(unit: str) -> dict[str, Any]:
    return {"unit_id": unit, "source_id": "__init__.py"}


def tally_patch(unit: str, read: dict[str, Any]) -> dict[str, Any]:
    """The `unit_apply_patch` arguments moving the tally one up, from `read` (the structured read result)."""
    value = tally_count(read["content"])
    old, new = f"COUNT = {value}\n", f"COUNT = {value + 1}\n"
    return read_tally(unit) | {"old": old, "new": new, "expected_hash": read["hash"]}


def tally_count(content: str) -> int:
    found = COUNT.search(content)
    if found is None:
        raise AssertionError(f"no COUNT line in the tally: {content[:200]!r}")
    return int(found.group(1))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    """A process's resident memory in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")
