"""docs/sessions.md says what is true: its Python example runs against a folder and a PostgreSQL database of the
test cluster (tests/test_docs.py checks its command lines against the real parser)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
