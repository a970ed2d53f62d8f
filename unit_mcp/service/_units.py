"""The shared handle every tool of the service works through: the host, the loader, the limits, and the one check
of a unit's and a source's ids, the reads, the text rules and the loader's refusals as `UnitError`s."""

from __future__ import annotations

import contextlib
import re
import threading
import weakref
from collections.abc import Hashable, Iterator
from typing import Any, TypeVar

from .. import paths
from ..changelog import ChangeLog
from ..errors import (
    BinarySource,
    Exists,
    InvalidArgument,
    InvalidSourceId,
    NotSupported,
    SourceSyntaxError,
    StaleHash,
    TooLarge,
    UnknownSource,
    UnknownUnit,
)
from ..host import Host
from ..loader import (
    MissingSource,
    NotASource,
    PathConflict,
    Source,
    SourceExists,
    SourceTooLarge,
    UnitKind,
    UnsafeSource,
)
from ..localaccess import LocalAccess
from ..paging import PAGE_OVERHEAD, RESULT_BYTES
from ..resolve import ResolveIndex
from ..syntax import SyntaxCache
from ..testrun import TestRuns

R = TypeVar("R")


class Units:
    """What every tool shares: the host and its loader, the server's limits, the test runs, the resolve index."""

    def __init__(
        self,
        host: Host,
        *,
        test_timeout: float = 60.0,
        max_test_timeout: float = 600.0,
        max_source_bytes: int = 2 * 1024 * 1024,
        max_read_bytes: int = 16 * 1024 * 1024,
        max_test_output: int = RESULT_BYTES // 2 - PAGE_OVERHEAD - 1000,  # fits one result with its marker
        max_call_s: float = 240.0,
        run_retention_s: float = 600.0,
        max_running_tests: int = 8,
        local_access: LocalAccess | None = None,
    ) -> None:
        self.host = host
        self.loader = host.loader
        self.test_timeout = test_timeout
        self.max_test_timeout = max_test_timeout
        self.max_source_bytes = max_source_bytes
        self.max_read_bytes = max(max_read_bytes, max_source_bytes)
        """unit_read_source pages through sources up to this size; edits stop at max_source_bytes."""
        self.max_test_output = max_test_output
        self.max_call_s = max_call_s
        """A call waiting for tests answers 'running' with the run_id after this long (clients time out calls)."""
        self.runs = TestRuns(retention=run_retention_s)
        self.max_running_tests = max_running_tests
        """Runs at once: wait=false no longer ties a run to a worker thread, so this bounds the test processes."""
        self.index: ResolveIndex | None = None
        self.stale_units: set[str] = set()
        self.index_lock = threading.Lock()
        self.syntax = SyntaxCache()
        self.local_access = local_access
        """Given by `--allow-local-access`: unit_request_local_access is offered (docs/local-access.md)."""
        self.stamps: dict[str, dict[str, tuple[Hashable, str]]] = {}
        """unit id -> source id -> (its stamp, its hash) when a checkpoint last hashed it (`_checkpoints`)."""
        changed = weakref.WeakMethod(self._unit_changed)
        host.unit_listeners.append(lambda unit_id: (method := changed()) is not None and method(unit_id))

    def _unit_changed(self, unit_id: str) -> None:
        """The host reloaded or unloaded a unit: its facts are read again before the next resolve."""
        with self.index_lock:
            self.stale_units.add(unit_id)

    @property
    def change_log(self) -> ChangeLog:
        return self.host.changes

    # -- ids ----------------------------------------------------------------------------------

    def unit(self, unit_id: Any) -> UnitKind:
        unit_id = paths.validate_unit_id(unit_id)
        kind = self.loader.kind(unit_id)
        if kind is None:
            raise UnknownUnit(f"There is no unit {unit_id!r}.")
        return kind

    def source(self, unit_id: str, source_id: str) -> Source:
        """The one check of a unit's source id, before anything reads or writes it."""
        kind = self.unit(unit_id)
        paths.validate_source_id(source_id)
        if kind == "file" and source_id != f"{unit_id}.py":
            raise UnknownSource(
                f"Unit {unit_id!r} is a file unit; its only source is {unit_id}.py, not {source_id!r}.",
                hint=f"Use source_id {unit_id}.py.",
            )
        return Source(unit_id, kind, source_id)

    def test_names(self, unit_id: str, kind: UnitKind) -> list[str]:
        if kind != "directory":
            return []
        found = (re.fullmatch(r"test_([A-Za-z0-9_]+)\.py", s) for s in self.loader.source_ids(unit_id, kind))
        return [match.group(1) for match in found if match]

    def edit_capabilities(self, kind: UnitKind) -> list[str]:
        caps = self.loader.capabilities
        out = ["read"] if caps.read else []
        if caps.write:
            out.append("patch")
        if caps.create and kind == "directory":
            out.append("create")
        return out

    # -- reading ------------------------------------------------------------------------------

    def read(self, src: Source, limit: int | None = None) -> bytes:
        """The bytes of a source a tool reads or edits, refused without reading it when over `limit` (by default
        `max_source_bytes`, the edit limit)."""
        limit = self.max_source_bytes if limit is None else limit
        try:
            with self.storage(src, "read"):
                return self.loader.read(src, max_bytes=limit)
        except SourceTooLarge as exc:
            size = "more than that" if exc.size is None else f"{exc.size} bytes"
            raise TooLarge(
                f"{src.source_id!r} of unit {src.unit_id!r} is {size}; these tools read sources of up to "
                f"{self.max_read_bytes} bytes and edit sources of up to {self.max_source_bytes} bytes.",
                hint="Split it into smaller sources to read or edit it here; unit_inspect shows every source's size.",
                size=exc.size,
                limit=limit,
            ) from None

    def read_or_none(self, src: Source) -> bytes | None:
        """The source's bytes, or None when it does not exist."""
        try:
            return self.read(src)
        except UnknownSource:
            return None

    def editable(
        self, unit_id: str, source_id: str, expected_hash: str | None, *, write: bool
    ) -> tuple[Source, bytes, str, str]:
        """The source an edit changes, with its bytes, text and hash, refused if it no longer hashes to
        `expected_hash` (or, for a `write`, if the store cannot be written)."""
        src = self.source(unit_id, source_id)
        if write:
            self.require("write", unit_id)
        return (src, *self.current(src, expected_hash))

    def exists(self, src: Source) -> bool:
        """Whether the source exists (not read)."""
        try:
            with self.storage(src, "read"):
                self.loader.read(src, max_bytes=0)
        except SourceTooLarge:
            return True
        except UnknownSource:
            return False
        return True

    def current(self, src: Source, expected_hash: str | None, limit: int | None = None) -> tuple[bytes, str, str]:
        """The source's bytes, text and hash (read and hashed once for the whole edit), refused if it no longer
        hashes to `expected_hash` (or is over `limit`, as `read` refuses it)."""
        data = self.read(src, limit)
        text = self.text(src, data)
        current = paths.hash_bytes(data)
        if expected_hash is not None and expected_hash != current:
            raise StaleHash(
                f"{src.source_id} of unit {src.unit_id} changed since it was read: expected {expected_hash}, "
                f"found {current}.",
                expected_hash=expected_hash,
                current_hash=current,
            )
        return data, text, current

    @staticmethod
    def text(src: Source, data: bytes) -> str:
        unit_id, source_id = src.unit_id, src.source_id
        if b"\x00" in data:
            raise BinarySource(f"{source_id!r} in unit {unit_id!r} is binary.")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise BinarySource(f"{source_id!r} in unit {unit_id!r} is not UTF-8 text.") from None

    @staticmethod
    def encode(src: Source, text: str) -> bytes:
        """UTF-8 bytes of a source about to be written; refuse what read_source could not give back."""
        unit_id, source_id = src.unit_id, src.source_id
        if "\x00" in text:
            raise BinarySource(
                f"The edit would put a NUL character into {source_id!r} of unit {unit_id!r}; nothing was written.",
                hint="Sources are UTF-8 text: remove the NUL (\\x00) characters.",
            )
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidArgument(
                f"The new text of {source_id!r} is not valid Unicode ({exc.reason} at index {exc.start}).",
                hint="Send UTF-8 text without lone surrogate code points.",
            ) from None

    def compile(self, src: Source, data: bytes) -> None:
        """Refuse Python that does not compile; hand the code to the host so the reload does not compile it again."""
        source_id = src.source_id
        if not source_id.endswith(".py"):
            return
        origin = self.loader.origin(src)
        try:
            code = compile(data, origin, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise SourceSyntaxError(
                f"{source_id}: {exc.msg} at line {exc.lineno}, column {exc.offset}; nothing was written.",
                file=source_id,
                line=exc.lineno,
                column=exc.offset,
                text=(exc.text or "").rstrip("\n")[:500],
            ) from None
        except ValueError as exc:
            raise SourceSyntaxError(f"{source_id}: {exc}; nothing was written.", file=source_id) from None
        self.host.remember_code(origin, data, code)

    @contextlib.contextmanager
    def storage(self, src: Source, action: str) -> Iterator[None]:
        """The loader's refusals as `UnitError`s naming the unit and the source."""
        unit_id, source_id = src.unit_id, src.source_id
        nothing = "; nothing was written" if action == "write" else ""
        try:
            yield
        except SourceExists:
            raise Exists(f"Unit {unit_id!r} already has {source_id!r}.") from None
        except UnsafeSource:
            raise InvalidSourceId(
                f"{source_id!r} of unit {unit_id!r}, or a folder above it, is a symbolic link or not a regular "
                f"file{nothing}.",
                hint="Only regular files inside the unit can be read or written.",
            ) from None
        except PathConflict:
            raise InvalidSourceId(
                f"A folder on the path of {source_id!r} in unit {unit_id!r} is a file{nothing}.",
                hint="Pick a source id whose folders are folders (unit_inspect lists the sources).",
            ) from None
        except NotASource:
            raise UnknownSource(f"{source_id!r} in unit {unit_id!r} is a folder, not a source file.") from None
        except MissingSource:
            if action == "write":
                raise UnknownSource(
                    f"{source_id!r} of unit {unit_id!r} (or a folder above it) disappeared; nothing was written."
                ) from None
            raise UnknownSource(f"Unit {unit_id!r} has no source {source_id!r}.") from None

    # -- capabilities -------------------------------------------------------------------------

    def require(self, capability: str, unit_id: str) -> None:
        if not getattr(self.loader.capabilities, capability):
            raise NotSupported(
                f"The {self.loader.name} loader of unit {unit_id!r} cannot {capability} sources (read-only store).",
                hint="This server was started read-only; edit the unit another way or restart it writable.",
            )

    def require_history(self, unit_id: str) -> None:
        if not self.loader.capabilities.history:
            raise NotSupported(
                f"The {self.loader.name} loader of unit {unit_id!r} keeps no history of its sources.",
                hint="History needs a SQLite store (--units sqlite:PATH) or a units folder inside a git work tree.",
            )

    def require_writable(self) -> None:
        if not self.loader.capabilities.write:
            raise NotSupported(
                f"The {self.loader.name} loader is read-only: nothing can be put back.",
                hint="This server was started read-only; restart it writable to roll back.",
            )

    def check_size(self, name: str, value: str) -> None:
        if len(value) > self.max_source_bytes:
            raise TooLarge(
                f"`{name}` is {len(value)} characters; the limit is {self.max_source_bytes}.",
                hint="Send a smaller edit (a diff or an exact replacement of the lines that change).",
            )
