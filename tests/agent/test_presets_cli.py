"""`python -m unit_mcp.agent run --presets FILE` as a user runs it: the activation of a risky preset asked on a
terminal that closes is answered later from the command line, and the preset stays active for later turns."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.agent_cli import main

from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import UnitServer, agent_cli, ask_on_a_terminal_then_die

pytestmark = pytest.mark.anyio
PRESETS = """\
[[preset]]
name = "look"
tools = ["unit_list", "unit_inspect"]
active = true

[[preset]]
name = "edit"
description = "Read and change unit sources."
tools = ["unit_read_source", "unit_apply_patch"]
"""


async def test_a_preset_activation_asked_on_a_closed_terminal_is_answered_from_the_cli(
    tmp_path: Path, unit_server: UnitServer, capsys: pytest.CaptureFixture[str]
) -> None:
    presets = tmp_path / "presets.toml"
    presets.write_text(PRESETS)
    steps = [
        call(tool_call("preset_activate", {"name": "edit"})),
        say("Activated: {{last}}", when=Match(last_role="tool", user_contains="edit greeter")),
        say("Now I can read.", when=Match(user_contains="read it")),
    ]
    data = str(tmp_path / "d")
    async with ScriptedModel(steps) as model:
        options = [
            "--model", "m", "--base-url", model.base_url, "--mcp-url", unit_server.url,
            "--mcp-token-file", unit_server.token_file(tmp_path), "--presets", str(presets),
        ]  # fmt: skip
        run = [*options, "--session", "ses-presets", "edit greeter"]
        asked = await ask_on_a_terminal_then_die(data, run, wait=30)
        assert 'Allow preset_activate (shell) with {"name": "edit"}?' in asked
        offered = model.requests[0].tool_names
        assert "unit_read_source" not in offered and {"unit_list", "preset_activate"} <= set(offered)

        assert main(["--data-dir", data, "sessions", "pending", "ses-presets"]) == 0
        (line,) = capsys.readouterr().out.strip().splitlines()
        request_id = line.split()[0]
        code, out, err = await agent_cli("--data-dir", data, "answer", "ses-presets", request_id, "approve", *options)
        assert code == 0, err
        assert out.strip().startswith("Activated: preset edit is active")

        # a later process finds the preset active: its tools are offered (approved by the policy, no terminal)
        code, out, err = await agent_cli(
            "--data-dir", data, "run", *options, "--allow", "filesystem-read", "--session", "ses-presets", "read it"
        )  # fmt: skip
        assert code == 0, err
        assert out.strip() == "Now I can read."
        assert "unit_read_source" in model.requests[-1].tool_names

    assert main(["--data-dir", data, "sessions", "show", "ses-presets"]) == 0
    assert "preset-activated" in capsys.readouterr().out


async def test_a_broken_preset_file_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('[[preset]]\nname = "x"\n')
    code, _, err = await agent_cli(
        "run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--presets", str(bad), "hi"
    )
    assert code == 2 and "argument --presets: p.toml: preset #1 is invalid: tools: Field required" in err
