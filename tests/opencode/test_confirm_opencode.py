"""`--confirm shell` with the real OpenCode (it shows no MCP elicitation): its patch waits for a person's answer
on the unit server's page, and writes only after a yes. OpenCode runs from the printed config with the scripted
model; the answer is given over HTTP as the page's buttons give it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
from support.confirm_page import answer_on_page, logged_changes, not_yet_in
from support.server_process import ServerProcess

from unit_mcp.agent.opencode import IsolatedRoot, opencode_tool_name
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .opencode_stack import EXAMPLE_UNITS, MODEL, scripted_provider, title_step

pytestmark = pytest.mark.anyio
PATCH = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Howdy"}


@pytest.mark.parametrize("approve", [True, False])
async def test_opencode_writes_only_after_a_yes_on_the_page(
    tmp_path: Path, opencode_binary: Path, approve: bool
) -> None:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "server-data"
    server = ServerProcess("--confirm", "shell", "--units", str(units), "--data-dir", str(data), tmp=tmp_path)
    patch = opencode_tool_name("unit-dev", "unit_apply_patch")
    script = [
        title_step(),
        call(tool_call(patch, PATCH), when=Match(last_role="user", has_tools=True)),
        say("Done.", when=Match(last_role="tool")),
    ]
    try:
        printed = server.ready(last="UNITS_UI_URL")
        async with ScriptedModel(script) as model:
            root = IsolatedRoot(tmp_path / "opencode-run", config_home=Path(printed["OPENCODE_XDG_CONFIG_HOME"]))
            root.add_config(scripted_provider(model.base_url))
            argv = [str(opencode_binary), "run", "--model", MODEL, "--format", "json", "Greet", "with", "Howdy."]
            runs: list[bytes] = []

            async def opencode() -> None:
                done = await anyio.run_process(argv, cwd=root.workdir, env=root.env(), check=False)
                runs.append(done.stdout)

            with anyio.fail_after(180):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(opencode)
                    shown = await answer_on_page(
                        printed["UNITS_UI_URL"], approve, before=not_yet_in(units / "greeter.py", "Howdy")
                    )
            model.assert_done()
    finally:
        server.stop()
    assert "unit_apply_patch" in shown and "+" in shown and "Howdy" in shown  # the tool and the diff were shown
    events = [json.loads(line) for line in runs[0].decode().splitlines() if line.startswith("{")]
    uses = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert [u["tool"] for u in uses] == [patch], events
    assert ("Howdy" in (units / "greeter.py").read_text()) is approve
    output = uses[0]["state"].get("output") or uses[0]["state"].get("error") or ""
    assert ("[declined]" in output) is not approve, uses[0]
    outcomes = [c.outcome for c in logged_changes(data)]
    assert outcomes == (["asked", "approved", "applied"] if approve else ["asked", "declined"])
