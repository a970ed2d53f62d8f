"""`scripts/test-online`, the opt-in entry point of the online scenario: with nothing configured it fails loudly,
naming every missing piece and where to give it, and runs nothing; pointed at the scripted model (an
OpenAI-compatible endpoint like any other) it runs the scenario's deterministic tests against the real unit server."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest

from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import REPO

pytestmark = pytest.mark.anyio
ENTRY = REPO / "scripts" / "test-online"


def bare_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment without any online setting, key or binary path (a developer's own must not leak in)."""
    drop = ("UNIT_MCP_ONLINE_", "OPENAI_", "OPENCODE_PATH", "CODEX_PATH")
    env = {key: value for key, value in os.environ.items() if not key.startswith(drop)}
    return {**env, "TMPDIR": str(tmp_path), **extra}


def test_with_nothing_configured_it_fails_loudly_naming_what_is_missing(tmp_path: Path) -> None:
    done = subprocess.run([str(ENTRY)], capture_output=True, text=True, env=bare_env(tmp_path), timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    said = done.stderr
    assert "cannot run the online scenario against a real provider; missing:" in said
    for piece in ("provider:", "model:", "base_url:", "credentials: the API key variable OPENAI_API_KEY is not set"):
        assert f"  - {piece}" in said, said
    assert "UNIT_MCP_ONLINE_PROVIDER or `provider` in the config file" in said and "passed" not in said


def test_a_config_file_names_the_binary_and_a_key_file_must_be_private(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-not-a-real-key\n")
    key.chmod(0o644)
    config = tmp_path / "online.toml"
    config.write_text(
        'provider = "opencode"\nmodel = "m"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'api_key_file = "{key}"\nbinary = "{tmp_path / "no-opencode"}"\n'
    )
    done = subprocess.run(
        [str(ENTRY), "--config", str(config)], capture_output=True, text=True, env=bare_env(tmp_path), timeout=300
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert len(lines) == 2, done.stderr
    assert lines[0] == f"  - api_key_file: {key} must be yours with mode 0600 (chmod 600 {key})"
    assert lines[1].startswith("  - binary: no executable opencode binary found; looked at the path given")
    assert "sk-not-a-real-key" not in done.stderr


async def test_pointed_at_the_scripted_model_it_runs_the_scenario(tmp_path: Path) -> None:
    """The nonce and approval-boundary tests (the echo test's marker is made in the scenario's process, so a script
    cannot know it: deselected)."""
    steps = [
        call("get_nonce", when=Match(last_role="user", user_contains="get_nonce")),
        call(tool_call("record_value", {"value": "{{tool:get_nonce.nonce}}"}), when=Match(last_contains="nonce")),
        say("done:{{tool:get_nonce.nonce}}", when=Match(last_contains="recorded:")),
        call("wipe_units", when=Match(last_role="user", user_contains="wipe_units")),
        say("wipe_units is not available to me.", when=Match(last_contains="approval_denied")),
    ]
    async with ScriptedModel(steps) as model:
        env = bare_env(
            tmp_path,
            UNIT_MCP_ONLINE_PROVIDER="openai",
            UNIT_MCP_ONLINE_MODEL="scripted",
            UNIT_MCP_ONLINE_BASE_URL=model.base_url,
            OPENAI_API_KEY="unused-by-the-scripted-model",
        )
        done = await anyio.run_process(
            [str(ENTRY), "--", "-k", "not echo_token", "-q", "-p", "no:xdist"], env=env, check=False
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, out[-3000:] + err[-3000:]
    assert "the online scenario with provider=openai, model=scripted" in err
    assert "2 passed, 1 deselected" in out, out
    model.assert_done()
