"""Handles, not paths: unit and source id validation, and file access that never leaves the units root.

Every access walks from the root one `O_NOFOLLOW` directory descriptor at a time, so no symlink can redirect it;
writes are atomic (temporary file, fsync, rename). A data dir is trusted only when it is ours (`private_dir`),
and secrets come from the environment or a private file, never argv.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import hashlib
import keyword
import logging
import os
import queue
import re
import secrets
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .errors import InvalidSourceId, InvalidUnitId

_UNIT_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
MAX_SEGMENT_BYTES = 255
MAX_SOURCE_ID_BYTES = 1024
MAX_UNIT_ID_LENGTH = 128

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class UnsafePath(Exception):
    """A symlink, or something other than a regular file or directory, stands on the path."""


class UntrustedFolder(Exception):
    """A data folder another local user could have planted or can change: one line naming it and what to do."""


class UnsafeSecret(Exception):
    """A secret file that other users can read or that is not ours: one line naming it and what to do."""


KEPT_BYTES = (1024, 64 * 1024)
"""Bytes of this many (from, to) have their hash kept by content (the newest 64): a read, its dry run and the patch
after it hash the same source again and again, and looking it up (Python's own hash of the bytes) costs a fraction."""


def hash_bytes(data: bytes) -> str:
    if type(data) is bytes and KEPT_BYTES[0] <= len(data) <= KEPT_BYTES[1]:
        return _kept_hash(data)
    return "sha256:" + hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=64)
def _kept_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def validate_unit_id(unit_id: object) -> str:
    if not isinstance(unit_id, str) or not unit_id:
        raise InvalidUnitId("unit_id must be a non-empty string.")
    if not is_unit_id(unit_id):
        shown = unit_id if len(unit_id) <= 80 else unit_id[:80] + "…"
        raise InvalidUnitId(f"{shown!r} is not a valid unit id.")
    return unit_id


