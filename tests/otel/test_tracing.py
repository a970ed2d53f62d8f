"""`unit_mcp.tracing` on its own: the trace context in `_meta` and in an environment (round trip, hostile carriers),
the stages a test process hands back (only known names, bounded, hostile lines dropped), and a test run's context
reaching the test process without restarting the warm test host."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from unit_mcp import tracing
from unit_mcp.changelog import Caller
from unit_mcp.confirm import Confirmations
from unit_mcp.errors import Declined
from unit_mcp.fleet import Fleet, FleetTools, NodeSpec
from unit_mcp.testrun import WARM, run_test_process

from .conftest import EXAMPLE_UNITS, by_name

pytestmark = pytest.mark.anyio

HEX = st.text("0123456789abcdef", min_size=1, max_size=40)
JUNK = st.one_of(st.none(), st.integers(), st.text(max_size=80), st.lists(st.text(max_size=5), max_size=3))


def test_the_context_round_trips_through_meta_and_the_environment(exporter: InMemorySpanExporter) -> None:
    with tracing.span("outer") as outer:
        meta = tracing.inject_meta({"other": 1})
        environ = tracing.environment()
    assert meta["other"] == 1 and meta["traceparent"] == environ["TRACEPARENT"]
    for context in (tracing.extract_meta(meta), tracing.context_from_environment(environ)):
        assert context is not None
        continued = trace.get_current_span(context).get_span_context()
        assert (continued.trace_id, continued.span_id) == (
            outer.get_span_context().trace_id,
            outer.get_span_context().span_id,
        )


def test_a_traced_function_runs_in_a_span_named_after_its_arguments(exporter: InMemorySpanExporter) -> None:
    """`traced` takes the span's attributes from the call's arguments (positional, keyword or a default; None left
    out), runs the function inside it, and records what it raises."""

    @tracing.traced("work", unit_mcp__tool="tool", unit_mcp__unit_id="unit_id")
    def work(tool: str, unit_id: str | None = None, *, fail: bool = False) -> int:
        if fail:
            raise ValueError("no")
        return tracing.current().get_span_context().span_id

    ran = [work("unit_apply_patch", "counter"), work(tool="unit_rollback")]
    with pytest.raises(ValueError, match="no"):
        work("unit_revert", unit_id="greeter", fail=True)
    spans = by_name(exporter.get_finished_spans(), "work")
    assert [s.context.span_id for s in spans[:2]] == ran
    assert [dict(s.attributes or {}) for s in spans] == [
        {"unit_mcp.tool": "unit_apply_patch", "unit_mcp.unit_id": "counter"},
        {"unit_mcp.tool": "unit_rollback"},
        {"unit_mcp.tool": "unit_revert", "unit_mcp.unit_id": "greeter"},
    ]
    assert [s.status.status_code for s in spans] == [StatusCode.UNSET, StatusCode.UNSET, StatusCode.ERROR]


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["traceparent", "tracestate", "baggage", "x"]), JUNK, max_size=4),
    HEX,
    HEX,
)
def test_any_meta_gives_a_valid_context_or_none(meta: dict[str, Any], trace_hex: str, span_hex: str) -> None:
    """Whatever a client puts in `_meta` (junk, wrong types, forged ids), extraction never raises, and what it
    returns is a valid span context or None (the server's own context applies then)."""
    for carrier in (meta, {**meta, "traceparent": f"00-{trace_hex}-{span_hex}-01"}):
        context = tracing.extract_meta(carrier)
        assert context is None or trace.get_current_span(context).get_span_context().is_valid


LINES = st.lists(
    st.one_of(
        st.text(max_size=60),
        st.builds(json.dumps, st.dictionaries(st.sampled_from(["name", "start", "end", "attributes"]), JUNK)),
        st.builds(
            lambda name, start, length, attributes: json.dumps(
                {"name": name, "start": start, "end": start + length, "attributes": attributes}
            ),
            st.sampled_from(["unit load", "unit test", "evil"]),
            st.integers(-5, 2**64),
            st.integers(-5, 100),
            st.dictionaries(st.text(max_size=8), JUNK, max_size=4),
        ),
    ),
    max_size=24,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(LINES)
def test_hostile_handed_back_lines_never_make_other_spans(
    tmp_path_factory: Any, exporter: InMemorySpanExporter, lines: list[str]
) -> None:
    """The file is the test's to write: whatever it holds, at most 16 spans come of it, only of the stage names,
    with only plain attributes under our prefix."""
    exporter.clear()
    folder = tmp_path_factory.mktemp("handback")
    (folder / tracing.SPANS_FILE).write_text("\n".join(lines))
    made = tracing.replay_handed_back(folder)
    spans = exporter.get_finished_spans()
    assert made == len(spans) <= 16
    for span in spans:
        assert span.name in {"unit load", "unit test"}
        assert span.start_time is not None and span.end_time is not None and 0 < span.start_time <= span.end_time
        assert all(key.startswith("unit_mcp.test.") for key in span.attributes)
        assert all(isinstance(value, int | str | bool) for value in span.attributes.values())


def test_handed_back_stages_are_checked(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    good = {"name": "unit test", "start": 10, "end": 20, "attributes": {"exit_code": 0, "pid": 7}}
    lines = [
        json.dumps(good),
        json.dumps({**good, "name": "evil span"}),  # not a stage a test process has
        json.dumps({**good, "start": 30}),  # ends before it starts
        json.dumps({**good, "attributes": {"exit_code": {"nested": 1}, "x y": 1, "long": "x" * 500}}),
        "not json",
        *[json.dumps(good)] * 40,  # at most 16 lines are read
    ]
    (tmp_path / tracing.SPANS_FILE).write_text("\n".join(lines))
    with tracing.span("unit test run"):
        made = tracing.replay_handed_back(tmp_path)
    assert made == 13  # 16 lines read: 3 dropped (a name, the times, not JSON); the 4th kept without its attributes
    stages = by_name(exporter.get_finished_spans(), "unit test")
    assert len(stages) == 13 and not by_name(exporter.get_finished_spans(), "evil span")
    assert {tuple(sorted(s.attributes)) for s in stages} == {
        ("unit_mcp.test.exit_code", "unit_mcp.test.pid"),
        (),
    }


def test_a_test_run_carries_its_context_without_restarting_the_warm_host(
    tmp_path: Path, exporter: InMemorySpanExporter
) -> None:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    pids = []
    for _ in range(2):
        with tracing.span("unit test run") as run:
            result = run_test_process(units, "units", "counter", "init", timeout=30)
        assert result.exit_code == 0, result.stderr
        pids.append(WARM.pid)
        stages = [
            s for s in exporter.get_finished_spans() if s.parent and s.parent.span_id == run.get_span_context().span_id
        ]
        assert sorted(s.name for s in stages) == ["unit load", "unit test"]
        exporter.clear()
    assert pids[0] is not None and pids[0] == pids[1]


async def test_a_confirmation_wait_is_a_span_with_its_outcome_and_who(exporter: InMemorySpanExporter) -> None:
    confirmations = Confirmations(["shell"])
    caller = Caller(name="a client")

    async def person(message: str) -> bool:
        return True

    for elicit, outcome in ((person, "approved"), (None, "declined")):
        question = confirmations.question(caller, "unit_apply_patch", "shell", "patch counter", None, unit_id="counter")
        with contextlib.suppress(Declined):
            await confirmations.ask(question, elicit)
        (wait,) = by_name(exporter.get_finished_spans(), "confirmation wait")
        assert wait.attributes["unit_mcp.tool"] == "unit_apply_patch"
        assert wait.attributes["unit_mcp.unit_id"] == "counter"
        assert wait.attributes["unit_mcp.confirmation.outcome"] == outcome
        assert f"confirmation {outcome}" in [event.name for event in wait.events]
        exporter.clear()


async def test_a_fleet_call_to_a_node_is_a_span_with_the_node_and_its_failure(exporter: InMemorySpanExporter) -> None:
    with socket.socket() as sock:  # a port nothing listens on: the node is down
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Fleet([NodeSpec("gone", f"http://127.0.0.1:{port}")], timeout=2) as fleet:
        tools = FleetTools(fleet)
        failed = await tools.call("fleet_send_message", {"node": "gone", "message": "hello"})
        listed = await tools.call("fleet_list_nodes", {})
    assert failed.is_error and not listed.is_error
    (sent,) = by_name(exporter.get_finished_spans(), "fleet fleet_send_message")
    assert sent.attributes["unit_mcp.fleet.node"] == "gone"
    assert sent.attributes["error.type"] == "node_error" and sent.status.status_code is StatusCode.ERROR
    assert "hello" not in sent.to_json()  # the message is content: off by default
    (listing,) = by_name(exporter.get_finished_spans(), "fleet fleet_list_nodes")
    assert listing.status.status_code is StatusCode.UNSET
