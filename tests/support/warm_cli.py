"""`python -m unit_mcp.agent ARGS` (and `unit_mcp.server`, `unit_mcp.fleet`, a script) as a fork of one warm
interpreter per test process, not a fresh interpreter.

A fresh `python -m unit_mcp.agent run …` spends about 3 s of CPU importing the OpenAI and MCP clients before it does
anything; the agent tests start it about 50 times (and the durable tests start workers the same way). The CLI's
process is what these tests check (its exit code, its stdout and stderr, a terminal on stdin, a SIGKILL), not the
interpreter's start, so a server process imports the CLI and what a turn imports once, and forks a child per call
(as `tests/durable/start_at_once.py` does): a real process with its own pid, the caller's arguments, environment,
working folder and stdin/stdout/stderr (passed over a Unix socket), running the same `unit_mcp/agent/__main__.py`
under `runpy` (or a script: the durable tests' `provider_worker.py`), with SIGKILL, exit codes and signals as a
subprocess has them. The interpreter's own start is still
checked cold: `test_help_shows_the_real_defaults` and the other tests that run `python -m unit_mcp.agent` directly.

No module the server imports reads the environment at import time but `unit_mcp.resultlog`, which each child reads
again (each child gets the caller's whole environment before the CLI runs), and no thread runs when it forks (checked
at its start); it ends when its parent's pipe closes (the test process ended) or at the test process's exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import anyio

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
MAX_MESSAGE = 1 << 20  # the request: argv, environment and working folder, as JSON (a SOCK_SEQPACKET message)
WARM = [  # what `run`, `answer` and `worker` import once they start (the CLI imports them lazily)
    "unit_mcp.agent._cli",
    "unit_mcp.agent._mcpsource",
    "unit_mcp.agent._openai_agent",
    "unit_mcp.agent._registry",
    "unit_mcp.agent._runner",
    "unit_mcp.agent._durable",
    "unit_mcp.agent.prompts",
    "unit_mcp.agent.toolsurface",
    "unit_mcp.agent.turns",
    "unit_mcp.agent.presets",
    "unit_mcp.agent.agentfile",
    "unit_mcp.agent.codex",  # and what the durable tests' provider_worker.py imports
    "unit_mcp.agent.opencode",
    "httpx2",
    "openai",
    "unit_mcp.server",  # what support.server_process starts: `python -m unit_mcp.server` and `unit_mcp.fleet`
    "unit_mcp.fleet",
]
MODULES = ("unit_mcp.agent", "unit_mcp.server", "unit_mcp.fleet")
"""The `python -m` entry points a child may become."""


# -- the server (its own process) --


def warm_up() -> None:
    """Import what `WARM` names (what a child would otherwise import itself), here, before any fork."""
    import importlib

    for name in WARM:
        importlib.import_module(name)


def serve(address: str) -> None:
    """Import the CLI once, then fork a child per request on `address` until stdin (the parent's pipe) closes."""
    warm_up()
    if threading.active_count() != 1:  # a fork copies only the forking thread: a child could inherit a held lock
        raise SystemExit(f"warm_cli: a thread runs after the imports ({threading.enumerate()}); fork is unsafe")
    sys.path[:] = [entry for entry in sys.path if entry != str(TESTS)]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(address)
    listener.listen(64)
    try:
        _serve(listener)
    finally:  # the folder goes with the server (a pytest-xdist worker ends without running atexit)
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


def _serve(listener: socket.socket) -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    waiting: dict[int, socket.socket] = {}  # child pid -> the connection its exit status goes to
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.02 if waiting else None)  # polls only to reap
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            return  # the test process ended
        if listener in readable:
            connection, _ = listener.accept()
            pid = _spawn(connection, listener, waiting)
            if pid is not None:
                waiting[pid] = connection
        while waiting:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = waiting.pop(pid, None)
            if connection is not None:
                code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
                _send(connection, {"returncode": code})
                connection.close()


