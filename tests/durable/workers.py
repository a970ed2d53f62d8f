"""Worker processes of one data dir for the durable tests, each logging to its own file: the CLI's `worker` (a fork of
the warm CLI, support.warm_cli: a process of its own, killed as any), or `provider_worker.py` running one agent
(`Workers.script`)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
from support.warm_cli import WarmProcess, warm_cli

from unit_mcp.agent import DurableClient, SessionStore
from unit_mcp.agent.items import Session
from unit_mcp.proctree import descendants, kill_all

SCRIPT = Path(__file__).with_name("provider_worker.py")


def durable_data(tmp_path: Path) -> tuple[Path, str]:
    """A private data folder and the URL of the SQLite system database in it."""
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    return data, f"sqlite:///{data / 'dbos.sqlite'}"


def stored_session(data: Path, session_id: str) -> Session:
    """The session as its store holds it now (a reader of its own, beside the workers writing it)."""
    reader = SessionStore(data, read_only=True)
    try:
        return reader.require(session_id)
    finally:
        reader.close()


class Workers:
    """Workers run as `python -m unit_mcp.agent worker OPTIONS`, or as `python SCRIPT OPTIONS` when given, each with
    its executor id; every one still running is killed at the end."""

    def __init__(
        self, data: Path, options: list[str], *, script: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.data, self.options = data, options
        self.script_path = script  # None: the CLI's worker; either way a fork of the warm CLI (support.warm_cli)
        self.env = {**os.environ, **(env or {})}
        self.running: dict[str, WarmProcess] = {}

    @classmethod
    def script(cls, data: Path, system_db: str, provider: str, target: str, model: str, env: dict[str, str]) -> Workers:
        """Workers running `provider_worker.py` (its agent `provider_worker.AGENT`), secrets in `env`."""
        return cls(data, [str(data), system_db, provider, target, model], script=SCRIPT, env=env)

    def log(self, executor_id: str) -> Path:
        return self.data.parent / f"{executor_id}.log"

    async def start(self, executor_id: str) -> WarmProcess:
        log = self.log(executor_id)
        args = self.options if self.script_path else ["--data-dir", str(self.data), "worker", *self.options]
        with log.open("wb") as out, open(os.devnull, "rb") as null:
            process = warm_cli().spawn(
                [*args, "--executor-id", executor_id, "--takeover"],
                stdin=null.fileno(), stdout=out.fileno(), stderr=out.fileno(), env=self.env, script=self.script_path,
            )  # fmt: skip
        self.running[executor_id] = process
        with anyio.fail_after(60):
            while f"worker {executor_id} runs durable turns".encode() not in log.read_bytes():
                assert process.poll() is None, log.read_text()[-3000:]
                await anyio.sleep(0.05)
        return process

    def kill(self, executor_id: str) -> None:
        assert _kill(self.running.pop(executor_id)) == -signal.SIGKILL

    async def died(self, executor_id: str) -> None:
        """Wait (bounded) for a worker that something else kills to be gone, and reap it."""
        process = self.running.pop(executor_id)
        with anyio.fail_after(60):
            while process.poll() is None:
                await anyio.sleep(0.05)

    def close(self) -> None:
        for process in self.running.values():
            _kill(process)


def _kill(process: WarmProcess) -> int:
    """SIGKILL a worker and what it started (an agents-file OpenCode agent's node dies with it); its exit code."""
    started = descendants(process.pid)
    process.kill()
    code = process.wait(30)
    kill_all(started)
    return code


@dataclass
class Submitted:
    store: SessionStore
    client: DurableClient
    turn_id: str


@asynccontextmanager
async def submitted(
    workers: Workers, system_db: str, agent: str, session_id: str, text: str
) -> AsyncIterator[Submitted]:
    """Worker A started, the session created and `text` submitted as a durable turn; at the end every worker still
    running is killed and the store closed."""
    store = SessionStore(workers.data)
    try:
        await workers.start("worker-a")
        store.create(agent, session_id=session_id)
        async with DurableClient(system_db) as client:
            yield Submitted(store, client, await client.submit(store, session_id, text))
    finally:
        workers.close()
        store.close()
