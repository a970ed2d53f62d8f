"""The warm CLI the agent and durable tests run `python -m unit_mcp.agent` through (support.warm_cli, a fork of one
interpreter that imported the CLI) answers as a fresh interpreter does: the same exit code, stdout and stderr for a
help page that reads the environment, a refused argument and a command on a store named by a variable."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from .conftest import REPO, agent_cli

pytestmark = pytest.mark.anyio


async def test_a_fork_of_the_warm_cli_answers_as_a_fresh_python_m(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MCP_", "UNIT_MCP_", "OPENAI_"))}
    store = tmp_path / "data"
    cases = [
        (["--help"], {"HOME": str(tmp_path), "XDG_DATA_HOME": "", "COLUMNS": "100"}),
        (["run", "--model", "m", "--no-such-option", "hi"], {}),
        (["sessions", "pending", "ses-nope"], {"UNIT_MCP_AGENT_DATA": str(store)}),
    ]
    codes = []
    for args, env in cases:
        warm = await agent_cli(*args, env={**clean, **env})
        codes.append(warm[0])
        done = await anyio.run_process(
            [sys.executable, "-m", "unit_mcp.agent", *args], cwd=REPO, env={**clean, **env}, check=False
        )
        assert warm == (done.returncode, done.stdout.decode(), done.stderr.decode()), args
    assert codes == [0, 2, 1]  # a help page, a refused argument, an unknown session
