"""`--confirm shell` with the real Claude Code, headless (`claude -p`) from the printed CLAUDE_CMD: it declares
MCP elicitation but, with nobody at its prompt, dismisses the question at once (`cancel`), so the call waits for
the unit server's page, and the patch is written only after a yes there. With an `Elicitation` hook (a command
that puts the question to a person some other way) it answers through the client itself."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from pathlib import Path

import anyio
import pytest
from support.confirm_page import answer_on_page, logged_changes, not_yet_in
from support.server_process import ServerProcess

from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import REPO, SERVER, client_env

pytestmark = pytest.mark.anyio
DISMISSED = "was not answered through the client (the client dismissed the question without a choice"
PATCH = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Howdy"}
SCRIPT = [
    call(tool_call(f"mcp__{SERVER}__unit_apply_patch", PATCH), when=Match(has_tools=True)),
    say("Done.", when=Match(last_role="tool")),
]


def confirming_server(tmp_path: Path) -> tuple[Path, Path, ServerProcess]:
    """A server asking before every shell call, on a copy of the example units: the units, its data dir, itself."""
    units, data = tmp_path / "units", tmp_path / "data"
    shutil.copytree(REPO / "unit_mcp" / "examples" / "units", units, ignore=shutil.ignore_patterns("__pycache__"))
    args = ["--no-watch", "--confirm", "shell", "--units", str(units), "--data-dir", str(data)]
    return units, data, ServerProcess(*args, tmp=tmp_path)


def headless_claude(
    claude: Path, printed: dict[str, str], model: ScriptedModel, home: Path, *options: str
) -> tuple[list[str], dict[str, str]]:
    """`claude -p` from the printed CLAUDE_CMD on the scripted model, with `options`: its argv and environment."""
    command = shlex.split(printed["CLAUDE_CMD"])
    env = client_env(
        home, ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="scripted-key", MCP_CONNECTION_NONBLOCKING="0"
    )
    argv = [str(claude), *command[1:], *options, "--output-format", "stream-json", "--verbose"]
    return [*argv, "--no-session-persistence", "--model", "claude-scripted"], env


@pytest.mark.parametrize("approve", [True, False])
async def test_claude_code_writes_only_after_a_yes_on_the_page(
    tmp_path: Path, client_binaries: dict[str, Path], approve: bool
) -> None:
    units, data, server = confirming_server(tmp_path)
    try:
        printed = server.ready(last="UNITS_UI_URL")
        with ScriptedModel(SCRIPT) as model:
            home = tmp_path / "home"
            argv, env = headless_claude(client_binaries["claude"], printed, model, home, "-p", "Greet with Howdy.")
            with anyio.fail_after(180):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: anyio.run_process(argv, env=env, cwd=home, check=False))
                    while DISMISSED not in (data / "logs" / "app.log").read_text(encoding="utf-8"):
                        await anyio.sleep(0.1)  # Claude Code was asked, and dismissed it: the page decides
                    shown = await answer_on_page(
                        printed["UNITS_UI_URL"], approve, before=not_yet_in(units / "greeter.py", "Howdy")
                    )
            requests = list(model.requests)
        assert not model.remaining, requests
    finally:
        assert server.stop() == 0
    assert "unit_apply_patch" in shown and "claude-code" in shown and "Howdy" in shown  # tool, client, diff
    result = requests[-1].last_message  # what reached the model after the call
    assert result["role"] == "tool" and result["is_error"] is not approve, result
    if approve:
        assert json.loads(result["content"])["reload"]["reloaded"] is True, result
    else:
        assert result["content"].startswith("[declined] "), result
    assert ("Howdy" in (units / "greeter.py").read_text()) is approve
    outcomes = [c.outcome for c in logged_changes(data)]
    assert outcomes == (["asked", "approved", "applied"] if approve else ["asked", "declined"])


HOOK = """import json, pathlib, sys, time
here = pathlib.Path(sys.argv[1])
(here / "asked.tmp").write_text(sys.stdin.read())
(here / "asked.tmp").rename(here / "asked.json")
while not (here / "answer").exists():
    time.sleep(0.1)
yes = (here / "answer").read_text() == "yes"
output = {"hookEventName": "Elicitation", "action": "accept", "content": {"approve": yes}}
print(json.dumps({"hookSpecificOutput": output}))
"""


@pytest.mark.parametrize("approve", [True, False])
async def test_claude_code_answers_through_its_elicitation_hook(
    tmp_path: Path, client_binaries: dict[str, Path], approve: bool
) -> None:
    """The hook stands for the person: it gets the question (with the diff) and gives the answer it is told."""
    units, data, server = confirming_server(tmp_path)
    person = tmp_path / "person"
    person.mkdir()
    (person / "hook.py").write_text(HOOK)
    hook = {"type": "command", "command": f"{shlex.quote(sys.executable)} {person / 'hook.py'} {person}"}
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"hooks": {"Elicitation": [{"matcher": SERVER, "hooks": [hook]}]}}))
    try:
        printed = server.ready(last="UNITS_UI_URL")
        with ScriptedModel(SCRIPT) as model:
            home = tmp_path / "home"
            claude = client_binaries["claude"]
            argv, env = headless_claude(claude, printed, model, home, "--settings", str(settings), "-p", "Greet.")
            with anyio.fail_after(180):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(lambda: anyio.run_process(argv, env=env, cwd=home, check=False))
                    while not (person / "asked.json").exists():
                        await anyio.sleep(0.1)
                    asked = json.loads((person / "asked.json").read_text())
                    assert "Howdy" not in (units / "greeter.py").read_text()  # nothing written before the answer
                    (person / "answer.tmp").write_text("yes" if approve else "no")
                    (person / "answer.tmp").rename(person / "answer")  # whole, as the hook reads it
            requests = list(model.requests)
        assert not model.remaining, requests
    finally:
        assert server.stop() == 0
    assert asked["mcp_server_name"] == SERVER and "unit_apply_patch (risk shell)" in asked["message"]
    assert "+" in asked["message"] and "Howdy" in asked["message"]  # the diff
    result = requests[-1].last_message
    assert result["role"] == "tool" and result["is_error"] is not approve, result
    assert ("Howdy" in (units / "greeter.py").read_text()) is approve
    log = (data / "logs" / "app.log").read_text(encoding="utf-8")
    assert f"question 1 answered {'yes' if approve else 'no'} by the client" in log
