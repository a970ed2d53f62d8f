"""Property: steering messages are delivered in order, exactly once, each before the first model request
after it arrived, whether it arrives during a model request, during a tool call, or as its turn is ending
(then it starts the next turn)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unit_mcp.agent import AgentRunner, FunctionAgent, Hooks, ModelRequest, ModelResponse, TurnContext
from unit_mcp.agent.hooks import StepResult
from unit_mcp.agent.items import MessageItem

from .conftest import running


@dataclass(frozen=True)
class Step:
    action: Literal["tool", "answer", "stop"]
    during_model: int
    during_tool: int


def normalise(step: Step) -> Step:
    """An answer without pending steering would end the story; a stop always steers once, on its way out."""
    if step.action == "answer" and step.during_model == 0:
        return Step("tool", 0, step.during_tool)
    return step


steps = st.builds(Step, st.sampled_from(["tool", "answer", "stop"]), st.integers(0, 2), st.integers(0, 2)).map(
    normalise
)


async def scenario(root: Path, plan: list[Step]) -> tuple[list[list[str]], dict[str, int], list[str]]:
    requests: list[list[str]] = []  # the user texts of every model request, in order
    arrived: dict[str, int] = {}  # message -> index of the model request during whose step it arrived
    sent: list[str] = []
    runners: list[AgentRunner] = []  # the runner below: a turn's context does not hand it out

    async def steer(ctx: TurnContext) -> None:
        text = f"steer-{len(sent)}"
        sent.append(text)
        arrived[text] = len(requests) - 1
        await runners[0].steer(ctx.session_id, text)

    def current() -> Step:
        index = len(requests) - 1
        return plan[index] if index < len(plan) else Step("answer", 0, 0)

    async def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        requests.append([m["content"] for m in request.messages if m["role"] == "user"])
        step = current()
        for _ in range(step.during_model):
            await steer(ctx)
        if step.action == "answer" or len(requests) > len(plan):
            return ModelResponse(content="answer")
        return ModelResponse.calling(("work", {}))

    async def work(ctx: TurnContext) -> str:
        for _ in range(current().during_tool):
            await steer(ctx)
        return "worked"

    async def stop(ctx: TurnContext, result: StepResult, default: bool) -> bool:
        if current().action == "stop" and len(requests) <= len(plan):
            await steer(ctx)  # arrives as the turn decides to end: it must start the next one
            return False
        return default

    agent = FunctionAgent(model, id="f", max_steps=100, hooks=Hooks(should_continue=[stop]))
    async with running(root, {"f": lambda deps: agent}) as runner:
        runners.append(runner)
        runner.tools.tool(work)
        session = await runner.create_session("f")
        await runner.run_turn(session.id, "start")
        with anyio.fail_after(20):
            while True:
                await anyio.sleep(0.005)
                current_session = await runner.get_session(session.id)
                assert current_session is not None
                delivered = [
                    i.content
                    for i in current_session.items
                    if isinstance(i, MessageItem) and i.content.startswith("steer-")
                ]
                if len(delivered) == len(sent) and runner.active_turn(session.id) is None and len(requests) > len(plan):
                    break
    return requests, arrived, delivered


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(plan=st.lists(steps, min_size=1, max_size=6))
def test_steering_is_delivered_in_order_exactly_once_before_the_next_request(plan: list[Step]) -> None:
    with tempfile.TemporaryDirectory() as root:
        requests, arrived, delivered = anyio.run(scenario, Path(root), plan)

    assert delivered == sorted(arrived, key=lambda text: int(text.split("-")[1]))  # in order, once each
    for text, during in arrived.items():
        assert text not in requests[during]
        assert requests[during + 1].count(text) == 1  # the first request after it arrived has it
    assert all(len(texts) == len(set(texts)) for texts in requests)
