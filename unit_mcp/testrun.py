"""Run a unit's test module in a subprocess: own process group, timeout that kills the whole group, capped output."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

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


def _drain(stream: IO[bytes], buffer: CappedBuffer) -> None:
    try:
        while chunk := stream.read1(65536):  # type: ignore[attr-defined]
            buffer.feed(chunk)
    except (OSError, ValueError):
        pass


@dataclass
class TestProcessResult:
    __test__ = False

    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    duration_ms: float
    timed_out: bool


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_test_process(
    units_root: Path,
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
    cmd = [sys.executable, "-m", "unit_mcp.testhost", "--units", str(units_root), "--namespace", namespace,
           "--unit", unit_id, "--test", test_name]  # fmt: skip
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
    readers = [
        threading.Thread(target=_drain, args=(proc.stdout, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, err), daemon=True),
    ]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid)  # the test's own children too, whether it finished or not
        proc.wait()
    for reader in readers:
        reader.join(2)
    proc.stdout.close()
    proc.stderr.close()
    duration = (time.perf_counter() - started) * 1000
    return TestProcessResult(
        exit_code=None if timed_out else proc.returncode,
        stdout=out.text(),
        stderr=err.text(),
        truncated=out.truncated or err.truncated,
        duration_ms=duration,
        timed_out=timed_out,
    )
