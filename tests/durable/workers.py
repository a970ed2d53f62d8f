"""Worker processes of one data dir for the durable tests, each logging to its own file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
from agent.conftest import REPO


class Workers:
    """Workers run as `python -m unit_mcp.agent worker OPTIONS`, or as `command` + the executor id when given; every
    one still running is killed at the end."""

    def __init__(
        self, data: Path, options: list[str], *, command: list[str] | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data, self.options = data, options
        self.command = command or [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(data), "worker", *options]
        self.env = {**os.environ, **(env or {})}
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, executor_id: str) -> Path:
        return self.data.parent / f"{executor_id}.log"

    async def start(self, executor_id: str) -> subprocess.Popen[bytes]:
        log = self.log(executor_id)
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*self.command, "--executor-id", executor_id, "--takeover"],
                cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.running[executor_id] = process
        with anyio.fail_after(60):
            while f"worker {executor_id} runs durable turns".encode() not in log.read_bytes():
                assert process.poll() is None, log.read_text()[-3000:]
                await anyio.sleep(0.05)
        return process

    def kill(self, executor_id: str) -> None:
        process = self.running.pop(executor_id)
        process.kill()
        assert process.wait(30) == -signal.SIGKILL

    def close(self) -> None:
        for process in self.running.values():
            process.kill()
            process.wait(30)