def _send(connection: socket.socket, message: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # the caller went away: nobody waits for this answer
        connection.send(json.dumps(message).encode())


def _spawn(connection: socket.socket, listener: socket.socket, waiting: dict[int, socket.socket]) -> int | None:
    data, fds, _, _ = socket.recv_fds(connection, MAX_MESSAGE, 3)
    if len(fds) != 3:
        _send(connection, {"error": f"expected stdin, stdout and stderr, got {len(fds)} descriptors"})
        connection.close()
        return None
    request = json.loads(data)
    pid = os.fork()
    if pid == 0:  # the child: becomes `python -m unit_mcp.agent ARGS`, never returns
        listener.close()
        for other in waiting.values():
            other.close()
        connection.close()
        _become_cli(request, fds)
    for fd in fds:
        os.close(fd)
    _send(connection, {"pid": pid})
    return pid


def _become_cli(request: dict[str, Any], fds: list[int]) -> None:
    import runpy
    import traceback

    from unit_mcp import resultlog

    code: int = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # as a fresh interpreter: the caller's TMPDIR, not one this server looked up
        resultlog.recorder = resultlog._from_env()  # read at its import: this caller's environment decides
        script = request.get("script")
        try:
            if script is None:
                module = request.get("module", "unit_mcp.agent")
                if module not in MODULES:
                    raise SystemExit(f"warm_cli: {module} is not one of {MODULES}")
                sys.argv = [module, *request["args"]]  # run_module sets argv[0] to its file, as `python -m` does
                # A module imported above runs again as __main__ (a copy, as `python -m` makes); runpy says so.
                warnings.filterwarnings("ignore", f"'{module}' found in sys.modules", RuntimeWarning)
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:  # `python SCRIPT ARGS`: its folder first on sys.path
                sys.argv = [script, *request["args"]]
                sys.path.insert(0, os.path.dirname(script))
                runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:  # as the interpreter turns it into an exit status
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed pipe: the exit status still goes out
                stream.flush()
        os._exit(code & 0xFF)


# -- the caller's side (the test process) --


class WarmProcess:
    """The forked CLI, as much of `subprocess.Popen` as the tests use: pid, poll, wait, kill, returncode."""

    def __init__(self, connection: socket.socket, pid: int, args: list[str]) -> None:
        self.connection, self.pid, self.args = connection, pid, args
        self.returncode: int | None = None
        self.stdout: IO[str] | None = None  # set by `WarmCli.popen`
        self.stderr: IO[str] | None = None

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._status(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # not reaped yet, so the pid is still this process's
            os.kill(self.pid, signum)

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None and select.select([self.connection], [], [], timeout)[0]:
            message = self.connection.recv(MAX_MESSAGE)
            if not message:
                raise RuntimeError("warm_cli: the server ended before the CLI did")
            self.returncode = int(json.loads(message)["returncode"])
            self.connection.close()
        return self.returncode


class WarmCli:
    """One server per test process (started at its first use)."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="warm-cli-"))  # 0700: only this user may connect
        self.address = str(self.folder / "socket")
        code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); from support.warm_cli import serve; serve(sys.argv[1])"
        self.server = subprocess.Popen(
            [sys.executable, "-c", code, self.address],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert self.server.stdout is not None
        ready = self.server.stdout.readline()
        if ready != b"ready\n":
            self.server.wait(30)
            raise RuntimeError(f"warm_cli: the server did not start (exit {self.server.returncode})")
        atexit.register(self.close)

    def spawn(
        self,
        args: list[str],
        *,
        stdin: int,
        stdout: int,
        stderr: int,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO,
        script: Path | None = None,
        module: str = "unit_mcp.agent",
    ) -> WarmProcess:
        """`python -m MODULE ARGS` (by default `unit_mcp.agent`; one of MODULES), or `python SCRIPT ARGS`, with these
        descriptors (the caller keeps and closes its own)."""
        request = {
            "args": list(args),
            "env": dict(os.environ if env is None else env),
            "cwd": str(cwd),
            "script": None if script is None else str(script),
            "module": module,
        }
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.connect(self.address)
        socket.send_fds(connection, [json.dumps(request).encode()], [stdin, stdout, stderr])
        answer = json.loads(connection.recv(MAX_MESSAGE))
        if "pid" not in answer:
            connection.close()
            raise RuntimeError(f"warm_cli: {answer.get('error', answer)}")
        return WarmProcess(connection, int(answer["pid"]), list(args))

    def popen(
        self,
        args: list[str],
        *,
        env: Mapping[str, str],
        cwd: Path,
        module: str = "unit_mcp.agent",
        script: Path | None = None,
    ) -> WarmProcess:
        """`python -m MODULE ARGS` (or `python SCRIPT ARGS`) as `subprocess.Popen(..., stdout=PIPE, stderr=PIPE,
        text=True)` with stdin from /dev/null: the process's `stdout` and `stderr` are text streams of the caller's."""
        process, out_read, err_read = self._piped(args, env=env, cwd=cwd, module=module, script=script)
        process.stdout = open(out_read, encoding="utf-8")  # noqa: SIM115  # the caller's to read
        process.stderr = open(err_read, encoding="utf-8")  # noqa: SIM115
        return process

    async def run(self, args: list[str], *, env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        """Exit code, stdout and stderr of `python -m unit_mcp.agent ARGS` (stdin /dev/null), like
        `anyio.run_process`: a cancelled caller kills the process."""
        process, out_read, err_read = self._piped(args, env=env)
        try:
            out, err = await anyio.to_thread.run_sync(_read_to_end, out_read, err_read, abandon_on_cancel=True)
        except BaseException:
            process.kill()  # its pipes end with it, and the abandoned reader with them
            raise
        return await anyio.to_thread.run_sync(process.wait), out.decode(), err.decode()

    def _piped(
        self,
        args: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: Path = REPO,
        module: str = "unit_mcp.agent",
        script: Path | None = None,
    ) -> tuple[WarmProcess, int, int]:
        """The process started with stdin from /dev/null and stdout and stderr on new pipes: it, and the pipes' read
        ends (the caller's to close; its own copies of the write ends are closed)."""
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            process = self.spawn(
                list(args), stdin=null, stdout=out_write, stderr=err_write, env=env, cwd=cwd, module=module,
                script=script,
            )  # fmt: skip
        except BaseException:
            os.close(out_read)
            os.close(err_read)
            raise
        finally:
            for fd in (null, out_write, err_write):
                os.close(fd)
        return process, out_read, err_read

    def close(self) -> None:
        if self.server.poll() is None:
            assert self.server.stdin is not None
            self.server.stdin.close()  # the server's signal to end
            try:
                self.server.wait(10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


def _read_to_end(out_read: int, err_read: int) -> tuple[bytes, bytes]:
    """Both streams to their end, as `anyio.run_process` reads them (then closed)."""
    chunks: dict[int, list[bytes]] = {out_read: [], err_read: []}
    reading = set(chunks)
    try:
        while reading:
            for fd in select.select(list(reading), [], [])[0]:
                chunk = os.read(fd, 65536)
                if chunk:
                    chunks[fd].append(chunk)
                else:
                    reading.discard(fd)
    finally:
        os.close(out_read)
        os.close(err_read)
    return b"".join(chunks[out_read]), b"".join(chunks[err_read])


_warm: WarmCli | None = None
_started = threading.Lock()


def warm_cli() -> WarmCli:
    """This test process's server (started now if it was not)."""
    global _warm
    with _started:
        if _warm is None or _warm.server.poll() is not None:
            _warm = WarmCli()
        return _warm
