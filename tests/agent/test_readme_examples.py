"""The README's examples for presets, runner events and hooks run as written (each in its own interpreter)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def example(heading: str) -> str:
    """The first python block of the README section under `heading`."""
    text = README.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else None]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, f"the README section {heading!r} has no python example"
    return found.group(1)


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("### Presets", "active: ['math'] offered: ['add', 'preset_activate', 'preset_deactivate']"),
        ("### Runner events", "turn-status {'status': 'completed'"),
        ("### Hooks", "5 (took 0.0"),
    ],
)
def test_readme_example_runs(tmp_path: Path, heading: str, expected: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(example(heading), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the examples' temporary stores land in tmp_path
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout
