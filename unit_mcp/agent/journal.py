"""An append-only JSON Lines file: O(1) appends that a crash can tear only at the very end.

Every record is one line written with a single `write` on an `O_APPEND` descriptor, so a process that dies
mid-write leaves at most one incomplete last line; the reader drops it and the next writer truncates it
away. A failed write (disk full) is rolled back with `ftruncate`. Damage anywhere but the last line cannot
come from a crash and is reported as `SessionCorrupt` instead of being silently skipped. A writer holds an
exclusive `flock` on its journal, so two writers cannot interleave records.

Durability (when the bytes reach the disk, not just the OS): `"always"` fsyncs after every record, so a
power loss loses nothing that was acknowledged; `"flush"` fsyncs only at `sync()` (the runner calls it at
the end of every turn), so a power loss may lose the records of the running turn but never corrupts older
ones; `"never"` leaves it to the OS. A process crash loses nothing acknowledged under any policy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from .errors import SessionCorrupt, SessionLocked

Durability = Literal["always", "flush", "never"]


def encode(record: dict[str, Any]) -> bytes:
    """One record as one line (JSON escapes newlines inside strings, so a record never spans lines)."""
    return (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def fsync_dir(directory: Path) -> None:
    """Make a created, renamed or deleted file entry durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(fd: int, path: Path) -> None:
    """One writer per journal: an exclusive advisory lock held while the journal is open for appending."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise SessionLocked(f"{path.stem} is open for writing elsewhere (another store or process)") from None


def read(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The records of a journal and the byte length they occupy; a torn last line is left out."""
    data = path.read_bytes()
    records: list[dict[str, Any]] = []
    offset = 0
    while offset < len(data):
        end = data.find(b"\n", offset)
        if end == -1:
            break  # the last write was torn before its newline
        line = data[offset:end]
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if end + 1 >= len(data):
                break  # a torn last line that happens to contain a newline (e.g. zero-filled blocks)
            raise SessionCorrupt(f"{path.name}: record {len(records) + 1} is damaged ({exc})") from None
        records.append(record)
        offset = end + 1
    return records, offset


class Journal:
    """The writer of one journal file; not thread-safe on its own (the session store serialises calls)."""

    def __init__(self, path: Path, *, durability: Durability = "always") -> None:
        self.path = path
        self.durability = durability
        self._fd: int | None = None
        self._size = 0
        self._dirty = False

    @classmethod
    def create(cls, path: Path, records: Iterable[dict[str, Any]], *, durability: Durability = "always") -> Journal:
        """A new journal holding `records`, written whole (temporary file, fsync, rename) so it is never half there."""
        journal = cls(path, durability=durability)
        journal.rewrite(records)
        return journal

    @classmethod
    def open(cls, path: Path, valid_size: int, *, durability: Durability = "always") -> Journal:
        """Open for appending after `read()`, cutting off a torn tail so new records start on a fresh line."""
        journal = cls(path, durability=durability)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        _lock(fd, path)
        if os.fstat(fd).st_size != valid_size:
            os.ftruncate(fd, valid_size)
            os.fsync(fd)
        journal._fd, journal._size = fd, valid_size
        return journal

    def append(self, record: dict[str, Any]) -> None:
        line = encode(record)
        fd = self._require_fd()
        try:
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self._size)
            raise
        self._size += len(line)
        if self.durability == "always":
            os.fsync(fd)
        else:
            self._dirty = True

    def sync(self) -> None:
        """Flush point: make every appended record durable unless durability is "never"."""
        if self._fd is not None and self._dirty and self.durability != "never":
            os.fsync(self._fd)
        self._dirty = False

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the whole journal atomically (compaction): readers see the old file or the new one."""
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            size = 0
            with os.fdopen(fd, "wb") as out:
                for record in records:
                    line = encode(record)
                    out.write(line)
                    size += len(line)
                out.flush()
                if self.durability != "never":
                    os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        if self.durability != "never":
            fsync_dir(self.path.parent)
        self.close()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        _lock(fd, self.path)
        self._fd = fd
        self._size = size
        self._dirty = False

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.sync()
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _require_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"journal {self.path.name} is closed")
        return self._fd
