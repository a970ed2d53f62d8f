"""The project's scripts as a newcomer meets them on a machine missing a tool: one line naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_scripts_test_names_a_missing_tool_in_one_line(tmp_path: Path) -> None:
    """A PATH with Python, git and the shell's basics but no npm: scripts/test stops before installing anything."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(Path(sys.executable).resolve())
    for tool in ("git", "dirname", "bash"):
        found = shutil.which(tool)
        assert found is not None, f"{tool} is needed to run this test"
        (bin_dir / tool).symlink_to(found)
    done = subprocess.run(
        [str(bin_dir / "bash"), "scripts/test"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "scripts/test: npm is not installed; the external checks, OpenCode and Codex tests install their pinned "
        "tools with it (Debian: apt-get install npm)"
    ]
