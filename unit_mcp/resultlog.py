"""A recorder of every tool result, off unless `UNIT_MCP_RESULTS_DIR` names a folder (the test suite sets it).

Each process appends its results to `results-<pid>.jsonl` in that folder (parallel test workers and the servers the
tests start never share a file), one JSON line per result: the tool, how it was called (`mcp`: a wire result of
`UnitTools`; `python`: a `UnitService` method's result to a Python caller) and the result's text. The suite then
greps them all for host paths (`tests/support/resultcheck.py`). Off, it costs one `is None` test per call."""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

ENV = "UNIT_MCP_RESULTS_DIR"
MAX_TEXT = 1_000_000
"""A longer result is recorded up to this many characters."""

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class ResultLog:
    """Appends results to this process's file in `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()

    def write(self, tool: str, via: str, text: str) -> None:
        line = json.dumps(
            {"tool": tool, "via": via, "test": os.environ.get("PYTEST_CURRENT_TEST"), "text": text[:MAX_TEXT]},
            ensure_ascii=False,
        )
        with self._lock, (self.folder / f"results-{os.getpid()}.jsonl").open("a", encoding="utf-8") as out:
            out.write(line + "\n")


def _from_env() -> ResultLog | None:
    folder = os.environ.get(ENV)
    return ResultLog(Path(folder)) if folder and Path(folder).is_dir() else None


recorder: ResultLog | None = _from_env()
"""The process's recorder, None when off (read once at import; `start` turns it on in a running process)."""


def start(folder: Path) -> None:
    """Record from now on into `folder`, in this process and in the processes it starts."""
    global recorder
    os.environ[ENV] = str(folder)
    recorder = ResultLog(folder)


def record(tool: str, via: str, result: Any) -> None:
    """Record one result (a pydantic model, an MCP result or text) if recording is on."""
    if recorder is None:
        return
    dump = getattr(result, "model_dump_json", None)
    recorder.write(tool, via, dump(by_alias=True) if dump is not None else str(result))


def recording(call: F, tool: Callable[..., str]) -> F:
    """`call` (an async tool handler) recording its results, or `call` itself when recording is off.
    `tool(*args)` names the tool of a call."""
    if recorder is None:
        return call

    @functools.wraps(call)
    async def recorded(*args: Any) -> Any:
        result = await call(*args)
        record(tool(*args), "mcp", result)
        return result

    return recorded  # type: ignore[return-value]
