"""Run a unit's test module in a process of its own: own process group, timeout that kills every process it started
(however it detached), capped output, a scratch folder of its own and an allowed list of environment variables.

The process is forked by the warm test host (`unit_mcp.warmhost`, started once and restarted when it dies); should
that fail twice in a row the test runs in a new interpreter (`python -m unit_mcp.testhost`), as it always did.
A cancellation (`unit_mcp.cancel`) kills the group too, within one poll interval (`POLL`)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import contextvars
import functools
import json
import os
import secrets
import select
import selectors
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from . import cancel, tracing
from .loader import member_addresses
from .pgconnect import is_postgres
from .proctree import kill_tree, stopped

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


class _Process(Protocol):
    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def _pump(proc: _Process, streams: dict[int, CappedBuffer], *, deadline: float, cancellable: bool = False) -> bool:
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


def run_test_process(
    units_root: Path | str,
    namespace: str,
    unit_id: str,
    test_name: str,
    *,
    timeout: float,
    max_output: int = 64 * 1024,
    warm: bool = True,
) -> TestProcessResult:
    """Run one test module in a scratch folder of its own (working directory, HOME, TMPDIR and the test host's data
    folder; private, removed after); `warm=False` starts a new interpreter instead of forking the warm test host."""
    with tempfile.TemporaryDirectory(prefix="unit-mcp-test-", ignore_cleanup_errors=True) as scratch:
        env = sandbox_env(scratch, WARM.pass_env, units=units_root) | tracing.environment()
        argv = ["--units", str(units_root), "--namespace", namespace, "--unit", unit_id, "--test", test_name,
                "--data-dir", scratch]  # fmt: skip
        started = time.perf_counter()
        child = WARM.spawn(argv, env, scratch) if warm else None
        if child is not None:
            with child:
                run = _supervise(child, child.stdout, child.stderr, started, timeout=timeout, max_output=max_output)
            if child.returncode == LOST:
                run.stderr += LOST_NOTE
            tracing.replay_handed_back(scratch)
            return run
        proc = subprocess.Popen(
            [sys.executable, "-m", "unit_mcp.testhost", *argv],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=env,
            cwd=scratch,
        )
        assert proc.stdout is not None and proc.stderr is not None
        with proc.stdout, proc.stderr:
            run = _supervise(
                proc, proc.stdout.fileno(), proc.stderr.fileno(), started, timeout=timeout, max_output=max_output
            )
        tracing.replay_handed_back(scratch)
        return run


PASSED_ENV = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "PYTHONHOME", "PYTHONUTF8"})
"""The server's variables a test sees (and every `LC_*`); others only when the operator names them (--test-env)."""
LIBPQ_ENV = frozenset({
    "PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGPASSWORD", "PGPASSFILE", "PGSERVICE",
    "PGSERVICEFILE", "PGSSLMODE", "PGSSLCERT", "PGSSLKEY", "PGSSLROOTCERT", "PGCONNECT_TIMEOUT", "PGOPTIONS",
    "PGTARGETSESSIONATTRS",
})  # fmt: skip
"""What libpq reads to connect: the test host of a PostgreSQL store loads the unit from that store."""
SCRATCH_ENV = ("HOME", "TMPDIR")
"""Set per run, to its scratch folder."""
PER_RUN_ENV = frozenset(tracing.ENV_CARRIER.values())
"""Set per run, to the trace context of the call that runs it (the warm host is not restarted for them)."""


def passed_env_name(name: str) -> str:
    """An argparse type for --test-env: a variable name a test may see."""
    if not name.isidentifier() or not name.isascii():
        raise argparse.ArgumentTypeError(f"{name!r} is not an environment variable name (letters, digits and _)")
    if name in SCRATCH_ENV:
        raise argparse.ArgumentTypeError(f"{name} is set to the test's scratch folder; it cannot be passed")
    return name


