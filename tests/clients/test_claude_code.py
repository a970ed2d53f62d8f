"""The real Claude Code (npm @anthropic-ai/claude-code, pinned) headless against this server over Streamable
HTTP, SSE and stdio, its model a scripted Anthropic Messages endpoint on loopback.

Over HTTP it runs exactly the command the server printed (CLAUDE_CMD and its --mcp-config file). Everything is
asserted on what the model was sent: only the unit tools offered, a call's result and a refusal in the next
requests, and with a wrong token no unit tool at all (Claude Code exits 0 either way).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

from unit_mcp.clients import Endpoint, claude_config
from unit_mcp.testing import Match, RecordedRequest, ScriptedModel, call, say, tool_call
from unit_mcp.tools import tool_risks

from .conftest import SERVER, client_env, stdio_command

UNIT_TOOLS = sorted(f"mcp__{SERVER}__{name}" for name in tool_risks())
READ = f"mcp__{SERVER}__unit_read_source"
PROMPT = "Read the counter unit's source, then try a file outside it."


def script() -> list:  # type: ignore[type-arg]
    after_tool = Match(last_role="tool")
    return [
        call(tool_call(READ, {"unit_id": "counter", "source_id": "__init__.py"}), when=Match(has_tools=True)),
        call(tool_call(READ, {"unit_id": "counter", "source_id": "../secret.py"}), when=after_tool),
        say("The counter steps by one; the file outside the unit was refused.", when=after_tool),
    ]


def run_claude(binary: Path, command: list[str], model: ScriptedModel, home: Path) -> subprocess.CompletedProcess[str]:
    """`claude -p` headless with the given MCP arguments, its model the scripted one."""
    # MCP_CONNECTION_NONBLOCKING=0: wait for the server before the first model request (by default Claude Code
    # waits up to 5 s, and a stdio server starting on a busy machine can take longer).
    env = client_env(
        home, ANTHROPIC_BASE_URL=model.url, ANTHROPIC_API_KEY="scripted-key", MCP_CONNECTION_NONBLOCKING="0"
    )
    argv = [str(binary), *command[1:], "-p", PROMPT, "--output-format", "stream-json", "--verbose"]
    argv += ["--no-session-persistence", "--model", "claude-scripted"]
    return subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=120, check=False)


def explain(done: subprocess.CompletedProcess[str], requests: list[RecordedRequest]) -> str:
    seen = [(r.path, r.tool_names[:3], r.last_message.get("role"), r.error) for r in requests]
    return f"exit {done.returncode}\nrequests: {seen}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-2000:]}"


def printed_command(server: dict[str, str], transport: str, tmp_path: Path, units: Path) -> list[str]:
    """Over HTTP the printed CLAUDE_CMD as is; over SSE and stdio the same command on another config."""
    command = shlex.split(server["CLAUDE_CMD"])
    assert (
        command[0] == "claude"
        and "--strict-mcp-config" in command
        and command[-2:] == ["--allowedTools", f"mcp__{SERVER}"]
    )
    if transport == "http":
        return command
    config = tmp_path / f"claude-{transport}.json"
    if transport == "sse":
        endpoint = Endpoint(
            url=server["MCP_URL"], sse_url=server["MCP_SSE_URL"], token=server["MCP_TOKEN"], name=SERVER
        )
        data = claude_config(endpoint, transport="sse")
    else:
        executable, args = stdio_command(units, tmp_path / "stdio-data")
        data = {"mcpServers": {SERVER: {"type": "stdio", "command": executable, "args": args}}}
    config.write_text(json.dumps(data), encoding="utf-8")
    command[command.index("--mcp-config") + 1] = str(config)
    return command


@pytest.mark.parametrize("transport", ["http", "sse", "stdio"])
def test_claude_code_uses_only_the_unit_tools(
    transport: str, client_binaries: dict[str, Path], server: dict[str, str], units: Path, tmp_path: Path
) -> None:
    command = printed_command(server, transport, tmp_path, units)
    with ScriptedModel(script()) as model:
        done = run_claude(client_binaries["claude"], command, model, tmp_path / "home")
        requests = list(model.requests)
    why = explain(done, requests)
    assert not model.remaining, why
    main = [r for r in requests if r.tool_names]
    assert len(main) == 3, why
    for request in main:
        assert sorted(request.tool_names) == UNIT_TOOLS, why  # only the unit tools: no built-in, no other server

    assert {r.api_key for r in requests} == {"scripted-key"}, why

    result = main[1].last_message
    assert result["role"] == "tool" and not result["is_error"], why
    read = json.loads(result["content"])
    assert read["unit_id"] == "counter" and read["hash"].startswith("sha256:") and "def init" in read["content"]

    refusal = main[2].last_message
    assert refusal["role"] == "tool" and refusal["is_error"] is True, why
    assert refusal["content"].startswith("[invalid_source_id] "), refusal


def test_claude_code_with_a_wrong_token_offers_no_unit_tool(
    client_binaries: dict[str, Path], server: dict[str, str], tmp_path: Path
) -> None:
    endpoint = Endpoint(url=server["MCP_URL"], sse_url=server["MCP_SSE_URL"], token="wrong-token", name=SERVER)
    config = tmp_path / "claude-wrong-token.json"
    config.write_text(json.dumps(claude_config(endpoint)), encoding="utf-8")
    command = shlex.split(server["CLAUDE_CMD"])
    command[command.index("--mcp-config") + 1] = str(config)
    with ScriptedModel([say("I have no unit tools.", repeat=True)]) as model:
        done = run_claude(client_binaries["claude"], command, model, tmp_path / "home")
        requests = list(model.requests)
    why = explain(done, requests)
    assert requests, why  # the model was asked (so the run got that far) …
    for request in requests:
        assert not [name for name in request.tool_names if name.startswith("mcp__")], why  # … without a unit tool
    init = next(json.loads(line) for line in done.stdout.splitlines() if '"subtype":"init"' in line)
    assert {"name": SERVER, "status": "failed"} in init["mcp_servers"], init["mcp_servers"]
