"""Loader-neutral unit operations: one method per tool, pydantic results, `UnitError` refusals.

Each tool is one method, named like the tool without `unit_`, that takes the tool's argument model (`arguments`):
the tool layer passes the model it validated, a Python caller the arguments themselves (`takes` validates them).
Methods are blocking (storage and process work); async callers run them in a worker thread.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import contextvars
import json
import re
import threading
import time
import typing
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

from . import applog, cancel, paths
from .arguments import (
    MAX_LOG_LINES,
    MAX_VERSION,
    ApplyPatchArgs,
    Args,
    CancelTestArgs,
    ChangesArgs,
    CheckpointArgs,
    CreateSourceArgs,
    HistoryArgs,
    ListArgs,
    LocalAccessArgs,
    ReadLogArgs,
    ReadSourceArgs,
    ResolveArgs,
    RestoreSnapshotArgs,
    RevertArgs,
    RevertChangeArgs,
    RollbackArgs,
    RunTestsArgs,
    TestStatusArgs,
    UnitArgs,
    takes,
)
from .changelog import NOBODY, Caller, Change, ChangeLog, Outcome, SourceChange, iso_time
from .errors import (
    BinarySource,
    Cancelled,
    Exists,
    InvalidArgument,
    InvalidSourceId,
    NotSupported,
    ReloadFailed,
    RestoreFailed,
    SnapshotFailed,
    SourceSyntaxError,
    StaleHash,
    TestTimeout,
    TooLarge,
    TooManyRuns,
    UnitError,
    UnitNotLoaded,
    UnknownChange,
    UnknownCheckpoint,
    UnknownRun,
    UnknownSnapshot,
    UnknownSource,
    UnknownUnit,
    UnknownVersion,
)
from .folderloader import FilesystemLoader
from .host import LIFECYCLE, Host, Reloaded, ReloadError, RestoreError
from .loader import (
    LoaderError,
    MissingSource,
    NotASource,
    PathConflict,
    Source,
    SourceExists,
    SourceTooLarge,
    StaleSource,
    UnitKind,
    UnsafeSource,
    Written,
    primary_source_id,
)
from .loader import UnknownVersion as MissingVersion
from .localaccess import LocalAccess
from .models import (
    ActivityEvidence,
    ApplyPatchResult,
    CancelTestResult,
    ChangeClient,
    ChangedSource,
    ChangeRecord,
    ChangesResult,
    CheckpointResult,
    CreateSourceResult,
    HistoryResult,
    HistoryVersion,
    InspectResult,
    Lifecycle,
    LocalAccessResult,
    LocalFolderHandle,
    ReadLogResult,
    ReadSourceResult,
    ReloadResult,
    Replica,
    ResolveResult,
    RestoreConflict,
    RestoredSource,
    RestoreSnapshotResult,
    RevertChangeResult,
    RollbackResult,
    RunTestsResult,
    SnapshotResult,
    SourceArtifact,
    SourceHandle,
    UnitListResult,
    UnitSummary,
)
from .paging import (
    MAX_FIELD_BYTES,
    PAGE_OVERHEAD,
    RESULT_BYTES,
    binding,
    clip,
    decode_cursor,
    encode_cursor,
    fitting,
    json_size,
    size_of,
    text_page,
)
from .patching import apply_unified_diff, line_ending_kind, replace_exact, reverse_unified_diff, unified_diff
from .resolve import ResolveIndex, UnitFacts, python_facts
from .syntax import SyntaxCache
from .testrun import TestRun, TestRuns, run_test_process


def reload_result(reloaded: Reloaded) -> ReloadResult:
    """The engine's account of a reload as the tools return it."""
    return ReloadResult(
        unit_id=reloaded.unit_id,
        reloaded=True,
        restored_state=reloaded.restored_state,
        activity=ActivityEvidence.model_validate(
            {key: clip(v, MAX_FIELD_BYTES) if isinstance(v, str) else v for key, v in reloaded.activity.items()}
        ),
        duration_ms=reloaded.duration_ms,
    )


def _fitting_names(names: list[str]) -> list[str]:
    """Test names within one field's share of a listed unit (unit_inspect lists more)."""
    return [*fitting(names, MAX_FIELD_BYTES, json_size)]


LINE_ENDINGS = typing.get_args(ReadSourceResult.model_fields["line_ending"].annotation)


QUICK_READ_BYTES = RESULT_BYTES
"""unit_read_source answers a folder's source up to this size on the event loop (`read_source_at_once`)."""
CANCEL_GRACE = 5.0
"""Seconds a cancel waits for a run to end (its processes die within a poll, 0.1 s)."""


_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("unit_mcp_caller", default=NOBODY)
_REPLAY: contextvars.ContextVar[bool] = contextvars.ContextVar("unit_mcp_replay", default=False)
R = TypeVar("R")
MAX_LISTED_SOURCES = 20
"""Sources of one record's change set that unit_changes lists (a rollback's may have hundreds)."""
MAX_PAGE_BYTES = 60_000
"""A unit_changes page ends before its JSON passes this (results stay under 80 KB); next_cursor goes on."""
MAX_SHOWN_DIFF = 8000
"""Characters of each source's diff a rollback's or a revert's dry run shows."""
_CURSOR = re.compile(r"before:([1-9][0-9]{0,18})")


def call_as(caller: Caller, call: Callable[[], R], *, replay: bool = False) -> R:
    """Run `call` on behalf of `caller`: the change log records who made the writes it makes. `replay`: the caller
    may be repeating a call whose result is in place (`wire.REPLAY_META_KEY`), which then answers `already_applied`."""
    token, replaying = _CALLER.set(caller), _REPLAY.set(replay)
    try:
        return call()
    finally:
        _REPLAY.reset(replaying)
        _CALLER.reset(token)


def _hash(data: bytes | None) -> str | None:
    return None if data is None else paths.hash_bytes(data)


def _shown_diff(source_id: str, before: bytes | None, after: bytes | None) -> str:
    text = unified_diff(
        (before or b"").decode("utf-8", "replace"), (after or b"").decode("utf-8", "replace"), source_id
    )
    return text if len(text) <= MAX_SHOWN_DIFF else text[:MAX_SHOWN_DIFF] + f"\n... [{len(text) - MAX_SHOWN_DIFF} more]"


@dataclass
class _Record:
    """The change set a write call builds as it goes, recorded once its outcome is known."""

    sources: list[SourceChange] = field(default_factory=list)


@dataclass
class _Target:
    """One source a rollback or a revert puts back: from `current` (None: absent) to `data` (None: remove it)."""

    source: Source
    current: bytes | None
    data: bytes | None

    @property
    def action(self) -> str:
        return "removed" if self.data is None else "recreated" if self.current is None else "restored"

    def shown(self, diff: str | None) -> RestoredSource:
        return RestoredSource(
            unit_id=self.source.unit_id,
            source_id=self.source.source_id,
            action=self.action,  # type: ignore[arg-type]
            hash_before=_hash(self.current),
            hash=_hash(self.data),
            diff=diff,
        )


def _shown_targets(targets: list[_Target], dry_run: bool) -> list[RestoredSource]:
    """The targets as a result lists them; a dry run with each diff while the diffs fit in MAX_PAGE_BYTES."""
    shown, budget = [], MAX_PAGE_BYTES
    for target in targets:
        diff = None
        if dry_run:
            diff = _shown_diff(target.source.source_id, target.current, target.data)
            budget -= len(diff)
            if budget < 0:
                diff = "[diff left out: the result would pass 80 KB; unit_read_source shows the source now]"
        shown.append(target.shown(diff))
    return shown


@dataclass
class _Plan:
    """What the change log says of one source since a checkpoint."""

    known: bool
    data: bytes | None
    hash: str | None
    expected: str | None = None
    outside: bool = False


