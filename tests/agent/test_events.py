"""Runner-wide events through the real runner: one subscription across sessions, slow subscribers, and the
same stream as server-sent events over a real loopback HTTP server."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from unit_mcp.agent import (
    AgentApprovals,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    FunctionAgent,
    ModelRequest,
    ModelResponse,
    OpenAIAgent,
    PendingApprovals,
    SessionStore,
    TurnContext,
)
from unit_mcp.agent.events import RunnerEvent, Subscription, events_app
from unit_mcp.agent.items import EventItem, MessageItem, Session
from unit_mcp.loopback import Guard, LoopbackServer, security_settings
from unit_mcp.testing import ScriptedModel, say

from .conftest import running
from .test_paused_approvals import SESSION as PAUSED_SESSION
from .test_paused_approvals import app as paused_app
from .test_paused_approvals import kill_while_waiting

pytestmark = pytest.mark.anyio


def calls_then(text: str, *calls: tuple[str, dict[str, object]]) -> Callable[[ModelRequest, TurnContext], object]:
    def model(request: ModelRequest, ctx: TurnContext) -> ModelResponse | str:
        return ModelResponse.calling(*calls) if request.step == 1 and calls else text

    return model


async def drain(subscription: Subscription, until: Callable[[RunnerEvent], bool]) -> list[RunnerEvent]:
    events: list[RunnerEvent] = []
    with anyio.fail_after(10):
        async for event in subscription:
            events.append(event)
            if until(event):
                return events
    return events


def ended(event: RunnerEvent) -> bool:
    return event.kind == "turn-status" and event.data["status"] in {"completed", "failed", "cancelled", "disposed"}


async def test_one_subscription_sees_a_turn_from_start_to_end(tmp_path: Path) -> None:
    agents = {"f": lambda deps: FunctionAgent(calls_then("all done", ("work", {"n": 2})), id="f")}
    async with running(tmp_path, agents) as runner:

        @runner.tools.tool
        def work(n: int) -> str:
            return "x" * n

        session = await runner.create_session("f")
        async with runner.events() as events:
            handle = await runner.run_turn(session.id, "go")
            seen = await drain(events, lambda e: e.kind == "agent-status" and e.data["status"] == "idle")
        await handle.wait(5)

    assert all(e.session_id == session.id and e.turn_id == handle.id for e in seen if e.kind != "agent-status")
    assert [(e.kind, e.data.get("status") or e.data.get("name") or e.data.get("delta")) for e in seen] == [
        ("turn-status", "running"),
        ("agent-status", "running"),  # the agent's own status: running while any turn of it runs
        ("text", ""),
        ("tool-call-started", "work"),
        ("tool-call-finished", "work"),
        ("text", "all done"),
        ("turn-status", "completed"),
        ("agent-status", "idle"),
    ]
    assert {e.data["agent_id"] for e in seen if e.kind == "agent-status"} == {"f"}
    finished = seen[4].data
    assert finished["is_error"] is False and finished["duration"] >= 0
    assert [e.seq for e in seen] == sorted(e.seq for e in seen)


async def test_events_of_every_session_arrive_on_one_subscription(tmp_path: Path) -> None:
    agents = {"f": lambda deps: FunctionAgent(calls_then("ok"), id="f")}
    async with running(tmp_path, agents) as runner:
        one, two = await runner.create_session("f"), await runner.create_session("f")
        async with runner.events() as events:
            first = await runner.run_turn(one.id, "a")
            second = await runner.run_turn(two.id, "b")
            await first.wait(5)
            await second.wait(5)
            seen: list[RunnerEvent] = []
            with anyio.fail_after(5):
                while sum(ended(e) for e in seen) < 2:
                    seen.append(await events.next())
    assert {e.session_id for e in seen if ended(e)} == {one.id, two.id}


async def test_queued_cancelled_and_disposed_are_reported(tmp_path: Path) -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest, ctx: TurnContext) -> str:
        await release.wait()
        return "late"

    async with running(tmp_path, {"f": lambda deps: FunctionAgent(slow, id="f")}) as runner:
        session, other = await runner.create_session("f"), await runner.create_session("f")
        events = runner.events()
        handle = await runner.run_turn(session.id, "first")
        assert await runner.enqueue(session.id, "second") is None
        await handle.cancel("changed my mind")
        await runner.run_turn(other.id, "left running")
        statuses = [(e.session_id, e.data["status"]) for e in events.ready() if e.kind == "turn-status"]
        assert statuses[:3] == [(session.id, "running"), (session.id, "queued"), (session.id, "cancelled")]
    # leaving the runner disposes of the turns still running, and ends the subscription
    rest = [e async for e in events]
    assert (other.id, "disposed") in [(e.session_id, e.data.get("status")) for e in rest if e.kind == "turn-status"]
    assert events.closed


async def test_approvals_requested_and_answered(tmp_path: Path) -> None:
    pending = PendingApprovals()
    approvals = AgentApprovals(approver=pending)
    surface = AgentToolSurface(approvals)

    @surface.tool(risk="shell")
    def build() -> str:
        return "built"

    agents = {"f": lambda deps: FunctionAgent(calls_then("built it", ("build", {})), id="f")}
    async with running(tmp_path, agents, surface=surface) as runner:
        session = await runner.create_session("f")
        async with runner.events() as events:
            handle = await runner.run_turn(session.id, "build")
            asked = await drain(events, lambda e: e.kind == "approval-requested")
            request = asked[-1].data["request"]
            assert request["risk"] == "shell" and request["tool"] == "build"
            waiting = await events.next()
            assert (waiting.kind, waiting.data["status"]) == ("turn-status", "waiting-for-approval")
            await runner.answer_approval(session.id, request["id"], approved=True)
            rest = await drain(events, ended)
        assert (await handle.wait(5)).result == "built it"
    answered = next(e for e in rest if e.kind == "approval-answered")
    assert answered.data == {"request_id": request["id"], "approved": True, "decided_by": "approver"}
    after = [e.data["status"] for e in rest if e.kind == "turn-status"]
    assert after == ["running", "completed"]


async def test_a_slow_subscriber_never_blocks_a_turn_and_is_told_what_it_missed(tmp_path: Path) -> None:
    calls = [("work", {"n": i}) for i in range(1, 6)]
    agents = {"f": lambda deps: FunctionAgent(calls_then("done", *calls), id="f", parallel_tools=False)}
    async with running(tmp_path, agents) as runner:

        @runner.tools.tool
        def work(n: int) -> str:
            return str(n)

        session = await runner.create_session("f")
        slow = runner.events(buffer=3)  # never read while the turn runs
        with slow:
            watcher = runner.events()
            handle = await runner.run_turn(session.id, "go")
            assert (await handle.wait(5)).result == "done"
            total = len(watcher.ready())
            gap = await slow.next()
            kept = [await slow.next() for _ in range(3)]
    assert total > 3
    assert gap.kind == "gap" and gap.data["dropped"] == total - 3
    assert gap.data["resumes_at"] == kept[0].seq
    assert ended(kept[-2]) and (kept[-1].kind, kept[-1].data["status"]) == ("agent-status", "idle")


async def test_server_sent_events_over_loopback(tmp_path: Path) -> None:
    agents = {"f": lambda deps: FunctionAgent(calls_then("streamed over http"), id="f")}
    async with running(tmp_path, agents) as runner:
        session = await runner.create_session("f")
        server = LoopbackServer()
        port = server.bind()
        token = "t0ken"
        app = events_app(runner)
        await server.start(Guard(app, security=security_settings(server.host, port), token=token))
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as http:
                refused = await http.get("/events")
                assert refused.status_code == 401
                headers = {"Authorization": f"Bearer {token}"}
                frames: list[tuple[str, dict[str, object]]] = []
                async with http.stream("GET", "/events", params={"session_id": session.id}, headers=headers) as sse:
                    assert sse.headers["content-type"].startswith("text/event-stream")
                    kind = ""
                    with anyio.fail_after(10):
                        async for line in sse.aiter_lines():
                            if line.startswith("event:"):
                                kind = line.split(":", 1)[1].strip()
                            elif line.startswith("data:"):
                                data = json.loads(line.split(":", 1)[1])
                                frames.append((kind, data))
                                if kind == "ready":
                                    handle = await runner.run_turn(session.id, "hello")
                                elif kind == "turn-status" and data["data"]["status"] == "completed":
                                    break
        finally:
            await server.stop()
        await handle.wait(5)
    kinds = [kind for kind, _ in frames]
    assert kinds == ["ready", "turn-status", "agent-status", "text", "turn-status"]
    assert frames[3][1]["data"]["delta"] == "streamed over http"
    assert frames[3][1]["session_id"] == session.id


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(min_size=1, max_size=120), chunk_size=st.integers(min_value=1, max_value=16))
def test_streamed_text_chunks_always_join_to_the_final_message(text: str, chunk_size: int) -> None:
    """Property (reference 002): at every point the text streamed so far is a prefix of the final message,
    and the chunks joined are the message the journal keeps."""

    async def example() -> tuple[list[RunnerEvent], str]:
        with tempfile.TemporaryDirectory() as tmp:
            async with ScriptedModel([say(text, chunk_size=chunk_size)]) as model:
                agents = {"o": lambda deps: OpenAIAgent(id="o", model="m", base_url=model.base_url)}
                async with running(Path(tmp), agents) as runner:
                    session = await runner.create_session("o")
                    async with runner.events() as events:
                        handle = await runner.run_turn(session.id, "talk")
                        seen = await drain(events, ended)
                    await handle.wait(10)
                    stored = await runner.get_session(session.id)
                    assert stored is not None
                    final = next(i for i in stored.items if isinstance(i, MessageItem) and i.role == "assistant")
                    return seen, final.content

    seen, final = anyio.run(example)
    chunks = [e for e in seen if e.kind == "text"]
    assert chunks and chunks[-1].data["final"] and not any(e.data["restart"] for e in chunks)
    streamed = ""
    for chunk in chunks:
        streamed += chunk.data["delta"]
        assert final.startswith(streamed)
    assert streamed == final == text


async def test_a_turn_resumed_after_its_process_ended_reports_its_answer_and_the_call(tmp_path: Path) -> None:
    waited = kill_while_waiting(tmp_path, calls=1)
    runner, _ = paused_app(tmp_path).build(tmp_path, 1)
    async with runner, runner.events() as events:
        handle = (await runner.answer_approval(PAUSED_SESSION, waited[0], approved=True)).handle
        assert handle is not None
        seen = [e for e in await drain(events, ended) if e.kind not in ("text", "agent-status")]
    assert [(e.kind, e.data.get("status") or e.data.get("name")) for e in seen] == [
        ("approval-answered", None),
        ("turn-status", "running"),
        ("tool-call-started", "deploy"),
        ("tool-call-finished", "deploy"),
        ("turn-status", "completed"),
    ]
    assert seen[0].data == {"request_id": waited[0], "approved": True, "decided_by": "approver"}
    assert seen[0].turn_id != handle.id and seen[1].data["resumes"] == seen[0].turn_id
    assert seen[2].data["resumed"] is True and seen[3].data["is_error"] is False


class HeldStore(SessionStore):
    """A real store whose `require` can be held, to stop a turn's start half-way (on a worker thread)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold = threading.Event()
        self.held = threading.Event()
        self.hold.set()

    def require(self, session_id: str) -> Session:
        if not self.hold.is_set():
            self.held.set()
            self.hold.wait(10)
        return super().require(session_id)


