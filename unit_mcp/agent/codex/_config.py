"""The isolated `config.toml` a Codex run reads: one model, one MCP server, nothing else Codex could reach.

No native tools, retries, analytics or update checks (the keys are checked against the pinned Codex with
`--strict-config`); the approval-filtered endpoint is the one required MCP server. Secrets are never written:
the config names the environment variables that carry them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PINNED_VERSION = "0.171.0"
MODEL_KEY_ENV = "UNIT_MCP_CODEX_MODEL_KEY"
MCP_TOKEN_ENV = "UNIT_MCP_CODEX_MCP_TOKEN"
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True)
class CodexModel:
    """The model a Codex agent uses: its own choice, from the agent's configuration, never the runner's.

    `base_url` is a Responses API base (`http://127.0.0.1:PORT/v1`); `api_key` reaches Codex only through
    the environment. `stream_idle_timeout` bounds a stream that stops sending (seconds)."""

    name: str
    base_url: str
    provider_id: str = "unit-mcp-model"
    provider_name: str = "unit-mcp model"
    api_key: str | None = None
    context_window: int = 128_000
    stream_idle_timeout: float = 60.0


@dataclass(frozen=True)
class McpServer:
    """The one MCP server a run may use (Streamable HTTP), with the bearer token it needs, if any."""

    name: str
    url: str
    token: str | None = None
    startup_timeout: float = 10.0
    tool_timeout: float = 300.0


def model_catalog(model: CodexModel) -> dict[str, Any]:
    """Codex's metadata for the model: no shell tool (`shell_type = disabled`), no reasoning, no apply_patch."""
    return {
        "models": [
            {
                "slug": model.name,
                "display_name": model.name,
                "description": f"{model.name} served by {model.provider_name}",
                "supported_reasoning_levels": [],
                "shell_type": "disabled",
                "visibility": "list",
                "supported_in_api": True,
                "priority": 1,
                "upgrade": None,
                "base_instructions": "",
                "supports_reasoning_summaries": False,
                "support_verbosity": False,
                "default_verbosity": None,
                "apply_patch_tool_type": None,
                "truncation_policy": {"mode": "bytes", "limit": 10_000},
                "supports_parallel_tool_calls": True,
                "context_window": model.context_window,
                "experimental_supported_tools": [],
                "input_modalities": ["text"],
            }
        ]
    }


def codex_config(
    model: CodexModel, server: McpServer, *, catalog_path: str, instructions: str | None = None
) -> dict[str, Any]:
    """The whole config as data; `dumps_toml` writes it. `instructions` become Codex's developer message."""
    mcp: dict[str, Any] = {
        "url": server.url,
        "required": True,
        "startup_timeout_sec": _seconds(server.startup_timeout),
        "tool_timeout_sec": _seconds(server.tool_timeout),
        "default_tools_approval_mode": "approve",
    }
    if server.token is not None:
        mcp["bearer_token_env_var"] = MCP_TOKEN_ENV
    config: dict[str, Any] = {
        "model": model.name,
        "model_provider": model.provider_id,
        "model_catalog_json": catalog_path,
        "approval_policy": "never",
        "sandbox_mode": "read-only",
        "web_search": "disabled",
        "check_for_update_on_startup": False,
        "project_doc_max_bytes": 0,
    }
    if instructions:
        config["developer_instructions"] = instructions
    config["analytics"] = {"enabled": False}
    config["features"] = {
        "plugins": False,
        "shell_tool": False,
        "unified_exec": False,
        "view_image": False,  # reads image files from anywhere the read-only sandbox can see
        "image_generation": False,
        "goals": False,
        "apps": False,
        "unbounded_connection_retries": False,
    }
    config["agents"] = {"enabled": False}
    config["skills"] = {"include_instructions": False, "bundled": {"enabled": False}}
    config["model_providers"] = {
        model.provider_id: {
            "name": model.provider_name,
            "base_url": model.base_url,
            "wire_api": "responses",
            "env_key": MODEL_KEY_ENV,
            "request_max_retries": 0,
            "stream_max_retries": 0,
            "stream_idle_timeout_ms": max(1, round(model.stream_idle_timeout * 1000)),
        }
    }
    config["mcp_servers"] = {server.name: mcp}
    return config


def config_env(model: CodexModel, server: McpServer) -> dict[str, str]:
    """The secrets the config refers to by name (Codex requires the model's key variable to be set)."""
    env = {MODEL_KEY_ENV: model.api_key or "unused"}
    if server.token is not None:
        env[MCP_TOKEN_ENV] = server.token
    return env


def dumps_catalog(model: CodexModel) -> str:
    return json.dumps(model_catalog(model), indent=2) + "\n"


def dumps_toml(config: Mapping[str, Any]) -> str:
    """TOML for nested tables of strings, numbers, booleans and lists of those (all a Codex config needs);
    scalars first, then each sub-table under its dotted header."""
    lines: list[str] = []
    _table(config, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _table(table: Mapping[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {key: value for key, value in table.items() if value is not None and not isinstance(value, Mapping)}
    tables = {key: value for key, value in table.items() if isinstance(value, Mapping)}
    if path and (scalars or not tables):
        lines += ["", "[" + ".".join(_key(part) for part in path) + "]"]
    lines += [f"{_key(key)} = {_value(value)}" for key, value in scalars.items()]
    for key, value in tables.items():
        _table(value, [*path, key], lines)


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML value {value!r} is not a finite number")
        return repr(value)
    if isinstance(value, str):
        # a JSON string is a TOML basic string, once DEL (which JSON leaves raw) is escaped too
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(item) for item in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _seconds(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)