def sandbox_env(
    scratch: str | None = None, passed: Iterable[str] = (), *, units: Path | str | None = None
) -> dict[str, str]:
    """The environment of a test: the allowed variables of the server's (never its tokens and keys) and what the
    test host needs to import `unit_mcp` and the `units`: libpq's variables only when they are a PostgreSQL store
    (a database password is no business of a folder's tests)."""
    libpq = LIBPQ_ENV if any(is_postgres(member) for member in member_addresses(str(units))) else frozenset()
    allowed = PASSED_ENV.union(libpq, passed).difference(SCRATCH_ENV)
    env = {name: value for name, value in os.environ.items() if name in allowed or name.startswith("LC_")}
    pgpass = Path.home() / ".pgpass"
    if libpq and "PGPASSFILE" not in env and "PGPASSWORD" not in env and pgpass.is_file():
        env["PGPASSFILE"] = str(pgpass)  # libpq's default, which the scratch HOME would hide
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_PARENT, os.environ.get("PYTHONPATH", "")) if p)
    if site.ENABLE_USER_SITE:
        env["PYTHONUSERBASE"] = site.getuserbase()  # packages installed with --user, though HOME moves
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    if scratch is not None:
        env.update(dict.fromkeys(SCRATCH_ENV, scratch))
    return env


def _supervise(
    proc: _Process, stdout: int, stderr: int, started: float, *, timeout: float, max_output: int
) -> TestProcessResult:
    """Pump the test's output until it ends, its deadline or a cancellation; then kill its whole tree."""
    out, err = CappedBuffer(max_output), CappedBuffer(max_output)
    streams = {stdout: out, stderr: err}
    try:
        ended = _pump(proc, streams, deadline=started + timeout, cancellable=True)
        cancelled = not ended and cancel.requested()
        timed_out = not ended and not cancelled
    finally:
        if _unreaped(proc):
            kill_tree(proc.pid)  # the test's own children too, whether it finished or not
        proc.wait()
        _pump(proc, streams, deadline=time.perf_counter() + PIPE_GRACE)  # what was written before the kill
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


def _unreaped(proc: _Process) -> bool:
    """Whether proc's pid is still its own (not reaped, so not reusable): a reaped cold run's guardian
    (`testhost.guarded`) has killed what it left behind; a forked child stays unreaped until released, unless its
    warm host died."""
    if isinstance(proc, ForkedChild):
        return proc.returncode != LOST
    return proc.returncode is None


LOST = -1
"""The exit code of a forked test whose warm host died, stopped or hung before reporting it."""
LOST_NOTE = "\n[unit-mcp: the warm test host did not report how this test ended (it died or was stopped); replaced]\n"


class ForkedChild:
    """A test process forked by the warm host, seen through the reply socket (it is not our child: the warm host
    reports its exit code and keeps it unreaped until `close`) and through a pidfd, which tells when it ended even
    if the warm host does not (dead, stopped, stuck): then the code is `LOST` and `on_lost` runs on exit."""

    def __init__(
        self, pid: int, reply: socket.socket, stdout: int, stderr: int, *, host_pid: int, on_lost: Callable[[], None]
    ) -> None:
        self.pid = pid
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None
        self._reply: socket.socket | None = reply
        self._pidfd: int | None = None
        self._host_pid = host_pid
        self._on_lost: Callable[[], None] | None = None
        self._replace_host = on_lost
        with contextlib.suppress(OSError):
            self._pidfd = os.pidfd_open(pid)

    def poll(self) -> int | None:
        self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired("warm test", timeout or 0)
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        watched = [fd for fd in (self._reply, self._pidfd) if fd is not None]
        ready = select.select(watched, [], [], timeout)[0] if watched else []
        if self._reply is not None and (self._reply in ready or (self._pidfd in ready and self._reported())):
            try:
                message = self._reply.recv(256)
            except OSError:
                message = b""
            if message:
                self.returncode = int(json.loads(message)["exit"])
                return
            self._reply.close()  # the warm host died: the pidfd alone tells when the child ends
            self._reply = None
            return self._read(timeout)
        if not watched or self._pidfd in ready:  # ended, and the warm host is gone or does not answer
            self.returncode = LOST
            if self._reply is not None:
                self._on_lost = self._replace_host

    def _reported(self) -> bool:
        """The child ended: whether its warm host reports it (after killing its strays) within `REPORT_GRACE`
        seconds; one that is stopped or gone never will."""
        assert self._reply is not None
        deadline = time.perf_counter() + REPORT_GRACE
        while not stopped(self._host_pid) and time.perf_counter() < deadline:
            if select.select([self._reply], [], [], POLL)[0]:
                return True
        return False

    def __enter__(self) -> ForkedChild:
        return self

    def __exit__(self, *exc: object) -> None:
        """Release the child (the warm host reaps it now), close our ends, and replace a warm host that failed."""
        for fd in (self.stdout, self.stderr, self._pidfd):
            if fd is not None:
                os.close(fd)
        if self._reply is not None:
            self._reply.close()
        if self._on_lost is not None:
            self._on_lost()