async def test_a_queued_turn_starting_while_the_runner_shuts_down_is_disposed_not_left_running(
    tmp_path: Path,
) -> None:
    asked = anyio.Event()

    async def forever(request: ModelRequest, ctx: TurnContext) -> str:
        asked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    registry = AgentRegistry()
    registry.register("f", lambda deps: FunctionAgent(forever, id="f"))
    store = HeldStore(tmp_path / "sessions")
    runner = AgentRunner(store=store, registry=registry, tools=AgentToolSurface(AgentApprovals()), cancel_timeout=5)
    events = runner.events()
    with anyio.fail_after(30):  # before the fix the queued turn started after the shutdown and ran for ever
        async with runner:
            session = await runner.create_session("f")
            first = await runner.run_turn(session.id, "first")
            assert await runner.enqueue(session.id, "second") is None
            await asked.wait()
            store.hold.clear()  # the queued turn's start will stop in `require`
            await first.cancel("next one")
            await anyio.to_thread.run_sync(store.held.wait, 10)
            threading.Timer(0.5, store.hold.set).start()  # released once the runner is shutting down
    store.close()
    statuses = [e.data["status"] for e in events.ready() if e.kind == "turn-status"]
    assert statuses == ["running", "queued", "cancelled", "disposed"]
    items = SessionStore(tmp_path / "sessions").require(session.id).items
    assert [i.kind for i in items if isinstance(i, EventItem) and i.kind.startswith("turn-")] == [
        "turn-started",
        "turn-cancelled",
        "turn-started",
        "turn-cancelled",
    ]


