"""docs/sessions.md says what is true: its Python example runs against a folder and a PostgreSQL database of the
test cluster, and every command line of its shell example is one the agent CLI accepts."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from unit_mcp.agent._cli import parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "sessions.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_the_python_example_runs(tmp_path: Path, database: str, request: pytest.FixtureRequest) -> None:
    (example,) = blocks("python")
    cluster: Any = request.getfixturevalue("pg_cluster") if database == "postgres" else None
    store = str(tmp_path / "sessions") if cluster is None else cluster.new_database()
    done = subprocess.run(
        [sys.executable, "-c", example],
        env={**os.environ, "SESSIONS": store},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_the_shell_example_is_what_the_cli_accepts() -> None:
    (shell,) = blocks("bash")
    commands = [shlex.split(line.split("#")[0]) for line in shell.splitlines() if "unit_mcp.agent" in line]
    assert len(commands) == 2
    for words in commands:
        assert words[:3] == ["python", "-m", "unit_mcp.agent"]
        args = parser().parse_args(words[3:])
        assert args.sessions == "postgresql://agent@db.internal:5432/agents"
