"""Reading session journals that another process may be writing, without taking their writer lock.

A journal only grows by whole lines (see `journal.py`) until it is compacted, which replaces the file (a new
inode). So a reader remembers a `Position` (the file's inode and a byte offset after the last whole line) and
later reads only what was appended; a new inode or a shorter file means it was compacted and the reader
starts over. Nothing here writes, locks or repairs a journal.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("unit_mcp.agent.ui")

_POSITION = re.compile(r"([0-9a-f]{1,16})-([0-9a-f]{1,16})")


@dataclass(frozen=True)
class Position:
    """Where a reader is in one journal; `token` is what the page's event stream sends as its event id."""

    inode: int
    offset: int

    @property
    def token(self) -> str:
        return f"{self.inode:x}-{self.offset:x}"

    @classmethod
    def parse(cls, token: str | None) -> Position | None:
        match = _POSITION.fullmatch(token or "")
        return None if match is None else cls(int(match[1], 16), int(match[2], 16))


@dataclass(frozen=True)
class Chunk:
    """Records read from a journal: `restarted` when they start at its beginning although a later position was
    asked for (the journal was compacted), `position` where the next read starts."""

    records: list[dict[str, Any]]
    position: Position
    restarted: bool


def signature(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a journal, or None when it is gone: what changes whenever it is written."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


def read_from(path: Path, position: Position | None = None, *, until: int | None = None) -> Chunk:
    """The whole records appended since `position` (all of them without one), up to byte `until` if given.
    Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        stat = os.fstat(fd)
        start = 0
        restarted = False
        if position is not None:
            if position.inode == stat.st_ino and position.offset <= stat.st_size:
                start = position.offset
            else:
                restarted = True
        end = stat.st_size if until is None else min(until, stat.st_size)
        data = os.pread(fd, end - start, start) if end > start else b""
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1  # a torn or half-written last line waits for the next read
    records = []
    for line in data[:end].splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            log.warning("%s: a damaged record was skipped", path.name)
            continue
        if isinstance(record, dict):
            records.append(record)
    return Chunk(records, Position(stat.st_ino, start + end), restarted)
