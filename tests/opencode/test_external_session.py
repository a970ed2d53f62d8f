"""An external OpenCode session developing a unit through the server's printed config, end to end.

`python -m unit_mcp.server` runs as a child process on a copy of the example units; `opencode run` runs
with XDG_CONFIG_HOME set to the printed value (the deny-all config) plus only the scripted provider
(OPENCODE_CONFIG, which may not carry permissions). The scripted model lists the units, reads a source,
patches it with the hash it read, runs the unit's tests and reloads it. Everything is asserted from the
server's side (its app log, the file on disk) and from what OpenCode sent the model.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import anyio
import pytest
from support.server_process import ServerProcess

from unit_mcp.agent.opencode import IsolatedRoot, opencode_tool_name
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call
from unit_mcp.tools import tool_risks

from .opencode_stack import EXAMPLE_UNITS, MODEL, scripted_provider, title_step

pytestmark = pytest.mark.anyio

SERVER = "unit-dev"  # the entry point's default --server-name
UNIT_TOOLS = sorted(tool_risks())
SEQUENCE = ["unit_list", "unit_read_source", "unit_apply_patch", "unit_run_tests", "unit_reload"]
_CALL_LINE = re.compile(r" unit_mcp\.tools: call (\w+) (.*?) ?(ok|refused)\b")


def t(name: str) -> str:
    return opencode_tool_name(SERVER, name)


def script() -> list:  # type: ignore[type-arg]
    source = {"unit_id": "counter", "source_id": "__init__.py"}
    read_hash = "{{tool:" + t("unit_read_source") + ".hash}}"  # the hash the model read, filled from that result
    after_tool = Match(last_role="tool")
    return [
        call(t("unit_list"), when=Match(last_role="user", has_tools=True)),
        call(tool_call(t("unit_read_source"), source), when=after_tool),
        call(
            tool_call(
                t("unit_apply_patch"), {**source, "old": "step = 1", "new": "step = 2", "expected_hash": read_hash}
            ),
            when=after_tool,
        ),
        call(tool_call(t("unit_run_tests"), {"unit_id": "counter"}), when=after_tool),
        call(tool_call(t("unit_reload"), {"unit_id": "counter"}), when=after_tool),
        say("counter now steps by 2; tests pass and it is reloaded.", when=after_tool),
    ]


async def test_external_opencode_session_develops_a_unit(tmp_path: Path, opencode_binary: Path) -> None:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    data = tmp_path / "server-data"
    server = ServerProcess("--units", str(units), "--data-dir", str(data), tmp=tmp_path)
    try:
        printed = server.ready()
        config_home = Path(printed["OPENCODE_XDG_CONFIG_HOME"])
        isolated_config = json.loads((config_home / "opencode" / "opencode.json").read_text())
        assert isolated_config["permission"] == {"*": "deny", f"{SERVER}_*": "allow"}

        async with ScriptedModel([title_step(), *script()], log_path=tmp_path / "model-requests.jsonl") as model:
            root = IsolatedRoot(tmp_path / "opencode-run", config_home=config_home)
            root.add_config(scripted_provider(model.base_url))
            words = ["Make", "the", "counter", "step", "by", "two,", "test", "it", "and", "reload", "it."]
            with anyio.fail_after(120):
                run = await anyio.run_process(
                    [str(opencode_binary), "run", "--model", MODEL, "--format", "json", *words],
                    cwd=root.workdir,
                    env=root.env(),
                    check=False,
                )
            output = run.stdout.decode()
            explain = f"exit {run.returncode}\nstdout:\n{output[-4000:]}\nstderr:\n{run.stderr.decode()[-4000:]}"
            assert run.returncode == 0, explain
            model.assert_done()
            requests = list(model.requests)
    finally:
        server.stop()

    # What OpenCode printed: the five tool uses, completed, in order, and the final text.
    events = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    uses = [e["part"] for e in events if e.get("type") == "tool_use"]
    assert [(u["tool"], u["state"]["status"]) for u in uses] == [(t(n), "completed") for n in SEQUENCE], explain
    evidence = json.loads(uses[-1]["state"]["output"])
    assert evidence["reloaded"] is True and evidence["unit_id"] == "counter", evidence
    assert "error" not in evidence["activity"]  # no error: the field is left out
    tests = json.loads(uses[3]["state"]["output"])
    assert tests["passed"] is True and tests["timed_out"] is False, tests

    # The server's side: exactly these calls, in this order, all accepted; the file changed; reloads happened.
    log = (data / "logs" / "app.log").read_text(encoding="utf-8")
    calls = [(m.group(1), m.group(3)) for m in _CALL_LINE.finditer(log)]
    assert calls == [(name, "ok") for name in SEQUENCE], log[-3000:]
    source = (units / "counter" / "__init__.py").read_text(encoding="utf-8")
    assert "step = 2\n" in source and "step = 1\n" not in source
    assert log.count("units.counter: counter dropped at") >= 2  # the patch's reload and the explicit one
    assert log.count("units.counter: counter ready at") >= 3  # start-up, then after each reload

    # What OpenCode offered the model: the ten unit tools of this server, and nothing else, every time.
    with_tools = [r for r in requests if r.tool_names]
    assert len(with_tools) == len(SEQUENCE) + 1
    for request in with_tools:
        assert sorted(request.tool_names) == [t(name) for name in UNIT_TOOLS], request.tool_names