class WarmTestHost:
    """The caller's side of `unit_mcp.warmhost`: one warm process, started on first use (or by `start`) and
    started again when it has died, stopped, hung, or the environment it was started with has changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._env: dict[str, str] | None = None
        self._answered = False
        self._failed_until = 0.0
        self.pass_env: tuple[str, ...] = ()
        """Variables of the server's that tests see besides `PASSED_ENV` (the server's --test-env)."""

    def start(self, pass_env: Iterable[str] = ()) -> None:
        """Have the warm process running (so that the first test run finds it ready)."""
        with self._lock:
            self.pass_env = tuple(pass_env)
            self._ensure(sandbox_env(None, self.pass_env))

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _ensure(self, env: dict[str, str]) -> socket.socket:
        proc = self._proc
        if proc is None or proc.poll() is not None or stopped(proc.pid) or self._control is None or env != self._env:
            self._stop()
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            with theirs:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "unit_mcp.warmhost", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    start_new_session=True,  # a signal to the server's group does not reach it
                    pass_fds=[theirs.fileno()],
                    env=env,
                    cwd="/",
                )
            self._control, self._env, self._answered = mine, env, False
        assert self._control is not None
        return self._control

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path | str) -> ForkedChild | None:
        """Fork a test host child running `argv` with `env` in `cwd`; None if the warm host failed twice (the caller
        runs it cold, and so do the calls of the next `RETRY_AFTER` seconds: a warm host that cannot start is not
        retried per call). A warm host that does not answer within `FORK_TIMEOUT` (`STARTUP_TIMEOUT` after a
        start) is killed and replaced."""
        if time.monotonic() < self._failed_until or not _pidfds():
            return None
        host_env = {name: value for name, value in env.items() if name not in SCRATCH_ENV and name not in PER_RUN_ENV}
        for _ in range(2):
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            proc = None
            try:
                try:
                    with self._lock:
                        control = self._ensure(host_env)
                        proc, answered = self._proc, self._answered
                        request = json.dumps({"argv": argv, "cwd": str(cwd), "env": env}).encode()
                        socket.send_fds(control, [request], [out_w, err_w, theirs.fileno()])
                finally:  # ours closed before waiting: a warm host dying now must end the wait (EOF), not hold it
                    os.close(out_w)
                    os.close(err_w)
                    theirs.close()
                mine.settimeout(FORK_TIMEOUT if answered else STARTUP_TIMEOUT)  # a start waits for the imports
                message = mine.recv(256)
                mine.settimeout(None)
            except OSError:
                message = b""
            if message and proc is not None:
                self._answered = True
                return ForkedChild(
                    int(json.loads(message)["pid"]),
                    mine,
                    out_r,
                    err_r,
                    host_pid=proc.pid,
                    on_lost=functools.partial(self._replace, proc),
                )
            for fd in (out_r, err_r):
                os.close(fd)
            mine.close()
            with self._lock:
                self._stop()
        self._failed_until = time.monotonic() + RETRY_AFTER
        return None

    def _replace(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill a warm host that did not report a test's end; the next run starts a new one."""
        with self._lock:
            if self._proc is proc:
                self._stop()

    def _stop(self) -> None:
        """Kill the warm process and every process below it (tests still running, strays it had not killed yet)."""
        control, proc, self._control, self._proc = self._control, self._proc, None, None
        if control is not None:
            control.close()
        if proc is not None:
            if proc.poll() is None:  # not reaped: its pid is still its own
                kill_tree(proc.pid)  # SIGKILL works on a stopped process too
            proc.wait()

    def stop(self) -> None:
        with self._lock:
            self._stop()


