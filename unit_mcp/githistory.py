"""History for a units folder inside a git work tree: every accepted write is one commit of that file only.

Mode `ref` (the default) commits with plumbing on `refs/unit-mcp/history`, never touching HEAD, the index or the
work tree; mode `branch` commits only the written path on the user's branch. Versions of a source are numbered
from 1 (its oldest commit).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Literal, get_args

from .loader import UnknownVersion, Version
from .paths import hash_bytes

TRAILER = "Tool-Call"
HISTORY_REF = "refs/unit-mcp/history"
GitMode = Literal["ref", "branch", "off"]
"""Where a units folder's history goes: its own ref (default), the user's branch, or nowhere."""
GIT_MODES: tuple[GitMode, ...] = get_args(GitMode)
_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
_NO_COMMIT = "0" * 40


class GitError(Exception):
    pass


class GitHistory:
    def __init__(self, top: Path, identity: list[str], mode: GitMode = "ref") -> None:
        self.top = top
        self.mode = mode
        self._identity = identity
        self._lock = threading.Lock()

    @classmethod
    def find(cls, folder: Path, mode: GitMode = "ref") -> GitHistory | None:
        """The work tree holding `folder`, or None (mode `off`, no git executable, not in a work tree, or ignored
        there)."""
        if mode == "off" or shutil.which("git") is None:
            return None
        try:
            out = _git(folder, "rev-parse", "--is-inside-work-tree", "--show-toplevel").decode().split("\n")
        except GitError:
            return None
        if out[0] != "true":
            return None
        top = Path(out[1]).resolve()
        try:
            _git(top, "check-ignore", "-q", "--", str(folder))
            return None  # an ignored folder (a data folder, say) is not the user's to commit
        except GitError:
            pass
        try:
            has_identity = bool(_git(top, "config", "user.email").strip())
        except GitError:
            has_identity = False
        identity = [] if has_identity else ["-c", "user.name=unit-mcp", "-c", "user.email=unit-mcp@localhost"]
        return cls(top, identity, mode)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.top).as_posix()

    def commit(self, path: Path, tool_call: str, data: bytes) -> None:
        """Record `data`, the accepted bytes of `path`."""
        rel = self._rel(path)
        message = f"{tool_call}: {rel}\n\n{TRAILER}: {tool_call}\n"
        with self._lock:
            if self.mode == "ref":
                self._commit_on_ref(path, rel, message, data)
                return
            _git(self.top, "add", "--", rel)
            try:
                _git(self.top, *self._identity, "commit", "--no-verify", "--quiet", "--only", "-m", message, "--", rel)
            except GitError as exc:
                if "nothing to commit" not in str(exc) and "no changes added" not in str(exc):
                    raise

    def _commit_on_ref(self, path: Path, rel: str, message: str, data: bytes) -> None:
        """One commit on HISTORY_REF: the tip's tree (or the branch's, at the first write) with `rel` replaced."""
        parent = _rev(self.top, HISTORY_REF) or _rev(self.top, "HEAD")
        blob = _git(self.top, "hash-object", "-w", "--stdin", stdin=data).decode().strip()
        mode = "100755" if os.access(path, os.X_OK) else "100644"
        tree = _put(self.top, f"{parent}^{{tree}}" if parent else None, rel.split("/"), mode, blob)
        if parent is not None and tree == _rev(self.top, f"{parent}^{{tree}}"):
            return  # the same bytes as the last version: nothing to record
        commit_args = ["commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
        commit = _git(self.top, *self._identity, *commit_args).decode().strip()
        old = _rev(self.top, HISTORY_REF) or _NO_COMMIT
        _git(self.top, "update-ref", "-m", message.split("\n")[0], HISTORY_REF, commit, old)

    def _tip(self) -> str:
        """Where versions are read: the history ref once it exists (mode `ref`), else the user's branch."""
        return HISTORY_REF if self.mode == "ref" and _rev(self.top, HISTORY_REF) else "HEAD"

    def _count(self, rel: str) -> int:
        try:
            return int(_git(self.top, "rev-list", "--count", self._tip(), "--", rel).strip() or 0)
        except GitError:
            return 0  # no commit yet

    def history(self, path: Path, limit: int) -> list[Version]:
        rel = self._rel(path)
        with self._lock:
            count = self._count(rel)
            if count == 0:
                return []
            fmt = f"%H%x1f%cI%x1f%(trailers:key={TRAILER},valueonly,separator=%x2c)%x1e"
            log = _git(self.top, "log", f"-n{limit}", f"--format={fmt}", self._tip(), "--", rel).decode()
            commits = [entry.strip("\n").split("\x1f") for entry in log.split("\x1e") if entry.strip()]
            blobs = _cat_blobs(self.top, [f"{sha}:{rel}" for sha, _, _ in commits])
        versions = []
        for index, ((_sha, when, trailer), data) in enumerate(zip(commits, blobs, strict=True)):
            if data is None:
                continue  # the file was deleted in that commit
            versions.append(Version(count - index, hash_bytes(data), len(data), when, trailer.strip() or None))
        return versions

    def version_data(self, path: Path, version: int) -> bytes:
        rel = self._rel(path)
        with self._lock:
            count = self._count(rel)
            if not 1 <= version <= count:
                raise UnknownVersion(version)
            tip = self._tip()
            sha = _git(self.top, "log", f"--skip={count - version}", "-n1", "--format=%H", tip, "--", rel).strip()
            data = _cat_blobs(self.top, [f"{sha.decode()}:{rel}"])[0]
        if data is None:
            raise UnknownVersion(version)
        return data


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> bytes:
    done = subprocess.run(
        ["git", *args], cwd=cwd, input=stdin, capture_output=True, env={**os.environ, **_ENV}, check=False
    )
    if done.returncode != 0:
        raise GitError(f"git {args[0] if args else ''} failed: {(done.stderr or done.stdout).decode(errors='replace')}")
    return done.stdout


