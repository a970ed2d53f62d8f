"""Process trees from /proc: every descendant of a process, and killing a list of processes for sure.

Kept apart (and light: no subprocess, no selectors) because the test host imports it at start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every process below pid, from /proc (children that left the process group included)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
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
    while time.perf_counter() < deadline and any(_running(t) for t in pids):
        time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
