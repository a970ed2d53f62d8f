"""The filesystem loader: finds units in a units root and reads and writes their sources by handle."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from . import paths

if TYPE_CHECKING:
    from .models import SourceArtifact

UnitKind = Literal["directory", "file"]


@dataclass(frozen=True)
class Capabilities:
    read: bool = True
    write: bool = True
    create: bool = True
    commit: bool = False


class FilesystemLoader:
    """Units as `<root>/<id>/__init__.py` (directory units) or `<root>/<id>.py` (file units)."""

    name = "filesystem"

    def __init__(self, root: Path, *, read_only: bool = False) -> None:
        self.root = root
        self.capabilities = Capabilities(write=not read_only, create=not read_only)

    def discover(self) -> dict[str, UnitKind]:
        """Unit ids on disk. Symlinks are ignored; a package directory wins over a same-named module."""
        found: dict[str, UnitKind] = {}
        with os.scandir(self.root) as entries:
            for entry in entries:
                if entry.is_symlink() or paths.is_hidden_or_compiled(entry.name):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    init = os.path.join(entry.path, "__init__.py")
                    if _is_unit_id(entry.name) and os.path.isfile(init) and not os.path.islink(init):
                        found[entry.name] = "directory"
                elif entry.is_file(follow_symlinks=False) and entry.name.endswith(".py"):
                    stem = entry.name[:-3]
                    if _is_unit_id(stem) and found.get(stem) != "directory":
                        found.setdefault(stem, "file")
        return dict(sorted(found.items()))

    def kind(self, unit_id: str) -> UnitKind | None:
        """The kind of one unit, by looking at its two possible places only (no scan of the root)."""
        if not _is_unit_id(unit_id):
            return None
        # os.lstat on strings, not pathlib: this runs on every call that names a unit.
        folder = os.path.join(self.root, unit_id)
        if _lstat_is(folder, stat.S_ISDIR) and _lstat_is(os.path.join(folder, "__init__.py"), stat.S_ISREG):
            return "directory"
        if _lstat_is(folder + ".py", stat.S_ISREG):
            return "file"
        return None

    def primary_source_id(self, unit_id: str, kind: UnitKind) -> str:
        return "__init__.py" if kind == "directory" else f"{unit_id}.py"

    def parts(self, unit_id: str, kind: UnitKind, segments: tuple[str, ...]) -> list[str]:
        """Path parts below the units root for a validated source id."""
        if kind == "directory":
            return [unit_id, *segments]
        return list(segments)

    def source_ids(self, unit_id: str, kind: UnitKind) -> list[str]:
        if kind == "file":
            return [f"{unit_id}.py"]
        base = self.root / unit_id
        out: list[str] = []
        stack = [("", base)]
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

    def artifacts(self, unit_id: str, kind: UnitKind) -> list[SourceArtifact]:
        from .models import SourceArtifact  # not at module level: the test host process never needs pydantic

        primary = self.primary_source_id(unit_id, kind)
        result = []
        for source_id in self.source_ids(unit_id, kind):
            try:
                data = self.read(unit_id, kind, source_id)
            except (OSError, paths.UnsafePath):
                continue
            result.append(
                SourceArtifact(
                    source_id=source_id,
                    kind=artifact_kind(source_id, data),
                    size=len(data),
                    hash=paths.hash_bytes(data),
                    primary=source_id == primary,
                )
            )
        return result

    def read(self, unit_id: str, kind: UnitKind, source_id: str) -> bytes:
        return paths.read_bytes(self.root, self.parts(unit_id, kind, paths.validate_source_id(source_id)))

    def replace(self, unit_id: str, kind: UnitKind, source_id: str, data: bytes) -> None:
        paths.replace_bytes(self.root, self.parts(unit_id, kind, paths.validate_source_id(source_id)), data)

    def create(self, unit_id: str, source_id: str, data: bytes) -> list[str]:
        return paths.create_bytes(self.root, [unit_id, *paths.validate_source_id(source_id)], data)

    def remove(self, unit_id: str, source_id: str, created_dirs: list[str]) -> None:
        paths.remove_file(self.root, [unit_id, *paths.validate_source_id(source_id)])
        paths.remove_empty_dirs(self.root, created_dirs)


def _lstat_is(path: str, kind: Callable[[int], bool]) -> bool:
    """Whether path is of that kind itself (a symbolic link is of none)."""
    try:
        return kind(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_unit_id(name: str) -> bool:
    try:
        paths.validate_unit_id(name)
    except Exception:
        return False
    return True


def artifact_kind(source_id: str, data: bytes) -> Literal["python", "text", "binary"]:
    if b"\x00" in data[:8192]:
        return "binary"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary"
    return "python" if source_id.endswith(".py") else "text"
