"""Prompt utilities: templates, enrichers registered outside the runner, tool lists, blocks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from unit_mcp.agent import AgentError, FunctionAgent, ModelRequest, TurnContext, TurnStatus, prompts
from unit_mcp.agent.items import ErrorItem
from unit_mcp.agent.toolsurface import ToolDef

from .conftest import reload, running

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def clean_enrichers() -> Iterator[None]:
    before = prompts.enrichers.names()
    yield
    for name in prompts.enrichers.names():
        if name not in before:
            prompts.remove_enricher(name)


def test_render_template_names_what_is_missing() -> None:
    assert prompts.render_template("Hello $who, ${what}!", {"who": "unit"}, what="welcome") == "Hello unit, welcome!"
    with pytest.raises(AgentError, match="needs a value for 'who'"):
        prompts.render_template("Hello $who")


def test_format_tools_and_assemble_blocks() -> None:
    tools = [
        ToolDef(name="unit_list", upstream_name="unit_list", source="unit", risk="normal", description="List.\nMore."),
        ToolDef(name="unit_reload", upstream_name="unit_reload", source="unit", risk="shell"),
    ]
    assert prompts.format_tools(tools) == "- unit_list (normal): List.\n- unit_reload (shell)"
    assembled = prompts.assemble_blocks(
        [("Instructions", "Be careful."), prompts.PromptBlock(name="Empty"), ("Tools", "x")]
    )
    assert assembled == "## Instructions\nBe careful.\n\n## Tools\nx"


async def test_enrichers_live_outside_the_runner_and_shape_the_system_prompt(tmp_path: Path) -> None:
    prompts.register_enricher("active_unit", lambda ctx: f"session {ctx.session_id}")
    prompts.register_enricher("silent", lambda ctx: None)

    async def weather(ctx: TurnContext) -> str:
        return "sunny"

    prompts.register_enricher("weather", weather)
    seen: list[str] = []

    def model(request: ModelRequest, ctx: TurnContext) -> str:
        seen.append(request.messages[0]["content"])
        return "ok"

    agent = FunctionAgent(model, id="f", instructions="You develop units.")
    async with running(tmp_path, {"f": lambda deps: agent}) as runner:
        session = await runner.create_session("f")
        await (await runner.run_turn(session.id, "hi")).wait(5)
    assert seen == [
        f"## Instructions\nYou develop units.\n\n## Context\nactive_unit: session {session.id}\nweather: sunny"
    ]


async def test_a_failing_enricher_fails_the_turn_naming_it(tmp_path: Path) -> None:
    def broken(ctx: TurnContext) -> str:
        raise LookupError("no world loaded")

    prompts.register_enricher("active_world", broken)
    agent = FunctionAgent(lambda request, ctx: "never", id="f", instructions="x")
    async with running(tmp_path, {"f": lambda deps: agent}) as runner:
        session = await runner.create_session("f")
        handle = await (await runner.run_turn(session.id, "hi")).wait(5)
    assert handle.status is TurnStatus.FAILED
    assert handle.error == "EnricherError: prompt enricher 'active_world' failed: LookupError: no world loaded"
    error = next(i for i in reload(tmp_path, session.id).items if isinstance(i, ErrorItem))
    assert error.code == "EnricherError"
