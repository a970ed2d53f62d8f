"""History for a units folder inside a git work tree: every accepted write is one commit of that file only.

Runs the `git` executable. A commit names only the written path (`git commit --only`), so whatever else the user
has changed or staged stays as it was. Versions of a source are numbered from 1 (its oldest commit) upwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

from .loader import UnknownVersion, Version
from .paths import hash_bytes

TRAILER = "Tool-Call"
_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}


class GitError(Exception):
    pass


class GitHistory:
    def __init__(self, top: Path, identity: list[str]) -> None:
        self.top = top
        self._identity = identity
        self._lock = threading.Lock()

    @classmethod
    def find(cls, folder: Path) -> GitHistory | None:
        """The work tree holding `folder`, or None (no git executable, not in a work tree, or ignored there)."""
        if shutil.which("git") is None:
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
        return cls(top, identity)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.top).as_posix()

    def commit(self, path: Path, tool_call: str) -> None:
        rel = self._rel(path)
        message = f"{tool_call}: {rel}\n\n{TRAILER}: {tool_call}\n"
        with self._lock:
            _git(self.top, "add", "--", rel)
            try:
                _git(self.top, *self._identity, "commit", "--no-verify", "--quiet", "--only", "-m", message, "--", rel)
            except GitError as exc:
                if "nothing to commit" not in str(exc) and "no changes added" not in str(exc):
                    raise

    def _count(self, rel: str) -> int:
        try:
            return int(_git(self.top, "rev-list", "--count", "HEAD", "--", rel).strip() or 0)
        except GitError:
            return 0  # no commit yet

    def history(self, path: Path, limit: int) -> list[Version]:
        rel = self._rel(path)
        with self._lock:
            count = self._count(rel)
            if count == 0:
                return []
            fmt = f"%H%x1f%cI%x1f%(trailers:key={TRAILER},valueonly,separator=%x2c)%x1e"
            log = _git(self.top, "log", f"-n{limit}", f"--format={fmt}", "HEAD", "--", rel).decode()
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
            sha = _git(self.top, "log", f"--skip={count - version}", "-n1", "--format=%H", "HEAD", "--", rel).strip()
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
