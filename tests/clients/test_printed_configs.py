"""The ready configs the server writes and prints, one line per client: their shapes point at this run's URL
and token, they are private to the user, and the printed Inspector line runs the pinned copy as pasted."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

from unit_mcp.clients import GEMINI_BUILTIN_TOOLS

from .conftest import REPO, SERVER, client_env


def _json(path: str | Path) -> dict:  # type: ignore[type-arg]
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_every_client_config_points_at_this_run(server: dict[str, str]) -> None:
    url, token = server["MCP_URL"], server["MCP_TOKEN"]
    bearer = {"Authorization": f"Bearer {token}"}

    command = shlex.split(server["CLAUDE_CMD"])
    assert command == [
        "claude",
        "--mcp-config",
        command[2],
        "--strict-mcp-config",
        "--tools",
        "",
        "--allowedTools",
        f"mcp__{SERVER}",
    ]
    assert _json(command[2]) == {"mcpServers": {SERVER: {"type": "http", "url": url, "headers": bearer}}}

    settings = _json(Path(server["GEMINI_CLI_HOME"]) / ".gemini" / "settings.json")
    assert settings["mcpServers"] == {SERVER: {"httpUrl": url, "headers": bearer, "trust": True}}
    assert settings["tools"]["exclude"] == list(GEMINI_BUILTIN_TOOLS)
    assert settings["telemetry"] == {"enabled": False} and settings["privacy"] == {"usageStatisticsEnabled": False}
    assert settings["general"]["enableAutoUpdate"] is False

    assert _json(server["CURSOR_MCP_JSON"]) == {"mcpServers": {SERVER: {"url": url, "headers": bearer}}}
    assert _json(server["VSCODE_MCP_JSON"]) == {"servers": {SERVER: {"type": "http", "url": url, "headers": bearer}}}

    launcher = Path(server["OPENCODE_CMD"])
    assert os.access(launcher, os.X_OK) and launcher.read_text().startswith("#!/bin/sh\n")
    clients = Path(server["DATA_DIR"]) / "clients"
    for path in [clients, *clients.rglob("*")]:  # they hold the token: nobody else may read them
        assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path


def test_the_printed_inspector_line_lists_the_tools(server: dict[str, str], tmp_path: Path) -> None:
    command = shlex.split(server["INSPECTOR_CMD"])
    assert command[0].startswith(str(REPO / ".cache" / "npm-tools")), "the pinned copy, on its own Node"
    env = client_env(tmp_path / "home")
    env["PATH"] = "/usr/bin:/bin"  # no Node on PATH: the line brings its own
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    names = [tool["name"] for tool in json.loads(done.stdout)["tools"]]
    assert "unit_read_source" in names and len(names) == 14, names
