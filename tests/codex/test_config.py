"""What a Codex run is given, without running Codex: the config and its TOML, the isolated home and its
environment, the prompt carrying earlier turns, and the events read from Codex's stdout."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from support.codex_parts import (
    CLIPPED,
    MCP_TOKEN_ENV,
    MODEL_KEY_ENV,
    CodexHome,
    McpServer,
    McpToolCall,
    codex_config,
    codex_prompt,
    dumps_toml,
    parse_line,
)

from unit_mcp.agent.codex import CodexModel
from unit_mcp.agent.items import MessageItem, ToolCallItem, ToolResultItem

MODEL = CodexModel(name="m-1", base_url="http://127.0.0.1:9/v1", api_key="model-secret")
SERVER = McpServer(name="unit-agent", url="http://127.0.0.1:8/mcp", token="mcp-secret")


def test_the_config_allows_one_model_and_one_mcp_server_and_nothing_native() -> None:
    config = codex_config(MODEL, SERVER, catalog_path="/x/catalog.json", instructions="Be careful.")
    assert (config["model"], config["model_provider"]) == ("m-1", "unit-mcp-model")
    assert (config["approval_policy"], config["sandbox_mode"], config["web_search"]) == (
        "never",
        "read-only",
        "disabled",
    )
    provider = config["model_providers"]["unit-mcp-model"]
    assert provider["wire_api"] == "responses" and provider["env_key"] == MODEL_KEY_ENV
    assert (provider["request_max_retries"], provider["stream_max_retries"]) == (0, 0)
    assert list(config["mcp_servers"]) == ["unit-agent"]
    mcp = config["mcp_servers"]["unit-agent"]
    assert mcp["required"] is True and mcp["default_tools_approval_mode"] == "approve"
    assert mcp["bearer_token_env_var"] == MCP_TOKEN_ENV
    features = config["features"]
    assert not any(features[name] for name in ("shell_tool", "unified_exec", "plugins", "view_image", "goals"))
    assert features["unbounded_connection_retries"] is False
    assert config["agents"] == {"enabled": False} and config["analytics"] == {"enabled": False}
    assert config["developer_instructions"] == "Be careful."
    text = dumps_toml(config)
    assert tomllib.loads(text) == config
    assert "model-secret" not in text and "mcp-secret" not in text  # secrets travel in the environment only


def test_toml_strings_and_keys_survive_any_text() -> None:
    tricky = 'quote " backslash \\ newline \n tab \t del \x7f nul \x00 unicode ü ✓ 🦀 ${HOME} [x]'
    data = {"a": tricky, "b": [1, 2.5, True, "x"], "dotted.key": {"with space": {"k": tricky}}, "empty": {}}
    assert tomllib.loads(dumps_toml(data)) == data


def test_the_home_and_its_environment_shut_out_the_callers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "the-users-key")
    monkeypatch.setenv("CODEX_HOME", "/home/user/.codex")
    home = CodexHome(parent=tmp_path)
    path = home.write(MODEL, SERVER, instructions="hi")
    assert path.parent == home.codex_home and path.stat().st_mode & 0o777 == 0o600
    config = tomllib.loads(path.read_text())
    catalog = json.loads(Path(config["model_catalog_json"]).read_text())
    assert catalog["models"][0]["slug"] == "m-1" and catalog["models"][0]["shell_type"] == "disabled"
    env = home.env(MODEL, SERVER)
    assert "OPENAI_API_KEY" not in env and env["CODEX_HOME"] == str(home.codex_home)
    assert env["HOME"] == str(home.home) and env[MODEL_KEY_ENV] == "model-secret" and env[MCP_TOKEN_ENV] == "mcp-secret"
    assert set(env) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "TZ",
        "HOME",
        "CODEX_HOME",
        "TMPDIR",
        "NO_COLOR",
        MODEL_KEY_ENV,
        MCP_TOKEN_ENV,
    }
    assert os.listdir(home.workdir) == []
    home.cleanup()
    assert not home.root.exists()


def test_a_follow_up_prompt_carries_the_earlier_turns_bounded() -> None:
    earlier = [
        MessageItem(role="user", content="echo x", turn_id="t1"),
        ToolCallItem(name="echo_token", arguments='{"token": "x"}', call_id="c1", turn_id="t1"),
        ToolResultItem(name="echo_token", output="x", call_id="c1", turn_id="t1"),
        MessageItem(role="assistant", content="x", turn_id="t1"),
    ]
    now = MessageItem(role="user", content="and again", turn_id="t2")
    assert codex_prompt([now], "t2", "and again") == "and again"
    prompt = codex_prompt([*earlier, now], "t2", "and again")
    assert prompt == (
        '## Conversation so far\nuser: echo x\ntool echo_token {"token": "x"} -> x\nassistant: x\n\n'
        "## Your task now\nand again"
    )
    long = [MessageItem(role="user", content="y" * 5000, turn_id=f"t{i}") for i in range(10)]
    clipped = codex_prompt([*long, now], "t2", "and again", limit=1000)
    assert CLIPPED in clipped and len(clipped) < 1200 and clipped.endswith("and again")


def test_events_are_read_loosely() -> None:
    assert parse_line("not json") is None and parse_line('{"no": "type"}') is None and parse_line("[1]") is None
    failed = parse_line('{"type": "turn.failed", "error": {"message": "boom"}}')
    assert failed is not None and failed.message == "boom"
    call = McpToolCall.model_validate(
        {
            "id": "item_0",
            "type": "mcp_tool_call",
            "server": "unit-agent",
            "tool": "unit_list",
            "arguments": {"a": 1},
            "result": {"content": [], "structured_content": {"units": []}},
            "status": "completed",
        }
    )
    assert call.arguments_json() == '{"a": 1}' and call.output_text() == '{"units": []}' and not call.failed
    refused = McpToolCall.model_validate(
        {"id": "i", "tool": "t", "result": {"content": [{"type": "text", "text": "[no] nope"}]}, "status": "failed"}
    )
    assert refused.failed and refused.output_text() == "[no] nope"
    lost = McpToolCall.model_validate({"id": "i", "tool": "t", "error": {"message": "tool call cancelled"}})
    assert lost.failed and lost.output_text() == "tool call cancelled"
