"""Agents from a file: the shapes it takes, its one-line refusals, and every agent registered and built at start
(so `ctx.agents` sees them and a broken one fails before any turn). An opencode agent's node: tests/opencode."""

from __future__ import annotations

import json
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentToolSurface, OpenAIAgent
from unit_mcp.agent.agentfile import AgentFileError, AgentSpec, load_agents, parse_agents, start_agents

pytestmark = pytest.mark.anyio


async def build(registry: AgentRegistry, specs: list[AgentSpec], **options: Any) -> None:
    async with AsyncExitStack() as stack:
        await start_agents(stack, registry, specs, surface=AgentToolSurface(AgentApprovals()), **options)


def test_toml_and_json_files_give_the_same_agents(tmp_path: Path) -> None:
    toml = tmp_path / "agents.toml"
    toml.write_text("[[agent]]\nid = 'a'\nprovider = 'openai'\nmodel = 'm'\nsystem_prompt = 'be brief'\n")
    as_json = tmp_path / "agents.json"
    as_json.write_text(
        json.dumps({"agents": [{"id": "a", "provider": "openai", "model": "m", "system_prompt": "be brief"}]})
    )
    assert (
        load_agents(toml)
        == load_agents(as_json)
        == parse_agents([dict(id="a", provider="openai", model="m", system_prompt="be brief")])
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"agnet": []}, "unknown top-level key(s) agnet; use [[agent]]"),
        ({"agent": []}, "expected a non-empty list of agents"),
        ([{"id": "a", "provider": "claude", "model": "m"}], "agent #1 is invalid: provider: Input should be"),
        ([{"id": "a", "provider": "openai", "model": "m", "key": "k"}], "agent #1 is invalid: key: Extra inputs"),
        ([{"id": "a", "provider": "openai", "model": "m"}] * 2, "agent id(s) given twice: a"),
    ],
)
def test_a_file_that_cannot_be_used_says_why_in_one_line(data: object, message: str) -> None:
    with pytest.raises(AgentFileError, match=re.escape(message)):
        parse_agents(data, origin="agents.toml")


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(AgentFileError, match="cannot read the agents file"):
        load_agents(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[[agent]\n")
    with pytest.raises(AgentFileError, match=re.escape("the agents file broken.toml is not valid TOML")):
        load_agents(broken)


async def test_every_agent_is_registered_and_built_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = parse_agents(
        [
            {"id": "a", "provider": "openai", "model": "m", "api_key_env": "A_KEY"},
            {"id": "b", "provider": "openai", "model": "n", "base_url": "http://127.0.0.1:9/v1"},
        ]
    )
    registry = AgentRegistry()
    with pytest.raises(AgentFileError, match="agent a: its key variable A_KEY is not set"):
        await build(registry, specs, base_url="http://127.0.0.1:8/v1", env={})
    await build(registry, specs, base_url="http://127.0.0.1:8/v1", env={"A_KEY": "k"})
    assert [(info.id, info.built) for info in registry.list()] == [("a", True), ("b", True)]
    a, b = registry.require("a"), registry.require("b")
    assert isinstance(a, OpenAIAgent) and (a.model, a.base_url, a.api_key) == ("m", "http://127.0.0.1:8/v1", "k")
    assert isinstance(b, OpenAIAgent) and b.base_url == "http://127.0.0.1:9/v1"

    monkeypatch.setenv("CODEX_PATH", "/nonexistent/codex")
    monkeypatch.setenv("PATH", "/nonexistent")
    codex = parse_agents([{"id": "c", "provider": "codex", "model": "m", "base_url": "http://127.0.0.1:9/v1"}])
    with pytest.raises(AgentFileError, match="agent c cannot be built: the factory of agent 'c' failed: CodexNot"):
        await build(AgentRegistry(), codex, env={})
    opencode = parse_agents([{"id": "o", "provider": "opencode", "model": "m", "base_url": "http://127.0.0.1:9/v1"}])
    monkeypatch.setenv("OPENCODE_PATH", "/nonexistent/opencode")
    with pytest.raises(AgentFileError, match="agent o: its OpenCode node did not start: "):
        await build(AgentRegistry(), opencode, env={})
