"""One runner holds an OpenAI-compatible agent, an OpenCode agent and a Codex agent side by side, each with
its own model from its own configuration, all answered by one script (chat completions for the first two,
the Responses API for Codex) and all reaching the same real unit server through the same tool surface."""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import pytest
from opencode.opencode_stack import MODEL as OPENCODE_MODEL
from opencode.opencode_stack import scripted_provider

from unit_mcp.agent import OpenAIAgent, TurnStatus
from unit_mcp.agent.items import MessageItem, ToolCallItem
from unit_mcp.agent.opencode import IsolatedRoot, NodeProcess, OpenCodeAgent, opencode_endpoint, opencode_tool_name
from unit_mcp.testing import Match, call, say, tool_call

from .codex_stack import AGENT_ID, MODEL, SERVER, TURN_TIMEOUT, codex_stack, reload

pytestmark = pytest.mark.anyio


@pytest.mark.slow  # an OpenCode node takes ~5 s to start and ~5 s for its first turn here
async def test_openai_opencode_and_codex_agents_in_one_runner(
    tmp_path: Path, codex_binary: Path, opencode_binary: Path
) -> None:
    echo = opencode_tool_name(SERVER, "echo_token")  # OpenCode offers the tool under its server's name
    script = [
        say("Unit work", when=Match(system_contains="title generator"), repeat=True, label="title"),
        call(
            tool_call("echo_token", {"token": "token-of-{{user}}"}),
            when=Match(last_role="user", tools_offered=["echo_token"]),
            repeat=True,
        ),
        call(tool_call(echo, {"token": "token-of-{{user}}"}), when=Match(last_role="user", tools_offered=[echo])),
        say("{{last}}", when=Match(last_role="tool"), repeat=True),
    ]
    openai = {"openai": lambda model: OpenAIAgent(id="openai", model="scripted-openai", base_url=model.base_url)}
    async with (
        codex_stack(tmp_path, codex_binary, script, more_agents=openai) as stack,
        AsyncExitStack() as node,
    ):
        root = IsolatedRoot(tmp_path / "opencode-node")
        endpoint = await node.enter_async_context(
            opencode_endpoint(stack.surface, server_name=SERVER, config_root=root.config_home)
        )
        root.add_config(scripted_provider(stack.model.base_url))
        process = await node.enter_async_context(NodeProcess(binary=opencode_binary, root=root))
        client = await node.enter_async_context(process.client())
        stack.runner.registry.register(
            "opencode", lambda deps: OpenCodeAgent(client, model=OPENCODE_MODEL, endpoint=endpoint, id="opencode")
        )

        agents = ("openai", "opencode", AGENT_ID)
        sessions = {agent: await stack.runner.create_session(agent) for agent in agents}
        handles = {agent: await stack.runner.run_turn(sessions[agent].id, agent) for agent in agents}
        with anyio.fail_after(TURN_TIMEOUT * 2):
            for handle in handles.values():
                await handle.wait()
        for agent, handle in handles.items():
            assert handle.status is TurnStatus.COMPLETED, (agent, handle.error)
            assert handle.result == f"token-of-{agent}", agent

    assert sorted(args["token"] for name, args in stack.server.calls if name == "echo_token") == [
        f"token-of-{agent}" for agent in sorted(agents)
    ]
    paths = {record.path for record in stack.model.requests}
    assert paths == {"/v1/chat/completions", "/v1/responses"}
    expected = {
        "openai": ("openai", "scripted-openai"),
        "opencode": ("opencode", OPENCODE_MODEL),
        AGENT_ID: ("codex", MODEL),
    }
    for agent, (provider, model) in expected.items():
        items = reload(tmp_path, sessions[agent].id).items
        final = [i for i in items if isinstance(i, MessageItem) and i.role == "assistant" and i.content][-1]
        assert (final.provider, final.model, final.content) == (provider, model, f"token-of-{agent}"), agent
        assert [i.name for i in items if isinstance(i, ToolCallItem)] == ["echo_token"], agent
