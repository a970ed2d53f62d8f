"""Workers with one identity (security round 4, item 7): a second `unit-mcp agent worker` on the same host with the
default `--executor-id` took over a live worker's turns, and an in-flight tool call ran twice. A worker refuses, in
one line, to start with the executor id of a worker that is alive and beating; once that one is gone, the id is
free again (a restarted worker resumes its turns)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

WORKER = [sys.executable, "-m", "unit_mcp.agent"]
OPTIONS = ["worker", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]


def start(data: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*WORKER, "--data-dir", str(data), *OPTIONS], stdout=out, stderr=subprocess.STDOUT, cwd=data.parent
        )


def ready(process: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> bool:
    """Whether the worker printed its ready line (False: it exited first)."""
    deadline = time.monotonic() + timeout
    while b"runs durable turns" not in log.read_bytes():
        if process.poll() is not None:
            return False
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return True


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    return folder


def test_second_worker_with_a_live_workers_executor_id_is_refused(data: Path, tmp_path: Path) -> None:
    first = start(data, tmp_path / "first.log")
    second: subprocess.Popen[bytes] | None = None
    try:
        assert ready(first, tmp_path / "first.log"), (tmp_path / "first.log").read_text()
        second = start(data, tmp_path / "second.log")
        assert not ready(second, tmp_path / "second.log"), "a second worker with the same executor id started"
        assert second.wait(30) == 1
        said = (tmp_path / "second.log").read_text()
        executor = f"worker@{socket.gethostname()}"  # the documented default identity (docs/durable.md)
        assert said == (
            f"unit-mcp agent: error: worker {executor} is already running (pid {first.pid} on "
            f"{socket.gethostname()}): stop it first, or give this one another --executor-id\n"
        ), said
        assert first.poll() is None, "the live worker was disturbed"
    finally:
        for process in (second, first):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)

    # Once the first is gone, its id is free: a restarted worker starts and resumes its turns.
    again = start(data, tmp_path / "again.log")
    try:
        assert ready(again, tmp_path / "again.log"), (tmp_path / "again.log").read_text()
    finally:
        again.terminate()
        assert again.wait(30) == 0
