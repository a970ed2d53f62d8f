"""CodexProcess: one `codex exec --json` run, its JSONL events read as they are printed, stopped for sure.

The prompt goes in on stdin (an argument is limited to 128 KiB), stderr is kept as a bounded tail for error
messages, and the process runs in a group of its own. `interrupt` sends SIGINT (Codex's cancel); leaving the
context makes sure it is gone: SIGINT, then SIGKILL to the group after `interrupt_timeout`.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from ...resource import StackedResource
from .._binaries import find_binary
from ._config import PINNED_VERSION
from ._errors import CodexError, CodexNotInstalled
from ._output import CodexEvent, parse_line

log = logging.getLogger("unit_mcp.agent.codex.process")

MAX_LINE = 64 * 1024 * 1024  # one event carries a whole tool result; a unit's source can be large


def find_codex(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The `codex` binary: `explicit`, else $CODEX_PATH, else `codex` on PATH."""
    install = (
        f"Install the pinned version with `npm install --prefix DIR @openai/codex@{PINNED_VERSION}` "
        "(scripts/codex-tool does this) and pass "
        "DIR/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
    )
    return find_binary("codex", "CODEX_PATH", explicit, error=CodexNotInstalled, install=install)


class CodexProcess(StackedResource):
    def __init__(
        self,
        binary: str | os.PathLike[str],
        args: Sequence[str],
        *,
        prompt: str,
        env: Mapping[str, str],
        cwd: str | os.PathLike[str],
        interrupt_timeout: float = 5.0,
        stderr_lines: int = 40,
    ) -> None:
        self.command = [os.fspath(binary), *args]
        self.prompt = prompt
        self.env = dict(env)
        self.cwd = os.fspath(cwd)
        self.interrupt_timeout = interrupt_timeout
        self.interrupted = False
        self.killed = False
        self._stderr: collections.deque[str] = collections.deque(maxlen=stderr_lines)
        self._process: anyio.abc.Process | None = None
        self._stdout: BufferedByteReceiveStream | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.returncode

    def stderr_tail(self) -> str:
        """The last lines Codex wrote to stderr (warnings, errors), for error messages."""
        return "\n".join(self._stderr)

    # -- lifecycle --------------------------------------------------------------------------------

    async def _open(self, stack: AsyncExitStack) -> None:
        """Start the process and its pumps; leaving stops the process (shielded: this also runs when the turn is
        cancelled), then the pumps."""
        try:
            process = await anyio.open_process(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.cwd,
                env=self.env,
                start_new_session=True,
            )
        except OSError as exc:
            raise CodexError(f"cannot start {self.command[0]}: {exc}") from exc
        self._process = process
        assert process.stdout is not None
        self._stdout = BufferedByteReceiveStream(process.stdout)
        stack.push_async_callback(process.aclose)
        tg = await stack.enter_async_context(anyio.create_task_group())
        stack.callback(tg.cancel_scope.cancel)
        stack.push_async_callback(self._stop_shielded)
        tg.start_soon(self._feed, process)
        tg.start_soon(self._drain_stderr, process)

    async def _stop_shielded(self) -> None:
        with anyio.CancelScope(shield=True):
            await self.stop()

    def interrupt(self) -> None:
        """Ask Codex to cancel its turn (SIGINT); idempotent, and a no-op once it has exited."""
        process = self._process
        if process is None or process.returncode is not None or self.interrupted:
            return
        self.interrupted = True
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGINT)

    async def stop(self) -> int | None:
        """Interrupt, wait up to `interrupt_timeout`, then kill the whole group; returns the exit status."""
        process = self._process
        if process is None:
            return None
        if process.returncode is None:
            self.interrupt()
            with anyio.move_on_after(self.interrupt_timeout):
                await process.wait()
        if process.returncode is None:
            self.killed = True
            log.warning("codex (pid %s) ignored SIGINT for %.1f s; killing it", process.pid, self.interrupt_timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
        return process.returncode

    async def wait(self) -> int:
        assert self._process is not None
        return await self._process.wait()

    # -- output -----------------------------------------------------------------------------------

    async def events(self) -> AsyncIterator[CodexEvent | str]:
        """Each stdout line as it is printed: an event, or the raw line when it is not one (kept, not fatal)."""
        stdout = self._stdout
        assert stdout is not None
        while True:
            try:
                raw = await stdout.receive_until(b"\n", MAX_LINE)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
                return
            except anyio.DelimiterNotFound:
                raise CodexError(f"codex printed a line longer than {MAX_LINE} bytes") from None
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            event = parse_line(line)
            yield event if event is not None else line

    async def _feed(self, process: anyio.abc.Process) -> None:
        stdin = process.stdin
        assert stdin is not None
        try:
            await stdin.send(self.prompt.encode("utf-8"))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            log.debug("codex closed its stdin before reading the whole prompt")
        finally:
            with contextlib.suppress(OSError, anyio.BrokenResourceError):
                await stdin.aclose()

    async def _drain_stderr(self, process: anyio.abc.Process) -> None:
        stderr = process.stderr
        assert stderr is not None
        buffered = BufferedByteReceiveStream(stderr)
        while True:
            try:
                raw = await buffered.receive_until(b"\n", 64 * 1024)
            except anyio.DelimiterNotFound:
                raw = await buffered.receive(64 * 1024)
            except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self._stderr.append(line)
                log.debug("codex stderr: %s", line)
