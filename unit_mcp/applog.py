"""Read the app log from its end, a block at a time, never loading the whole file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

BLOCK = 64 * 1024
MAX_LINE_CHARS = 4000


def reverse_lines(path: Path, *, max_pending: int = 1024 * 1024) -> Iterator[bytes]:
    """Yield the lines of a file last first. A line longer than max_pending bytes is cut to its end."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    with handle:
        handle.seek(0, 2)
        position = handle.tell()
        pending = b""
        while position > 0:
            size = min(BLOCK, position)
            position -= size
            handle.seek(position)
            block = handle.read(size) + pending
            parts = block.split(b"\n")
            pending = parts[0][-max_pending:]
            for line in reversed(parts[1:]):
                if line:
                    yield line
        if pending:
            yield pending


def log_files(path: Path, backups: int) -> list[Path]:
    """The live log and its rotated backups, newest first."""
    return [path] + [path.with_name(f"{path.name}.{n}") for n in range(1, backups + 1)]


def tail(files: list[Path], *, grep: str | None, skip: int, count: int) -> tuple[list[str], bool]:
    """The `count` newest lines containing grep, after skipping the `skip` newest.

    Returns them oldest first, and whether older matching lines exist.
    """
    found: list[str] = []
    wanted = skip + count + 1
    seen = 0
    for path in files:
        for raw in reverse_lines(path):
            line = raw.decode("utf-8", "replace").rstrip("\r")
            if grep is not None and grep not in line:
                continue
            seen += 1
            if seen > skip:
                found.append(line[:MAX_LINE_CHARS])
            if seen >= wanted:
                break
        if seen >= wanted:
            break
    has_more = len(found) > count
    return list(reversed(found[:count])), has_more
