"""One trace from a turn to the unit's test process: the runner's spans (invoke_agent, chat, execute_tool, the wait
for a person), the SDK's client and server spans, the unit server's (write, reload, test run) and the stages the
test process hands back, all under the turn's trace id with the parent links right. Message contents and tool
arguments stay out unless the conventions' opt-in is set."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from unit_mcp import tracing
from unit_mcp.agent import (
    AgentApprovals,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    ApprovalRequest,
    McpToolSource,
    OpenAIAgent,
    TurnStatus,
)
from unit_mcp.testing import ScriptedModel, ScriptedUsage, call, say, tool_call

from .conftest import UnitServer, by_name

pytestmark = pytest.mark.anyio

MARKER = "otel-marker-5d1e9c"
"""Text the patch writes into the unit's source: it must not reach a span unless content capture is on."""


async def run_turn(tmp_path: Path, server: UnitServer) -> list[ApprovalRequest]:
    """A turn that lists the units, patches counter (a person approves), reloads it and runs its test."""
    asked: list[ApprovalRequest] = []

    def person(request: ApprovalRequest) -> bool:
        asked.append(request)
        return True

    patch = {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": f"step = 1  # {MARKER}"}
    steps = [
        call(tool_call("unit_list")),
        call(tool_call("unit_apply_patch", patch)),
        call(tool_call("unit_reload", {"unit_id": "counter"})),
        call(tool_call("unit_run_tests", {"unit_id": "counter"})),
        say("done", usage=ScriptedUsage(prompt_tokens=30, completion_tokens=2)),
    ]
    surface = AgentToolSurface(AgentApprovals(approver=person))
    registry = AgentRegistry()
    async with ScriptedModel(steps) as model:
        registry.register("o", lambda deps: OpenAIAgent(id="o", model="scripted-model", base_url=model.base_url))
        async with McpToolSource(server.url, token=server.token) as source:
            surface.add_source(source)
            async with AgentRunner(store=tmp_path / "sessions", registry=registry, tools=surface) as runner:
                session = await runner.create_session("o")
                handle = await (await runner.run_turn(session.id, "patch counter")).wait(60)
    assert handle.status is TurnStatus.COMPLETED, handle.error
    assert handle.result == "done"
    return asked


def parent(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None, f"{span.name} has no parent"
    return spans[span.parent.span_id]


def ancestor_names(span: ReadableSpan, spans: dict[int, ReadableSpan]) -> list[str]:
    names = []
    while span.parent is not None:
        span = spans[span.parent.span_id]
        names.append(span.name)
    return names


async def test_a_turn_is_one_trace_across_runner_server_and_test_process(
    tmp_path: Path, exporter: InMemorySpanExporter, traced_server: UnitServer
) -> None:
    asked = await run_turn(tmp_path, traced_server)
    assert "unit_apply_patch" in [request.tool for request in asked]
    every = exporter.get_finished_spans()
    (turn,) = by_name(every, "invoke_agent o")
    finished = [s for s in every if s.context.trace_id == turn.context.trace_id]
    # outside the turn's trace: only the MCP source connecting (before the turn), and its answers
    assert {s.name.removeprefix("MCP send ") for s in every if s not in finished} <= {"server/discover", "tools/list"}
    spans = {s.context.span_id: s for s in finished}
    assert turn.parent is None
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.id"] == "o"
    assert turn.attributes["gen_ai.conversation.id"]

    chats = by_name(finished, "chat scripted-model")
    assert len(chats) == 5 and all(parent(c, spans) is turn for c in chats)
    assert {c.attributes["gen_ai.provider.name"] for c in chats} == {"openai"}
    assert chats[-1].attributes["gen_ai.usage.input_tokens"] == 30
    assert chats[-1].attributes["gen_ai.usage.output_tokens"] == 2
    assert [c.attributes["gen_ai.response.finish_reasons"] for c in chats] == [("tool_calls",)] * 4 + [("stop",)]

    tools = [s for s in finished if s.name.startswith("execute_tool ")]
    assert [t.attributes["gen_ai.tool.name"] for t in sorted(tools, key=lambda s: s.start_time)] == [
        "unit_list", "unit_apply_patch", "unit_reload", "unit_run_tests",
    ]  # fmt: skip
    assert all(parent(t, spans) is turn for t in tools)
    (patching,) = by_name(finished, "execute_tool unit_apply_patch")
    assert patching.attributes["gen_ai.operation.name"] == "execute_tool"
    assert patching.attributes["gen_ai.tool.call.id"]
    assert patching.attributes["unit_mcp.risk"] == "shell"  # a write runs the unit's code (reload)
    assert patching.attributes["unit_mcp.approval.decision"] == "approved"
    assert patching.attributes["unit_mcp.approval.by"] == "approver"
    waits = by_name(finished, "approval wait")
    assert sorted(parent(w, spans).name for w in waits) == sorted(f"execute_tool {r.tool}" for r in asked)

    # the server continues the trace from `_meta`: the SDK's server span under its client span under our tool span
    (served,) = [s for s in by_name(finished, "tools/call unit_apply_patch") if s.kind is SpanKind.SERVER]
    assert parent(served, spans).kind is SpanKind.CLIENT
    assert parent(parent(served, spans), spans) is patching
    (write,) = by_name(finished, "unit write")
    assert parent(write, spans) is served
    assert (write.attributes["unit_mcp.tool"], write.attributes["unit_mcp.unit_id"]) == ("unit_apply_patch", "counter")
    assert write.attributes["unit_mcp.outcome"] == "applied"
    assert write.attributes["unit_mcp.change_id"] >= 1
    assert len(write.attributes["unit_mcp.hashes_after"][0]) >= 64
    reloads = by_name(finished, "unit reload")
    assert len(reloads) == 2
    assert {parent(r, spans).name for r in reloads} == {"unit write", "tools/call unit_reload"}
    assert all(r.attributes["unit_mcp.reload.duration_ms"] > 0 for r in reloads)

    (run,) = by_name(finished, "unit test run")
    assert ancestor_names(run, spans)[:2] == ["tools/call unit_run_tests", "MCP send tools/call unit_run_tests"]
    assert run.attributes["unit_mcp.test_run.id"]
    assert run.attributes["unit_mcp.test_run.exit_code"] == 0
    assert run.attributes["unit_mcp.test_run.timed_out"] is False
    # the test process's own stages, handed back and emitted under the run
    stages = by_name(finished, "unit load") + by_name(finished, "unit test")
    assert sorted(s.name for s in stages) == ["unit load", "unit test"]
    assert all(parent(s, spans) is run for s in stages)
    pids = {s.attributes["unit_mcp.test.pid"] for s in stages}
    assert len(pids) == 1 and os.getpid() not in pids
    (tested,) = by_name(finished, "unit test")
    assert tested.attributes["unit_mcp.test.exit_code"] == 0
    assert run.start_time <= tested.start_time <= tested.end_time <= run.end_time
    assert not [s for s in finished if s.status.status_code is StatusCode.ERROR]


@pytest.mark.parametrize("capture", [False, True])
async def test_content_reaches_spans_only_when_asked(
    tmp_path: Path,
    exporter: InMemorySpanExporter,
    traced_server: UnitServer,
    capture: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if capture:
        monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "true")
    else:
        monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV, raising=False)
    await run_turn(tmp_path, traced_server)
    assert MARKER in (traced_server.units_root / "counter" / "__init__.py").read_text()
    exported = "\n".join(span.to_json() for span in exporter.get_finished_spans())
    assert (MARKER in exported) is capture
    assert ("patch counter" in exported) is capture  # the user's message
    if capture:
        (patching,) = by_name(exporter.get_finished_spans(), "execute_tool unit_apply_patch")
        assert MARKER in json.loads(patching.attributes["gen_ai.tool.call.arguments"])["new"]


async def test_tracing_off_makes_no_span_and_puts_nothing_in_meta() -> None:
    assert not tracing.enabled()
    with tracing.span("x", {"a": 1}) as span:
        assert not span.is_recording()
        assert tracing.inject_meta({}) == {}
        assert tracing.environment() == {}
