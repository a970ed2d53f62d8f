"""OpenAIAgent over real HTTP: the openai SDK against the scripted model, tools on the real unit server."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from unit_mcp.agent import Agent, AgentApprovals, AgentToolSurface, OpenAIAgent, SessionStore, TurnStatus
from unit_mcp.agent.items import Item, MessageItem, ToolResultItem, Usage
from unit_mcp.agent.turns import TurnCallbacks
from unit_mcp.testing import Match, ScriptedError, ScriptedModel, ScriptedUsage, Step, call, say, tool_call

from .conftest import SLOW_EVENTS, UnitServer, reload, running

pytestmark = pytest.mark.anyio


def agent_for(model: ScriptedModel, **options: Any) -> dict[str, Callable[[Mapping[str, Any]], Agent]]:
    return {"o": lambda deps: OpenAIAgent(id="o", model="scripted-model", base_url=model.base_url, **options)}


async def test_streamed_deltas_are_partials_and_the_final_message_keeps_usage_and_model(tmp_path: Path) -> None:
    partials: list[tuple[str, bool]] = []

    def on_partial(item: Item) -> None:
        assert isinstance(item, MessageItem)
        partials.append((item.content, item.partial))

    text = "The counter unit counts clicks and keeps its state across reloads."
    async with ScriptedModel(
        [say(text, chunk_size=10, usage=ScriptedUsage(prompt_tokens=42, completion_tokens=7))]
    ) as model:
        async with running(tmp_path, agent_for(model)) as runner:
            session = await runner.create_session("o")
            handle = await runner.run_turn(session.id, "what is counter?", TurnCallbacks(on_partial=on_partial))
            assert (await handle.wait(10)).result == text
        (request,) = model.requests
        assert request.stream and request.finished and not request.disconnected
        assert request.body["stream_options"] == {"include_usage": True}

    growing = [content for content, partial in partials if partial]
    assert len(growing) == 6 and growing[-1] == text and all(text.startswith(part) for part in growing)
    assert partials[-1] == (text, False)
    answer = next(i for i in reload(tmp_path, session.id).items if isinstance(i, MessageItem) and i.role == "assistant")
    assert (answer.content, answer.partial, answer.provider, answer.model) == (text, False, "openai", "scripted-model")
    assert answer.usage == Usage(input_tokens=42, output_tokens=7)
    writes = SessionStore(tmp_path / "sessions", read_only=True).changes(session.id)
    assert (
        writes is not None and writes.cursor < 10
    )  # the deltas stayed in memory; only the finished message was written


@pytest.mark.parametrize("stream", [True, False])
async def test_parallel_tool_calls_on_the_unit_server(tmp_path: Path, unit_server: UnitServer, stream: bool) -> None:
    steps = [
        call(tool_call("unit_inspect", {"unit_id": "counter"}), tool_call("echo_token", {"token": "t-1"})),
        say("counter has {{tool:unit_inspect.loader}} loader; echo {{tool:echo_token}}", when=Match(last_role="tool")),
    ]
    surface = AgentToolSurface(AgentApprovals())
    async with ScriptedModel(steps) as model, unit_server.source() as source:
        surface.add_source(source)
        async with running(tmp_path, agent_for(model, stream=stream), surface=surface) as runner:
            session = await runner.create_session("o")
            handle = await (await runner.run_turn(session.id, "inspect counter")).wait(10)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert handle.result == "counter has filesystem loader; echo t-1"
        second = model.requests[1]
        assert [m["role"] for m in second.messages] == ["user", "assistant", "tool", "tool"]
        assert [c["function"]["name"] for c in second.messages[1]["tool_calls"]] == ["unit_inspect", "echo_token"]
        assert model.requests[0].body["parallel_tool_calls"] is True
    assert sorted(unit_server.called()) == ["echo_token", "unit_inspect"]


async def test_cancelling_mid_stream_closes_the_stream(tmp_path: Path) -> None:
    first_delta = anyio.Event()
    slow = Step(text="word " * 200, chunk_size=5, chunk_delay=0.05)
    async with ScriptedModel([slow]) as model:
        async with running(tmp_path, agent_for(model)) as runner:
            session = await runner.create_session("o")
            handle = await runner.run_turn(session.id, "talk", TurnCallbacks(on_partial=lambda item: first_delta.set()))
            with anyio.fail_after(5):
                await first_delta.wait()
            assert await handle.cancel()
            with anyio.fail_after(5):
                while not model.requests[0].disconnected:
                    await anyio.sleep(0.01)
        assert not model.requests[0].finished
    reloaded = reload(tmp_path, session.id)
    partial = next(i for i in reloaded.items if isinstance(i, MessageItem) and i.role == "assistant")
    assert partial.content.startswith("word") and not partial.partial and len(partial.content) < 1000


async def test_cancelling_mid_tool_call_stops_the_tool_on_the_server(tmp_path: Path, unit_server: UnitServer) -> None:
    SLOW_EVENTS.clear()
    surface = AgentToolSurface(AgentApprovals())
    async with ScriptedModel([call(tool_call("slow_echo", {"seconds": 30}))]) as model, unit_server.source() as source:
        surface.add_source(source)
        async with running(tmp_path, agent_for(model), surface=surface) as runner:
            session = await runner.create_session("o")
            handle = await runner.run_turn(session.id, "be slow")
            with anyio.fail_after(5):
                while unit_server.called() != ["slow_echo"]:
                    await anyio.sleep(0.01)
            with anyio.fail_after(5):
                assert await handle.cancel("changed my mind")
            assert handle.status is TurnStatus.CANCELLED
        with anyio.fail_after(5):
            while SLOW_EVENTS != ["cancelled"]:
                await anyio.sleep(0.01)  # the server's handler was cancelled too, not left running

    reloaded = reload(tmp_path, session.id)
    assert reloaded.open_tool_calls() == []
    closing = next(i for i in reloaded.items if isinstance(i, ToolResultItem))
    assert closing.synthetic and "changed my mind" in closing.output


async def test_a_provider_error_fails_the_turn_with_its_message(tmp_path: Path) -> None:
    steps = [Step(error=ScriptedError(status=400, message="context length exceeded")), say("recovered")]
    async with ScriptedModel(steps) as model, running(tmp_path, agent_for(model)) as runner:
        session = await runner.create_session("o")
        failed = await (await runner.run_turn(session.id, "x")).wait(10)
        assert failed.status is TurnStatus.FAILED
        assert "BadRequestError" in (failed.error or "") and "context length exceeded" in (failed.error or "")
        assert (await (await runner.run_turn(session.id, "again")).wait(10)).result == "recovered"


async def test_steering_reaches_the_model_in_the_same_turn(tmp_path: Path) -> None:
    waiting, release = anyio.Event(), anyio.Event()
    steps = [call("hold"), say("blue it is", when=Match(last_contains="make it blue"))]
    async with ScriptedModel(steps) as model:
        async with running(tmp_path, agent_for(model)) as runner:

            @runner.tools.tool
            async def hold() -> str:
                waiting.set()
                await release.wait()
                return "held"

            session = await runner.create_session("o")
            handle = await runner.run_turn(session.id, "paint")
            with anyio.fail_after(5):
                await waiting.wait()
            await runner.steer(session.id, "make it blue")
            release.set()
            assert (await handle.wait(10)).result == "blue it is"
        assert [m["role"] for m in model.requests[1].messages] == ["user", "assistant", "tool", "user"]