async def test_agent_status_follows_every_turn_of_an_agent_and_ends_disposed(tmp_path: Path) -> None:
    release = anyio.Event()

    async def slow(request: ModelRequest, ctx: TurnContext) -> str:
        await release.wait()
        return "done"

    agents = {"f": lambda deps: FunctionAgent(slow, id="f"), "g": lambda deps: FunctionAgent(slow, id="g")}
    async with running(tmp_path, agents) as runner:
        one, two, three = [await runner.create_session(agent) for agent in ("f", "f", "g")]
        events = runner.events()
        first, second = await runner.run_turn(one.id, "a"), await runner.run_turn(two.id, "b")
        await runner.run_turn(three.id, "c")
        release.set()
        await first.wait(5)
        await second.wait(5)
        seen = await drain(events, lambda e: e.kind == "agent-status" and e.data == {"agent_id": "f", "status": "idle"})
        release = anyio.Event()  # a new turn of g waits until the runner stops
        await runner.run_turn(three.id, "d")
    seen += [e async for e in events]  # the rest, up to the runner's end
    statuses = [(e.data["agent_id"], e.data["status"]) for e in seen if e.kind == "agent-status"]
    assert [s for s in statuses if s[0] == "f"] == [("f", "running"), ("f", "idle"), ("f", "disposed")]  # 2 turns
    assert [s for s in statuses if s[0] == "g"][-2:] == [("g", "running"), ("g", "disposed")]
