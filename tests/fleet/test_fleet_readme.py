"""docs/fleet.md's Python example runs as written, against the pinned OpenCode binary."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_docs import REPO, blocks


def test_the_fleet_example_runs(tmp_path: Path, opencode_binary: Path) -> None:
    script = tmp_path / "example.py"
    (example,) = [block.text for block in blocks(REPO / "docs" / "fleet.md") if block.lang == "python"]
    script.write_text(example, encoding="utf-8")
    env = {**os.environ, "OPENCODE_PATH": str(opencode_binary), "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "healthy: True - No permission rules are configured" in done.stdout
    assert "nodes: ['build']" in done.stdout
