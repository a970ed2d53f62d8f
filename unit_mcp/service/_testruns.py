"""Test runs: `unit_run_tests` (in a subprocess, `testrun.py`), `unit_test_status`, `unit_cancel_test`."""

from __future__ import annotations

import ast
from typing import Literal

from .. import cancel, tracing
from ..arguments import CancelTestArgs, RunTestsArgs, TestStatusArgs, takes
from ..errors import (
    Cancelled,
    InvalidArgument,
    NotSupported,
    TestTimeout,
    TooManyRuns,
    UnitError,
    UnknownRun,
    UnknownSource,
)
from ..loader import Source
from ..models import CancelTestResult, RunTestsResult
from ..paging import PAGE_OVERHEAD, RESULT_BYTES, clip
from ..testrun import TestRun, run_test_process
from ._units import Units

CANCEL_GRACE = 5.0
"""Seconds a cancel waits for a run to end (its processes die within a poll, 0.1 s)."""


@takes(RunTestsArgs)
def run_tests(svc: Units, args: RunTestsArgs) -> RunTestsResult:
    unit_id, test_name = args.unit_id, args.test_name
    timeout = svc.test_timeout if args.timeout is None else args.timeout
    if timeout > svc.max_test_timeout:
        raise InvalidArgument(f"timeout must be between 0 and {svc.max_test_timeout} seconds, not {timeout!r}.")
    runner = _runner(svc, unit_id, test_name)

    def work() -> RunTestsResult:
        return run_once(svc, unit_id, test_name, runner, float(timeout))

    running = RunTestsResult(
        unit_id=unit_id,
        test_name=test_name,
        runner=runner,
        passed=False,
        exit_code=None,
        stdout="",
        stderr="",
        truncated=False,
        duration_ms=0.0,
        timed_out=False,
        state="running",
    )
    run = svc.runs.start(f"test_{test_name} of unit {unit_id}", work, running, limit=svc.max_running_tests)
    if run is None:
        raise TooManyRuns(f"{svc.max_running_tests} test runs are still running; test_{test_name} was not started.")
    return _outcome(svc, run, svc.max_call_s if args.wait else 0.0, stop_if_cancelled=True)


def gate(svc: Units, unit_id: str, test_name: str) -> RunTestsResult:
    """Run the unit's test once, in the test host (which loads the unit from the store), for a write that keeps only
    if it passes: a run past the timeout is a failed run, not a refusal."""
    try:
        with tracing.span("unit test run", {"unit_mcp.test_run.gate": True}):
            return run_once(svc, unit_id, test_name, _runner(svc, unit_id, test_name), svc.test_timeout)
    except TestTimeout as exc:
        return RunTestsResult.model_validate({k: v for k, v in exc.details.items() if k in RunTestsResult.model_fields})


def _runner(svc: Units, unit_id: str, test_name: str) -> Literal["main", "pytest"]:
    """How the unit's test module runs (`main()` or pytest), refused when the unit has no such test."""
    kind = svc.unit(unit_id)
    if kind != "directory":
        raise NotSupported(
            f"Unit {unit_id!r} is a file unit and has no tests.",
            hint="Tests live in directory units as test_<name>.py.",
        )
    names = svc.test_names(unit_id, kind)
    if test_name not in names:
        raise UnknownSource(
            f"Unit {unit_id!r} has no test module test_{test_name}.py.",
            hint=f"Its tests: {', '.join(names) or 'none'}. Create one with unit_create_source.",
        )
    test = Source(unit_id, kind, f"test_{test_name}.py")
    try:
        tree = ast.parse(svc.text(test, svc.read(test)))
        has_main = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "main" for n in tree.body)
    except (SyntaxError, ValueError):
        has_main = False
    return "main" if has_main else "pytest"


