"""Edits of one source: `unit_apply_patch`, `unit_create_source`, `unit_revert` (and `unit_history`, the versions
it reverts to). Each plans its write and ends in `commit`."""

from __future__ import annotations

import contextlib

from .. import paths
from ..arguments import MAX_VERSION, ApplyPatchArgs, CreateSourceArgs, HistoryArgs, RevertArgs, takes
from ..errors import Exists, InvalidSourceId, NotSupported, TooLarge, UnknownVersion
from ..folderloader import FilesystemLoader
from ..loader import Source, SourceTooLarge
from ..loader import UnknownVersion as MissingVersion
from ..models import ApplyPatchResult, CreateSourceResult, HistoryResult, HistoryVersion
from ..paging import PAGE_OVERHEAD, RESULT_BYTES, decode_cursor, encode_cursor, fitting, size_of
from ..patching import Edit
from ._commit import commit
from ._patch import Patch, edit_plan
from ._plan import Committed, Plan, Target
from ._reading import QUICK_READ_BYTES
from ._recording import bytes_before
from ._units import Units


@takes(ApplyPatchArgs)
def apply_patch(svc: Units, args: ApplyPatchArgs) -> ApplyPatchResult:
    edit = Patch.of(svc, args)

    def plan() -> Plan[ApplyPatchResult]:
        src, data, text, current = svc.editable(
            args.unit_id, args.source_id, args.expected_hash, write=not args.dry_run
        )
        return edit_plan(svc, src, data, text, current, edit.apply(text, current), edit.mode, args.dry_run)

    return commit(
        svc,
        "unit_apply_patch",
        args.unit_id,
        args.source_id,
        plan,
        dry_run=args.dry_run,
        replayed=edit.first_call,
        test=args.test,
    )


def apply_patch_at_once(svc: Units, args: ApplyPatchArgs) -> ApplyPatchResult | None:
    """`apply_patch` of a dry run cheap enough for the event loop (less than the hop to a worker thread): an exact
    replacement whose `old` is in a folder's non-Python source of at most QUICK_READ_BYTES as sent. None for anything
    else (a syntax check, a tolerant match, a diff, a larger source), which the loader refuses before reading."""
    if not args.dry_run or args.old is None or args.source_id.endswith(".py"):
        return None
    if not isinstance(svc.loader, FilesystemLoader):
        return None
    edit = Patch.of(svc, args)
    src = svc.source(args.unit_id, args.source_id)
    try:
        data, text, current = svc.current(src, args.expected_hash, limit=QUICK_READ_BYTES)
    except TooLarge:
        return None
    if "\r" in args.old or args.old not in text:
        return None

    def plan() -> Plan[ApplyPatchResult]:
        return edit_plan(svc, src, data, text, current, edit.apply(text, current), edit.mode, dry_run=True)

    return commit(svc, "unit_apply_patch", args.unit_id, args.source_id, plan, dry_run=True)


def _whole(text: str) -> Edit:
    """A source replaced whole (a revert to a version)."""
    return Edit(text=text, count=1, match="exact", lines=[])


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
        svc.compile(src, data)  # a syntax error is refused before the existence check and the write
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

        return Plan([Target(src, None, data)], answer, compiled=True)

    return commit(
        svc,
        "unit_create_source",
        args.unit_id,
        args.source_id,
        plan,
        replayed=lambda: plan(made=True),
        test=args.test,
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
        data, text, current = svc.current(src, args.expected_hash)
        old = version(src)
        return edit_plan(svc, src, data, text, current, _whole(svc.text(src, old)), "revert", args.dry_run)

    def replayed() -> Plan[ApplyPatchResult] | None:
        """The first call, where the change log holds its record (a revert is not undone to find its bytes)."""
        if args.expected_hash is None:
            return None
        src = svc.source(args.unit_id, args.source_id)
        old = version(src)
        before = bytes_before(svc, src, args.expected_hash, paths.hash_bytes(old))
        if before is None:
            return None
        before_text, edit = svc.text(src, before), _whole(svc.text(src, old))
        return edit_plan(svc, src, before, before_text, paths.hash_bytes(before), edit, "revert", dry_run=False)

    return commit(
        svc,
        "unit_revert",
        args.unit_id,
        args.source_id,
        plan,
        dry_run=args.dry_run,
        replayed=replayed,
        test=args.test,
    )
