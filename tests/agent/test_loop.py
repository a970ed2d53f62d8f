"""The step loop through the real runner: steering, queued input, hooks, containment, limits, delegation."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import pytest

from unit_mcp.agent import (
    AgentApprovals,
    AgentError,
    AgentRunner,
    AgentToolSurface,
    FunctionAgent,
    Hooks,
    LocalTool,
    ModelRequest,
    ModelResponse,
    TurnContext,
    TurnStatus,
    delegate,
    delegation_tool,
)
from unit_mcp.agent.hooks import Refusal, StepResult, ToolCall
from unit_mcp.agent.items import ErrorItem, EventItem, MessageItem, Session, ToolResultItem

from .conftest import reload, running

pytestmark = pytest.mark.anyio


def user_texts(request: ModelRequest) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "user"]


def parent_and_helper(
    tmp_path: Path, parent: Callable[..., Any], helper: Callable[..., Any], *tools: LocalTool
) -> AbstractAsyncContextManager[AgentRunner]:
    """A runner with the agents "parent" and "helper" (these functions as their models) and `tools`."""
    surface = AgentToolSurface(AgentApprovals())
    for tool in tools:
        surface.add_local(tool)
    agents = {
        "parent": lambda deps: FunctionAgent(parent, id="parent"),
        "helper": lambda deps: FunctionAgent(helper, id="helper"),
    }
    return running(tmp_path, agents, surface=surface)


async def settle(runner: AgentRunner, session_id: str, turns: int) -> Session:
    """Wait until `turns` turns have ended and nothing is running or queued."""
    with anyio.fail_after(10):
        while True:
            session = await runner.get_session(session_id)
            assert session is not None
            ended = [
                i
                for i in session.items
                if isinstance(i, EventItem) and i.kind.startswith("turn-") and i.kind != "turn-started"
            ]
            if len(ended) >= turns and runner.active_turn(session_id) is None:
                return session
            await anyio.sleep(0.01)


async def test_a_steering_message_lands_in_the_same_turn(tmp_path: Path) -> None:
    requests: list[ModelRequest] = []
    tool_running, release = anyio.Event(), anyio.Event()

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        requests.append(request)
        return ModelResponse.calling(("work", {})) if request.step == 1 else "done, in blue"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}) as runner:

        @runner.tools.tool
        async def work() -> str:
            tool_running.set()
            await release.wait()
            return "worked"

        session = await runner.create_session("f")
        handle = await runner.run_turn(session.id, "paint the wall")
        with anyio.fail_after(5):
            await tool_running.wait()
        assert await runner.steer(session.id, "make it blue") is True
        release.set()
        assert (await handle.wait(5)).result == "done, in blue"

    assert len(requests) == 2
    assert user_texts(requests[0]) == ["paint the wall"]
    assert user_texts(requests[1]) == ["paint the wall", "make it blue"]
    assert requests[1].messages[-1] == {"role": "user", "content": "make it blue"}  # after the tool result
    items = reload(tmp_path, session.id).items
    steering = next(i for i in items if isinstance(i, MessageItem) and i.kind == "steering")
    assert steering.turn_id == handle.id and steering.content == "make it blue"
    assert [i.kind for i in items if isinstance(i, EventItem)] == ["turn-started", "turn-completed"]


async def test_queued_input_waits_for_the_running_turn_and_steering_without_a_turn_starts_one(tmp_path: Path) -> None:
    gate = anyio.Event()
    seen: list[list[str]] = []

    async def model(request: ModelRequest, ctx: TurnContext) -> str:
        seen.append(user_texts(request))
        await gate.wait()
        return f"answer {len(seen)}"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}) as runner:
        session = await runner.create_session("f")
        first = await runner.run_turn(session.id, "first")
        assert await runner.enqueue(session.id, "second") is None
        assert await runner.enqueue(session.id, "third") is None
        gate.set()
        await first.wait(5)
        await settle(runner, session.id, turns=2)
        assert await runner.steer(session.id, "fourth") is False  # idle: it starts a turn of its own
        final = await settle(runner, session.id, turns=3)

    assert seen == [["first"], ["first", "second", "third"], ["first", "second", "third", "fourth"]]
    assert [m.content for m in final.items if isinstance(m, MessageItem) and m.role == "assistant"] == [
        "answer 1",
        "answer 2",
        "answer 3",
    ]


async def test_hooks_rewrite_refuse_observe_and_stop(tmp_path: Path) -> None:
    ran: list[dict[str, str]] = []
    observed: list[StepResult] = []

    def before_request(ctx: TurnContext, request: ModelRequest) -> ModelRequest:
        return request.model_copy(update={"messages": [{"role": "system", "content": "be brief"}, *request.messages]})

    def before_tool_call(ctx: TurnContext, call: ToolCall) -> ToolCall | Refusal | None:
        arguments = json.loads(call.arguments)
        if arguments.get("path", "").startswith("/etc"):
            return Refusal(reason="outside the units root")
        if arguments.get("path") == "draft":
            return call.model_copy(update={"arguments": json.dumps({"path": "final"})})
        return None

    def should_continue(ctx: TurnContext, result: StepResult, default: bool) -> bool:
        return False  # one step only: the tool results are the answer

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        assert request.messages[0] == {"role": "system", "content": "be brief"}
        return ModelResponse.calling(("save", {"path": "draft"}), ("save", {"path": "/etc/passwd"}), content="saving")

    hooks = Hooks(
        before_request=[before_request],
        before_tool_call=[before_tool_call],
        after_step=[lambda ctx, result: observed.append(result)],
        should_continue=[should_continue],
    )
    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f", hooks=hooks)}) as runner:

        @runner.tools.tool
        def save(path: str) -> str:
            ran.append({"path": path})
            return f"saved {path}"

        session = await runner.create_session("f")
        handle = await (await runner.run_turn(session.id, "save it")).wait(5)

    assert handle.status is TurnStatus.COMPLETED and handle.result == "saving"
    assert ran == [{"path": "final"}]
    (step,) = observed
    outputs = sorted(output.text for output in step.outputs.values())
    assert outputs == ["saved final"] and len(step.tool_calls) == 2
    items = reload(tmp_path, session.id).items
    results = sorted(i.output for i in items if isinstance(i, ToolResultItem))
    assert results == ["[refused] outside the units root", "saved final"]
    rewritten = next(i for i in items if isinstance(i, EventItem) and i.kind == "tool-call-rewritten")
    assert json.loads(rewritten.data["original_arguments"]) == {"path": "draft"}


@pytest.mark.parametrize("point", ["before_request", "after_step", "before_tool_call", "should_continue"])
async def test_a_failing_hook_ends_the_turn_never_the_runner(tmp_path: Path, point: str) -> None:
    def broken(*args: object) -> None:
        raise ValueError("hook bug")

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        return ModelResponse.calling(("noop", {})) if request.step == 1 else ModelResponse(content="fine")

    agent = FunctionAgent(model, id="f", hooks=Hooks(**{point: [broken]}))  # type: ignore[arg-type]
    async with running(tmp_path, {"f": lambda deps: agent, "ok": lambda deps: FunctionAgent(model, id="ok")}) as runner:
        runner.tools.tool(lambda: "noop", name="noop")
        session = await runner.create_session("f")
        failed = await (await runner.run_turn(session.id, "go")).wait(5)
        assert failed.status is TurnStatus.FAILED
        assert failed.error is not None and failed.error.startswith(f"HookError: {point} hook")
        assert "ValueError: hook bug" in failed.error
        other = await runner.create_session("ok")
        assert (await (await runner.run_turn(other.id, "go")).wait(5)).status is TurnStatus.COMPLETED
    on_disk = reload(tmp_path, session.id)
    assert on_disk.open_tool_calls() == [] and any(
        isinstance(i, ErrorItem) and i.code == "HookError" for i in on_disk.items
    )


async def test_a_crashing_tool_ends_the_turn_and_closes_its_call(tmp_path: Path) -> None:
    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        return ModelResponse.calling(("explode", {}), ("wait", {}))

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}) as runner:

        @runner.tools.tool
        def explode() -> str:
            raise OSError("disk on fire")

        @runner.tools.tool
        async def wait() -> str:
            await anyio.sleep(30)
            return "never"

        session = await runner.create_session("f")
        handle = await (await runner.run_turn(session.id, "go")).wait(5)
    assert handle.status is TurnStatus.FAILED
    assert handle.error == "ToolFailed: local tool explode failed: OSError: disk on fire"
    on_disk = reload(tmp_path, session.id)
    assert on_disk.open_tool_calls() == []
    closed = next(i for i in on_disk.items if isinstance(i, ToolResultItem) and i.name == "wait")
    assert closed.synthetic and closed.output.startswith("[failed]")


async def test_parallel_tool_calls_run_at_the_same_time(tmp_path: Path) -> None:
    both = [anyio.Event(), anyio.Event()]

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        if request.step == 1:
            return ModelResponse.calling(("meet", {"me": 0, "other": 1}), ("meet", {"me": 1, "other": 0}))
        return "met"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}) as runner:

        @runner.tools.tool
        async def meet(me: int, other: int) -> str:
            both[me].set()
            with anyio.fail_after(5):
                await both[other].wait()  # deadlocks unless the two calls overlap
            return f"{me} met {other}"

        session = await runner.create_session("f")
        assert (await (await runner.run_turn(session.id, "go")).wait(10)).result == "met"


async def test_bad_arguments_go_back_to_the_model_and_the_step_limit_holds(tmp_path: Path) -> None:
    seen: list[str] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        if request.messages[-1]["role"] == "tool":
            seen.append(request.messages[-1]["content"])
        return ModelResponse(tool_calls=[ToolCall(name="noop", arguments="{not json")])

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f", max_steps=3)}) as runner:
        runner.tools.tool(lambda: "noop", name="noop")
        session = await runner.create_session("f")
        handle = await (await runner.run_turn(session.id, "go")).wait(5)
    assert handle.status is TurnStatus.FAILED
    assert handle.error == "StepLimitReached: no final answer after 3 model requests (max_steps)"
    assert len(seen) == 2 and all(text.startswith("[invalid_argument] noop") for text in seen)


async def test_delegation_runs_another_agent_in_a_linked_child_session(tmp_path: Path) -> None:
    def parent(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        if request.messages[-1]["role"] == "user":
            return ModelResponse.calling(("delegate_to_helper", {"task": "count the units"}))
        return f"helper said: {request.messages[-1]['content']}"

    def helper(request: ModelRequest, ctx: TurnContext) -> str:
        return f"4 units ({user_texts(request)[-1]})"

    async with parent_and_helper(tmp_path, parent, helper, delegation_tool("helper")) as runner:
        session = await runner.create_session("parent")
        handle = await (await runner.run_turn(session.id, "how many units?")).wait(5)
        assert handle.result == "helper said: 4 units (count the units)"
        (child_meta,) = [meta for meta in await runner.list_sessions() if meta.agent_id == "helper"]
        assert child_meta.parent_id == session.id

    items = reload(tmp_path, session.id).items
    events = {i.kind: i.data for i in items if isinstance(i, EventItem) and i.kind.startswith("delegation")}
    assert events["delegation-started"]["child_session_id"] == child_meta.id
    assert events["delegation-finished"]["status"] == "completed"
    assert events["delegation-finished"]["result"] == "4 units (count the units)"


async def test_a_reusing_delegation_tool_continues_the_same_child_session(tmp_path: Path) -> None:
    def parent(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        if request.messages[-1]["role"] == "user":
            return ModelResponse.calling(("delegate_to_helper", {"task": user_texts(request)[-1]}))
        return str(request.messages[-1]["content"])

    def helper(request: ModelRequest, ctx: TurnContext) -> str:
        return " then ".join(user_texts(request))  # everything this child session was asked so far

    async with parent_and_helper(tmp_path, parent, helper, delegation_tool("helper", reuse=True)) as runner:
        session = await runner.create_session("parent")
        first = await (await runner.run_turn(session.id, "count")).wait(5)
        second = await (await runner.run_turn(session.id, "double it")).wait(5)
        (child,) = [meta for meta in await runner.list_sessions() if meta.agent_id == "helper"]
    assert (first.result, second.result) == ("count", "count then double it")
    assert child.parent_id == session.id
    started = [i.data for i in reload(tmp_path, session.id).items if getattr(i, "kind", "") == "delegation-started"]
    assert [event["child_session_id"] for event in started] == [child.id, child.id]


async def test_an_agent_resolves_another_through_ctx_agents_and_names_the_child_session(tmp_path: Path) -> None:
    outcomes: list[str] = []

    async def parent(request: ModelRequest, ctx: TurnContext) -> str:
        assert ctx.agents.get("nobody") is None
        helper = ctx.agents.require("helper")
        child = user_texts(request)[-1]  # the child session's id, as the user names it
        try:
            handle = await delegate(ctx, helper.id, f"task for {child}", child_session_id=child)
        except AgentError as exc:
            outcomes.append(f"refused: {exc}")
            return "refused"
        outcomes.append(f"{handle.session_id}: {handle.result}")
        return "done"

    def helper(request: ModelRequest, ctx: TurnContext) -> str:
        return f"{ctx.session_id} heard {len(user_texts(request))}"

    async with parent_and_helper(tmp_path, parent, helper) as runner:
        session = await runner.create_session("parent")
        stranger = await runner.create_session("helper")  # a helper session, but not this parent's child
        for child in ("ses-named-child", "ses-named-child", stranger.id):
            await (await runner.run_turn(session.id, child)).wait(5)
        named = await runner.get_session("ses-named-child")
    assert outcomes[:2] == ["ses-named-child: ses-named-child heard 1", "ses-named-child: ses-named-child heard 2"]
    assert outcomes[2].startswith(f"refused: session {stranger.id} is not a child of session {session.id}")
    assert named is not None and named.parent_id == session.id and named.agent_id == "helper"


async def test_cancelling_the_parent_cancels_the_delegated_turn(tmp_path: Path) -> None:
    helper_started = anyio.Event()

    async def helper(request: ModelRequest, ctx: TurnContext) -> str:
        helper_started.set()
        await anyio.sleep(30)
        return "never"

    def parent(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        return ModelResponse.calling(("delegate_to_helper", {"task": "slow work"}))

    async with parent_and_helper(tmp_path, parent, helper, delegation_tool("helper")) as runner:
        session = await runner.create_session("parent")
        handle = await runner.run_turn(session.id, "go")
        with anyio.fail_after(5):
            await helper_started.wait()
        (child,) = [meta for meta in await runner.list_sessions() if meta.agent_id == "helper"]
        assert runner.active_turn(child.id) is not None
        await handle.cancel()
        assert runner.active_turn(child.id) is None
    child_items = reload(tmp_path, child.id).items
    cancelled = next(i for i in child_items if isinstance(i, EventItem) and i.kind == "turn-cancelled")
    assert cancelled.data["reason"].startswith("the delegating turn")
