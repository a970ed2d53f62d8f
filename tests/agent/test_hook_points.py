"""The execute_tool, step_result and compact hook points through the real runner and step loop."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from unit_mcp.agent import FunctionAgent, Hooks, ModelRequest, ModelResponse, ToolOutput, TurnContext, TurnStatus
from unit_mcp.agent.hooks import COMPACTED, Proceed, ToolCall, ToolExecution, summarise_tool_results
from unit_mcp.agent.items import ErrorItem, EventItem, MessageItem, ToolResultItem

from .conftest import reload, running

pytestmark = pytest.mark.anyio


def tool_results(request: ModelRequest) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


def call_once(name: str, **arguments: object):  # type: ignore[no-untyped-def]
    seen: list[ModelRequest] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        seen.append(request)
        return ModelResponse.calling((name, arguments)) if request.step == 1 else "finished"

    model.seen = seen  # type: ignore[attr-defined]
    return model


async def run(tmp_path: Path, model, hooks: Hooks, tools: dict, **options: object):  # type: ignore[no-untyped-def]
    agents = {
        "f": lambda deps: FunctionAgent(model, id="f", hooks=hooks, **options),
        "g": lambda deps: FunctionAgent(lambda request, ctx: "alive", id="g"),
    }
    async with running(tmp_path, agents) as runner:
        for fn in tools.values():
            runner.tools.tool(fn)
        session = await runner.create_session("f")
        handle = await (await runner.run_turn(session.id, "go")).wait(10)
        # the runner survives whatever the hooks did: a second turn on it still works
        other = await runner.create_session("g")
        assert (await (await runner.run_turn(other.id, "still there?")).wait(10)).result == "alive"
    return handle, reload(tmp_path, session.id)


async def test_execute_tool_hook_replaces_a_result_and_sees_the_duration(tmp_path: Path) -> None:
    seen: list[ToolExecution] = []

    async def audit(ctx: TurnContext, call: ToolCall, proceed: Proceed) -> ToolOutput:
        execution = await proceed()
        seen.append(execution)
        assert execution.output is not None
        return ToolOutput(text=f"audited: {execution.output.text}")

    async def slow(n: int) -> str:
        await anyio.sleep(0.05)
        return f"slow {n}"

    model = call_once("slow", n=3)
    handle, session = await run(tmp_path, model, Hooks(execute_tool=[audit]), {"slow": slow})
    assert handle.status is TurnStatus.COMPLETED
    (execution,) = seen
    assert execution.call.name == "slow" and execution.call.arguments == '{"n": 3}'
    assert execution.duration >= 0.05 and execution.error is None
    (result,) = [i for i in session.items if isinstance(i, ToolResultItem)]
    assert result.output == "audited: slow 3"
    assert tool_results(model.seen[1]) == ["audited: slow 3"]


async def test_execute_tool_hook_turns_a_crash_into_a_result(tmp_path: Path) -> None:
    def explode() -> str:
        raise RuntimeError("disk on fire")

    async def forgive(ctx: TurnContext, call: ToolCall, proceed: Proceed) -> ToolOutput | None:
        execution = await proceed()
        if execution.error is not None:
            return ToolOutput(text=f"[crashed] {execution.error}", is_error=True)
        return None

    handle, session = await run(tmp_path, call_once("explode"), Hooks(execute_tool=[forgive]), {"x": explode})
    assert handle.status is TurnStatus.COMPLETED and handle.result == "finished"
    (result,) = [i for i in session.items if isinstance(i, ToolResultItem)]
    assert result.is_error and "disk on fire" in result.output


async def test_without_the_hook_that_crash_fails_the_turn(tmp_path: Path) -> None:
    def explode() -> str:
        raise RuntimeError("disk on fire")

    async def watch(ctx: TurnContext, call: ToolCall, proceed: Proceed) -> None:
        await proceed()  # leaves the error in place

    handle, _ = await run(tmp_path, call_once("explode"), Hooks(execute_tool=[watch]), {"x": explode})
    assert handle.status is TurnStatus.FAILED and "disk on fire" in (handle.error or "")


async def test_a_sandbox_hook_can_answer_without_running_the_tool(tmp_path: Path) -> None:
    ran: list[str] = []

    def touch() -> str:
        ran.append("touched")
        return "touched"

    def sandbox(ctx: TurnContext, call: ToolCall, proceed: Proceed) -> ToolOutput:
        return ToolOutput(text=f"[sandboxed] {call.name} did not run", is_error=True)

    handle, session = await run(tmp_path, call_once("touch"), Hooks(execute_tool=[sandbox]), {"t": touch})
    assert handle.status is TurnStatus.COMPLETED and ran == []
    (result,) = [i for i in session.items if isinstance(i, ToolResultItem)]
    assert result.output == "[sandboxed] touch did not run"


async def test_execute_tool_hooks_nest_first_outermost(tmp_path: Path) -> None:
    order: list[str] = []

    def layer(name: str):  # type: ignore[no-untyped-def]
        async def hook(ctx: TurnContext, call: ToolCall, proceed: Proceed) -> ToolOutput:
            order.append(f"{name} in")
            execution = await proceed()
            order.append(f"{name} out")
            assert execution.output is not None
            return ToolOutput(text=f"{name}({execution.output.text})")

        return hook

    def plain() -> str:
        order.append("tool")
        return "x"

    hooks = Hooks(execute_tool=[layer("outer"), layer("inner")])
    _, session = await run(tmp_path, call_once("plain"), hooks, {"p": plain})
    assert order == ["outer in", "inner in", "tool", "inner out", "outer out"]
    (result,) = [i for i in session.items if isinstance(i, ToolResultItem)]
    assert result.output == "outer(inner(x))"


@pytest.mark.parametrize("point", ["execute_tool", "step_result", "compact"])
async def test_a_raising_hook_fails_the_turn_with_an_error_item(tmp_path: Path, point: str) -> None:
    def broken(*args: object) -> None:
        raise ValueError(f"{point} is broken")

    def big() -> str:
        return "y" * 500

    hooks = Hooks(**{point: [broken]})
    handle, session = await run(tmp_path, call_once("big"), hooks, {"b": big}, compact_at=100)
    assert handle.status is TurnStatus.FAILED
    errors = [i for i in session.items if isinstance(i, ErrorItem)]
    assert errors and errors[-1].code == "HookError" and f"{point} hook" in errors[-1].message
    assert f"{point} is broken" in errors[-1].message


async def test_step_result_hook_replaces_the_answer_before_it_is_recorded(tmp_path: Path) -> None:
    def drop_calls(ctx: TurnContext, response: ModelResponse) -> ModelResponse:
        return ModelResponse(content=f"[reviewed] {response.content or 'no calls allowed'}")

    ran: list[str] = []

    def never() -> str:
        ran.append("ran")
        return "ran"

    handle, session = await run(tmp_path, call_once("never"), Hooks(step_result=[drop_calls]), {"n": never})
    assert handle.status is TurnStatus.COMPLETED and handle.result == "[reviewed] no calls allowed"
    assert ran == []
    answers = [i.content for i in session.items if isinstance(i, MessageItem) and i.role == "assistant"]
    assert answers == ["[reviewed] no calls allowed"]


async def test_compaction_shortens_the_history_and_the_journal_keeps_everything(tmp_path: Path) -> None:
    requests: list[ModelRequest] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        requests.append(request)
        return ModelResponse.calling(("read", {"n": request.step})) if request.step <= 4 else "read them all"

    def read(n: int) -> str:
        return f"page {n}\n" + "lorem ipsum " * 100

    handle, session = await run(tmp_path, model, Hooks(), {"r": read}, compact_at=2500)
    assert handle.status is TurnStatus.COMPLETED
    outputs = [i.output for i in session.items if isinstance(i, ToolResultItem)]
    assert len(outputs) == 4 and all(len(o) > 1000 for o in outputs)  # the journal keeps every result whole
    compactions = [i for i in session.items if isinstance(i, EventItem) and i.kind == "compaction"]
    assert compactions
    first = compactions[0].data
    assert first["size_after"] < first["size_before"] and first["size_before"] > 2500
    last = requests[-1]
    results = tool_results(last)
    assert len(results) == 4
    assert all(r.startswith(f"{COMPACTED} read returned") for r in results[:2])
    assert results[-1] == outputs[-1]  # the newest results stay whole
    assert last.messages[0]["role"] == "user" and last.messages[0]["content"] == "go"


async def test_a_custom_compaction_hook_decides_the_history(tmp_path: Path) -> None:
    requests: list[ModelRequest] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        requests.append(request)
        return ModelResponse.calling(("read", {})) if request.step == 1 else "ok"

    def read() -> str:
        return "z" * 400

    def summary(ctx: TurnContext, messages: list[dict]) -> list[dict]:  # type: ignore[type-arg]
        return [{"role": "user", "content": "summary: the user asked to read, read gave 400 z"}]

    _, session = await run(tmp_path, model, Hooks(compact=[summary]), {"r": read}, compact_at=300)
    assert requests[-1].messages == summary(None, [])  # type: ignore[arg-type]
    assert [i.kind for i in session.items if isinstance(i, EventItem) and i.kind == "compaction"] == ["compaction"]


def test_default_summary_keeps_recent_results_and_is_idempotent() -> None:
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "function": {"name": "t1"}}]},
        {"role": "tool", "tool_call_id": "a", "content": "long\n" * 50},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "b", "function": {"name": "t2"}}]},
        {"role": "tool", "tool_call_id": "b", "content": "recent"},
    ]
    once = summarise_tool_results(messages, keep_recent=1)
    assert once[2]["content"] == f"{COMPACTED} t1 returned 250 chars: " + " ".join(["long"] * 50)[:119] + "…"
    assert once[4] == messages[4] and once[:2] == messages[:2]
    assert summarise_tool_results(once, keep_recent=1) == once
