"""A durable turn traces once: its worker (a real process exporting over OTLP/HTTP to a receiver started here) is
SIGKILLed in the middle of a tool call and restarted; the resumed turn's spans join the first worker's trace, a
step DBOS replays (the first model request, the first tool call) makes no span again, and the call the kill
interrupted makes one (from the run that completed it)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from agent.conftest import UnitServer
from durable.provider_worker import AGENT
from durable.workers import Workers, durable_data, submitted

from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import Receiver

pytestmark = pytest.mark.anyio


async def test_a_killed_and_resumed_durable_turn_has_one_span_per_completed_call_in_one_trace(
    tmp_path: Path, unit_server: UnitServer, receiver: Receiver
) -> None:
    script = [
        call(tool_call("record_value", {"value": "one"}), label="first call"),
        call(tool_call("slow_echo", {"seconds": 3}), when=Match(last_role="tool"), label="the call worker A dies in"),
        say("done", when=Match(last_role="tool"), label="final"),
    ]
    data, system_db = durable_data(tmp_path)
    async with ScriptedModel(script) as model:
        env = {"MCP_TOKEN": unit_server.token, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        env["OTEL_BSP_SCHEDULE_DELAY"] = "50"
        workers = Workers.script(data, system_db, "openai", unit_server.url, model.base_url, env)
        async with submitted(workers, system_db, AGENT, "ses-traced", "record one, then wait") as turn:
            with anyio.fail_after(60):
                while "slow_echo" not in unit_server.called():
                    await anyio.sleep(0.05)

            def first_call_exported(spans: list) -> bool:  # type: ignore[type-arg]
                """Everything worker A ended before the kill: the first call and both model requests (the second
                one's span ends as slow_echo starts, and a loaded machine may export it a batch later)."""
                names = [span.name for _, span in spans]
                return "execute_tool record_value" in names and names.count("chat scripted") == 2

            assert await anyio.to_thread.run_sync(receiver.wait_for, first_call_exported, 20)
            workers.kill("worker-a")  # in the middle of slow_echo
            await workers.start("worker-a")  # resumes the turn: the tool step runs again, the rest replays
            with anyio.fail_after(120):
                assert await turn.client.wait(turn.turn_id) == "done"

            def resumed_turn_exported(spans: list) -> bool:  # type: ignore[type-arg]
                return any(span.name == "invoke_agent agent" for _, span in spans)

            # The worker exports what it ended in batches (every 50 ms): wait for the turn's span before the SIGKILL.
            assert await anyio.to_thread.run_sync(receiver.wait_for, resumed_turn_exported, 30)
            workers.close()
        model.assert_done()
    await anyio.sleep(0.5)
    spans = [span for resource, span in receiver.spans() if resource["service.name"] == "unit-mcp-agent"]
    names = sorted(span.name for span in spans)
    assert names.count("execute_tool record_value") == 1, names
    assert names.count("execute_tool slow_echo") == 1, names  # the interrupted run never ended: never exported
    assert [c.name for c in unit_server.calls].count("slow_echo") == 2  # it did run twice (replay-safe tool)
    assert len(model.requests) == 3  # the resumed turn took the first two answers from DBOS, not the model
    assert names.count("chat scripted") == 3, names  # one per model request: a replayed step made none
    (resumed,) = [span for span in spans if span.name == "invoke_agent agent"]
    connecting = {"MCP send server/discover", "MCP send tools/list"}  # each worker's MCP source, before any turn
    assert {span.trace_id for span in spans if span.name not in connecting} == {resumed.trace_id}, names
    assert resumed.parent_span_id, "the resumed turn's span continues the first worker's"
    attributes = {a.key: a.value for a in resumed.attributes}
    assert attributes["unit_mcp.turn.resumed"].bool_value is True
