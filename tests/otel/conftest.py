"""Fixtures for the tracing tests: the SDK's in-memory exporter as the process's tracer provider (for one test:
the API's globals are put back after it, as the OpenTelemetry project's own test utilities do), a real unit server
over loopback HTTP built after the provider is set (so it keeps the SDK's server spans), and a loopback OTLP/HTTP
receiver that decodes what it is sent with `opentelemetry-proto`."""

from __future__ import annotations

import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mcp.shared._otel as mcp_otel
import pytest
from agent.conftest import UnitServer, unit_server  # the agent tests' unit server (durable turns), and its handle
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from unit_mcp import Host, UnitService, tracing
from unit_mcp.bridge import Bridge
from unit_mcp.tools import UnitTools

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_UNITS = REPO / "unit_mcp" / "examples" / "units"


def _reset_globals() -> None:
    """The API sets its provider once per process; tests put it back (opentelemetry-test-utils does the same), and
    the module-level proxy tracers (ours, the SDK's) forget the tracer of the provider they were handed."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
    trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
    for proxy in (tracing._tracer, mcp_otel._tracer):
        assert isinstance(proxy, trace.ProxyTracer)
        proxy._real_tracer = None  # type: ignore[attr-defined]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test: every span ends up in the returned exporter."""
    _reset_globals()
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "unit-mcp-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)
    try:
        yield memory
    finally:
        provider.shutdown()
        _reset_globals()


@pytest.fixture
async def traced_server(tmp_path: Path, exporter: InMemorySpanExporter) -> AsyncIterator[UnitServer]:
    """The real tool layer over a real Host on a copy of the example units (namespace `units`, as their tests
    import them), served by the real Bridge."""
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    with Host(units, tmp_path / "host-data", namespace="units") as host:
        tools = UnitTools(UnitService(host, test_timeout=30))
        async with Bridge(tools.server(), config_root=tmp_path / "unit-opencode") as bridge:
            yield UnitServer(bridge, units)  # its units folder as `units_root`


@dataclass
class Receiver:
    """A loopback OTLP/HTTP receiver: each POST to /v1/traces decoded into `requests`."""

    server: ThreadingHTTPServer
    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        """(resource attributes, span) for every span received."""
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    out.extend((resource, span) for span in scope.spans)
        return out

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: predicate(self.spans()), timeout)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    holder: list[Receiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
            ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
            if ok:
                with holder[0].arrived:
                    holder[0].requests.append(request)
                    holder[0].arrived.notify_all()
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    holder.append(Receiver(server))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder[0]
    finally:
        server.shutdown()
        server.server_close()


__all__ = ["unit_server"]


def by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]