def run_once(
    svc: Units, unit_id: str, test_name: str, runner: Literal["main", "pytest"], timeout: float
) -> RunTestsResult:
    """One run of a test in a subprocess, to its end: its result, or `Cancelled` / `TestTimeout`."""
    run = run_test_process(
        svc.loader.address, svc.host.namespace, unit_id, test_name, timeout=timeout, max_output=svc.max_test_output
    )
    stdout, stderr = svc.host.redact(run.stdout), svc.host.redact(run.stderr)
    shown_out, shown_err = (
        clip(stdout, RESULT_BYTES // 2 - PAGE_OVERHEAD),
        clip(stderr, RESULT_BYTES // 2 - PAGE_OVERHEAD),
    )
    result = RunTestsResult(
        unit_id=unit_id,
        test_name=test_name,
        runner=runner,
        passed=run.exit_code == 0 and not run.timed_out,
        exit_code=run.exit_code,
        stdout=shown_out,
        stderr=shown_err,
        truncated=run.truncated or len(stdout) > len(shown_out) or len(stderr) > len(shown_err),
        redacted=(stdout, stderr) != (run.stdout, run.stderr),
        duration_ms=run.duration_ms,
        timed_out=run.timed_out,
    )
    tracing.set_attributes(
        tracing.current(),
        unit_mcp__unit_id=unit_id,
        unit_mcp__test_run__test=test_name,
        unit_mcp__test_run__exit_code=run.exit_code,
        unit_mcp__test_run__timed_out=run.timed_out,
        unit_mcp__test_run__cancelled=run.cancelled,
    )
    if not result.passed:
        tracing.fail(tracing.current(), "timed_out" if run.timed_out else "test_failed")
    if run.cancelled:
        raise Cancelled(f"Tests test_{test_name} of unit {unit_id!r} were cancelled and their processes killed.")
    if run.timed_out:
        raise TestTimeout(
            f"Tests test_{test_name} of unit {unit_id!r} ran past {timeout} s and were killed.", **result.model_dump()
        )
    return result


def _run(svc: Units, run_id: str) -> TestRun:
    run = svc.runs.get(run_id)
    if run is None:
        raise UnknownRun(f"There is no test run {run_id!r} (never started, or forgotten since it ended).")
    return run


def _outcome(svc: Units, run: TestRun, wait: float, *, stop_if_cancelled: bool = False) -> RunTestsResult:
    """The run's result (or its refusal) once it ends within `wait` seconds, else its state so far. A caller
    that cancels a call waiting on its own run (`stop_if_cancelled`) stops the run, as a cancelled call did."""
    if not cancel.wait(run.done, wait) and cancel.requested() and stop_if_cancelled:
        run.cancel.set()
        run.done.wait(CANCEL_GRACE)
    if not run.done.is_set():
        assert isinstance(run.subject, RunTestsResult)
        return run.subject.model_copy(update={"run_id": run.run_id, "duration_ms": run.elapsed() * 1000})
    if isinstance(run.outcome, UnitError):
        raise run.outcome.with_traceback(None)
    if isinstance(run.outcome, Exception):
        raise RuntimeError(f"test run {run.label} failed") from run.outcome
    assert isinstance(run.outcome, RunTestsResult)
    return run.outcome.model_copy(update={"run_id": run.run_id})


@takes(TestStatusArgs)
def test_status(svc: Units, args: TestStatusArgs) -> RunTestsResult:
    """A run's result, or its state while it runs, waiting up to wait_s (at most the longest call) to end."""
    return _outcome(svc, _run(svc, args.run_id), min(args.wait_s, svc.max_call_s))


@takes(CancelTestArgs)
def cancel_test(svc: Units, args: CancelTestArgs) -> CancelTestResult:
    """Stop a run: its process group is killed within a poll; its status then answers [cancelled]."""
    run = _run(svc, args.run_id)
    running = not run.done.is_set()
    run.cancel.set()
    run.done.wait(CANCEL_GRACE)
    return CancelTestResult(run_id=run.run_id, cancelled=running, state="finished" if run.done.is_set() else "running")
