"""An opencode agent from an agents file: `python -m unit_mcp.agent run --agents FILE` starts the agent's own
isolated node on the real (pinned) OpenCode binary, with the agent's model at its base_url (the scripted model) and
its key passed only through the node's environment, and records the turn under the agent's id."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import anyio
import pytest

from unit_mcp.agent import SessionStore
from unit_mcp.testing import Match, ScriptedModel, say

from .opencode_stack import REPO, title_step

pytestmark = pytest.mark.anyio


async def test_an_opencode_agent_from_a_file_runs_on_its_own_node(tmp_path: Path, opencode_binary: Path) -> None:
    steps = [title_step(), say("hello from the node", when=Match(user_contains="greet"))]
    data = tmp_path / "agent-data"
    async with ScriptedModel(steps) as model:
        agents = tmp_path / "agents.json"
        agents.write_text(
            '{"agent": [{"id": "oc", "provider": "opencode", "model": "m", "api_key_env": "OC_KEY", '
            f'"base_url": "{model.base_url}", "system_prompt": "You greet."}}]}}',
            encoding="utf-8",
        )
        env = {**os.environ, "OPENCODE_PATH": str(opencode_binary), "OC_KEY": "node-key", "TMPDIR": str(tmp_path)}
        command = [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(data), "run", "--agents", str(agents)]
        with anyio.fail_after(180):
            done = await anyio.run_process([*command, "greet", "me"], cwd=REPO, env=env, check=False)
        requests = [r for r in model.requests if "greet" in r.last_text]
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert done.stdout.decode().strip() == "hello from the node"
    (request,) = requests
    assert request.body["model"] == "m" and request.api_key == "node-key"
    assert "You greet." in request.messages[0]["content"]
    session_id = err.strip().splitlines()[-1].removeprefix("session: ")
    assert SessionStore(data, read_only=True).require(session_id).agent_id == "oc"
    assert not list(tmp_path.glob("unit-mcp-opencode-node-*"))  # the node's private world is removed with it
