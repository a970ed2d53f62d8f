"""Turn lifecycle through the real runner: handles, completion, failure, cancellation, supersession."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from support.item_kinds import item_kinds

from unit_mcp.agent import AgentError, FunctionAgent, ModelRequest, ModelResponse, SessionStore, TurnContext, TurnStatus
from unit_mcp.agent.errors import TurnClosed
from unit_mcp.agent.items import ErrorItem, EventItem, Session, ToolCallItem, ToolResultItem
from unit_mcp.agent.projections import chat_messages
from unit_mcp.agent.turns import TurnCallbacks

from .conftest import reload, running

pytestmark = pytest.mark.anyio


class Scripted:
    """An agent whose turns wait for the test: it finishes, fails or hangs when told to."""

    def __init__(self, *, hook: Any = None) -> None:
        self.id = "scripted"
        self.name = "Scripted"
        self.release = anyio.Event()
        self.outcome = "finish"
        self.hook = hook
        self.runs = 0
        self.ctx: TurnContext | None = None  # the turn it interrupted

    async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
        self.runs += 1
        if self.hook is not None:
            ctx.turn.set_cancel(self.hook)
        await self.release.wait()
        if self.outcome == "finish":
            await ctx.turn.finish(f"echo:{input}")
        elif self.outcome == "fail":
            await ctx.turn.fail("the provider said no", code="provider_error")
        elif self.outcome == "raise":
            raise RuntimeError("boom")
        elif self.outcome == "interrupt":
            await ctx.turn.append_item(ToolCallItem(name="probe", call_id="c1", arguments="{}"))
            await ctx.turn.interrupted("the node died before it answered")
            self.ctx = ctx


def kinds(session: Session) -> list[str]:
    return item_kinds(session.items)


async def test_run_turn_returns_a_handle_at_once_and_completes(tmp_path: Path) -> None:
    agent = Scripted()
    seen: list[str] = []
    async with running(tmp_path, {"scripted": lambda deps: agent}) as runner:
        session = await runner.create_session("scripted")
        callbacks = TurnCallbacks(
            on_item=lambda item: seen.append(item.type), on_finish=lambda h: seen.append("finish")
        )
        handle = await runner.run_turn(session.id, "hello", callbacks)
        assert handle.running and handle.status is TurnStatus.RUNNING
        assert runner.active_turn(session.id) is handle
        assert SessionStore(tmp_path / "sessions", read_only=True).require(session.id).status == "running"
        with pytest.raises(TimeoutError):
            await handle.wait(0.05)

        agent.release.set()
        await handle.wait(5)
        assert (handle.status, handle.result, handle.error) == (TurnStatus.COMPLETED, "echo:hello", None)
        assert runner.active_turn(session.id) is None
        assert seen[-1] == "finish" and "message" in seen

    on_disk = reload(tmp_path, session.id)
    assert on_disk.status == "idle"
    assert kinds(on_disk) == ["turn-started", "message", "turn-completed"]


@pytest.mark.parametrize("outcome", ["fail", "raise"])
async def test_failure_is_recorded_and_the_runner_goes_on(tmp_path: Path, outcome: str) -> None:
    agent = Scripted()
    agent.outcome = outcome
    errors: list[str | None] = []
    async with running(tmp_path, {"scripted": lambda deps: agent}) as runner:
        session = await runner.create_session("scripted")
        handle = await runner.run_turn(session.id, "x", TurnCallbacks(on_error=lambda h: errors.append(h.error)))
        handle.on_error(lambda h: errors.append("handle callback"))
        agent.release.set()
        await handle.wait(5)
        assert handle.status is TurnStatus.FAILED
        assert errors == [handle.error, "handle callback"]
        assert runner.active_turn(session.id) is None

        agent.outcome = "finish"
        second = await runner.run_turn(session.id, "again")
        assert (await second.wait(5)).status is TurnStatus.COMPLETED

    on_disk = reload(tmp_path, session.id)
    error = next(item for item in on_disk.items if isinstance(item, ErrorItem))
    expected = (
        ("the provider said no", "provider_error") if outcome == "fail" else ("RuntimeError: boom", "RuntimeError")
    )
    assert (error.message, error.code) == expected
    assert kinds(on_disk).count("turn-failed") == 1 and on_disk.status == "idle"


async def test_an_interrupted_turn_ends_interrupted_with_its_reason_and_closes_its_open_call(tmp_path: Path) -> None:
    agent = Scripted()
    agent.outcome = "interrupt"
    errors: list[str | None] = []
    async with running(tmp_path, {"scripted": lambda deps: agent}) as runner:
        session = await runner.create_session("scripted")
        handle = await runner.run_turn(session.id, "x")
        handle.on_error(lambda h: errors.append(h.error))
        agent.release.set()
        await handle.wait(5)
        assert handle.status is TurnStatus.INTERRUPTED and errors == ["the node died before it answered"]
        assert agent.ctx is not None
        with pytest.raises(TurnClosed, match=r"had already ended \(interrupted\)"):
            await agent.ctx.turn.interrupted("again")

    on_disk = reload(tmp_path, session.id)
    assert kinds(on_disk) == ["turn-started", "message", "tool-call", "tool-result", "error", "turn-interrupted"]
    result, error, ended = on_disk.items[-3:]
    assert isinstance(result, ToolResultItem) and result.synthetic and result.output.startswith("[interrupted]")
    assert isinstance(error, ErrorItem) and (error.message, error.code) == (
        "the node died before it answered",
        "interrupted",
    )
    assert isinstance(ended, EventItem) and ended.data["error"] == "the node died before it answered"
    assert on_disk.status == "idle" and on_disk.open_tool_calls() == []


async def test_cancel_runs_the_hook_exactly_once_and_persists_the_status(tmp_path: Path) -> None:
    calls: list[str] = []

    async def abort() -> None:
        calls.append("abort")

    agent = Scripted(hook=abort)
    async with running(tmp_path, {"scripted": lambda deps: agent}) as runner:
        session = await runner.create_session("scripted")
        handle = await runner.run_turn(session.id, "x")
        await anyio.sleep(0.05)
        outcomes: list[bool] = []
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(lambda: _collect(outcomes, handle.cancel("stop")))
        assert sorted(outcomes) == [False, False, True]
        assert await runner.cancel_turn(session.id) is False
        assert calls == ["abort"]
        assert handle.status is TurnStatus.CANCELLED and handle.error is None
        assert runner.active_turn(session.id) is None

    on_disk = reload(tmp_path, session.id)
    event = on_disk.items[-1]
    assert isinstance(event, EventItem) and event.kind == "turn-cancelled" and event.data["reason"] == "stop"
    assert on_disk.status == "idle"


async def _collect(outcomes: list[bool], cancel: Any) -> None:
    outcomes.append(await cancel)


async def test_a_failing_cancel_hook_still_cancels_and_surfaces_the_error(tmp_path: Path) -> None:
    def abort() -> None:
        raise ConnectionError("provider unreachable")

    agent = Scripted(hook=abort)
    async with running(tmp_path, {"scripted": lambda deps: agent}) as runner:
        session = await runner.create_session("scripted")
        handle = await runner.run_turn(session.id, "x")
        await anyio.sleep(0.05)
        assert await handle.cancel() is True
        assert handle.status is TurnStatus.CANCELLED
        assert handle.error == "cancel hook failed: ConnectionError: provider unreachable"

    items = reload(tmp_path, session.id).items
    assert any(isinstance(i, ErrorItem) and i.code == "cancel_hook_failed" for i in items)


async def test_a_second_turn_cancels_the_first_and_records_why(tmp_path: Path) -> None:
    calls: list[str] = []
    agent = Scripted(hook=lambda: calls.append("abort"))
    async with running(tmp_path, {"scripted": lambda deps: agent}) as runner:
        session = await runner.create_session("scripted")
        first = await runner.run_turn(session.id, "one")
        await anyio.sleep(0.05)
        second = await runner.run_turn(session.id, "two")
        assert first.status is TurnStatus.CANCELLED and calls == ["abort"]
        assert runner.active_turn(session.id) is second
        agent.release.set()
        assert (await second.wait(5)).result == "echo:two"

    on_disk = reload(tmp_path, session.id)
    cancelled = next(i for i in on_disk.items if isinstance(i, EventItem) and i.kind == "turn-cancelled")
    assert cancelled.data["reason"] == f"superseded by turn {second.id}"
    assert kinds(on_disk).count("turn-completed") == 1


async def test_an_agent_that_returns_without_finishing_fails_the_turn(tmp_path: Path) -> None:
    class Lazy:
        id = name = "lazy"

        async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
            return None

    async with running(tmp_path, {"lazy": lambda deps: Lazy()}) as runner:
        session = await runner.create_session("lazy")
        handle = await (await runner.run_turn(session.id, "x")).wait(5)
        assert handle.status is TurnStatus.FAILED and "without finishing" in (handle.error or "")


async def test_output_after_the_end_is_refused(tmp_path: Path) -> None:
    leftovers: list[BaseException] = []
    checked = anyio.Event()

    class Chatty:
        id = name = "chatty"

        async def run(self, input: str, session: Session, ctx: TurnContext) -> None:
            await ctx.turn.finish("done")
            for late in (ctx.turn.finish("again"), ctx.turn.append_item(EventItem(kind="late"))):
                try:
                    await late
                except TurnClosed as exc:
                    leftovers.append(exc)
            checked.set()

    async with running(tmp_path, {"chatty": lambda deps: Chatty()}) as runner:
        session = await runner.create_session("chatty")
        handle = await (await runner.run_turn(session.id, "x")).wait(5)
        with anyio.fail_after(5):
            await checked.wait()
        assert handle.result == "done" and len(leftovers) == 2
    assert not any(isinstance(i, EventItem) and i.kind == "late" for i in reload(tmp_path, session.id).items)


async def test_cancelling_mid_tool_call_leaves_no_orphan_on_disk_or_after_reload(tmp_path: Path) -> None:
    """A tool that is still running when the turn is cancelled gets a closing result; the tool is stopped."""
    started = anyio.Event()
    stopped: list[str] = []

    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse:
        if request.step == 1:
            return ModelResponse.calling(("quick", {}))
        return ModelResponse.calling(("slow", {}))

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(model, id="f")}) as runner:

        @runner.tools.tool
        async def slow() -> str:
            started.set()
            try:
                await anyio.sleep(60)
            finally:
                stopped.append("slow")
            return "never"

        @runner.tools.tool
        def quick() -> str:
            return "quick result"

        session = await runner.create_session("f")
        handle = await runner.run_turn(session.id, "go")
        with anyio.fail_after(5):
            await started.wait()
        assert await handle.cancel("the user pressed stop")
        assert stopped == ["slow"]
        live = await runner.get_session(session.id)
        assert live is not None and live.open_tool_calls() == []

    reloaded = reload(tmp_path, session.id)
    assert reloaded.open_tool_calls() == []
    results = {i.name: i for i in reloaded.items if isinstance(i, ToolResultItem)}
    assert results["slow"].synthetic and results["slow"].is_error and "the user pressed stop" in results["slow"].output
    assert results["quick"].output == "quick result"
    assert not any(i.kind == "turn-interrupted" for i in reloaded.items if isinstance(i, EventItem))
    roles = [m["role"] for m in chat_messages(reloaded.items)]
    assert roles == ["user", "assistant", "tool", "assistant", "tool"]


async def test_the_runner_must_be_entered(tmp_path: Path) -> None:
    from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface

    runner = AgentRunner(store=tmp_path, registry=AgentRegistry(), tools=AgentToolSurface(AgentApprovals()))
    session = await runner.create_session("nobody")
    with pytest.raises(AgentError, match="async with"):
        await runner.run_turn(session.id, "x")