def change_record(change: Change) -> ChangeRecord:
    """A change log record as `unit_changes` returns it."""
    return ChangeRecord(
        change_id=change.id,
        time=change.time,
        client=ChangeClient(
            name=change.caller.name, version=change.caller.version, session_id=change.caller.session_id
        ),
        tool=change.tool,
        unit_id=change.unit_id,
        source_id=change.source_id,
        outcome=change.outcome,
        error_code=change.error_code,
        message=change.message,
        hash_before=change.hash_before,
        hash_after=change.hash_after,
        duration_ms=change.duration_ms,
        sources=[
            ChangedSource(
                unit_id=s.unit_id,
                source_id=s.source_id,
                action=s.action,
                hash_before=s.hash_before,
                hash_after=s.hash_after,
            )
            for s in change.sources[:MAX_LISTED_SOURCES]
        ],
        sources_total=len(change.sources),
    )


class UnitService:
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
        self._index: ResolveIndex | None = None
        self._stale: set[str] = set()
        self._index_lock = threading.Lock()
        self._syntax = SyntaxCache()
        self.local_access: LocalAccess | None = None
        """Set by `--allow-local-access`: unit_request_local_access is offered (docs/local-access.md)."""
        changed = weakref.WeakMethod(self._unit_changed)
        host.unit_listeners.append(lambda unit_id: (method := changed()) is not None and method(unit_id))

    # -- helpers ----------------------------------------------------------------------------

    def _unit(self, unit_id: Any) -> UnitKind:
        unit_id = paths.validate_unit_id(unit_id)
        kind = self.host.unit_kind(unit_id)
        if kind is None:
            raise UnknownUnit(f"There is no unit {unit_id!r}.")
        return kind

    def _source(self, unit_id: str, source_id: str) -> Source:
        """The one check of a unit's source id, before anything reads or writes it."""
        kind = self._unit(unit_id)
        paths.validate_source_id(source_id)
        if kind == "file" and source_id != f"{unit_id}.py":
            raise UnknownSource(
                f"Unit {unit_id!r} is a file unit; its only source is {unit_id}.py, not {source_id!r}.",
                hint=f"Use source_id {unit_id}.py.",
            )
        return Source(unit_id, kind, source_id)

    def _read(self, src: Source, limit: int | None = None) -> bytes:
        """The bytes of a source a tool reads or edits, refused without reading it when over `limit` (by default
        `max_source_bytes`, the edit limit)."""
        limit = self.max_source_bytes if limit is None else limit
        try:
            with self._storage(src, "read"):
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

    def _text(self, src: Source, data: bytes) -> str:
        unit_id, source_id = src.unit_id, src.source_id
        if b"\x00" in data:
            raise BinarySource(f"{source_id!r} in unit {unit_id!r} is binary.")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise BinarySource(f"{source_id!r} in unit {unit_id!r} is not UTF-8 text.") from None

    def _encode(self, src: Source, text: str) -> bytes:
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

    @contextlib.contextmanager
    def _storage(self, src: Source, action: str) -> Iterator[None]:
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

    def _require(self, capability: str, unit_id: str) -> None:
        if not getattr(self.loader.capabilities, capability):
            raise NotSupported(
                f"The {self.loader.name} loader of unit {unit_id!r} cannot {capability} sources (read-only store).",
                hint="This server was started read-only; edit the unit another way or restart it writable.",
            )

    def _require_history(self, unit_id: str) -> None:
        if not self.loader.capabilities.history:
            raise NotSupported(
                f"The {self.loader.name} loader of unit {unit_id!r} keeps no history of its sources.",
                hint="History needs a SQLite store (--units sqlite:PATH) or a units folder inside a git work tree.",
            )

    def _check_size(self, name: str, value: str) -> None:
        if len(value) > self.max_source_bytes:
            raise TooLarge(
                f"`{name}` is {len(value)} characters; the limit is {self.max_source_bytes}.",
                hint="Send a smaller edit (a diff or an exact replacement of the lines that change).",
            )

    def _compile(self, src: Source, data: bytes) -> None:
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

    def _reload(self, unit_id: str, written: Written | None = None) -> ReloadResult:
        """Reload after a write (`written`): on failure the loader puts the previous source back unless someone
        else changed it meanwhile (their version stays: `superseded_by`); on success it records the new version
        (history loaders)."""
        superseded: list[str | None] = []

        def rollback() -> bool:
            assert written is not None
            try:
                self.loader.rollback(written)
            except StaleSource as exc:
                superseded.append(exc.current_hash)
                return False
            return True

        try:
            reloaded = self.host.reload(unit_id, rollback_source=None if written is None else rollback)
        except ReloadError as exc:
            restored = " The previous source was restored and is still running." if written else ""
            hint = None
            if superseded and written is not None:
                exc.evidence["superseded_by"] = superseded[0]
                restored = (
                    f" {written.source.source_id} was changed by someone else during the reload (it now "
                    f"{'hashes to ' + superseded[0] if superseded[0] else 'is gone'}): their version was kept, not "
                    "overwritten with the previous one."
                )
                hint = "Call unit_read_source to see the version someone else wrote before you edit again."
            raise ReloadFailed(
                f"Reloading unit {unit_id!r} failed at {exc.stage}: {exc.error}.{restored}", hint=hint, **exc.evidence
            ) from None
        result = reload_result(reloaded)
        if written is not None:
            try:
                self.loader.accept(written)
            except Exception:
                self.host.logger.exception(
                    "recording %s of unit %s in the history failed", written.source.source_id, unit_id
                )
        return result

    def _test_names(self, unit_id: str, kind: UnitKind) -> list[str]:
        if kind != "directory":
            return []
        names = []
        for source_id in self.loader.source_ids(unit_id, kind):
            match = re.fullmatch(r"test_([A-Za-z0-9_]+)\.py", source_id)
            if match:
                names.append(match.group(1))
        return names

    def _edit_capabilities(self, kind: UnitKind) -> list[str]:
        caps = self.loader.capabilities
        out = ["read"] if caps.read else []
        if caps.write:
            out.append("patch")
        if caps.create and kind == "directory":
            out.append("create")
        return out

    @property
    def change_log(self) -> ChangeLog:
        return self.host.changes

    def _logged(self, tool: str, args: Args, work: Callable[[_Record], R]) -> R:
        """Run a write call and record its outcome in the change log once it is known; the result gets the
        record's `change_id`. A dry run writes nothing and is not recorded."""
        if getattr(args, "dry_run", False):
            return work(_Record())
        record = _Record()
        started = time.perf_counter()
        try:
            result = work(record)
        except UnitError as exc:
            outcome: Outcome = "refused"
            if record.sources:  # written, then the reload failed
                outcome = "rolled_back" if exc.details.get("source_restored") else "failed"
            self._record(tool, args, outcome, record, started, exc.code, exc.message)
            raise
        except Exception as exc:
            self._record(tool, args, "failed", record, started, "internal_error", type(exc).__name__)
            raise
        if getattr(result, "already_applied", False):
            return result  # a repeat wrote nothing: the first call's record stands
        result.change_id = self._record(tool, args, "applied", record, started)  # type: ignore[attr-defined]
        return result

    def _record(
        self,
        tool: str,
        args: Args,
        outcome: Outcome,
        record: _Record,
        started: float,
        code: str | None = None,
        message: str | None = None,
    ) -> int | None:
        """One record; bytes are kept of applied changes only. A log that cannot be written is logged, and the
        call's outcome stands."""
        sources = record.sources
        if outcome != "applied":
            sources = [SourceChange(s.unit_id, s.source_id, s.action, s.hash_before, s.hash_after) for s in sources]
        unit_id, source_id = getattr(args, "unit_id", None), getattr(args, "source_id", None)
        try:
            return self.change_log.record(
                caller=_CALLER.get(),
                tool=tool,
                unit_id=None if unit_id is None else str(unit_id)[:200],
                source_id=None if source_id is None else str(source_id)[:1100],
                outcome=outcome,
                error_code=code,
                message=None if message is None else self.host.redact(message)[:2000],
                duration_ms=(time.perf_counter() - started) * 1000,
                sources=sources,
            )
        except Exception:
            self.host.logger.exception("recording a call of %s in the change log failed", tool)
            return None

    def _current_or_none(self, src: Source) -> bytes | None:
        """The source's bytes, or None when it does not exist."""
        try:
            return self._read(src)
        except UnknownSource:
            return None

    def _put(self, target: _Target, tool: str, accepted: list[Written]) -> Callable[[], object]:
        """Write one target (checked against the bytes it holds now); returns what puts those bytes back."""
        src, current, data = target.source, target.current, target.data
        if data is None:
            assert current is not None
            self.loader.rollback(Written(src, current, None, tool, token=[]))  # removes it if it still holds current
            return lambda: self.loader.create(src, current, tool_call=tool)
        if current is None:
            written = self.loader.create(src, data, tool_call=tool)
        else:
            written = self.loader.write(src, data, expected_hash=paths.hash_bytes(current), tool_call=tool)
        accepted.append(written)
        return lambda: self.loader.rollback(written)

    def _put_back(self, targets: list[_Target], record: _Record, tool: str) -> list[str]:
        """Write every target, then reload their units, all or nothing: if a write or a reload fails, every source
        already written is put back (and the units reloaded before are reloaded again)."""
        units = sorted({t.source.unit_id for t in targets})
        with contextlib.ExitStack() as locks:
            for unit_id in units:
                locks.enter_context(self.host.unit_lock(unit_id))
            for target in targets:
                now = _hash(self._current_or_none(target.source))
                if now != _hash(target.current):
                    raise StaleHash(
                        f"{target.source.source_id} of unit {target.source.unit_id} changed while this call was "
                        f"prepared (it now hashes to {now}); nothing was written.",
                        current_hash=now,
                    )
            undo: list[Callable[[], object]] = []
            accepted: list[Written] = []

            def undo_all() -> bool:
                while undo:
                    undo.pop()()
                return True

            try:
                for target in targets:
                    with self._storage(target.source, "write"):
                        undo.append(self._put(target, tool, accepted))
            except StaleSource as exc:
                undo_all()
                raise StaleHash(
                    f"A source changed while this call wrote (it now hashes to {exc.current_hash}); every source "
                    "was put back as it was, nothing changed.",
                    current_hash=exc.current_hash,
                ) from None
            except BaseException:
                undo_all()
                raise
            record.sources.extend(
                SourceChange(
                    t.source.unit_id,
                    t.source.source_id,
                    "removed" if t.data is None else "created" if t.current is None else "modified",
                    _hash(t.current),
                    _hash(t.data),
                    t.current,
                    t.data,
                )
                for t in targets
            )
            reloaded: list[str] = []
            for unit_id in units:
                try:
                    self.host.reload(unit_id, rollback_source=undo_all)
                except ReloadError as exc:
                    for done in reloaded:  # they run the written sources' code: back to what they ran before
                        try:
                            self.host.reload(done)
                        except ReloadError:
                            self.host.logger.exception("reloading unit %s again after a failed %s", done, tool)
                    raise ReloadFailed(
                        f"Reloading unit {unit_id!r} failed at {exc.stage}: {exc.error}. Every source was put back "
                        "as it was before this call; nothing changed.",
                        **exc.evidence,
                    ) from None
                reloaded.append(unit_id)
            for written in accepted:
                try:
                    self.loader.accept(written)
                except Exception:
                    self.host.logger.exception("recording %s in the history failed", written.source.source_id)
        return reloaded

    def _require_writable(self) -> None:
        if not self.loader.capabilities.write:
            raise NotSupported(
                f"The {self.loader.name} loader is read-only: nothing can be put back.",
                hint="This server was started read-only; restart it writable to roll back.",
            )

    # -- operations -------------------------------------------------------------------------

    @takes(ListArgs)
    def list(self, args: ListArgs) -> UnitListResult:
        """Units sorted by unit_id, as many as fit one result; the cursor names the last unit shown."""
        after = "" if args.cursor is None else decode_cursor(args.cursor, "unit_list", {"after": str})["after"]
        kinds = self.host.unit_kinds()
        ids = sorted(unit_id for unit_id in kinds if unit_id > after)
        replicas = self._replicas(ids)
        summaries = (self._summary(unit_id, kinds[unit_id], replicas.get(unit_id)) for unit_id in ids)
        units = [*fitting(summaries, RESULT_BYTES - PAGE_OVERHEAD, size_of)]
        if len(units) == len(ids):
            return UnitListResult(units=units)
        return UnitListResult(
            units=units, truncated=True, next_cursor=encode_cursor("unit_list", after=units[-1].unit_id)
        )

    def _summary(self, unit_id: str, kind: UnitKind, replica: Replica | None) -> UnitSummary:
        error = self.host.load_error(unit_id)
        return UnitSummary(
            unit_id=unit_id,
            loader=self.loader.name,
            source_handle=SourceHandle(kind=kind, source_id=primary_source_id(unit_id, kind)),
            edit_capabilities=self._edit_capabilities(kind),
            test_capabilities=_fitting_names(self._test_names(unit_id, kind)),
            commit_capability=self.loader.capabilities.history,
            loader_capabilities=self.loader.capabilities.names(),
            loaded=self.host.is_loaded(unit_id),
            load_error=None if error is None else clip(error, MAX_FIELD_BYTES),
            replica=replica,
        )

    def _replicas(self, unit_ids: Sequence[str]) -> dict[str, Replica]:
        """What this server serves against the store, for loaders shared by several servers (`unit_versions`)."""
        versions = getattr(self.loader, "unit_versions", None)
        if versions is None:
            return {}
        return {
            unit_id: Replica(served_version=v.served, stored_version=v.stored, behind=v.behind, reload_error=v.error)
            for unit_id, v in versions(unit_ids).items()
        }

    def _facts(self, unit_id: str, kind: UnitKind) -> UnitFacts:
        source_ids = self.loader.source_ids(unit_id, kind)
        fields: list[tuple[str, str]] = [("unit_id", unit_id), ("module", self.host.module_name(unit_id))]
        for source_id in source_ids:
            fields.append(("file", source_id))
            if not source_id.endswith(".py") or source_id.startswith("test_"):
                continue
            try:
                text = self.loader.read(Source(unit_id, kind, source_id)).decode("utf-8")
            except (OSError, LoaderError, UnicodeDecodeError):
                continue
            docstring, names = python_facts(text)
            if docstring and source_id == primary_source_id(unit_id, kind):
                fields.append(("docstring", docstring.strip()))
            fields.extend(("symbol", name) for name in names)
        return UnitFacts(unit_id, tuple(fields))

    def _unit_changed(self, unit_id: str) -> None:
        """The host reloaded or unloaded a unit: its facts are read again before the next resolve."""
        with self._index_lock:
            self._stale.add(unit_id)

    def _current_index(self) -> ResolveIndex:
        """The resolve index, built from every unit on first use and then brought up to date unit by unit."""
        with self._index_lock:
            if self._index is None:
                self._stale.clear()
                self._index = ResolveIndex()
                for unit_id, kind in self.host.unit_kinds().items():
                    self._index.update(unit_id, self._facts(unit_id, kind))
            while self._stale:
                unit_id = self._stale.pop()
                now = self.host.unit_kind(unit_id)
                self._index.update(unit_id, None if now is None else self._facts(unit_id, now))
            return self._index

    @takes(ResolveArgs)
    def resolve(self, args: ResolveArgs) -> ResolveResult:
        if not args.description.strip():
            raise InvalidArgument(
                "description is empty.", hint="Describe the unit in a few words, e.g. 'click counter'."
            )
        description = args.description[:2000]
        start = 0
        if args.cursor is not None:
            state = decode_cursor(args.cursor, "unit_resolve", {"start": int, "description": str})
            if state["description"] != binding(description) or state["start"] < 0:
                raise InvalidArgument(
                    "cursor belongs to another description.",
                    hint="Pass the same description as the page that gave the cursor, or leave cursor out.",
                )
            start = state["start"]
        ranked = self._current_index().query(description, start + args.limit + 1)
        page = ranked[start : start + args.limit]
        more = len(ranked) > start + args.limit
        budget = RESULT_BYTES - PAGE_OVERHEAD - json_size(args.description)
        candidates = [*fitting(page, budget, size_of)]
        if not more and len(candidates) == len(page):
            return ResolveResult(description=args.description, candidates=candidates)
        cursor = encode_cursor("unit_resolve", start=start + len(candidates), description=binding(description))
        return ResolveResult(
            description=args.description,
            candidates=candidates,
            truncated=len(candidates) < len(page),
            next_cursor=cursor,
        )

    @takes(UnitArgs)
    def inspect(self, args: UnitArgs) -> InspectResult:
        unit_id = args.unit_id
        kind = self._unit(unit_id)
        module = self.host.module(unit_id)
        lifecycle = {
            name: name if module is not None and callable(getattr(module, name, None)) else None for name in LIFECYCLE
        }
        if module is None:
            primary = primary_source_id(unit_id, kind)
            try:
                tree = ast.parse(self.loader.read(Source(unit_id, kind, primary)))
                defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                lifecycle = {name: name if name in defined else None for name in LIFECYCLE}
            except (OSError, SyntaxError, ValueError, LoaderError):
                pass
        docstring = (module.__doc__ if module is not None else None) or None
        artifacts = [
            SourceArtifact(source_id=s.source_id, kind=s.kind, size=s.size, hash=s.hash, primary=s.primary)
            for s in self.loader.sources(unit_id, kind)
        ]
        main = next((a for a in artifacts if a.primary), None)
        tests, activities = self._test_names(unit_id, kind), self.host.activities(unit_id)
        error = self.host.load_error(unit_id)
        # Lists get a share each; the texts one field's bound (only a unit of thousands of files comes near).
        shown = [*fitting(artifacts, RESULT_BYTES // 2, size_of)]
        shown_tests = [*fitting(tests, RESULT_BYTES // 8, json_size)]
        shown_activities = [*fitting(activities, RESULT_BYTES // 8, json_size)]
        cut = (len(shown), len(shown_tests), len(shown_activities)) != (len(artifacts), len(tests), len(activities))
        return InspectResult(
            truncated=cut,
            unit_id=unit_id,
            loader=self.loader.name,
            loader_capabilities=self.loader.capabilities.names(),
            module=self.host.module_name(unit_id),
            source_handle=SourceHandle(
                kind=kind,
                source_id=primary_source_id(unit_id, kind),
                size=main.size if main else None,
                hash=main.hash if main else None,
            ),
            loaded=module is not None,
            load_error=None if error is None else clip(error, MAX_FIELD_BYTES),
            docstring=clip(docstring.strip(), MAX_FIELD_BYTES) if docstring else None,
            lifecycle=Lifecycle(**lifecycle),
            replica=self._replicas([unit_id]).get(unit_id),
            activities=shown_activities,
            edit_capabilities=self._edit_capabilities(kind),
            test_capabilities=shown_tests,
            source_artifacts=shown,
        )

    @takes(ReadSourceArgs)
    def read_source(self, args: ReadSourceArgs) -> ReadSourceResult:
        """The source's text, or one page of it cut after a line when the whole would not fit one result; every
        page carries the hash of the whole source, and a cursor of a source changed since is refused."""
        return self._read_source(args, self.max_read_bytes)

    def read_source_at_once(self, args: ReadSourceArgs) -> ReadSourceResult | None:
        """`read_source` of a first page of at most QUICK_READ_BYTES from a folder, cheap enough for the event loop
        (less than the hop to a worker thread); None for anything else, which the loader refuses before reading."""
        if args.cursor is not None or not isinstance(self.loader, FilesystemLoader):
            return None
        try:
            return self._read_source(args, QUICK_READ_BYTES)
        except TooLarge:
            return None

    def _read_source(self, args: ReadSourceArgs, limit: int) -> ReadSourceResult:
        src = self._source(args.unit_id, args.source_id)
        self._require("read", src.unit_id)
        data = self._read(src, limit)
        digest = paths.hash_bytes(data)
        bound = binding(src.unit_id, src.source_id)
        if args.cursor is None:
            start, text = 0, self._text(src, data)
            line_ending = line_ending_kind(text)
        else:  # the hash of the first page vouches for the text: not decoded again, page after page
            fields: dict[str, type] = {"offset": int, "hash": str, "source": str, "le": str}
            state = decode_cursor(args.cursor, "unit_read_source", fields)
            if state["source"] != bound:
                raise InvalidArgument(
                    "cursor belongs to another source.", hint="Pass the unit_id and source_id the cursor was read with."
                )
            if state["hash"] != digest:
                raise StaleHash(
                    f"{src.source_id} of unit {src.unit_id} changed since its first page was read: expected "
                    f"{state['hash']}, found {digest}.",
                    hint="Read it again from the start (leave cursor out).",
                    expected_hash=state["hash"],
                    current_hash=digest,
                )
            start, line_ending = state["offset"], state["le"]
            if not 0 < start < len(data) or data[start] & 0xC0 == 0x80 or line_ending not in LINE_ENDINGS:
                raise InvalidArgument(
                    "cursor is not one that unit_read_source handed out.", hint="Leave cursor out to start again."
                )
        end = text_page(data, start, RESULT_BYTES - PAGE_OVERHEAD)
        more = end < len(data)
        return ReadSourceResult(
            unit_id=src.unit_id,
            source_id=src.source_id,
            content=text if start == 0 and not more else data[start:end].decode(),
            hash=digest,
            size=len(data),
            line_ending=line_ending,  # type: ignore[arg-type]
            offset=start,
            truncated=more,
            next_cursor=encode_cursor("unit_read_source", offset=end, hash=digest, source=bound, le=line_ending)
            if more
            else None,
        )

    @takes(ApplyPatchArgs)
    def apply_patch(self, args: ApplyPatchArgs) -> ApplyPatchResult:
        return self._logged("unit_apply_patch", args, lambda record: self._apply_patch(args, record))

    def _apply_patch(self, args: ApplyPatchArgs, record: _Record) -> ApplyPatchResult:
        patch, old, new = args.patch, args.old, args.new
        if patch is not None and (old is not None or new is not None):
            raise InvalidArgument(
                "Pass either `patch` or `old`+`new`, not both.", hint="Use one editing mode per call."
            )
        if patch is None and (old is None or new is None):
            raise InvalidArgument(
                "Pass `patch` (a unified diff) or both `old` and `new`.",
                hint="For an exact replacement give `old` (text to find) and `new` (its replacement; may be empty).",
            )
        for name, value in (("patch", patch), ("old", old), ("new", new)):
            if value is not None:
                self._check_size(name, value)
        if patch is not None and not patch.strip():
            raise InvalidArgument("`patch` is empty.", hint="Send a unified diff with at least one @@ hunk.")
        src = self._source(args.unit_id, args.source_id)
        if not args.dry_run:
            self._require("write", src.unit_id)
        # A dry run writes nothing and reads a source that is only ever replaced whole: it needs no lock (and so
        # never waits for another edit's reload).
        label = f"{src.source_id} of unit {src.unit_id}"

        def edit(text: str) -> tuple[str, int]:
            if patch is not None:
                return apply_unified_diff(text, patch, src.source_id)
            assert old is not None and new is not None
            return replace_exact(text, old, new, replace_all=args.replace_all, label=label)

        def undo(text: str) -> tuple[str, int]:
            if patch is not None:
                return apply_unified_diff(text, reverse_unified_diff(patch, src.source_id), src.source_id)
            assert old is not None and new is not None
            return replace_exact(text, new, old, replace_all=args.replace_all, label=label)

        mode = "diff" if patch is not None else "exact"
        with contextlib.nullcontext() if args.dry_run else self.host.unit_lock(src.unit_id):
            try:
                text, current = self._current(src, args.expected_hash)
            except StaleHash:
                assert args.expected_hash is not None
                replayed = _REPLAY.get() and not args.dry_run
                repeated = self._already_patched(src, args.expected_hash, mode, edit, undo) if replayed else None
                if repeated is None:
                    raise
                return repeated
            new_text, count = edit(text)
            return self._edit(src, current, text, new_text, mode, count, args.dry_run, "unit_apply_patch", record)

    def _already_patched(
        self,
        src: Source,
        expected_hash: str,
        mode: str,
        edit: Callable[[str], tuple[str, int]],
        undo: Callable[[str], tuple[str, int]],
    ) -> ApplyPatchResult | None:
        """A repeated edit (a replayed step) whose result is in place: the source now holds exactly what `edit` makes
        of the bytes hashing to `expected_hash`. Those bytes come from the change log's record of the write or, when
        the writer died before recording it, from undoing the edit; the hash proves them. Reloads the unit again."""
        data = self._read(src)
        text, current = self._text(src, data), paths.hash_bytes(data)
        change = self._change_that_made(src, expected_hash, current)
        logged = None if change is None else self._bytes_before(change, src)
        befores = [] if logged is None else [logged]
        with contextlib.suppress(UnitError):
            befores.append(self._encode(src, undo(text)[0]))
        for before in befores:
            if paths.hash_bytes(before) != expected_hash:
                continue
            before_text = self._text(src, before)
            try:
                after_text, count = edit(before_text)
            except UnitError:
                continue
            if self._encode(src, after_text) != data:
                continue
            result = _patch_result(src, mode, count, (expected_hash, before_text), (current, after_text), dry_run=False)
            return result.model_copy(
                update={
                    "reload": self._reload(src.unit_id),
                    "change_id": None if change is None else change.id,
                    "already_applied": True,
                }
            )
        return None

    def _change_that_made(self, src: Source, hash_before: str | None, hash_after: str) -> Change | None:
        """The newest change-log record that took the source from `hash_before` to `hash_after` (None: no such)."""
        for change in self.change_log.changes(unit_id=src.unit_id, source_id=src.source_id, limit=20):
            if change.outcome in ("applied", "outside") and (change.hash_before, change.hash_after) == (
                hash_before,
                hash_after,
            ):
                return change
        return None

    def _bytes_before(self, change: Change, src: Source) -> bytes | None:
        full = self.change_log.change(change.id)
        for source in full.sources if full else ():
            if (source.unit_id, source.source_id) == (src.unit_id, src.source_id):
                return source.data_before
        return None

    def _current(self, src: Source, expected_hash: str | None) -> tuple[str, str]:
        """The source's text and hash, refused if it no longer hashes to `expected_hash`."""
        data = self._read(src)
        text = self._text(src, data)
        current = paths.hash_bytes(data)
        if expected_hash is not None and expected_hash != current:
            raise StaleHash(
                f"{src.source_id} of unit {src.unit_id} changed since it was read: expected {expected_hash}, "
                f"found {current}.",
                expected_hash=expected_hash,
                current_hash=current,
            )
        return text, current

    def _edit(
        self,
        src: Source,
        current: str,
        text: str,
        new_text: str,
        mode: str,
        count: int,
        dry_run: bool,
        tool_call: str,
        record: _Record,
    ) -> ApplyPatchResult:
        """Compile, write (checked against `current`, the hash of `text`, which another process may have changed
        since), reload; the loader puts the old source back if the reload fails. Called under the unit lock (a dry
        run needs none)."""
        unit_id, source_id = src.unit_id, src.source_id
        changed = new_text != text
        new_data = self._encode(src, new_text)
        new_hash = paths.hash_bytes(new_data)
        # A dry run may skip the full compile when the edited statements alone prove the source compiles; a write
        # compiles in full (the reload runs that code) and only keeps the statement map current.
        proven = (
            changed
            and source_id.endswith(".py")
            and (dry_run or self._syntax.knows(current))
            and self._syntax.compiles(current, text, new_hash, new_text, learn=not dry_run)
        )
        if changed and not (dry_run and proven):
            self._compile(src, new_data)
        result = _patch_result(src, mode, count, (current, text), (new_hash, new_text), dry_run=dry_run)
        if dry_run or not changed:
            return result
        try:
            with self._storage(src, "write"):
                written = self.loader.write(src, new_data, expected_hash=current, tool_call=tool_call)
        except StaleSource as exc:
            raise StaleHash(
                f"{source_id} of unit {unit_id} was changed by someone else while this edit was made: expected "
                f"{current}, found {exc.current_hash}; nothing was written.",
                expected_hash=current,
                current_hash=exc.current_hash,
            ) from None
        record.sources.append(
            SourceChange(unit_id, source_id, "modified", current, new_hash, written.previous, new_data)
        )
        result.reload = self._reload(unit_id, written)
        return result

    @takes(CreateSourceArgs)
    def create_source(self, args: CreateSourceArgs) -> CreateSourceResult:
        return self._logged("unit_create_source", args, lambda record: self._create_source(args, record))

    def _create_source(self, args: CreateSourceArgs, record: _Record) -> CreateSourceResult:
        unit_id, source_id = args.unit_id, args.source_id
        kind = self._unit(unit_id)
        if kind != "directory":
            raise NotSupported(
                f"Unit {unit_id!r} is a file unit; only directory units can hold more sources.",
                hint=f"Add code to {unit_id}.py with unit_apply_patch instead.",
            )
        self._require("create", unit_id)
        src = self._source(unit_id, source_id)
        self._check_size("source", args.source)
        if paths.is_hidden_or_compiled(source_id.rsplit("/", 1)[-1]) or "__pycache__" in source_id.split("/"):
            raise InvalidSourceId(
                f"{source_id!r} would be hidden or a compiled file.", hint="Pick a visible file name."
            )
        data = self._encode(src, args.source)
        self._compile(src, data)
        digest = paths.hash_bytes(data)
        with self.host.unit_lock(unit_id):
            if _REPLAY.get() and self._current_or_none(src) == data:  # a replayed call whose source is in place
                change = self._change_that_made(src, None, digest)
                return CreateSourceResult(
                    unit_id=unit_id,
                    source_id=source_id,
                    hash=digest,
                    size=len(data),
                    reload=self._reload(unit_id),
                    change_id=None if change is None else change.id,
                    already_applied=True,
                )
            with self._storage(src, "write"):
                written = self.loader.create(src, data, tool_call="unit_create_source")
            record.sources.append(SourceChange(unit_id, source_id, "created", None, digest, None, data))
            reload = self._reload(unit_id, written)
            return CreateSourceResult(unit_id=unit_id, source_id=source_id, hash=digest, size=len(data), reload=reload)

    @takes(HistoryArgs)
    def history(self, args: HistoryArgs) -> HistoryResult:
        """Versions newest first, `limit` a page and as many as fit one result; the cursor names the version
        below which the next page starts (versions written meanwhile do not shift it)."""
        src = self._source(args.unit_id, args.source_id)
        self._require_history(src.unit_id)
        below = MAX_VERSION + 1
        if args.cursor is not None:
            below = decode_cursor(args.cursor, "unit_history", {"below": int})["below"]
        wanted = args.limit + 1  # one more tells whether another page follows
        while True:
            fetched = self.loader.history(src, wanted)
            older = [v for v in fetched if v.version < below]
            if len(older) > args.limit or len(fetched) < wanted:
                break
            wanted *= 2
        if not fetched:  # refuse a source that does not exist, without reading it
            with contextlib.suppress(SourceTooLarge), self._storage(src, "read"):
                self.loader.read(src, max_bytes=0)
        page = [
            HistoryVersion(version=v.version, hash=v.hash, size=v.size, time=v.time, tool_call=v.tool_call)
            for v in older[: args.limit]
        ]
        versions = [*fitting(page, RESULT_BYTES - PAGE_OVERHEAD, size_of)]
        more = len(older) > len(versions)
        return HistoryResult(
            unit_id=src.unit_id,
            source_id=src.source_id,
            versions=versions,
            truncated=len(versions) < len(page),
            next_cursor=encode_cursor("unit_history", below=versions[-1].version) if more and versions else None,
        )

    @takes(RevertArgs)
    def revert(self, args: RevertArgs) -> ApplyPatchResult:
        """Put a source back to a version from its history, through the same checked write and reload as a patch."""
        return self._logged("unit_revert", args, lambda record: self._revert(args, record))

    def _revert(self, args: RevertArgs, record: _Record) -> ApplyPatchResult:
        src = self._source(args.unit_id, args.source_id)
        self._require_history(src.unit_id)
        if not args.dry_run:
            self._require("write", src.unit_id)
        with self.host.unit_lock(src.unit_id):
            text, current = self._current(src, args.expected_hash)
            try:
                old = self.loader.version_data(src, args.version)
            except MissingVersion:
                raise UnknownVersion(f"{src.source_id} of unit {src.unit_id} has no version {args.version}.") from None
            old_text = self._text(src, old)
            return self._edit(src, current, text, old_text, "revert", 1, args.dry_run, "unit_revert", record)

    @takes(RunTestsArgs)
    def run_tests(self, args: RunTestsArgs) -> RunTestsResult:
        unit_id, test_name = args.unit_id, args.test_name
        kind = self._unit(unit_id)
        timeout = self.test_timeout if args.timeout is None else args.timeout
        if timeout > self.max_test_timeout:
            raise InvalidArgument(f"timeout must be between 0 and {self.max_test_timeout} seconds, not {timeout!r}.")
        if kind != "directory":
            raise NotSupported(
                f"Unit {unit_id!r} is a file unit and has no tests.",
                hint="Tests live in directory units as test_<name>.py.",
            )
        names = self._test_names(unit_id, kind)
        if test_name not in names:
            raise UnknownSource(
                f"Unit {unit_id!r} has no test module test_{test_name}.py.",
                hint=f"Its tests: {', '.join(names) or 'none'}. Create one with unit_create_source.",
            )
        test = Source(unit_id, kind, f"test_{test_name}.py")
        source = self._text(test, self._read(test))
        try:
            tree = ast.parse(source)
            has_main = any(
                isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "main" for n in tree.body
            )
        except (SyntaxError, ValueError):
            has_main = False
        runner: Literal["main", "pytest"] = "main" if has_main else "pytest"

        def work() -> RunTestsResult:
            run = run_test_process(
                self.loader.address,
                self.host.namespace,
                unit_id,
                test_name,
                timeout=float(timeout),
                max_output=self.max_test_output,
            )
            stdout, stderr = self.host.redact(run.stdout), self.host.redact(run.stderr)
            result = RunTestsResult(
                unit_id=unit_id,
                test_name=test_name,
                runner=runner,
                passed=run.exit_code == 0 and not run.timed_out,
                exit_code=run.exit_code,
                stdout=clip(stdout, RESULT_BYTES // 2 - PAGE_OVERHEAD),
                stderr=clip(stderr, RESULT_BYTES // 2 - PAGE_OVERHEAD),
                truncated=run.truncated or (stdout, stderr) != (run.stdout, run.stderr),
                duration_ms=run.duration_ms,
                timed_out=run.timed_out,
            )
            if run.cancelled:
                raise Cancelled(
                    f"Tests test_{test_name} of unit {unit_id!r} were cancelled and their processes killed."
                )
            if run.timed_out:
                raise TestTimeout(
                    f"Tests test_{test_name} of unit {unit_id!r} ran past {timeout} s and were killed.",
                    **result.model_dump(),
                )
            return result

        running = RunTestsResult(
            unit_id=unit_id,
            test_name=test_name,
            runner=runner,
            passed=False,
            exit_code=None,
            stdout="",
            stderr="",
            truncated=False,
            duration_ms=0.0,
            timed_out=False,
            state="running",
        )
        run = self.runs.start(f"test_{test_name} of unit {unit_id}", work, running, limit=self.max_running_tests)
        if run is None:
            raise TooManyRuns(
                f"{self.max_running_tests} test runs are still running; test_{test_name} was not started."
            )
        return self._outcome(run, self.max_call_s if args.wait else 0.0, stop_if_cancelled=True)

    def _run(self, run_id: str) -> TestRun:
        run = self.runs.get(run_id)
        if run is None:
            raise UnknownRun(f"There is no test run {run_id!r} (never started, or forgotten since it ended).")
        return run

    def _outcome(self, run: TestRun, wait: float, *, stop_if_cancelled: bool = False) -> RunTestsResult:
        """The run's result (or its refusal) once it ends within `wait` seconds, else its state so far. A caller
        that cancels a call waiting on its own run (`stop_if_cancelled`) stops the run, as a cancelled call did."""
        if not cancel.wait(run.done, wait) and cancel.requested() and stop_if_cancelled:
            run.cancel.set()
            run.done.wait(CANCEL_GRACE)
        if not run.done.is_set():
            assert isinstance(run.subject, RunTestsResult)
            return run.subject.model_copy(update={"run_id": run.run_id, "duration_ms": run.elapsed() * 1000})
        if isinstance(run.outcome, UnitError):
            raise run.outcome.with_traceback(None)
        if isinstance(run.outcome, Exception):
            raise RuntimeError(f"test run {run.label} failed") from run.outcome
        assert isinstance(run.outcome, RunTestsResult)
        return run.outcome.model_copy(update={"run_id": run.run_id})

    @takes(TestStatusArgs)
    def test_status(self, args: TestStatusArgs) -> RunTestsResult:
        """A run's result, or its state while it runs, waiting up to wait_s (at most the longest call) to end."""
        return self._outcome(self._run(args.run_id), min(args.wait_s, self.max_call_s))

    @takes(CancelTestArgs)
    def cancel_test(self, args: CancelTestArgs) -> CancelTestResult:
        """Stop a run: its process group is killed within a poll; its status then answers [cancelled]."""
        run = self._run(args.run_id)
        running = not run.done.is_set()
        run.cancel.set()
        run.done.wait(CANCEL_GRACE)
        return CancelTestResult(
            run_id=run.run_id, cancelled=running, state="finished" if run.done.is_set() else "running"
        )

    @takes(UnitArgs)
    def reload(self, args: UnitArgs) -> ReloadResult:
        self._unit(args.unit_id)
        with self.host.unit_lock(args.unit_id):
            return self._reload(args.unit_id)

    @takes(ReadLogArgs)
    def read_log(self, args: ReadLogArgs) -> ReadLogResult:
        """Matching log lines with their absolute line numbers, oldest first: by default the newest `lines`
        (page back with `before`, the first number of the previous page); with `offset`, forward from that
        line number (`limit` lines, default `lines`)."""
        grep, lines, offset, limit, before = args.grep, args.lines, args.offset, args.limit, args.before
        if offset is not None and before is not None:
            raise InvalidArgument(
                "Give offset (read forward from a line number) or before (page back), not both.",
                hint="offset=N reads from line N on; before=N reads the newest lines numbered below N.",
            )
        count = limit if limit is not None else lines
        if args.cursor is not None:
            state = decode_cursor(args.cursor, "unit_read_log", {"at": int, "count": int, "forward": int, "grep": str})
            if state["grep"] != binding(grep or None) or state["at"] < 1:  # the position counts only matching lines
                raise InvalidArgument(
                    "cursor continues the page it came from: give it with that page's grep.",
                    hint="Pass next_cursor unchanged with the same grep, or leave cursor out to start again.",
                )
            offset, before = (state["at"], None) if state["forward"] else (None, state["at"])
            count = min(state["count"], MAX_LOG_LINES)
        files = applog.log_files(self.host.log_path, self.host.log_backups)
        if offset is not None:
            page = applog.forward(files, grep=grep or None, count=count, start=offset)
        else:
            page = applog.newest(files, grep=grep or None, count=count, before=before)
        numbered = [(number, self.host.redact(text)) for number, text in page.lines]
        budget = RESULT_BYTES - PAGE_OVERHEAD - json_size(grep or "")

        def size(line: tuple[int, str]) -> int:
            return json_size(line[1]) + len(str(line[0])) + 1

        if offset is not None:  # forward: the oldest lines that fit
            kept = [*fitting(numbered, budget, size)]
        else:  # newest first: the newest lines that fit
            kept = [*fitting(reversed(numbered), budget, size)][::-1]
        truncated = len(kept) < len(numbered)
        has_more = page.has_more or truncated
        cursor = None
        if has_more and kept:
            at = kept[-1][0] + 1 if offset is not None else kept[0][0]
            cursor = encode_cursor(
                "unit_read_log", at=at, count=count, forward=int(offset is not None), grep=binding(grep or None)
            )
        return ReadLogResult(
            lines=[text for _, text in kept],
            line_numbers=[number for number, _ in kept],
            returned=len(kept),
            has_more=has_more,
            total_lines=page.total,
            grep=grep or None,
            truncated=truncated,
            next_cursor=cursor,
        )

    @takes(UnitArgs)
    def snapshot(self, args: UnitArgs) -> SnapshotResult:
        unit_id = args.unit_id
        self._unit(unit_id)
        if not self.host.is_loaded(unit_id):
            raise UnitNotLoaded(f"Unit {unit_id!r} is not loaded: {self.host.load_error(unit_id)}")
        try:
            supported, state = self.host.snapshot(unit_id)
        except Exception as exc:
            raise SnapshotFailed(f"snapshot() of unit {unit_id!r} raised {self.host.redact(repr(exc))}.") from None
        try:
            kept = json.dumps(state)
        except (TypeError, ValueError) as exc:
            raise SnapshotFailed(f"snapshot() of unit {unit_id!r} returned a value that is not JSON: {exc}.") from None
        snapshot_id = self.host.keep_snapshot(unit_id, kept) if supported else None
        shown = self._redacted(json.loads(kept))
        if json_size(shown) > RESULT_BYTES - PAGE_OVERHEAD:
            return SnapshotResult(unit_id=unit_id, supported=supported, truncated=True, snapshot_id=snapshot_id)
        return SnapshotResult(unit_id=unit_id, supported=supported, state=shown, snapshot_id=snapshot_id)

    def _redacted(self, value: Any) -> Any:
        """A JSON value with host paths redacted in every string, keys included (restore gets the kept original)."""
        if isinstance(value, str):
            return self.host.redact(value)
        if isinstance(value, list):
            return [self._redacted(item) for item in value]
        if isinstance(value, dict):
            return {self.host.redact(key): self._redacted(item) for key, item in value.items()}
        return value

    @takes(RestoreSnapshotArgs)
    def restore_snapshot(self, args: RestoreSnapshotArgs) -> RestoreSnapshotResult:
        """Hand a kept snapshot's state to the unit's restore(); the state before is put back if restore() fails."""
        unit_id, snapshot_id = args.unit_id, args.snapshot_id
        self._unit(unit_id)
        with self.host.unit_lock(unit_id):
            if not self.host.is_loaded(unit_id):
                raise UnitNotLoaded(f"Unit {unit_id!r} is not loaded: {self.host.load_error(unit_id)}")
            kept = self.host.kept_snapshot(unit_id, snapshot_id)
            if kept is None:
                raise UnknownSnapshot(f"Unit {unit_id!r} has no kept snapshot {snapshot_id!r}.")
            try:
                restored = self.host.restore_snapshot(unit_id, json.loads(kept))
            except RestoreError as exc:
                back = "its state before was put back" if exc.rolled_back else "its state before could not be put back"
                raise RestoreFailed(
                    f"restore() of unit {unit_id!r} raised {self.host.redact(repr(exc.error))}; {back}.",
                    rolled_back=exc.rolled_back,
                ) from None
            except Exception as exc:
                raise SnapshotFailed(f"snapshot() of unit {unit_id!r} raised {self.host.redact(repr(exc))}.") from None
            if not restored:
                raise NotSupported(
                    f"Unit {unit_id!r} has no restore() now, so the snapshot cannot be put back.",
                    hint="Add a restore(state) function to the unit (and reload it) to restore snapshots.",
                )
            return RestoreSnapshotResult(unit_id=unit_id, snapshot_id=snapshot_id, restored=True)

    # -- the change log -----------------------------------------------------------------------

    @takes(ChangesArgs)
    def changes(self, args: ChangesArgs) -> ChangesResult:
        """The change log, newest first, a page at a time."""
        if args.unit_id is not None:
            paths.validate_unit_id(args.unit_id)
        if args.source_id is not None:
            if args.unit_id is None:
                raise InvalidArgument("source_id needs unit_id.", hint="Pass the unit_id of the source too.")
            paths.validate_source_id(args.source_id)
        before = None
        if args.cursor is not None:
            match = _CURSOR.fullmatch(_unb64(args.cursor))
            if match is None:
                raise InvalidArgument(
                    "cursor is not a next_cursor of unit_changes.", hint="Pass next_cursor exactly as it came back."
                )
            before = int(match.group(1))
        since = None
        if args.since is not None:
            try:
                when = datetime.fromisoformat(args.since)
            except ValueError:
                raise InvalidArgument(
                    f"since {args.since!r} is not an ISO 8601 time.", hint="e.g. since='2026-12-04T13:00:00Z'."
                ) from None
            since = iso_time((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp())
        log = self.change_log
        found = log.changes(
            unit_id=args.unit_id, source_id=args.source_id, since=since, before_id=before, limit=args.limit + 1
        )
        records: list[ChangeRecord] = []
        size = 0
        for change in found[: args.limit]:
            record = change_record(change)
            size += len(record.model_dump_json())
            if records and size > MAX_PAGE_BYTES:
                break
            records.append(record)
        cursor = _b64(f"before:{records[-1].change_id}") if len(found) > len(records) else None
        return ChangesResult(changes=records, next_cursor=cursor, latest_change_id=log.latest_id())

    @takes(CheckpointArgs)
    def checkpoint(self, args: CheckpointArgs) -> CheckpointResult:
        checkpoint = self.change_log.checkpoint(args.label, _CALLER.get())
        return CheckpointResult(
            checkpoint_id=checkpoint.id,
            time=checkpoint.time,
            label=checkpoint.label,
            after_change_id=checkpoint.after_change,
        )

    def _local_folder(self, unit_id: str) -> tuple[LocalAccess, Path]:
        """The grants and the real folder local access to `unit_id` would open, or the refusal."""
        access = self.local_access
        if access is None:
            raise NotSupported(
                "Local access is off on this server.",
                hint="Edit with unit_apply_patch; a person can start the server with --allow-local-access.",
            )
        unit_folder = getattr(self.loader, "unit_folder", None)
        self._unit(unit_id)
        if unit_folder is None:
            raise NotSupported(
                f"Unit {unit_id!r} lives in a database, not in a local folder.",
                hint="Edit it with unit_apply_patch and unit_create_source.",
            )
        folder = unit_folder(unit_id)
        if folder is None:
            raise NotSupported(
                f"Unit {unit_id!r} is a single file ({unit_id}.py), not a folder of its own.",
                hint="Edit it with unit_apply_patch; local access opens directory units only.",
            )
        return access, folder

    def local_access_question(self, args: LocalAccessArgs) -> str:
        """What the person is asked before a grant (a request that could not be granted is refused before)."""
        _, folder = self._local_folder(args.unit_id)
        return (
            f"Open {folder} to OpenCode's own read and edit tools for {args.minutes:g} minutes, without the "
            f"stale-content check, path containment or a rollback of a failed reload. Reason given: {args.reason}"
        )

    @takes(LocalAccessArgs)
    def request_local_access(self, args: LocalAccessArgs) -> LocalAccessResult:
        """The escape hatch: once a person said yes (the tool layer asks), OpenCode's own read and edit tools may
        work in the unit's folder for `minutes`, through a link that stops leading there when the access ends."""
        access, folder = self._local_folder(args.unit_id)
        grant = access.grant(args.unit_id, folder, args.reason, args.minutes, _CALLER.get())
        return LocalAccessResult(
            grant_id=grant.id,
            unit_id=args.unit_id,
            source_handle=LocalFolderHandle(path=str(grant.link), folder=str(folder)),
            expires_at=iso_time(grant.expires),
            restart="OpenCode reads its permissions when it starts: quit it and start it again from $OPENCODE_CMD "
            "(add --continue to go on with this conversation). Use the path above; the unit's folder itself, "
            "every other path, the shell and the web stay denied. Edits there skip the stale-content check "
            "and are reloaded by the file watcher.",
        )

    @takes(RollbackArgs)
    def rollback(self, args: RollbackArgs) -> RollbackResult:
        return self._logged("unit_rollback", args, lambda record: self._rollback(args, record))

    def _rollback(self, args: RollbackArgs, record: _Record) -> RollbackResult:
        """Every source changed since the checkpoint back to its bytes at the checkpoint; a source changed outside
        the tools since then is a conflict, left alone unless `force` (and its bytes are known)."""
        checkpoint = self.change_log.get_checkpoint(args.checkpoint_id)
        if checkpoint is None:
            raise UnknownCheckpoint(f"There is no checkpoint {args.checkpoint_id} in the change log.")
        if not args.dry_run:
            self._require_writable()
        plan: dict[tuple[str, str], _Plan] = {}
        for change in self.change_log.changes_after(checkpoint.after_change):
            if change.outcome not in ("applied", "outside"):
                continue
            for s in change.sources:
                entry = plan.setdefault(
                    (s.unit_id, s.source_id), _Plan(s.action != "unknown", s.data_before, s.hash_before)
                )
                entry.expected = s.hash_after
                entry.outside = entry.outside or change.outcome == "outside"
        targets: list[_Target] = []
        conflicts: list[RestoreConflict] = []
        for (unit_id, source_id), entry in sorted(plan.items()):
            try:
                src = self._source(unit_id, source_id)
                current = self._current_or_none(src)
            except UnitError as exc:
                conflicts.append(
                    RestoreConflict(
                        unit_id=unit_id,
                        source_id=source_id,
                        reason=exc.message,
                        current_hash=None,
                        expected_hash=entry.expected,
                    )
                )
                continue
            now = _hash(current)
            if now == entry.hash:
                continue  # as it was at the checkpoint already
            reason = None
            if entry.outside:
                reason = "changed outside these tools since the checkpoint"
            elif now != entry.expected:
                reason = "changed outside these tools since the change log's last record of it"
            if reason is not None and (not args.force or not entry.known):
                if not entry.known:
                    reason += "; its bytes at the checkpoint are unknown, so it cannot be put back"
                conflicts.append(
                    RestoreConflict(
                        unit_id=unit_id,
                        source_id=source_id,
                        reason=reason,
                        current_hash=now,
                        expected_hash=entry.expected,
                    )
                )
                continue
            targets.append(_Target(src, current, entry.data))
        reloaded = [] if args.dry_run or not targets else self._put_back(targets, record, "unit_rollback")
        return RollbackResult(
            checkpoint_id=checkpoint.id,
            dry_run=args.dry_run,
            sources=_shown_targets(targets, args.dry_run),
            conflicts=conflicts,
            reloaded=reloaded,
        )

    @takes(RevertChangeArgs)
    def revert_change(self, args: RevertChangeArgs) -> RevertChangeResult:
        return self._logged("unit_revert_change", args, lambda record: self._revert_change(args, record))

    def _revert_change(self, args: RevertChangeArgs, record: _Record) -> RevertChangeResult:
        """Every source of one change back to its bytes before it, refused with `stale_hash` if one moved on."""
        change = self.change_log.change(args.change_id)
        if change is None:
            raise UnknownChange(f"There is no change {args.change_id} in the change log.")
        if change.outcome not in ("applied", "outside") or not change.sources:
            raise NotSupported(
                f"Change {change.id} ({change.outcome}) changed no source; there is nothing to revert.",
                hint="Revert a change whose outcome is applied or outside (unit_changes).",
            )
        if not args.dry_run:
            self._require_writable()
        targets = []
        for s in change.sources:
            if s.action == "unknown":
                raise NotSupported(
                    f"Change {change.id} made outside these tools changed {s.source_id} of unit {s.unit_id}, whose "
                    "bytes before it the change log never saw; nothing was reverted.",
                    hint="Edit the source back with unit_apply_patch instead.",
                )
            src = self._source(s.unit_id, s.source_id)
            current = self._current_or_none(src)
            now = _hash(current)
            if now != s.hash_after:
                raise StaleHash(
                    f"{s.source_id} of unit {s.unit_id} changed since change {change.id}: it hashes to {now}, the "
                    f"change left {s.hash_after}; nothing was reverted.",
                    expected_hash=s.hash_after,
                    current_hash=now,
                    hint="Revert the later changes first (unit_changes lists them), or edit the source directly.",
                )
            targets.append(_Target(src, current, s.data_before))
        reloaded = [] if args.dry_run else self._put_back(targets, record, "unit_revert_change")
        return RevertChangeResult(
            reverted_change_id=change.id,
            dry_run=args.dry_run,
            sources=_shown_targets(targets, args.dry_run),
            reloaded=reloaded,
        )


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except ValueError:
        return ""


def _patch_result(
    src: Source, mode: str, count: int, before: tuple[str, str], after: tuple[str, str], *, dry_run: bool
) -> ApplyPatchResult:
    """What an edit of `src` answers, from the (hash, text) it had `before` to the one it has `after`."""
    return ApplyPatchResult(
        unit_id=src.unit_id,
        source_id=src.source_id,
        mode=mode,  # type: ignore[arg-type]
        dry_run=dry_run,
        changed=after[1] != before[1],
        replacements=count,
        hash_before=before[0],
        hash=after[0],
        diff=clip(unified_diff(before[1], after[1], src.source_id), RESULT_BYTES // 2),
    )
