"""The commands export over OTLP/HTTP when the standard variables say so: `unit-mcp serve` and `unit-mcp agent run`
as real subprocesses, a loopback receiver started here decoding what arrives with `opentelemetry-proto`; one trace
from the agent's turn to the server's tool call, each side under its own `service.name`."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from support.server_process import ServerProcess

from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import REPO, Receiver

pytestmark = pytest.mark.anyio


def otel_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }


async def test_serve_and_agent_export_one_trace_over_otlp(
    tmp_path: Path, receiver: Receiver, server_processes: list[ServerProcess]
) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "MCP_", "UNIT_MCP_", "OPENAI_"))}
    server = ServerProcess("--no-watch", tmp=tmp_path, env=otel_env(receiver))
    server_processes.append(server)
    printed = server.ready()
    token_file = tmp_path / "mcp-token"
    token_file.write_text(printed["MCP_TOKEN"] + "\n")
    token_file.chmod(0o600)
    steps = [call(tool_call("unit_list")), say("listed", when=Match(last_role="tool"))]
    async with ScriptedModel(steps) as model:
        done = await anyio.run_process(
            [
                sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(tmp_path / "agent-data"), "run",
                "--model", "m", "--base-url", model.base_url, "--mcp-url", printed["MCP_URL"],
                "--mcp-token-file", str(token_file), "list", "the", "units",
            ],
            cwd=REPO, check=False, env={**clean, **otel_env(receiver)},
        )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "listed"
    assert server.stop(signal.SIGTERM) == 0  # its spans are flushed as it exits

    def both(spans: list) -> bool:  # type: ignore[type-arg]
        return {"unit-mcp-agent", "unit-mcp-server"} <= {resource["service.name"] for resource, _ in spans}

    assert receiver.wait_for(both, 20), [resource for resource, _ in receiver.spans()]
    spans = receiver.spans()
    assert {resource.get("deployment.environment") for resource, _ in spans} == {"test"}
    agent = {span.name: span for resource, span in spans if resource["service.name"] == "unit-mcp-agent"}
    served = {span.name: span for resource, span in spans if resource["service.name"] == "unit-mcp-server"}
    turn = agent["invoke_agent unit-agent"]
    assert not turn.parent_span_id
    assert {"chat m", "execute_tool unit_list", "MCP send tools/call unit_list"} <= set(agent)
    call_span = served["tools/call unit_list"]
    assert call_span.trace_id == turn.trace_id
    assert call_span.parent_span_id == agent["MCP send tools/call unit_list"].span_id
    assert agent["MCP send tools/call unit_list"].parent_span_id == agent["execute_tool unit_list"].span_id
    attributes = {a.key: a.value for a in call_span.attributes}
    assert attributes["mcp.method.name"].string_value == "tools/call"
    assert attributes["gen_ai.tool.name"].string_value == "unit_list"


def test_an_unknown_exporter_is_one_line(tmp_path: Path) -> None:
    from unit_mcp import tracing

    os.environ["OTEL_TRACES_EXPORTER"] = "zipkin"
    try:
        with pytest.raises(SystemExit, match="OTEL_TRACES_EXPORTER names zipkin; use otlp, console or none"):
            tracing.configure("unit-mcp-server", "unit-mcp serve")
    finally:
        del os.environ["OTEL_TRACES_EXPORTER"]
    assert not tracing.enabled()
