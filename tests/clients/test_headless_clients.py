"""The real Claude Code (npm @anthropic-ai/claude-code) and Gemini CLI (npm @google/gemini-cli), both pinned,
headless against this server over Streamable HTTP, SSE and stdio, each with its model a scripted endpoint on
loopback in its own API (Anthropic Messages, Gemini).

Over HTTP each runs exactly what the server printed: Claude Code the CLAUDE_CMD and its --mcp-config file,
Gemini CLI the GEMINI_CLI_HOME. Gemini adds `wait_for_previous` to every tool and tells its model to set it on
dependent calls; the scripted model does, so the chained call proves the server accepts it. Everything is
asserted on what the model was sent: only the unit tools offered, a call's result and a refusal in the next
requests, and with a wrong token no unit tool at all (both exit 0 either way).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from unit_mcp.clients import GEMINI_VERSION, Endpoint, claude_config, gemini_server_entry, gemini_settings
from unit_mcp.testing import Match, RecordedRequest, ScriptedModel, Step, call, say, tool_call
from unit_mcp.tools import tool_risks

from .conftest import SERVER, client_env, stdio_command

PROMPT = "Read the counter unit's source, then try a file outside it."
Run = Callable[[Path, dict[str, str], str, Path, Path, ScriptedModel, str | None], subprocess.CompletedProcess[str]]


def run(argv: list[str], env: dict[str, str], home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=home, capture_output=True, text=True, timeout=120, check=False)


def endpoint(server: dict[str, str], token: str | None = None) -> Endpoint:
    return Endpoint(
        url=server["MCP_URL"], sse_url=server["MCP_SSE_URL"], token=token or server["MCP_TOKEN"], name=SERVER
    )


def run_claude(
    binary: Path, server: dict[str, str], transport: str, units: Path, tmp_path: Path, model: ScriptedModel,
    token: str | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`claude -p` headless: over HTTP the printed CLAUDE_CMD as is; else the same command on another config."""
    command = shlex.split(server["CLAUDE_CMD"])
    assert command[0] == "claude" and "--strict-mcp-config" in command
    assert command[-2:] == ["--allowedTools", f"mcp__{SERVER}"]
    if transport != "http" or token is not None:
        if transport == "stdio":
            executable, args = stdio_command(units, tmp_path / "stdio-data")
            data = {"mcpServers": {SERVER: {"type": "stdio", "command": executable, "args": args}}}
        else:
            data = claude_config(endpoint(server, token), transport=transport)
        config = tmp_path / f"claude-{transport}.json"
        config.write_text(json.dumps(data), encoding="utf-8")
        command[command.index("--mcp-config") + 1] = str(config)
    # MCP_CONNECTION_NONBLOCKING=0: wait for the server before the first model request (by default Claude Code
    # waits up to 5 s, and a stdio server starting on a busy machine can take longer); MCP_TIMEOUT: how long that
    # wait may be (default 30 s: a stdio server at a load of 17 took longer, and the request went without tools).
    home = tmp_path / "home"
    env = client_env(
        home,
        ANTHROPIC_BASE_URL=model.url,
        ANTHROPIC_API_KEY="scripted-key",
        MCP_CONNECTION_NONBLOCKING="0",
        MCP_TIMEOUT="60000",
    )
    argv = [str(binary), *command[1:], "-p", PROMPT, "--output-format", "stream-json", "--verbose"]
    return run([*argv, "--no-session-persistence", "--model", "claude-scripted"], env, home)


