"""Child process of unit_run_tests: a headless host with one unit loaded runs one of its test modules.

Exit status: 0 passed, 1 failed, 3 the unit did not load, 4 no such test module.
`main()` returning None, 0 or True is a pass; a test module without `main()` runs under pytest,
with the fixtures `host` (the headless Host) and `unit` (the loaded unit module).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .applog import LOG_FORMAT
from .host import Host
from .proctree import become_subreaper, kill_descendants, reap_strays


class _Fixtures:
    def __init__(self, host: Host, unit: Any) -> None:
        self._host = host
        self._unit = unit

    def register(self) -> Any:
        import pytest

        outer = self

        class Plugin:
            @pytest.fixture
            def host(self) -> Host:
                return outer._host

            @pytest.fixture
            def unit(self) -> Any:
                return outer._unit

        return Plugin()


SPANS_FILE = ".unit-mcp-spans.jsonl"
"""`tracing.SPANS_FILE` (not imported: the OpenTelemetry API would cost a cold test run 27 ms of start-up)."""


class HandBack:
    """What a test process records of itself for the server, which emits it as spans of the test run's trace
    (`tracing.replay_handed_back`): a record per stage, as JSON lines in the scratch folder, only when the server
    passed a `TRACEPARENT`."""

    def __init__(self, folder: str | None) -> None:
        self.path = Path(folder, SPANS_FILE) if folder is not None and "TRACEPARENT" in os.environ else None

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[dict[str, Any]]:
        """Time a stage; the yielded dict takes its attributes (say, the exit code)."""
        start, attributes = time.time_ns(), {"pid": os.getpid()}
        try:
            yield attributes
        finally:
            if self.path is not None:
                record = {"name": name, "start": start, "end": time.time_ns(), "attributes": attributes}
                with contextlib.suppress(OSError), self.path.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(record, default=str) + "\n")


def _log_to_stderr() -> None:
    """What the unit logs during a test (from INFO), and the host's warnings, go to the test's stderr, which the
    caller sees; an app log in the temporary data folder would be deleted unread."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    for name, level in (("units", logging.INFO), ("unit_mcp", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(level)


def _passed(result: object) -> bool:
    return result is None or result is True or (type(result) is int and result == 0)


def main(argv: list[str] | None = None) -> int:
    become_subreaper()  # the test's orphans stay below us, to be killed when it ends
    try:
        return _main(argv)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        kill_descendants(os.getpid())


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unit_mcp.testhost")
    parser.add_argument("--units", required=True)
    parser.add_argument("--namespace", default="units")
    parser.add_argument("--unit", required=True)
    parser.add_argument("--test", default="init")
    parser.add_argument("--data-dir", help="the host's data folder (default: a temporary one)")
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as stack:
        data_dir = args.data_dir
        if data_dir is None:
            import tempfile  # the server passes --data-dir; tempfile costs a test run 4 ms of start-up

            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="unit-mcp-test-"))
        _log_to_stderr()
        spans = HandBack(args.data_dir)
        with spans.stage("unit load"):
            host = Host(args.units, data_dir, namespace=args.namespace, app_log=False, read_only=True)
            host.start([args.unit])
        try:
            with spans.stage("unit test") as stage:
                stage["exit_code"] = code = _run(host, args.unit, args.test)
            return code
        finally:
            host.close()


def _run(host: Host, unit_id: str, test_name: str) -> int:
    if not host.is_loaded(unit_id):
        print(f"unit {unit_id} did not load: {host.load_error(unit_id)}", file=sys.stderr)
        return 3
    name = f"{host.module_name(unit_id)}.test_{test_name}"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name == name:
            print(f"unit {unit_id} has no test module test_{test_name}.py", file=sys.stderr)
            return 4
        print(host.unit_traceback(unit_id, exc), file=sys.stderr)
        return 1
    except Exception as exc:
        print(host.unit_traceback(unit_id, exc), file=sys.stderr)
        return 1
    test_main = getattr(module, "main", None)
    if callable(test_main):
        try:
            result = test_main(host) if inspect.signature(test_main).parameters else test_main()
        except Exception as exc:
            print(host.unit_traceback(unit_id, exc), file=sys.stderr)
            return 1
        if _passed(result):
            return 0
        print(f"main() returned {result!r}: a pass is None, 0 or True", file=sys.stderr)
        return 1
    try:
        import pytest
    except ImportError:
        print("pytest is not installed: give the test module a main() or install pytest", file=sys.stderr)
        return 1
    unit = host.module(unit_id)
    plugins = [_Fixtures(host, unit).register(), _unit_frames_first(host.module_name(unit_id))]
    path = str(module.__file__)
    rootdir = host.loader.location
    if not os.path.isfile(path):
        # A unit that is not a file (a database row): pytest collects the module imported above, through a
        # stand-in file holding its source for pytest's reports.
        rootdir = str(host.data_dir)
        path = os.path.join(rootdir, f"test_{test_name}.py")
        with open(path, "w", encoding="utf-8") as stand_in:
            stand_in.write(inspect.getsource(module))
        plugins.append(_ImportedModule(path, module))
    scratch = os.getcwd()
    plugins.append(_BackToScratch(scratch))
    os.chdir(rootdir)  # pytest's invocation folder: the paths it shows relative to it are the unit's
    try:
        code = pytest.main([path, "-q", "-p", "no:cacheprovider", "--import-mode=importlib", "--rootdir", rootdir,
                            "-W", _ANYIO_REWRITE], plugins=plugins)  # fmt: skip
    finally:
        os.chdir(scratch)
    return int(code)


