"""Our OpenTelemetry spans, over `opentelemetry-api` only (the SDK and an exporter are the user's choice: the
`[otel]` extra and `configure`, or their own `TracerProvider`).

With no tracer provider set, `span` hands back one shared no-op context: nothing is created, no context is attached
(bench/RESULTS.md, "otel"). Names and attributes follow the GenAI and MCP semantic conventions; message contents,
tool arguments and results are recorded only when `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT` is true.
Context crosses processes as W3C `traceparent`/`tracestate`: in an MCP request's `params._meta` and in a test
process's environment (`TRACEPARENT`, `TRACESTATE`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import json
import os
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

from ._version import __version__
from .extras import require_extra

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The conventions' opt-in for message contents, tool arguments and results (off unless `true`)."""
ENV_CARRIER = {"traceparent": "TRACEPARENT", "tracestate": "TRACESTATE"}
"""W3C trace context as environment variables (the names a child process reads)."""
SPANS_FILE = ".unit-mcp-spans.jsonl"
"""Where a test process leaves the spans it hands back to the server, in its scratch folder."""
_HANDED_BACK = frozenset({"unit load", "unit test"})
"""The only span names a test process may hand back (it runs the unit's code: anything else is dropped)."""

P = ParamSpec("P")
R = TypeVar("R")

_tracer = trace.get_tracer("unit_mcp", __version__)
_OFF: AbstractContextManager[Span] = contextlib.nullcontext(INVALID_SPAN)


def enabled() -> bool:
    """Whether a tracer provider is set (with none, every span of ours is the API's no-op)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def capture_content() -> bool:
    return os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    context: otel_context.Context | None = None,
) -> AbstractContextManager[Span]:
    """A span of ours made current for its block (an exception is recorded and sets the status to error); the
    shared no-op when tracing is off. `None` attribute values are left out."""
    if not enabled():
        return _OFF
    values = {k: v for k, v in (attributes or {}).items() if v is not None}
    return _tracer.start_as_current_span(name, context=context, kind=kind, attributes=values)


def traced(name: str, **attributes: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """The function run inside a `span` named `name` whose attributes are the call's arguments: `attributes` maps
    an attribute (`__` for `.`, as in `set_attributes`) to the parameter that gives its value. The function is
    called as it is with tracing off."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            if not enabled():
                return function(*args, **kwargs)
            given = signature.bind(*args, **kwargs).arguments
            with span(name, {k.replace("__", "."): given.get(p) for k, p in attributes.items()}):
                return function(*args, **kwargs)

        return call

    return decorate


def current() -> Span:
    """The current span (the API's invalid span when none, or with tracing off)."""
    return trace.get_current_span()


def set_attributes(target: Span, **values: Any) -> None:
    """Set the attributes that have a value; keyword names use `__` for `.` (`gen_ai__usage__input_tokens`)."""
    if target.is_recording():
        target.set_attributes({k.replace("__", "."): v for k, v in values.items() if v is not None})


def set_content(target: Span, key: str, value: Any) -> None:
    """Record a content attribute (a message, tool arguments or a result) only under the conventions' opt-in."""
    if target.is_recording() and capture_content() and value is not None:
        target.set_attribute(key, value if isinstance(value, str) else json.dumps(value, default=str))


def add_event(name: str, **attributes: Any) -> None:
    current = trace.get_current_span()
    if current.is_recording():
        current.add_event(name, {k: v for k, v in attributes.items() if v is not None})


def fail(target: Span, error_type: str, description: str | None = None) -> None:
    """Mark a span failed with the conventions' `error.type` (a refusal or a tool error: no exception)."""
    if target.is_recording():
        target.set_attribute("error.type", error_type)
        target.set_status(Status(StatusCode.ERROR, description))


# -- switching it on in a command ----------------------------------------------------------------

EXPORTERS = ("otlp", "console", "none")


