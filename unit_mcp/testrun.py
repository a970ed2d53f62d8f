"""Run a unit's test module in a subprocess: own process group, timeout that kills the whole group, capped output.

A cancellation (`unit_mcp.cancel`) kills the group too, within one poll interval (`POLL`)."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import cancel
from .proctree import descendants, kill_all

PIPE_GRACE = 0.5
POLL = 0.1  # seconds between checks for the end of the process and for a cancellation
PACKAGE_PARENT = str(Path(__file__).resolve().parent.parent)


class CappedBuffer:
    """Keeps the first and last `limit // 2` bytes of a stream and counts what was dropped between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        excess = len(self.tail) - self.tail_limit
        if excess > 0:
            self.dropped += excess
            del self.tail[:excess]

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    def text(self) -> str:
        middle = f"\n… [{self.dropped} bytes of output dropped] …\n".encode() if self.dropped else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", "replace")


@dataclass
class TestProcessResult:
    __test__ = False

    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    duration_ms: float
    timed_out: bool
    cancelled: bool = False


def _pump(
    proc: subprocess.Popen[bytes], streams: dict[int, CappedBuffer], *, deadline: float, cancellable: bool = False
) -> bool:
    """Copy both pipes into their buffers until EOF on both, the deadline or (if `cancellable`) a cancellation.
    True if the process ended.

    One thread and non-blocking reads: a pipe held open by an escaped grandchild can delay us
    until the deadline, never block us.
    """
    selector = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        selector.register(fd, selectors.EVENT_READ)
    try:
        while selector.get_map():
            now = time.perf_counter()
            if proc.poll() is not None:
                deadline = min(deadline, now + PIPE_GRACE)  # pipes held open by a stray child: stop soon
            remaining = deadline - now
            if remaining <= 0 or (cancellable and cancel.requested()):
                break
            for key, _ in selector.select(min(remaining, POLL)):
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                if chunk:
                    streams[key.fd].feed(chunk)
                else:
                    selector.unregister(key.fd)
        while proc.poll() is None:  # both pipes closed (or given up on), the process still runs
            if time.perf_counter() >= deadline or (cancellable and cancel.requested()):
                return False
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, min(POLL, deadline - time.perf_counter())))
        return True
    finally:
        selector.close()


def kill_tree(pid: int, *, settle: float = 2.0) -> None:
    """SIGKILL the process group of pid and every descendant found under pid, and wait (up to `settle`
    seconds) until none of them runs any more: a kill is delivered asynchronously."""
    targets = [pid, *descendants(pid)]  # before any kill: a dead parent's orphans move to init
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    kill_all(targets, settle=settle)


def run_test_process(
    units_root: Path | str,
    namespace: str,
    unit_id: str,
    test_name: str,
    *,
    timeout: float,
    max_output: int = 64 * 1024,
    cwd: Path | None = None,
) -> TestProcessResult:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, env.get("PYTHONPATH", "")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_CURRENT_TEST", None)
    data_dir = tempfile.TemporaryDirectory(prefix="unit-mcp-test-")  # made here: the child starts faster
    cmd = [sys.executable, "-m", "unit_mcp.testhost", "--units", str(units_root), "--namespace", namespace,
           "--unit", unit_id, "--test", test_name, "--data-dir", data_dir.name]  # fmt: skip
    with data_dir:
        return _run_test_host(cmd, env, cwd, timeout=timeout, max_output=max_output)


def _run_test_host(
    cmd: list[str], env: dict[str, str], cwd: Path | None, *, timeout: float, max_output: int
) -> TestProcessResult:
    started = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=env,
        cwd=cwd,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = CappedBuffer(max_output), CappedBuffer(max_output)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    try:
        ended = _pump(proc, streams, deadline=started + timeout, cancellable=True)
        cancelled = not ended and cancel.requested()
        timed_out = not ended and not cancelled
    finally:
        kill_tree(proc.pid)  # the test's own children too, whether it finished or not
        proc.wait()
        _pump(proc, streams, deadline=time.perf_counter() + PIPE_GRACE)  # what was written before the kill
        proc.stdout.close()
        proc.stderr.close()
    duration = (time.perf_counter() - started) * 1000
    return TestProcessResult(
        exit_code=None if timed_out or cancelled else proc.returncode,
        stdout=out.text(),
        stderr=err.text(),
        truncated=out.truncated or err.truncated,
        duration_ms=duration,
        timed_out=timed_out,
        cancelled=cancelled,
    )
