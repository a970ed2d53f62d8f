"""`python -m unit_mcp.server` (or another entry point: `unit_mcp.agent`, `unit_mcp.fleet`, an installed
`unit-mcp`) as a real child process, for the HTTP, external-tool, browser, fleet and install tests."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from support.warm_cli import MODULES, WarmProcess, warm_cli


class ServerProcess:
    """Starts the entry point; stdout is read on a thread so waiting for the ready lines can time out."""

    def __init__(
        self,
        *args: str,
        tmp: Path,
        module: str = "unit_mcp.server",
        env: dict[str, str] | None = None,
        program: Sequence[str] | None = None,
        cold: bool = False,
    ) -> None:
        """`env` adds variables: a secret goes there (or in a 0600 file), never in `args`. `program` runs instead
        of `python -m module`, e.g. an installed `unit-mcp serve`.

        `python -m module` is a fork of this test process's warm interpreter (`support.warm_cli`: the imports,
        about 1.2 s of CPU a start, made once), a process of its own with these arguments, environment and
        working folder, stdin from /dev/null. `cold=True` starts a fresh interpreter instead: for a test that
        reads the process's argv or environment in /proc (a fork shows the warm interpreter's there)."""
        environment = {**os.environ, "TMPDIR": str(tmp), **(env or {})}
        self.proc: subprocess.Popen[str] | WarmProcess
        if program is None and not cold and module in MODULES:
            self.proc = warm_cli().popen(list(args), env=environment, cwd=tmp, module=module)
        else:
            self.proc = subprocess.Popen(
                [*(program or (sys.executable, "-m", module)), *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=environment,
                cwd=tmp,
            )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line.rstrip("\n"))

    def ready(self, timeout: float = 90, *, last: str = "XDG_CONFIG_HOME") -> dict[str, str]:
        """The printed `KEY=value` lines, up to the line of key `last` (by default the server's ready-to-paste
        `XDG_CONFIG_HOME=… opencode` line); `timeout` for each line (a fleet master took over 30 s to print its
        first at a load of 17 on 2 cores)."""
        printed: dict[str, str] = {}
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.kill()
                raise AssertionError(f"the server printed no ready line; stderr: {self.stderr()}") from None
            key, _, value = line.partition("=")
            printed[key] = value
            if key == last:
                return printed

    def stop(self, signum: int = signal.SIGTERM) -> int:
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=20)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stderr(self) -> str:
        """What the server wrote to stderr; only once it has exited."""
        assert self.proc.poll() is not None and self.proc.stderr is not None
        return self.proc.stderr.read()
