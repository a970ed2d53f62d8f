"""NodeProcess: `opencode serve` on loopback for the runner, fully isolated, started and stopped by its id.

It runs in an `IsolatedRoot`, behind a per-run basic-auth password, in a process group of its own; `start`
waits (bounded) until it is healthy, `stop` sends SIGTERM then SIGKILL after `stop_timeout`, and `restart`
brings it back on the same port. For a node that runs elsewhere, build an `OpenCodeClient` on its URL.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import anyio
import httpx

from ...opencode_isolation import OPENCODE_VERSION
from ...proctree import dies_with_parent
from .._binaries import find_binary
from ._client import OpenCodeClient
from ._errors import NodeStartError, OpenCodeNotInstalled
from ._isolation import IsolatedRoot

PINNED_VERSION = OPENCODE_VERSION  # the version the isolation is verified against
_LISTENING = re.compile(r"listening on (http://\S+)")


def _free_port(host: str) -> int:
    """A port nothing listens on right now (the kernel's choice for port 0)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def find_opencode(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The `opencode` binary: `explicit`, else $OPENCODE_PATH, else `opencode` on PATH."""
    install = (
        f"Install the pinned version with `npm install --prefix DIR opencode-ai@{PINNED_VERSION}` "
        "(scripts/opencode-tool does this) and pass DIR/node_modules/opencode-linux-x64/bin/opencode"
    )
    return find_binary("opencode", "OPENCODE_PATH", explicit, error=OpenCodeNotInstalled, install=install)


class NodeProcess:
    def __init__(
        self,
        *,
        binary: str | os.PathLike[str] | None = None,
        root: IsolatedRoot | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        password: str | None = "",
        startup_timeout: float = 30.0,
        stop_timeout: float = 2.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`password=""` (the default) generates one; None serves without auth (a warning from OpenCode).
        `port=0` picks a free port (OpenCode's own choice would be 4096, which concurrent nodes and other
        OpenCode servers on the machine fight over); the port is kept for restarts."""
        self.binary = find_opencode(binary)
        self.root = root or IsolatedRoot()
        self.host = host
        self.port = port
        self.password = secrets.token_urlsafe(24) if password == "" else password
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.extra_env = dict(env or {})
        self.url: str | None = None
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._output: collections.deque[str] = collections.deque(maxlen=200)
        self._pump: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def __aenter__(self) -> NodeProcess:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def output(self) -> str:
        """The last lines the node printed (stdout and stderr), for error messages and debugging."""
        return "\n".join(self._output)

    def client(self, **options: Any) -> OpenCodeClient:
        """A client for this node (enter it with `async with`); options go to `OpenCodeClient`."""
        if self.url is None:
            raise NodeStartError("the node is not started")
        return OpenCodeClient(self.url, password=self.password, **options)

    async def start(self) -> str:
        """Start `opencode serve` and wait until it is healthy; returns its URL. A port this object picked
        itself is picked again (up to three times) if another process took it before OpenCode bound it."""
        if self.running:
            assert self.url is not None
            return self.url
        if self.port != 0:
            return await self._start(self.port)
        for attempt in range(3):
            try:
                return await self._start(_free_port(self.host))
            except NodeStartError:
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _start(self, port: int) -> str:
        env = self.root.env({"OPENCODE_SERVER_PASSWORD": self.password} if self.password is not None else None)
        env.update(self.extra_env)
        if self.password is None:
            env.pop("OPENCODE_SERVER_PASSWORD", None)
        command = [str(self.binary), "serve", "--hostname", self.host, "--port", str(port)]
        self._output.clear()
        self._proc = subprocess.Popen(
            command,
            cwd=self.root.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=dies_with_parent(),  # a SIGKILLed runner or worker leaves no node behind
        )
        assert self._proc.stdout is not None
        self._pump = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._pump.start()
        self.starts += 1
        try:
            url = await self._wait_ready()
        except BaseException:
            await self.stop()
            raise
        self.url = url
        self.port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        return url

    async def stop(self) -> int | None:
        """SIGTERM to the node's own process group, SIGKILL after `stop_timeout`; returns the exit status."""
        with anyio.CancelScope(shield=True):
            status = await self._stop()
        return status

    async def _stop(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                await anyio.to_thread.run_sync(proc.wait, self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                await anyio.to_thread.run_sync(proc.wait, self.stop_timeout)
        self._signal(proc, signal.SIGKILL)  # whatever it left behind in its group
        pump, self._pump = self._pump, None
        if pump is not None:
            await anyio.to_thread.run_sync(pump.join, self.stop_timeout)
        return proc.returncode

    async def restart(self) -> str:
        """Stop and start again on the same port (and the same data: its sessions survive)."""
        await self.stop()
        return await self.start()

    # -- internals --------------------------------------------------------------------------------

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)  # the group `start_new_session` made: pgid == our child's pid

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._output.append(raw.decode("utf-8", "replace").rstrip("\n"))
        stream.close()

    async def _wait_ready(self) -> str:
        deadline = time.monotonic() + self.startup_timeout
        url: str | None = None
        while url is None:
            found = next((m.group(1) for line in list(self._output) if (m := _LISTENING.search(line))), None)
            if found is not None:
                url = found.rstrip("/")
                break
            self._fail_if_gone("before it was listening")
            if time.monotonic() > deadline:
                raise NodeStartError(
                    f"opencode serve printed no 'listening on' line within {self.startup_timeout:.0f} s; "
                    f"its output:\n{self.output() or '(nothing)'}"
                )
            await anyio.sleep(0.05)
        auth = httpx.BasicAuth("opencode", self.password) if self.password is not None else None
        async with httpx.AsyncClient(base_url=url, auth=auth, timeout=5) as http:
            last = "no answer"
            while time.monotonic() < deadline:
                self._fail_if_gone("before it was healthy")
                try:
                    response = await http.get("/global/health")
                    if response.status_code == 200 and response.json().get("healthy"):
                        return url
                    last = f"{response.status_code} {response.text[:200]}"
                except (httpx.HTTPError, ValueError) as exc:
                    last = f"{type(exc).__name__}: {exc}"
                await anyio.sleep(0.1)
        raise NodeStartError(
            f"opencode serve at {url} was not healthy within {self.startup_timeout:.0f} s (last: {last}); "
            f"its output:\n{self.output()}"
        )

    def _fail_if_gone(self, when: str) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            if self._pump is not None:
                self._pump.join(1)
            hint = " (is its port taken?)" if "ServeError" in self.output() else ""
            raise NodeStartError(
                f"opencode serve exited with status {proc.returncode} {when}{hint}; its output:\n"
                f"{self.output() or '(nothing)'}"
            )