@functools.cache
def _pidfds() -> bool:
    """Whether this kernel has pidfd_open (Linux 5.3), which the warm host watches its children with."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


STARTUP_TIMEOUT = 30.0
FORK_TIMEOUT = 5.0  # a warm host forks in a millisecond: one that has not answered in this time is stuck
REPORT_GRACE = 5.0  # from a child's end to its report: the warm host kills the child's strays in between
RETRY_AFTER = 60.0
WARM = WarmTestHost()
"""The one warm test host of this process, shared by every service (the same environment serves them all)."""
atexit.register(WARM.stop)  # a warm host that a test stopped would not see our end and outlive us


class TestRun:
    """One test run started through `TestRuns`: its worker thread, the cancellation it watches and its outcome
    (the value or the exception the work ended with)."""

    __test__ = False

    def __init__(self, run_id: str, label: str, subject: object) -> None:
        self.run_id = run_id
        self.label = label
        self.subject = subject
        """What the starter keeps with the run (the service: its result while running)."""
        self.started = time.monotonic()
        self.ended: float | None = None
        self.done = threading.Event()
        self.cancel = threading.Event()
        self.outcome: object = None

    def elapsed(self) -> float:
        return (self.ended if self.ended is not None else time.monotonic()) - self.started


class TestRuns:
    """The runs of one server, each under a server-minted id, kept `retention` seconds after they end (and at most
    `keep` ended runs) so that a client whose call timed out can pick the result up. Shaped like the MCP Tasks
    extension: a handle, a status, a cancel."""

    __test__ = False

    def __init__(self, *, retention: float = 600.0, keep: int = 100) -> None:
        self.retention = retention
        self.keep = keep
        self._lock = threading.Lock()
        self._runs: dict[str, TestRun] = {}

    def start(self, label: str, work: Callable[[], object], subject: object = None, *, limit: int) -> TestRun | None:
        """Run `work` in a thread of its own, cancellable through the run (`cancel.requested()` inside it); None
        when `limit` runs are running already."""
        run = TestRun(secrets.token_urlsafe(12), label, subject)
        caller = contextvars.copy_context()  # the thread runs in the caller's trace

        def target() -> None:
            with cancel.cancellation() as event, tracing.span("unit test run", {"unit_mcp.test_run.id": run.run_id}):

                def watch() -> None:
                    run.cancel.wait()
                    event.set()

                threading.Thread(target=watch, daemon=True).start()
                try:
                    run.outcome = work()
                except Exception as exc:
                    run.outcome = exc
                finally:
                    run.ended = time.monotonic()
                    run.done.set()
                    run.cancel.set()  # ends the watcher

        with self._lock:
            self._forget()
            if sum(not other.done.is_set() for other in self._runs.values()) >= limit:
                return None
            self._runs[run.run_id] = run
        threading.Thread(target=caller.run, args=(target,), name=f"test run {label}", daemon=True).start()
        return run

    def get(self, run_id: str) -> TestRun | None:
        with self._lock:
            self._forget()
            return self._runs.get(run_id)

    def _forget(self) -> None:
        now = time.monotonic()
        ended = sorted((run.ended, run.run_id) for run in self._runs.values() if run.ended is not None)
        for position, (end, run_id) in enumerate(ended):
            if now - end > self.retention or position < len(ended) - self.keep:
                del self._runs[run_id]