_ANYIO_REWRITE = "ignore:Module already imported so cannot be rewritten; anyio:pytest.PytestAssertRewriteWarning"
"""anyio's pytest plugin is loaded after the host imported anyio: pytest's warning about it says nothing about the
unit (a message prefix, taken literally from the command line)."""


def _unit_frames_first(prefix: str) -> Any:
    """A pytest plugin that shows a failure's frames of the unit (its test module included) and counts the others
    (the host, pytest, libraries) in one line instead of printing them: the unit's frame comes first."""
    import pytest
    from _pytest._code import Traceback

    def own(entry: Any, test_module: Any) -> bool:
        if test_module is not None and entry.frame.f_globals is vars(test_module):
            return True  # pytest imports the test module itself (--import-mode=importlib), under its own name
        name = str(entry.frame.f_globals.get("__name__", ""))
        return name == prefix or name.startswith(prefix + ".")

    class UnitFramesFirst:
        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(self, item: Any, call: Any) -> Any:
            hidden = 0
            pytests = getattr(item, "_traceback_filter", None)  # pytest's cut at the test function, run first
            if call.excinfo is not None and pytests is not None:
                test_module = getattr(item, "module", None)

                def unit_frames(excinfo: Any) -> Any:
                    nonlocal hidden
                    shown = pytests(excinfo)
                    mine = [entry for entry in shown if own(entry, test_module)]
                    if not mine or len(mine) == len(shown):
                        return shown
                    hidden = len(shown) - len(mine)
                    return Traceback([*mine[:-1], mine[-1].with_repr_style(None)])  # the last one in full

                item._traceback_filter = unit_frames
            try:
                report = yield
            finally:
                vars(item).pop("_traceback_filter", None)
            if hidden:
                plural = "s" if hidden != 1 else ""
                report.sections.append(
                    ("frames not shown", f"{hidden} frame{plural} outside the unit (libraries, the host) not shown")
                )
            return report

    return UnitFramesFirst()


class _BackToScratch:
    """A pytest plugin that returns to the test's scratch folder once the session starts, so the tests run there.
    pytest, seeing the working folder differ from where it started, then shows each traceback path whole (which
    the server redacts) rather than relative to the scratch folder (`../<checkout>/.venv/...`, which it cannot)."""

    def __init__(self, scratch: str) -> None:
        self.scratch = scratch

    def pytest_sessionstart(self) -> None:
        os.chdir(self.scratch)


class _ImportedModule:
    """A pytest plugin that hands pytest an already imported module for one path instead of importing it."""

    def __init__(self, path: str, module: Any) -> None:
        self.path = path
        self.module = module

    def pytest_pycollect_makemodule(self, module_path: Any, parent: Any) -> Any:
        import pytest

        if str(module_path) != self.path:
            return None
        collector = pytest.Module.from_parent(parent, path=module_path)
        collector._obj = self.module  # what `collector.obj` would otherwise import from the path
        return collector


def guarded() -> int:
    """A cold run: fork the test host and outlive it, as the warm host does, so that what the test left behind
    (however it detached; adopted here) is killed before the run ends. The exit status is the test host's."""
    become_subreaper()
    pid = os.fork()
    if pid == 0:
        return main()
    _, status = os.waitpid(pid, 0)
    reap_strays(set())
    code = os.waitstatus_to_exitcode(status)
    if code < 0:  # killed by a signal: so are we, for the caller's returncode
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)  # no interpreter shutdown: the test host had its own


if __name__ == "__main__":
    sys.exit(guarded())