def is_unit_id(name: object) -> bool:
    """Whether `name` may be a unit id: the one rule every loader applies to what its store lists (and, without
    raising, what a folder's listing runs for each of its entries)."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_UNIT_ID_LENGTH
        and _UNIT_ID.fullmatch(name) is not None
        and not keyword.iskeyword(name)
    )


def is_source_id(source_id: object) -> bool:
    """Whether `source_id` may name a source: the rule every loader applies to what its store lists."""
    try:
        validate_source_id(source_id)
    except InvalidSourceId:
        return False
    return True


class StoredIds:
    """Ids a units database lists, checked by the rules the folder loader applies to names: one it would refuse (no
    module name, a path out of the unit's folder) is skipped, logged once to `log`, escaped on one line."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._skipped: set[tuple[str, str]] = set()

    def unit(self, unit_id: object) -> bool:
        if is_unit_id(unit_id):
            return True
        self._skip("", unit_id, "unit id %s in the units database is not a valid unit id: skipped")
        return False

    def source(self, unit_id: str, source_id: object) -> bool:
        if is_source_id(source_id):
            return True
        self._skip(
            unit_id,
            source_id,
            f"source id %s of unit {unit_id!a} in the units database is not a valid source id: skipped",
        )
        return False

    def _skip(self, unit_id: str, value: object, message: str) -> None:
        shown = ascii(value)[:120]
        if (unit_id, shown) not in self._skipped:
            self._skipped.add((unit_id, shown))
            self._log.warning(message, shown)


def validate_source_id(source_id: object) -> tuple[str, ...]:
    """Split a source id into segments, refusing anything that is not a plain relative handle."""
    if not isinstance(source_id, str) or not source_id:
        raise InvalidSourceId("source_id must be a non-empty string.")
    return _source_id_segments(source_id)


@functools.lru_cache(maxsize=4096)  # runs for every file a folder listing finds; a refusal is not cached
def _source_id_segments(source_id: str) -> tuple[str, ...]:
    shown = ascii(source_id if len(source_id) <= 80 else source_id[:80] + "…")
    encoded = source_id.encode("utf-8", "surrogatepass")
    if len(encoded) > MAX_SOURCE_ID_BYTES:
        raise InvalidSourceId(f"source_id {shown} is longer than {MAX_SOURCE_ID_BYTES} bytes.")
    segments = tuple(source_id.split("/"))
    for segment in segments:
        if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:
            raise InvalidSourceId(f"source_id {shown} has a segment longer than {MAX_SEGMENT_BYTES} bytes.")
        if not _SEGMENT.fullmatch(segment) or segment in {".", ".."}:
            raise InvalidSourceId(f"source_id {shown} is not a plain relative source handle.")
    return segments


def is_hidden_or_compiled(name: str) -> bool:
    return name.startswith(".") or name == "__pycache__" or name.endswith((".pyc", ".pyo"))


def _open_dir_at(parent_fd: int, name: str, *, create: bool = False) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            raise
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            _refuse_if_link(parent_fd, name)
        raise


def _refuse_if_link(parent_fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(f"{name} is a symbolic link")


def open_root(root: Path) -> int:
    """A descriptor of the units root itself, to walk from (`root_fd`); the caller closes it."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))


@contextmanager
def open_parent(root: Path, parts: Sequence[str], *, create: bool = False, root_fd: int | None = None) -> Iterator[int]:
    """Yield a descriptor of the directory holding parts[-1], walked from root without following links (from
    `root_fd`, the root opened by `open_root`, when given: it stays open)."""
    fd = open_root(root) if root_fd is None else root_fd
    try:
        for name in parts[:-1]:
            next_fd = _open_dir_at(fd, name, create=create)
            if fd != root_fd:
                os.close(fd)
            fd = next_fd
        yield fd
    finally:
        if fd != root_fd:
            os.close(fd)


def _open_regular(parent_fd: int, name: str) -> tuple[int, os.stat_result]:
    """A descriptor of the regular file `name` in `parent_fd` (never through a link), with its status."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(name, flags, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise UnsafePath(f"{name} is a symbolic link") from exc
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", name)
        raise UnsafePath(f"{name} is not a regular file")
    return fd, st


def read_bytes(root: Path, parts: Sequence[str], *, max_bytes: int | None = None, root_fd: int | None = None) -> bytes:
    """A regular file's bytes (`root_fd`: the root opened by `open_root`, walked from instead of opening it)."""
    if root_fd is not None and len(parts) == 1:  # a file unit at a start: no directory to open
        return _read_regular(root_fd, parts[0], max_bytes)
    with open_parent(root, parts, root_fd=root_fd) as dir_fd:
        return _read_regular(dir_fd, parts[-1], max_bytes)


def _read_regular(dir_fd: int, name: str, max_bytes: int | None) -> bytes:
    return _read_opened(*_open_regular(dir_fd, name), max_bytes)


def _read_opened(fd: int, st: os.stat_result, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file open as `fd` (whose status is `st`), which is closed."""
    try:
        size = st.st_size
        if max_bytes is not None and size > max_bytes:
            raise OverflowError(size, f"larger than {max_bytes} bytes")
        asked = max(size + 1, 65536)
        chunk = os.read(fd, asked)
        if len(chunk) < asked:  # a short read of a regular file is its end: no second read to find it
            return chunk
        chunks = [chunk]
        while chunk := os.read(fd, asked):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def exists(root: Path, parts: Sequence[str]) -> bool:
    try:
        with open_parent(root, parts) as dir_fd:
            os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            return True
    except FileNotFoundError:
        return False
    except NotADirectoryError:
        return False


def _write_temp(
    dir_fd: int, name: str, data: bytes, mode: int, durable: bool = True, alongside: Callable[[], None] | None = None
) -> str:
    """A hidden temporary file holding `data`, synced unless not `durable`; `alongside` runs on another thread while
    the file syncs (`beside`), and the file is removed if it raises."""
    tmp = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:  # the descriptor itself, not a buffered file object: one write call, no probing of the file
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            finished = None if alongside is None else beside(alongside)
            try:
                if durable:
                    os.fsync(fd)
            finally:
                if finished is not None:
                    finished()
        finally:
            os.close(fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    return tmp


def replace_bytes(
    root: Path,
    parts: Sequence[str],
    data: bytes,
    *,
    alongside: Callable[[], None] | None = None,
    check_previous: Callable[[bytes], None] | None = None,
) -> bytes:
    """Atomically replace an existing regular file, keeping its mode; returns the bytes it held. `check_previous`
    gets those bytes first (read in the same walk) and refuses the write by raising; `alongside` (a check of the new
    bytes) runs while they are synced, before they replace the file: if either raises, the file is left as it was."""
    with open_parent(root, parts) as dir_fd:
        fd, st = _open_regular(dir_fd, parts[-1])
        previous = _read_opened(fd, st)
        if check_previous is not None:
            check_previous(previous)
        mode = stat.S_IMODE(st.st_mode)
        tmp = _write_temp(dir_fd, parts[-1], data, mode, alongside=alongside)
        try:
            os.replace(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
    return previous


class _Beside:
    """One daemon thread for work that overlaps an fsync: the syncing thread waits in the kernel without the GIL,
    so CPU work (a compile) runs meanwhile instead of before it. Work the thread has not begun when its caller
    comes for it (a busy machine did not schedule the thread) runs in the caller: never later than without it.
    Started on first use; a child process starts its own (`_reset` after a fork)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _loop(self) -> None:
        while True:
            self._jobs.get()()

    def __call__(self, work: Callable[[], None]) -> Callable[[], None]:
        claim = threading.Lock()  # whoever takes it runs `work`: the thread, or the caller that found it not begun
        done = threading.Event()
        failed: list[BaseException] = []
        context = contextvars.copy_context()

        def job() -> None:
            if not claim.acquire(blocking=False):
                return
            try:
                context.run(work)
            except BaseException as exc:
                failed.append(exc)
            finally:
                done.set()

        def finished() -> None:
            if claim.acquire(blocking=False):
                work()
                return
            done.wait()
            if failed:
                raise failed[0]

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="unit-mcp-beside", daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return finished


beside = _Beside()
"""`beside(work)` starts `work` on the shared thread and returns what waits for it (raising what it raised)."""
os.register_at_fork(after_in_child=beside._reset)


def write_file(folder: Path, name: str, data: bytes, *, mode: int = 0o600, durable: bool = True) -> None:
    """Atomically write `folder/name` (new or replaced) with `mode`: a reader sees the old file or the new one.
    The one atomic writer of the package; `durable=False` skips the fsync (a crash may then leave the old file)."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        tmp = _write_temp(fd, name, data, mode, durable)
        try:
            os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        os.close(fd)


def create_bytes(root: Path, parts: Sequence[str], data: bytes, *, mode: int = 0o644) -> list[str]:
    """Atomically create a file that must not exist yet; return the parent folders it had to create."""
    created: list[str] = []
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        for index, name in enumerate(parts[:-1]):
            try:
                next_fd = _open_dir_at(fd, name)
            except FileNotFoundError:
                next_fd = _open_dir_at(fd, name, create=True)
                created.append("/".join(parts[: index + 1]))
            os.close(fd)
            fd = next_fd
        tmp = _write_temp(fd, parts[-1], data, mode)
        try:
            os.link(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd, follow_symlinks=False)
        finally:
            os.unlink(tmp, dir_fd=fd)
    finally:
        os.close(fd)
    return created


def remove_file(root: Path, parts: Sequence[str]) -> None:
    with open_parent(root, parts) as dir_fd:
        os.unlink(parts[-1], dir_fd=dir_fd)


def remove_empty_dirs(root: Path, rel_dirs: Sequence[str]) -> None:
    """Remove folders created for a file that was rolled back, deepest first, if they are empty."""
    for rel in sorted(rel_dirs, key=len, reverse=True):
        parts = rel.split("/")
        try:
            with open_parent(root, parts) as dir_fd:
                os.rmdir(parts[-1], dir_fd=dir_fd)
        except OSError:
            continue


def private_dir(path: Path, *names: str) -> Path:
    """`path/names…`, each level created 0700 when missing, refused unless it is a real folder of ours that
    no group or other user can write (what ssh asks of ~/.ssh) under folders no one else can rename it in
    (`_trust_parents`); the returned path is resolved."""
    folder = Path(os.path.abspath(path))
    for level in [folder, *(folder.joinpath(*names[: index + 1]) for index in range(len(names)))]:
        _trust(level)
    _trust_parents(folder)
    return folder.joinpath(*names).resolve()


def _trust_parents(folder: Path) -> None:
    """Refuse `folder` unless every folder above it, up to `/`, is ours or root's and not writable by group or
    others unless sticky (what ssh asks of the folders above `~/.ssh`): whoever can rename `folder` can put a folder
    of their own in its place after this check."""
    for parent in Path(os.path.realpath(folder)).parents:
        st = os.stat(parent)
        if st.st_uid not in (0, os.geteuid()):
            raise UntrustedFolder(
                f"{parent}, a folder above {folder}, belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}) or "
                "root, who could put a folder of their own in its place; give a data dir whose every parent folder "
                "is yours or root's"
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            fix = f"run `chmod go-w {parent}` or give" if _may_tighten(parent, st) else "give"
            raise UntrustedFolder(
                f"{parent}, a folder above {folder}, is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}) and not sticky, who could put a folder of their own in its place; "
                f"{fix} a data dir whose every parent folder is yours or root's"
            )


PRIVATE_FOLDER_HINT = "give a private folder of your own instead (`mktemp -d` makes one; or ~/.local/share/unit-mcp)"
"""What to pass instead of a folder that is shared or not a folder: never a change to the shared one."""


def _may_tighten(folder: Path, st: os.stat_result) -> bool:
    """Whether `chmod go-w folder` is a safe hint: a folder of ours that is not shared by design (sticky, writable
    by everyone, or the system's temporary folder), whose other users a chmod would lock out."""
    import tempfile  # only for this hint: a unit's test process imports paths and starts without it

    shared = {os.path.realpath(p) for p in (tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm")}
    return (
        st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_ISVTX | stat.S_IWOTH)
        and os.path.realpath(folder) not in shared
    )


def _trust(folder: Path) -> None:
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        _trust(folder.parent)
        os.mkdir(folder, 0o700)
    st = os.lstat(folder)
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedFolder(f"{folder} is a symbolic link; give the real folder (it may point anywhere)")
    if not stat.S_ISDIR(st.st_mode):
        what = "is a file, not a folder" if stat.S_ISREG(st.st_mode) else "is not a folder"
        raise UntrustedFolder(
            f"{folder} {what}; give a folder instead (a path that does not exist yet is created as "
            f"a private folder, e.g. {folder}.d)"
        )
    if st.st_uid != os.geteuid():
        raise UntrustedFolder(
            f"{folder} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()}), who could have planted "
            f"files in it; {PRIVATE_FOLDER_HINT}"
        )
    if st.st_mode & 0o022:
        fix = f"run `chmod go-w {folder}` or give a private folder" if _may_tighten(folder, st) else PRIVATE_FOLDER_HINT
        raise UntrustedFolder(f"{folder} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); {fix}")


def open_private(path: Path, flags: int) -> int:
    """Open (or create, 0600) a file of a private folder without following a symbolic link planted there."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path.name} is a symbolic link") from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path.name} is not a regular file")
    return fd


def read_secret(path: Path, option: str) -> str:
    """The first line of a secret file that is ours and readable by no one else (like ssh's private keys)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UnsafeSecret(f"cannot read {option} {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "rb") as handle:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeSecret(f"{option} {path} is not a regular file")
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UnsafeSecret(
                f"{option} {path} can be read or changed by other users (uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):04o}); make it yours with `chmod 600 {path}`"
            )
        first = handle.read(64 * 1024).decode("utf-8", "replace").splitlines()
    secret = first[0].strip() if first else ""
    if not secret:
        raise UnsafeSecret(f"{option} {path} is empty; put the secret on its first line")
    return secret