def configure(service_name: str, prog: str) -> bool:
    """Switch tracing on for a command from the standard variables: `OTEL_TRACES_EXPORTER` (otlp, console, none;
    otlp by default once `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set),
    `OTEL_SDK_DISABLED`, `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` (else `service.name` is `service_name`) and
    the OTLP exporter's own. Needs the `[otel]` extra (one line naming it otherwise). Returns whether it is on; a
    provider set already (the embedding program's) is left alone."""
    env = os.environ
    if enabled() or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",") if name.strip()]
    if not exporters:
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        exporters = ["otlp"] if endpoint else []
    unknown = [name for name in exporters if name not in EXPORTERS]
    if unknown:
        raise SystemExit(f"{prog}: error: OTEL_TRACES_EXPORTER names {', '.join(unknown)}; use otlp, console or none")
    exporters = [name for name in exporters if name != "none"]
    if not exporters:
        return False
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if "otlp" in exporters and protocol not in (None, "", "http/protobuf"):
        raise SystemExit(f"{prog}: error: OTEL_EXPORTER_OTLP_PROTOCOL={protocol} is not supported; use http/protobuf")
    require_extra("otel", prog)
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "unknown_service")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service_name}))
    provider = TracerProvider(resource=resource)  # shut down (its spans flushed) when the process exits
    for name in exporters:
        exporter: SpanExporter
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        else:
            exporter = ConsoleSpanExporter(out=sys.stderr)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


# -- context across processes ---------------------------------------------------------------------


def inject_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Put the current trace context into an MCP request's `_meta` (`traceparent`, `tracestate`); returns it."""
    if enabled():
        propagate.inject(meta)
    return meta


def extract_meta(meta: Mapping[str, Any] | None) -> otel_context.Context | None:
    """The context a `_meta` carries, or None (absent or malformed: the caller's current context applies)."""
    if not meta or not isinstance(meta.get("traceparent"), str):
        return None
    try:
        ctx = propagate.extract({k: v for k, v in meta.items() if isinstance(v, str)})
    except (ValueError, TypeError):
        return None
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def carried(context: contextvars.Context) -> contextvars.Context:
    """A copy of `context` (another task's) in which the current trace context is current: work run there (a
    durable turn's step on its worker's loop) belongs to this trace. `context` itself when tracing is off."""
    if not enabled():
        return context
    copy = context.copy()
    copy.run(otel_context.attach, otel_context.get_current())
    return copy


def environment() -> dict[str, str]:
    """The current trace context as environment variables for a child process (empty when tracing is off)."""
    if not enabled():
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return {ENV_CARRIER[k]: v for k, v in carrier.items() if k in ENV_CARRIER}


def context_from_environment(environ: Mapping[str, str] | None = None) -> otel_context.Context | None:
    environ = os.environ if environ is None else environ
    carrier = {k: environ[v] for k, v in ENV_CARRIER.items() if v in environ}
    return extract_meta(carrier)


# -- spans handed back by a test process (it writes them: testhost.HandBack) -----------------------


def replay_handed_back(folder: str | os.PathLike[str]) -> int:
    """Emit, as children of the current span, the stages a test process handed back (read from its scratch folder
    before it is removed). The file is the test's to write: only known names, int/str/bool attributes and sane
    times are taken, at most 16 records. Returns how many spans were made."""
    path = Path(folder, SPANS_FILE)
    if not enabled() or not path.is_file():
        return 0
    made = 0
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[:16]
    except OSError:
        return 0
    for line in lines:
        try:
            record = json.loads(line)
            name, start, end = record["name"], int(record["start"]), int(record["end"])
            attributes = record.get("attributes") or {}
        except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, not an object, a field missing or bad
            continue
        if not isinstance(name, str) or name not in _HANDED_BACK or not 0 < start <= end < 2**63:
            continue
        if not isinstance(attributes, dict):
            continue
        clean = {
            f"unit_mcp.test.{k}": v
            for k, v in attributes.items()
            if isinstance(k, str) and k.isidentifier() and isinstance(v, int | str | bool) and len(str(v)) <= 200
        }
        _tracer.start_span(name, attributes=clean, start_time=start).end(end_time=end)
        made += 1
    return made