def run_gemini(
    binary: Path, server: dict[str, str], transport: str, units: Path, tmp_path: Path, model: ScriptedModel,
    token: str | None = None,
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`gemini -p` headless: over HTTP the printed GEMINI_CLI_HOME (copied, so runs do not share state); else its
    settings with the server entry for SSE or stdio (or a wrong token)."""
    gemini_home = tmp_path / f"gemini-{transport}"
    shutil.copytree(Path(server["GEMINI_CLI_HOME"]), gemini_home)
    settings_path = gemini_home / ".gemini" / "settings.json"
    settings = json.loads(settings_path.read_text(encoding="utf-8"))
    assert settings == gemini_settings(settings["mcpServers"]) and list(settings["mcpServers"]) == [SERVER]
    if transport != "http" or token is not None:
        if transport == "stdio":
            executable, args = stdio_command(units, tmp_path / "stdio-data")
            entry = {"command": executable, "args": args, "trust": True}
        else:
            entry = gemini_server_entry(endpoint(server, token), transport=transport)
        settings_path.write_text(json.dumps(gemini_settings({SERVER: entry})), encoding="utf-8")
    home = tmp_path / "home"
    env = client_env(
        home,
        GEMINI_CLI_HOME=str(gemini_home),
        GEMINI_API_KEY="scripted-key",
        GOOGLE_GEMINI_BASE_URL=model.url,
        GEMINI_CLI_TRUST_WORKSPACE="true",
    )
    return run([str(binary), "-p", PROMPT, "-m", "gemini-2.5-flash", "--output-format", "stream-json"], env, home)


@dataclass(frozen=True)
class Cli:
    run: Run
    prefix: str
    """How the client names a tool of the server (before the tool's own name)."""
    injected: dict[str, Any]
    """What the client adds to the arguments of a dependent call."""
    first: Match
    """The client's first request to the model with the tools (Claude Code ends it with the servers' instructions)."""

    def script(self) -> list[Step]:
        read, after_tool = f"{self.prefix}unit_read_source", Match(last_role="tool")
        source = {"unit_id": "counter", "source_id": "__init__.py"}
        outside = {"unit_id": "counter", "source_id": "../secret.py", **self.injected}
        return [
            call(tool_call(read, source), when=self.first),
            call(tool_call(read, outside), when=after_tool),
            say("The counter steps by one; the file outside the unit was refused.", when=after_tool),
        ]


CLIS = {
    "claude": Cli(run_claude, f"mcp__{SERVER}__", {}, Match(has_tools=True)),
    "gemini": Cli(run_gemini, f"mcp_{SERVER}_", {"wait_for_previous": True}, Match(has_tools=True, last_role="user")),
}


def explain(done: subprocess.CompletedProcess[str], requests: list[RecordedRequest]) -> str:
    seen = [(r.path, r.tool_names[:3], r.last_message.get("role"), r.error) for r in requests]
    return f"exit {done.returncode}\nrequests: {seen}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("transport", ["http", "sse", "stdio"])
@pytest.mark.parametrize("client", list(CLIS))
def test_client_uses_only_the_unit_tools(
    client: str, transport: str, client_binaries: dict[str, Path], server: dict[str, str], units: Path, tmp_path: Path
) -> None:
    cli = CLIS[client]
    with ScriptedModel(cli.script()) as model:
        done = cli.run(client_binaries[client], server, transport, units, tmp_path, model, None)
        requests = list(model.requests)
    why = explain(done, requests)
    assert not model.remaining, why
    main = [r for r in requests if r.tool_names]
    assert len(main) == 3, why
    for request in main:  # only the unit tools: no built-in, no other server
        assert sorted(request.tool_names) == sorted(cli.prefix + name for name in tool_risks()), why
    assert {r.api_key for r in requests} == {"scripted-key"}, why

    result = main[1].last_message
    assert result["role"] == "tool" and not result["is_error"], why
    read = json.loads(result["content"])
    assert read["unit_id"] == "counter" and read["hash"].startswith("sha256:") and "def init" in read["content"]

    refusal = main[2].last_message
    assert refusal["role"] == "tool" and refusal["is_error"] is True, why
    assert "[invalid_source_id] " in refusal["content"], refusal
    if cli.injected:  # Gemini echoes the call: the injected argument went out, and the server did not refuse it
        assert '"wait_for_previous":true' in refusal["content"]
        assert "Extra inputs are not permitted" not in refusal["content"]


@pytest.mark.parametrize("client", list(CLIS))
def test_client_with_a_wrong_token_offers_no_unit_tool(
    client: str, client_binaries: dict[str, Path], server: dict[str, str], units: Path, tmp_path: Path
) -> None:
    cli = CLIS[client]
    with ScriptedModel([say("I have no unit tools.", repeat=True)]) as model:
        done = cli.run(client_binaries[client], server, "http", units, tmp_path, model, "wrong-token")
        requests = list(model.requests)
    why = explain(done, requests)
    assert requests, why  # the model was asked (so the run got that far) …
    for request in requests:
        assert not [name for name in request.tool_names if name.startswith(cli.prefix)], why  # … without a unit tool
    if client == "claude":  # Claude Code also says so in its init event
        init = next(json.loads(line) for line in done.stdout.splitlines() if '"subtype":"init"' in line)
        assert {"name": SERVER, "status": "failed"} in init["mcp_servers"], init["mcp_servers"]


def test_the_pinned_gemini_is_the_one_its_settings_were_checked_against(client_binaries: dict[str, Path]) -> None:
    """The tests above check the allow-lists on this version; a new pin needs them run (and GEMINI_VERSION moved)."""
    package = client_binaries["gemini"].resolve().parents[1] / "package.json"
    assert json.loads(package.read_text(encoding="utf-8"))["version"] == GEMINI_VERSION
