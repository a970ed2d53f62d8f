"""The real Gemini CLI (npm @google/gemini-cli, pinned) headless against this server over Streamable HTTP,
SSE and stdio, its model a scripted Gemini endpoint on loopback.

Over HTTP it runs with exactly the GEMINI_CLI_HOME the server printed. Gemini adds `wait_for_previous` to
every tool and tells its model to set it on dependent calls; the scripted model does, so the chained call
proves the server accepts it. Everything is asserted on what the model was sent: only the unit tools
offered, a call's result and a refusal in the next requests, and with a wrong token no unit tool at all
(Gemini CLI exits 0 either way).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from unit_mcp.clients import Endpoint, gemini_server_entry, gemini_settings
from unit_mcp.testing import Match, RecordedRequest, ScriptedModel, call, say, tool_call
from unit_mcp.tools import tool_risks

from .conftest import SERVER, client_env, stdio_command

MODEL = "gemini-2.5-flash"
PREFIX = f"mcp_{SERVER}_"
UNIT_TOOLS = sorted(f"{PREFIX}{name}" for name in tool_risks())
READ = f"{PREFIX}unit_read_source"
PROMPT = "Read the counter unit's source, then try a file outside it."


def script() -> list:  # type: ignore[type-arg]
    after_tool = Match(last_role="tool")
    source = {"unit_id": "counter", "source_id": "__init__.py"}
    outside = {"unit_id": "counter", "source_id": "../secret.py", "wait_for_previous": True}
    return [
        call(tool_call(READ, source), when=Match(has_tools=True, last_role="user")),
        call(tool_call(READ, outside), when=after_tool),
        say("The counter steps by one; the file outside the unit was refused.", when=after_tool),
    ]


def run_gemini(binary: Path, gemini_home: Path, model: ScriptedModel, home: Path) -> subprocess.CompletedProcess[str]:
    env = client_env(
        home,
        GEMINI_CLI_HOME=str(gemini_home),
        GEMINI_API_KEY="scripted-key",
        GOOGLE_GEMINI_BASE_URL=model.url,
        GEMINI_CLI_TRUST_WORKSPACE="true",
    )
    argv = [str(binary), "-p", PROMPT, "-m", MODEL, "--output-format", "stream-json"]
    return subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=120, check=False)


def explain(done: subprocess.CompletedProcess[str], requests: list[RecordedRequest]) -> str:
    seen = [(r.path, r.tool_names[:3], r.last_message.get("role"), r.error) for r in requests]
    return f"exit {done.returncode}\nrequests: {seen}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


def gemini_home(server: dict[str, str], transport: str, tmp_path: Path, units: Path, token: str | None = None) -> Path:
    """Over HTTP the printed GEMINI_CLI_HOME (copied, so runs do not share state); else its settings with
    the server entry for SSE or stdio (or a wrong token)."""
    printed = Path(server["GEMINI_CLI_HOME"])
    home = tmp_path / f"gemini-{transport}"
    shutil.copytree(printed, home)
    settings_path = home / ".gemini" / "settings.json"
    settings = json.loads(settings_path.read_text(encoding="utf-8"))
    assert settings == gemini_settings(settings["mcpServers"]) and list(settings["mcpServers"]) == [SERVER]
    if transport == "http" and token is None:
        return home
    endpoint = Endpoint(
        url=server["MCP_URL"], sse_url=server["MCP_SSE_URL"], token=token or server["MCP_TOKEN"], name=SERVER
    )
    if transport == "stdio":
        executable, args = stdio_command(units, tmp_path / "stdio-data")
        entry = {"command": executable, "args": args, "trust": True}
    else:
        entry = gemini_server_entry(endpoint, transport=transport)
    settings_path.write_text(json.dumps(gemini_settings({SERVER: entry})), encoding="utf-8")
    return home


@pytest.mark.parametrize("transport", ["http", "sse", "stdio"])
def test_gemini_cli_uses_only_the_unit_tools(
    transport: str, client_binaries: dict[str, Path], server: dict[str, str], units: Path, tmp_path: Path
) -> None:
    home = gemini_home(server, transport, tmp_path, units)
    with ScriptedModel(script()) as model:
        done = run_gemini(client_binaries["gemini"], home, model, tmp_path / "home")
        requests = list(model.requests)
    why = explain(done, requests)
    assert not model.remaining, why
    main = [r for r in requests if r.tool_names]
    assert len(main) == 3, why
    for request in main:
        assert sorted(request.tool_names) == UNIT_TOOLS, why  # only the unit tools: every built-in excluded

    assert {r.api_key for r in requests} == {"scripted-key"}, why

    result = main[1].last_message
    assert result["role"] == "tool" and not result["is_error"], why
    read = json.loads(result["content"])
    assert read["unit_id"] == "counter" and read["hash"].startswith("sha256:") and "def init" in read["content"]

    refusal = main[2].last_message  # the call carried wait_for_previous: the refusal is about the source id
    assert refusal["role"] == "tool" and refusal["is_error"] is True, why
    assert "[invalid_source_id]" in refusal["content"], refusal
    assert '"wait_for_previous":true' in refusal["content"]  # Gemini echoes the call: the argument went out …
    assert "Extra inputs are not permitted" not in refusal["content"]  # … and the server did not refuse it


def test_gemini_cli_with_a_wrong_token_offers_no_unit_tool(
    client_binaries: dict[str, Path], server: dict[str, str], units: Path, tmp_path: Path
) -> None:
    home = gemini_home(server, "http", tmp_path, units, token="wrong-token")
    with ScriptedModel([say("I have no unit tools.", repeat=True)]) as model:
        done = run_gemini(client_binaries["gemini"], home, model, tmp_path / "home")
        requests = list(model.requests)
    why = explain(done, requests)
    assert requests, why  # the model was asked (so the run got that far) …
    for request in requests:
        assert not [name for name in request.tool_names if name.startswith(PREFIX)], why  # … without a unit tool
