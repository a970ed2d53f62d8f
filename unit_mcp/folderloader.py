"""The folder loader: units in a units root, `<root>/<id>/__init__.py` (directory units) or `<root>/<id>.py`.

Every file-specific safety rule lives here and in `paths`: descriptor walks that never follow a link, atomic
writes that keep the file's mode, no symlinked units. When the root lies inside a git work tree, every accepted
write is recorded (`githistory.py`: on a ref of its own by default), which gives the loader the `history`
capability.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from . import paths
from .loader import (
    Capabilities,
    Loader,
    MissingSource,
    NotASource,
    PathConflict,
    Source,
    SourceExists,
    SourceInfo,
    SourceTooLarge,
    StaleSource,
    UnitKind,
    UnknownVersion,
    UnsafeSource,
    Version,
    Watch,
    WatchTarget,
    Written,
    artifact_kind,
    primary_source_id,
)

if TYPE_CHECKING:
    from .githistory import GitHistory, GitMode


RECENT_NS = 2_000_000_000
"""A file changed less than this long before its stamp is taken gets none (`source_stamps`): file times advance in
clock ticks (and some file systems keep whole seconds), so two edits within one tick can leave the same mtime."""


class FilesystemLoader(Loader):
    """Units as files in one folder. The hash check and the write happen under one lock of this loader."""

    name = "filesystem"

    def __init__(self, root: str | os.PathLike[str], *, read_only: bool = False, git_history: GitMode = "ref") -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"units root {self.root} is not a directory")
        self.address = self.location = str(self.root)
        self._prefix = os.path.join(self.location, "")  # the root with one trailing separator, for `origin`
        self._git: GitHistory | None = None
        if not read_only:
            from .githistory import GitHistory

            self._git = GitHistory.find(self.root, git_history)
        self.capabilities = Capabilities(write=not read_only, create=not read_only, history=self._git is not None)
        self._write_lock = threading.Lock()
        self._own_writes: dict[str, str | None] = {}
        self._held = _HeldRoot()

    # -- discovery ------------------------------------------------------------------------

    def discover(self) -> dict[str, UnitKind]:
        """Unit ids on disk. Symlinks are ignored; a package directory wins over a same-named module."""
        found: dict[str, UnitKind] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:  # `follow_symlinks=False`: a link is neither a file nor a folder here
                name = entry.name
                if name.endswith(".py"):  # a hidden file's stem is no unit id
                    stem = name[:-3]
                    if entry.is_file(follow_symlinks=False) and paths.is_unit_id(stem):
                        found.setdefault(stem, "file")
                elif entry.is_dir(follow_symlinks=False) and not paths.is_hidden_or_compiled(name):
                    init = os.path.join(entry.path, "__init__.py")
                    if paths.is_unit_id(name) and os.path.isfile(init) and not os.path.islink(init):
                        found[name] = "directory"  # a package wins over a same-named module
        return {unit_id: found[unit_id] for unit_id in sorted(found)}

    def kind(self, unit_id: str) -> UnitKind | None:
        """The kind of one unit, by looking at its two possible places only (no scan of the root)."""
        if not paths.is_unit_id(unit_id):
            return None
        # os.lstat on strings, not pathlib: this runs on every call that names a unit.
        folder = os.path.join(self.root, unit_id)
        if _lstat_is(folder, stat.S_ISDIR) and _lstat_is(os.path.join(folder, "__init__.py"), stat.S_ISREG):
            return "directory"
        if _lstat_is(folder + ".py", stat.S_ISREG):
            return "file"
        return None

    def unit_folder(self, unit_id: str) -> Path | None:
        """The real folder of a directory unit (for local access), or None: a file unit has no folder of its own."""
        if self.kind(unit_id) != "directory":
            return None
        return self.root / unit_id

    def _parts(self, source: Source) -> list[str]:
        """Path parts below the units root for a source; one that would leave its unit is refused (the ids were
        checked by whoever made the handle: this keeps the disk safe, whatever reaches it)."""
        parts = (f"{source.unit_id}/{source.source_id}" if source.kind == "directory" else source.source_id).split("/")
        if "" in parts or "." in parts or ".." in parts:
            raise UnsafeSource()
        return parts

    def _path(self, source: Source) -> Path:
        return self.root.joinpath(*self._parts(source))

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        if kind == "file":
            return [f"{unit_id}.py"]
        out: list[str] = []
        stack = [("", self.root / unit_id)]
        while stack:
            prefix, folder = stack.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for entry in entries:
                if paths.is_hidden_or_compiled(entry.name) or entry.is_symlink():
                    continue
                rel = f"{prefix}{entry.name}"
                try:
                    paths.validate_source_id(rel)
                except Exception:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    stack.append((rel + "/", Path(entry.path)))
                elif entry.is_file(follow_symlinks=False):
                    out.append(rel)
        return sorted(out)

    def sources(self, unit_id: str, kind: UnitKind) -> list[SourceInfo]:
        primary = primary_source_id(unit_id, kind)
        result = []
        for source_id in self.source_ids(unit_id, kind):
            try:
                data = self.read(Source(unit_id, kind, source_id))
            except (MissingSource, NotASource, PathConflict, UnsafeSource, OSError):
                continue
            result.append(
                SourceInfo(
                    source_id, len(data), paths.hash_bytes(data), source_id == primary, artifact_kind(source_id, data)
                )
            )
        return result

    def source_stamps(self, units: Mapping[str, UnitKind]) -> dict[str, dict[str, Hashable | None]]:
        """Each source's (device, inode, size, mtime, ctime), from `lstat` alone. Any write changes the ctime (which
        no one can set back), a replace the inode; a file whose mtime or ctime is within RECENT_NS of now gets no
        stamp, so an edit in the same clock tick as the stamp (same size, same mtime) is still read next time."""
        recent = time.time_ns() - RECENT_NS  # taken first: whatever changes during the walk is recent
        out: dict[str, dict[str, Hashable | None]] = {}
        for unit_id, kind in units.items():
            stamps: dict[str, Hashable | None] = {}
            folder = self.location if kind == "file" else os.path.join(self.location, unit_id)
            for source_id in self.source_ids(unit_id, kind):
                try:  # strings, not pathlib: this runs for every source of every unit at each turn's checkpoint
                    st = os.lstat(os.path.join(folder, source_id))
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                fresh = st.st_mtime_ns >= recent or st.st_ctime_ns >= recent
                stamps[source_id] = (
                    None if fresh else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                )
            out[unit_id] = stamps
        return out

    @contextlib.contextmanager
    def reading_all(self) -> Iterator[None]:
        """This thread's reads walk from one descriptor of the root, opened here, instead of opening the root each
        (a start of 10,000 units: 10,000 opens and closes fewer). The descriptor is this thread's alone, so it is
        never closed under another thread's walk; what each read opens below it is still opened without following
        a link."""
        try:
            fd = paths.open_root(self.root)
        except OSError:  # each read opens the root itself, and says what is wrong
            fd = None
        outer, self._held.root_fd = self._held.root_fd, fd
        try:
            yield
        finally:
            self._held.root_fd = outer
            if fd is not None:
                os.close(fd)

    def read(self, source: Source, *, max_bytes: int | None = None) -> bytes:
        parts = self._parts(source)
        try:  # not `with _refusals()`: this runs for every module import, and a context manager costs a tenth
            return paths.read_bytes(self.root, parts, max_bytes=max_bytes, root_fd=self._held.root_fd)
        except OverflowError as exc:
            raise SourceTooLarge(exc.args[0]) from None
        except (OSError, paths.UnsafePath) as exc:
            refusal = _refusal(exc)
            if refusal is exc:
                raise
            raise refusal from None

    def origin(self, source: Source) -> str:
        return self._prefix + "/".join(self._parts(source))  # str(self._path(...)), faster (one per module import)

    def write(self, source: Source, data: bytes, *, expected_hash: str, tool_call: str) -> Written:
        return self._write(source, data, expected_hash, tool_call, None)

    def write_checked(
        self, source: Source, data: bytes, *, expected_hash: str, tool_call: str, check: Callable[[], None]
    ) -> Written:
        """`check` runs on another thread while the new file syncs (`paths.beside`): a write costs the longer of
        the two, not their sum. The file is replaced only once both are done and the check passed."""
        return self._write(source, data, expected_hash, tool_call, check)

    def _write(
        self, source: Source, data: bytes, expected_hash: str, tool_call: str, check: Callable[[], None] | None
    ) -> Written:
        parts = self._parts(source)

        def unchanged(previous: bytes) -> None:
            """The file still holds what the caller expects (read in the write's own walk)."""
            if paths.hash_bytes(previous) != expected_hash:
                raise StaleSource(paths.hash_bytes(previous))
            if check is None:
                self._note(parts, data)

        def checked() -> None:
            assert check is not None
            check()
            self._note(parts, data)  # only once checked: a refused write is no write of ours

        with self._write_lock, _refusals():
            previous = paths.replace_bytes(
                self.root, parts, data, alongside=None if check is None else checked, check_previous=unchanged
            )
        return Written(source, data, previous, tool_call)

    def create(self, source: Source, data: bytes, *, tool_call: str) -> Written:
        parts = self._parts(source)
        with self._write_lock, _refusals():
            self._note(parts, data)
            created_dirs = paths.create_bytes(self.root, parts, data)
        return Written(source, data, None, tool_call, token=created_dirs)

    def rollback(self, written: Written) -> None:
        parts = self._parts(written.source)
        with self._write_lock, _refusals():
            try:
                current: str | None = paths.hash_bytes(paths.read_bytes(self.root, parts))
            except FileNotFoundError:
                current = None
            if current != paths.hash_bytes(written.data):
                raise StaleSource(current)  # someone else's edit since the write: theirs stays
            self._note(parts, written.previous)
            if written.previous is None:
                paths.remove_file(self.root, parts)
                paths.remove_empty_dirs(self.root, cast("list[str]", written.token))
            else:
                paths.replace_bytes(self.root, parts, written.previous)

    def accept(self, written: Written) -> None:
        if self._git is not None:
            self._git.commit(self._path(written.source), written.tool_call, written.data)

    def _note(self, parts: list[str], data: bytes | None) -> None:
        """Remember a write of ours so that the watcher does not reload it a second time."""
        self._own_writes[str(self.root.joinpath(*parts))] = None if data is None else paths.hash_bytes(data)

    def is_own_write(self, path: Path, digest: str | None) -> bool:
        key = str(path)
        return key in self._own_writes and self._own_writes[key] == digest

    # -- history (in a git work tree) ---------------------------------------------------------

    def history(self, source: Source, limit: int) -> list[Version]:
        if self._git is None:
            return []
        return self._git.history(self._path(source), limit)

    def version_data(self, source: Source, version: int) -> bytes:
        if self._git is None:
            raise UnknownVersion(version)
        return self._git.version_data(self._path(source), version)

    # -- watching and copying ---------------------------------------------------------------

    def watch(self, target: WatchTarget, *, debounce_ms: int) -> Watch:
        from .watcher import UnitWatcher

        watcher = UnitWatcher(self.root, self.is_own_write, target.reload_changed, debounce_ms=debounce_ms)
        watcher.start()
        return watcher

    def put_unit(self, unit_id: str, kind: UnitKind, files: dict[str, bytes], *, replace: bool) -> None:
        """Write the unit into a hidden folder next to it, then swap it in with renames."""
        import shutil
        import tempfile

        existing = self.kind(unit_id)
        if existing is not None and not replace:
            raise SourceExists(unit_id)
        staging = Path(tempfile.mkdtemp(prefix=f".{unit_id}.", dir=self.root))
        try:
            for source_id, data in files.items():
                paths.create_bytes(staging, list(paths.validate_source_id(source_id)), data)
            old = Path(tempfile.mkdtemp(prefix=f".{unit_id}.old.", dir=self.root))
            for name in (unit_id, f"{unit_id}.py"):
                if os.path.lexists(self.root / name):
                    os.replace(self.root / name, old / name)
            if kind == "directory":
                os.replace(staging, self.root / unit_id)
            else:
                os.replace(staging / f"{unit_id}.py", self.root / f"{unit_id}.py")
            shutil.rmtree(old)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def close(self) -> None:
        pass


class _HeldRoot(threading.local):
    """The units root a thread holds open while it reads every unit (`FilesystemLoader.reading_all`)."""

    root_fd: int | None = None


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """What the filesystem raises, as the loader-neutral refusals the service maps (no path in them)."""
    try:
        yield
    except (OSError, paths.UnsafePath) as exc:
        raise _refusal(exc) from None


def _refusal(exc: Exception) -> Exception:
    """The loader-neutral refusal for what the filesystem raised (the exception itself if none fits)."""
    if isinstance(exc, FileExistsError):
        return SourceExists()
    if isinstance(exc, paths.UnsafePath):
        return UnsafeSource()
    if isinstance(exc, NotADirectoryError):
        return PathConflict()
    if isinstance(exc, FileNotFoundError):
        return MissingSource()
    if isinstance(exc, IsADirectoryError):
        return NotASource()
    if isinstance(exc, OSError) and exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR):
        return UnsafeSource()
    return exc


def _lstat_is(path: str, kind: Callable[[int], bool]) -> bool:
    """Whether path is of that kind itself (a symbolic link is of none)."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False
