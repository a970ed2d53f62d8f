"""The README's fleet example runs as written, against the pinned OpenCode binary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from agent.test_readme_examples import example


def test_the_fleet_example_runs(tmp_path: Path, opencode_binary: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(example("## Fleet"), encoding="utf-8")
    env = {**os.environ, "OPENCODE_PATH": str(opencode_binary), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "healthy: True - No permission rules are configured" in done.stdout
    assert "nodes: ['build']" in done.stdout
