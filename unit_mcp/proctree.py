"""Process trees from /proc: every descendant of a process, and killing a tree for sure, however its processes
detached (setsid, double fork).

Kept apart (and light: no subprocess, no selectors) because the test host imports it at start-up.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Orphaned descendants of this process (even those that called setsid) are re-parented to it instead of
    escaping to init, so that they stay findable below it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def keep_memory_private() -> None:
    """Other processes of this user can no longer trace this one nor read its memory, environment or open files
    through /proc, and a crash leaves no core file: the token and API keys it holds stay in it. Linux only; kept
    across fork, reset by exec (so the test hosts, OpenCode and unit tests are not affected)."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def dies_with_parent(signum: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for a child that must not outlive this process (a SIGKILLed worker's OpenCode node): the
    kernel sends it `signum` when the thread that started it ends, so start it from the thread that lives as long
    as the process (the event loop's). None off Linux. prctl is looked up here, before the fork."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above: nothing would signal us any more
            os._exit(1)

    return in_child


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(name)) is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (children that left the process group included)."""
    children = _children()
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def kill_all(pids: list[int], *, settle: float = 2.0) -> None:
    """SIGKILL each pid, then wait up to `settle` seconds until none of them runs (zombies do not count)."""
    for target in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(target, signal.SIGKILL)
    deadline = time.perf_counter() + settle
    while time.perf_counter() < deadline and any(running(t) for t in pids):
        time.sleep(0.01)


def kill_descendants(pid: int, *, settle: float = 2.0) -> None:
    """SIGKILL every process below pid, again and again until none runs: one that forked between a scan and its
    kill is found by the next scan (below pid, if pid is a subreaper and alive), and a killed process forks no more.
    Gives up after `settle` seconds without progress (a process stuck in the kernel)."""
    deadline = time.perf_counter() + settle
    while time.perf_counter() < deadline:
        alive = [p for p in descendants(pid) if running(p)]
        if not alive:
            return
        kill_all(alive, settle=settle)
        if not any(running(p) for p in alive):
            deadline = time.perf_counter() + settle


def kill_tree(pid: int, *, settle: float = 2.0) -> None:
    """SIGKILL pid, its process group and every descendant, and wait (up to `settle` seconds) until none runs.

    pid is stopped first and killed last: as a subreaper it adopts the orphans of the descendants killed below it,
    so a process that detached (setsid, double fork) while the tree was being killed is still found there."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGSTOP)
    kill_descendants(pid, settle=settle)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    kill_all([pid], settle=settle)


def reap_strays(keep: set[int], *, settle: float = 2.0) -> None:
    """Kill and reap every child of this (subreaper) process not in `keep`, with its tree: processes it adopted
    because their parent died, until none is left."""
    me = os.getpid()
    deadline = time.perf_counter() + settle
    while time.perf_counter() < deadline:
        strays = [p for p in _children().get(me, []) if p not in keep]
        if not strays:
            return
        for stray in strays:
            kill_tree(stray, settle=settle)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(stray, os.WNOHANG)  # one still dying is found again by the next round


def stopped(pid: int) -> bool:
    """Whether pid is stopped (SIGSTOP, or by a tracer): it answers nothing until continued."""
    return _state(pid) in ("T", "t")


def running(pid: int) -> bool:
    """Whether pid is a live process (not gone, not a zombie waiting to be reaped)."""
    return _state(pid) not in (None, "Z", "X")


def _state(pid: int) -> str | None:
    fields = _stat(str(pid))
    return None if fields is None else fields[0].decode()


def _stat(pid: str) -> list[bytes] | None:
    """State and parent pid of a process from /proc/PID/stat (after the command name, which may hold anything);
    None once it is gone. Raw reads: a scan of every process runs at the end of each test."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    return stat[stat.rindex(b")") + 2 :].split(None, 2)[:2]