def _rev(top: Path, name: str) -> str | None:
    """The object `name` names, or None when it does not exist (no commit yet, no history ref yet)."""
    try:
        return _git(top, "rev-parse", "--verify", "--quiet", name).decode().strip() or None
    except GitError:
        return None


def _put(top: Path, tree: str | None, parts: list[str], mode: str, blob: str) -> str:
    """A new tree: `tree` (None: empty) with the file at `parts` set to `blob`, built level by level with mktree."""
    entries: dict[str, bytes] = {}
    if tree is not None:
        for line in _git(top, "ls-tree", "-z", tree).split(b"\0"):
            if line:
                entries[line.split(b"\t", 1)[1].decode()] = line
    name = parts[0]
    if len(parts) == 1:
        entries[name] = f"{mode} blob {blob}\t{name}".encode()
    else:
        old = entries.get(name, b"")
        sub = old.split()[2].decode() if old.split()[1:2] == [b"tree"] else None
        entries[name] = f"040000 tree {_put(top, sub, parts[1:], mode, blob)}\t{name}".encode()
    return _git(top, "mktree", "-z", stdin=b"".join(entry + b"\0" for entry in entries.values())).decode().strip()


def _cat_blobs(top: Path, names: list[str]) -> list[bytes | None]:
    """The contents of `<commit>:<path>` objects in one `git cat-file --batch` (None where the file is missing)."""
    if not names:
        return []
    out = _git(top, "cat-file", "--batch", stdin="".join(f"{name}\n" for name in names).encode())
    result: list[bytes | None] = []
    at = 0
    for _ in names:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        if header[-1] == b"missing" or len(header) < 3 or header[1] != b"blob":
            result.append(None)
            at = end + 1
            continue
        size = int(header[2])
        result.append(out[end + 1 : end + 1 + size])
        at = end + 1 + size + 1
    return result
