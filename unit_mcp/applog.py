"""The app log: written by a size-rotated handler on the `units` and `unit_mcp` loggers (`open_app_log`), read
by absolute line number: newest first from its end, or forward from a line, a block at a time, never loading a
file whole.

Line numbers run through the kept log as one stream: line 1 is the first line of the oldest rotated backup,
the last line of the live file is `total`. A rotation drops the oldest backup, so the numbers then shift
down by its line count. Each file's newlines are counted once and then only what was appended since.
"""

from __future__ import annotations

import io
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .paths import UnsafePath, open_private, private_dir

BLOCK = 64 * 1024
MAX_LINE_CHARS = 4000
MAX_PENDING = 1024 * 1024
_SIGNATURE_BYTES = 256
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOGGERS = ("units", "unit_mcp")


def open_app_log(path: Path, *, max_bytes: int, backups: int) -> logging.Handler:
    """Log the units and the server (INFO and up) to a size-rotated file at `path`; `close_app_log` undoes it.
    `logging.handlers` is imported here, not at start-up: a test run never logs."""
    import logging.handlers

    class AppLogHandler(logging.handlers.RotatingFileHandler):
        """Rolls over once the log file has reached maxBytes. A record is one `os.write` of its line on the
        O_APPEND descriptor (no buffer to flush) after one `fstat` for the size (other writers of the same file
        count too): the stock handler formats every record twice and asks the text stream where it is."""

        def emit(self, record: logging.LogRecord) -> None:  # called under the handler's lock
            try:
                data = (self.format(record) + "\n").encode("utf-8", "backslashreplace")
                if self.stream is None:
                    self.stream = self._open()
                if 0 < self.maxBytes <= os.fstat(self.stream.fileno()).st_size:
                    self.doRollover()
                fd = self.stream.fileno()  # written past its (unused) buffer
                while data:
                    data = data[os.write(fd, data) :]
            except RecursionError:
                raise
            except Exception:
                self.handleError(record)

        def _open(self) -> io.TextIOWrapper:
            """0600, and never through a symbolic link planted in the log folder."""
            fd = open_private(Path(self.baseFilename), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            return os.fdopen(fd, "a", encoding="utf-8")

    private_dir(path.parent)
    handler = AppLogHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(_Formatter(LOG_FORMAT))
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    return handler


class _Formatter(logging.Formatter):
    """logging.Formatter whose default time stamp (`2026-12-07 23:59:59,123`) is made from a text kept for the
    current second: `time.strftime` once a second instead of once a record."""

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second, text = self._second
        if int(record.created) != second:
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._second = (second, text)  # one assignment: another thread sees the old pair or the new one
        return f"{text},{int(record.msecs):03d}"


class StderrHandler(logging.Handler):
    """Log records for a person watching stderr, never blocking the logger: each clipped to `max_chars`, written
    by a thread of its own through a queue of at most `queued` records; what does not fit (a stderr pipe nobody
    reads) is dropped and counted. The app log has every record whole."""

    def __init__(self, fd: int, *, max_chars: int = MAX_LINE_CHARS, queued: int = 256) -> None:
        super().__init__()
        self._fd = fd
        self._max_chars = max_chars
        self._queue: queue.Queue[str] = queue.Queue(queued)
        self._dropped = 0
        self._counting = threading.Lock()
        threading.Thread(target=self._write, name="unit-mcp-stderr", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:
            self.handleError(record)
            return
        if len(text) > self._max_chars:
            text = f"{text[: self._max_chars]} … ({len(text) - self._max_chars:,} more characters in the app log)"
        try:
            self._queue.put_nowait(text)
        except queue.Full:
            with self._counting:
                self._dropped += 1

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (at most `timeout` seconds: stderr may never be read) until what was queued has been written."""
        with self._queue.all_tasks_done:
            self._queue.all_tasks_done.wait_for(lambda: not self._queue.unfinished_tasks, timeout)

    def _write(self) -> None:
        """Written with os.write on the descriptor: a write blocked on a full pipe holds no lock of Python's stderr
        object, so the interpreter can still exit."""
        while True:
            text = self._queue.get()
            with self._counting:
                dropped, self._dropped = self._dropped, 0
            if dropped:
                text = f"({dropped:,} log records were dropped: stderr is not being read; the app log has them)\n{text}"
            data = (text + "\n").encode("utf-8", "replace")
            try:
                while data:
                    data = data[os.write(self._fd, data) :]
            except OSError:
                return
            finally:
                self._queue.task_done()


def close_app_log(handler: logging.Handler) -> None:
    for name in LOGGERS:
        logging.getLogger(name).removeHandler(handler)
    handler.close()


@dataclass
class Page:
    lines: list[tuple[int, str]]
    """(line number, text), oldest first."""
    has_more: bool
    """Matching lines exist beyond the page: older ones (newest-first reading) or newer ones (forward)."""
    total: int
    """Lines in the kept log: the number of its last line."""


@dataclass
class _Counted:
    signature: bytes  # the file's first bytes: a reused inode number is a different file
    size: int
    newlines: int


_counted: dict[tuple[int, int], _Counted] = {}
_counted_lock = threading.Lock()


@dataclass
class _LogFile:
    handle: BinaryIO
    size: int
    newlines: int
    base: int  # lines in the older files

    @property
    def lines(self) -> int:
        """Complete lines, and an unterminated last one if there is one."""
        if self.size == 0:
            return 0
        self.handle.seek(self.size - 1)
        return self.newlines + (self.handle.read(1) != b"\n")


def log_files(path: Path, backups: int) -> list[Path]:
    """The live log and its rotated backups, newest first."""
    return [path] + [path.with_name(f"{path.name}.{n}") for n in range(1, backups + 1)]


def newest(files: list[Path], *, grep: str | None, count: int, before: int | None = None) -> Page:
    """The `count` newest lines containing grep (numbered below `before`, if given), oldest first."""
    with _open(files) as opened:
        total = opened[-1].base + opened[-1].lines if opened else 0
        found: list[tuple[int, str]] = []
        for log in reversed(opened):
            if before is not None and log.base + 1 >= before:
                continue
            for number, raw in _reverse(log):
                if before is not None and number >= before:
                    continue
                text = _match(raw, grep)
                if text is not None:
                    found.append((number, text))
                    if len(found) > count:
                        return Page(list(reversed(found[:count])), True, total)
        return Page(list(reversed(found)), False, total)


def forward(files: list[Path], *, grep: str | None, count: int, start: int) -> Page:
    """The first `count` lines containing grep from line number `start` on, oldest first."""
    with _open(files) as opened:
        total = opened[-1].base + opened[-1].lines if opened else 0
        found: list[tuple[int, str]] = []
        for log in opened:
            if log.base + log.lines < start:
                continue
            for number, raw in _forward(log, start):
                text = _match(raw, grep)
                if text is not None:
                    if len(found) == count:
                        return Page(found, True, total)
                    found.append((number, text))
        return Page(found, False, total)


class _open:
    """The existing log files, oldest first, opened with their sizes and newline counts fixed now: lines
    appended while reading are left for the next call, so every number given out is right."""

    def __init__(self, files: list[Path]) -> None:
        self.opened: list[_LogFile] = []
        base = 0
        for path in reversed(files):
            try:
                handle = os.fdopen(open_private(path, os.O_RDONLY), "rb")
            except (FileNotFoundError, UnsafePath):
                continue
            status = os.fstat(handle.fileno())
            log = _LogFile(handle, status.st_size, _newlines(handle, status), base)
            self.opened.append(log)
            base += log.lines

    def __enter__(self) -> list[_LogFile]:
        return self.opened

    def __exit__(self, *exc: object) -> None:
        for log in self.opened:
            log.handle.close()


def _newlines(handle: BinaryIO, status: os.stat_result) -> int:
    """Newlines in the first `st_size` bytes, counting only what was appended since the last call."""
    key = (status.st_dev, status.st_ino)
    handle.seek(0)
    signature = handle.read(_SIGNATURE_BYTES)
    with _counted_lock:
        known = _counted.get(key)
    if known is None or known.size > status.st_size or not signature.startswith(known.signature):
        known = _Counted(signature, 0, 0)
    handle.seek(known.size)
    done, newlines = known.size, known.newlines
    while done < status.st_size:
        chunk = handle.read(min(16 * BLOCK, status.st_size - done))
        if not chunk:
            break
        newlines += chunk.count(b"\n")
        done += len(chunk)
    with _counted_lock:
        if len(_counted) > 64:
            _counted.clear()
        _counted[key] = _Counted(signature, done, newlines)
    return newlines


def _reverse(log: _LogFile) -> Iterator[tuple[int, bytes]]:
    """(number, line) last first. A line longer than MAX_PENDING bytes is cut to its end."""
    handle, position, pending = log.handle, log.size, b""
    index = log.newlines  # of the piece after the last newline (empty when the file ends with one)
    while position > 0:
        size = min(BLOCK, position)
        position -= size
        handle.seek(position)
        parts = (handle.read(size) + pending).split(b"\n")
        pending = parts[0][-MAX_PENDING:]
        for line in reversed(parts[1:]):
            if line:
                yield log.base + index + 1, line
            index -= 1
    if pending:
        yield log.base + index + 1, pending


def _skip_to(log: _LogFile, start: int) -> tuple[int, int]:
    """The byte position and number of line `start` in this file (its first line if `start` is before it),
    found by counting newlines a block at a time."""
    wanted = start - log.base - 1  # newlines before that line
    handle, position, passed = log.handle, 0, 0
    handle.seek(0)
    while wanted > passed and position < log.size:
        chunk = handle.read(min(16 * BLOCK, log.size - position))
        if not chunk:
            break
        found = chunk.count(b"\n")
        if passed + found >= wanted:
            index = -1
            for _ in range(wanted - passed):
                index = chunk.index(b"\n", index + 1)
            return position + index + 1, start
        passed += found
        position += len(chunk)
    return position, log.base + passed + 1


def _forward(log: _LogFile, start: int) -> Iterator[tuple[int, bytes]]:
    """(number, line) first first from line `start`, up to the counted size. A line longer than MAX_PENDING
    bytes is cut."""
    handle = log.handle
    position, number = _skip_to(log, start)
    left = log.size - position
    handle.seek(position)
    while left > 0:
        raw = handle.readline(min(left, MAX_PENDING))
        if not raw:
            return
        left -= len(raw)
        if raw.endswith(b"\n"):
            if raw != b"\n":
                yield number, raw[:-1]
            number += 1
        else:  # a cut long line (its rest follows) or the unterminated last line
            yield number, raw
            while left > 0 and not raw.endswith(b"\n"):
                raw = handle.readline(min(left, MAX_PENDING))
                left -= len(raw)
                if not raw:
                    return
            number += 1


def _match(raw: bytes, grep: str | None) -> str | None:
    line = raw.decode("utf-8", "replace").rstrip("\r")
    if grep is not None and grep not in line:
        return None
    return line[:MAX_LINE_CHARS]
