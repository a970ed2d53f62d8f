"""Edits of one source: `unit_apply_patch`, `unit_create_source`, `unit_revert` (and `unit_history`, the versions
it reverts to). Each plans its write and ends in `commit`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from .. import paths
from ..arguments import MAX_VERSION, ApplyPatchArgs, CreateSourceArgs, HistoryArgs, RevertArgs, takes
from ..errors import Exists, InvalidSourceId, NotSupported, UnitError, UnknownVersion
from ..loader import Source, SourceTooLarge
from ..loader import UnknownVersion as MissingVersion
from ..models import ApplyPatchResult, CreateSourceResult, HistoryResult, HistoryVersion, RunTestsResult
from ..paging import PAGE_OVERHEAD, RESULT_BYTES, clip, decode_cursor, encode_cursor, fitting, size_of
from ..patching import (
    Edit,
    unified_diff,
)
from ._commit import commit
from ._patch import Patch
from ._plan import Committed, Plan, Target
from ._testruns import gate
from ._units import Units

MAX_MATCHED = 100
"""Places a result lists in `matched_lines` (a replace_all may change thousands; the result stays under 80 KB)."""


@takes(ApplyPatchArgs)
def apply_patch(svc: Units, args: ApplyPatchArgs) -> ApplyPatchResult:
    edit = Patch.of(svc, args)

    def plan() -> Plan[ApplyPatchResult]:
        src, data, text = svc.editable(args.unit_id, args.source_id, args.expected_hash, write=not args.dry_run)
        return _edit_plan(svc, src, data, text, edit.apply(text, paths.hash_bytes(data)), edit.mode, args.dry_run)

    def replayed() -> Plan[ApplyPatchResult] | None:
        return None if args.expected_hash is None else _patched(svc, args.unit_id, args.expected_hash, edit)

    return commit(
        svc,
        "unit_apply_patch",
        args.unit_id,
        args.source_id,
        plan,
        dry_run=args.dry_run,
        replayed=replayed,
        gate=_gate(svc, args.unit_id, args.test),
    )


def _gate(svc: Units, unit_id: str, test: str | None) -> Callable[[], RunTestsResult] | None:
    """The test a write keeps on (`test`, its name), run against the written sources."""
    return None if test is None else lambda: gate(svc, unit_id, test)


def _edit_plan(
    svc: Units, src: Source, data: bytes, text: str, edit: Edit, mode: str, dry_run: bool
) -> Plan[ApplyPatchResult]:
    """An edit of `src` from `text` (its bytes `data`) to `new_text`. A dry run may skip the full compile when the
    edited statements alone prove the source compiles; a write is compiled in full by `commit` (the reload runs
    that code) and only keeps the statement map current."""
    current, new_text, count = paths.hash_bytes(data), edit.text, edit.count
    changed = new_text != text
    new_data = svc.encode(src, new_text)
    new_hash = paths.hash_bytes(new_data)
    proven = (
        changed
        and src.source_id.endswith(".py")
        and (dry_run or svc.syntax.knows(current))
        and svc.syntax.compiles(current, text, new_hash, new_text, learn=not dry_run)
    )
    if changed and dry_run and not proven:
        svc.compile(src, new_data)
    targets = [Target(src, data, new_data)] if changed else []

    def answer(done: Committed) -> ApplyPatchResult:
        result = patch_result(src, mode, count, (current, text), (new_hash, new_text), dry_run=dry_run)
        result.reload = done.reloads.get(src.unit_id)
        result.change_id, result.already_applied = done.change_id, done.already_applied
        result.test, result.kept = done.test, done.kept
        result.match, result.matched_lines = edit.match, edit.lines[:MAX_MATCHED]
        return result

    return Plan(targets, answer)


def _patched(svc: Units, unit_id: str, expected_hash: str, edit: Patch) -> Plan[ApplyPatchResult] | None:
    """The first call of a repeated patch: the edit of the bytes hashing to `expected_hash`, if it makes what the
    source holds now. Those bytes come from the change log's record of the write or, when the writer died before
    recording it, from undoing the edit; the hash proves them."""
    src, data, text = svc.editable(unit_id, edit.source_id, None, write=True)
    befores = [] if (logged := _bytes_before(svc, src, expected_hash, paths.hash_bytes(data))) is None else [logged]
    with contextlib.suppress(UnitError):
        befores.append(svc.encode(src, edit.undo(text)[0]))
    for before in befores:
        if paths.hash_bytes(before) != expected_hash:
            continue
        before_text = svc.text(src, before)
        try:
            after = edit.apply(before_text)
        except UnitError:
            continue
        if svc.encode(src, after.text) == data:
            return _edit_plan(svc, src, before, before_text, after, edit.mode, dry_run=False)
    return None


def _bytes_before(svc: Units, src: Source, hash_before: str, hash_after: str) -> bytes | None:
    """The bytes before the newest change-log record that took the source from `hash_before` to `hash_after`."""
    for change in svc.change_log.changes(unit_id=src.unit_id, source_id=src.source_id, limit=20):
        if change.outcome in ("applied", "outside") and (change.hash_before, change.hash_after) == (
            hash_before,
            hash_after,
        ):
            full = svc.change_log.change(change.id)
            for source in full.sources if full else ():
                if (source.unit_id, source.source_id) == (src.unit_id, src.source_id):
                    return source.data_before
            return None
    return None


def _whole(text: str) -> Edit:
    """A source replaced whole (a revert to a version)."""
    return Edit(text=text, count=1, match="exact", lines=[])


def patch_result(
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


@takes(CreateSourceArgs)
def create_source(svc: Units, args: CreateSourceArgs) -> CreateSourceResult:
    def plan(*, made: bool = False) -> Plan[CreateSourceResult]:
        """The new source; `made`: as the first call made it (a repeat finds it there)."""
        unit_id, source_id = args.unit_id, args.source_id
        if svc.unit(unit_id) != "directory":
            raise NotSupported(
                f"Unit {unit_id!r} is a file unit; only directory units can hold more sources.",
                hint=f"Add code to {unit_id}.py with unit_apply_patch instead.",
            )
        svc.require("create", unit_id)
        src = svc.source(unit_id, source_id)
        svc.check_size("source", args.source)
        if paths.is_hidden_or_compiled(source_id.rsplit("/", 1)[-1]) or "__pycache__" in source_id.split("/"):
            raise InvalidSourceId(
                f"{source_id!r} would be hidden or a compiled file.", hint="Pick a visible file name."
            )
        data = svc.encode(src, args.source)
        svc.compile(src, data)  # before the lock: a syntax error is refused without waiting for a reload
        if not made and svc.exists(src):
            raise Exists(f"Unit {unit_id!r} already has {source_id!r}.")

        def answer(done: Committed) -> CreateSourceResult:
            return CreateSourceResult(
                unit_id=unit_id,
                source_id=source_id,
                hash=paths.hash_bytes(data),
                size=len(data),
                reload=done.reloads.get(unit_id),
                change_id=done.change_id,
                already_applied=done.already_applied,
                test=done.test,
                kept=done.kept,
            )

        return Plan([Target(src, None, data)], answer)

    return commit(
        svc,
        "unit_create_source",
        args.unit_id,
        args.source_id,
        plan,
        replayed=lambda: plan(made=True),
        gate=_gate(svc, args.unit_id, args.test),
    )


@takes(HistoryArgs)
def history(svc: Units, args: HistoryArgs) -> HistoryResult:
    """Versions newest first, `limit` a page and as many as fit one result; the cursor names the version below
    which the next page starts (versions written meanwhile do not shift it)."""
    src = svc.source(args.unit_id, args.source_id)
    svc.require_history(src.unit_id)
    below = MAX_VERSION + 1
    if args.cursor is not None:
        below = decode_cursor(args.cursor, "unit_history", {"below": int})["below"]
    wanted = args.limit + 1  # one more tells whether another page follows
    while True:
        fetched = svc.loader.history(src, wanted)
        older = [v for v in fetched if v.version < below]
        if len(older) > args.limit or len(fetched) < wanted:
            break
        wanted *= 2
    if not fetched:  # refuse a source that does not exist, without reading it
        with contextlib.suppress(SourceTooLarge), svc.storage(src, "read"):
            svc.loader.read(src, max_bytes=0)
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
def revert(svc: Units, args: RevertArgs) -> ApplyPatchResult:
    """Put a source back to a version from its history, through the same commit as a patch."""

    def version(src: Source) -> bytes:
        svc.require_history(src.unit_id)
        try:
            return svc.loader.version_data(src, args.version)
        except MissingVersion:
            raise UnknownVersion(f"{src.source_id} of unit {src.unit_id} has no version {args.version}.") from None

    def plan() -> Plan[ApplyPatchResult]:
        src = svc.source(args.unit_id, args.source_id)
        svc.require_history(src.unit_id)
        if not args.dry_run:
            svc.require("write", src.unit_id)
        data, text = svc.current(src, args.expected_hash)
        old = version(src)
        return _edit_plan(svc, src, data, text, _whole(svc.text(src, old)), "revert", args.dry_run)

    def replayed() -> Plan[ApplyPatchResult] | None:
        """The first call, where the change log holds its record (a revert is not undone to find its bytes)."""
        if args.expected_hash is None:
            return None
        src = svc.source(args.unit_id, args.source_id)
        old = version(src)
        before = _bytes_before(svc, src, args.expected_hash, paths.hash_bytes(old))
        if before is None:
            return None
        return _edit_plan(svc, src, before, svc.text(src, before), _whole(svc.text(src, old)), "revert", dry_run=False)

    return commit(
        svc,
        "unit_revert",
        args.unit_id,
        args.source_id,
        plan,
        dry_run=args.dry_run,
        replayed=replayed,
        gate=_gate(svc, args.unit_id, args.test),
    )
