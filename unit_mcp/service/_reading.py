"""The tools that read: `unit_list`, `unit_inspect`, `unit_read_source`, `unit_read_log`."""

from __future__ import annotations

import ast
import typing
from collections.abc import Sequence

from .. import applog, paths
from ..arguments import MAX_LOG_LINES, ListArgs, ReadLogArgs, ReadSourceArgs, UnitArgs, takes
from ..errors import InvalidArgument, StaleHash, TooLarge
from ..folderloader import FilesystemLoader
from ..loader import LoaderError, Source, UnitKind, primary_source_id
from ..models import (
    InspectResult,
    Lifecycle,
    ReadLogResult,
    ReadSourceResult,
    Replica,
    SourceArtifact,
    SourceHandle,
    UnitListResult,
    UnitSummary,
)
from ..paging import (
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
from ..patching import line_ending_kind
from ..reloading import LIFECYCLE
from ._units import Units

LINE_ENDINGS = typing.get_args(ReadSourceResult.model_fields["line_ending"].annotation)
QUICK_READ_BYTES = RESULT_BYTES
"""unit_read_source answers a folder's source up to this size on the event loop (`read_source_at_once`)."""


@takes(ListArgs, name="list")
def list_units(svc: Units, args: ListArgs) -> UnitListResult:
    """Units sorted by unit_id, as many as fit one result; the cursor names the last unit shown."""
    after = "" if args.cursor is None else decode_cursor(args.cursor, "unit_list", {"after": str})["after"]
    kinds = svc.host.unit_kinds()
    ids = sorted(unit_id for unit_id in kinds if unit_id > after)
    replicas = _replicas(svc, ids)
    summaries = (_summary(svc, unit_id, kinds[unit_id], replicas.get(unit_id)) for unit_id in ids)
    units = [*fitting(summaries, RESULT_BYTES - PAGE_OVERHEAD, size_of)]
    if len(units) == len(ids):
        return UnitListResult(units=units)
    return UnitListResult(units=units, truncated=True, next_cursor=encode_cursor("unit_list", after=units[-1].unit_id))


def _summary(svc: Units, unit_id: str, kind: UnitKind, replica: Replica | None) -> UnitSummary:
    error = svc.host.load_error(unit_id)
    return UnitSummary(
        unit_id=unit_id,
        loader=svc.loader.name,
        source_handle=SourceHandle(kind=kind, source_id=primary_source_id(unit_id, kind)),
        edit_capabilities=svc.edit_capabilities(kind),
        test_capabilities=[*fitting(svc.test_names(unit_id, kind), MAX_FIELD_BYTES, json_size)],
        commit_capability=svc.loader.capabilities.history,
        loader_capabilities=svc.loader.capabilities.names(),
        loaded=svc.host.is_loaded(unit_id),
        load_error=None if error is None else clip(error, MAX_FIELD_BYTES),
        replica=replica,
    )


def _replicas(svc: Units, unit_ids: Sequence[str]) -> dict[str, Replica]:
    """What this server serves against the store, for loaders shared by several servers (`unit_versions`)."""
    return {
        unit_id: Replica(served_version=v.served, stored_version=v.stored, behind=v.behind, reload_error=v.error)
        for unit_id, v in svc.loader.unit_versions(list(unit_ids)).items()
    }


@takes(UnitArgs)
def inspect(svc: Units, args: UnitArgs) -> InspectResult:
    unit_id = args.unit_id
    kind = svc.unit(unit_id)
    module = svc.host.module(unit_id)
    lifecycle = {
        name: name if module is not None and callable(getattr(module, name, None)) else None for name in LIFECYCLE
    }
    if module is None:
        primary = primary_source_id(unit_id, kind)
        try:
            tree = ast.parse(svc.loader.read(Source(unit_id, kind, primary)))
            defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            lifecycle = {name: name if name in defined else None for name in LIFECYCLE}
        except (OSError, SyntaxError, ValueError, LoaderError):
            pass
    docstring = (module.__doc__ if module is not None else None) or None
    artifacts = [
        SourceArtifact(source_id=s.source_id, kind=s.kind, size=s.size, hash=s.hash, primary=s.primary)
        for s in svc.loader.sources(unit_id, kind)
    ]
    main = next((a for a in artifacts if a.primary), None)
    tests, activities = svc.test_names(unit_id, kind), svc.host.activities(unit_id)
    error = svc.host.load_error(unit_id)
    # Lists get a share each; the texts one field's bound (only a unit of thousands of files comes near).
    shown = [*fitting(artifacts, RESULT_BYTES // 2, size_of)]
    shown_tests = [*fitting(tests, RESULT_BYTES // 8, json_size)]
    shown_activities = [*fitting(activities, RESULT_BYTES // 8, json_size)]
    cut = (len(shown), len(shown_tests), len(shown_activities)) != (len(artifacts), len(tests), len(activities))
    return InspectResult(
        truncated=cut,
        unit_id=unit_id,
        loader=svc.loader.name,
        loader_capabilities=svc.loader.capabilities.names(),
        module=svc.host.module_name(unit_id),
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
        replica=_replicas(svc, [unit_id]).get(unit_id),
        activities=shown_activities,
        edit_capabilities=svc.edit_capabilities(kind),
        test_capabilities=shown_tests,
        source_artifacts=shown,
    )


@takes(ReadSourceArgs)
def read_source(svc: Units, args: ReadSourceArgs) -> ReadSourceResult:
    """The source's text, or one page of it cut after a line when the whole would not fit one result; every page
    carries the hash of the whole source, and a cursor of a source changed since is refused."""
    return _read_source(svc, args, svc.max_read_bytes)


def read_source_at_once(svc: Units, args: ReadSourceArgs) -> ReadSourceResult | None:
    """`read_source` of a first page of at most QUICK_READ_BYTES from a folder, cheap enough for the event loop
    (less than the hop to a worker thread); None for anything else, which the loader refuses before reading."""
    if args.cursor is not None or not isinstance(svc.loader, FilesystemLoader):
        return None
    try:
        return _read_source(svc, args, QUICK_READ_BYTES)
    except TooLarge:
        return None


def _read_source(svc: Units, args: ReadSourceArgs, limit: int) -> ReadSourceResult:
    src = svc.source(args.unit_id, args.source_id)
    svc.require("read", src.unit_id)
    data = svc.read(src, limit)
    digest = paths.hash_bytes(data)
    bound = None
    if args.cursor is None:
        start, text = 0, svc.text(src, data)
        line_ending = line_ending_kind(text)
    else:  # the hash of the first page vouches for the text: not decoded again, page after page
        fields: dict[str, type] = {"offset": int, "hash": str, "source": str, "le": str}
        state = decode_cursor(args.cursor, "unit_read_source", fields)
        if state["source"] != (bound := binding(src.unit_id, src.source_id)):
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
        next_cursor=encode_cursor(
            "unit_read_source",
            offset=end,
            hash=digest,
            source=bound or binding(src.unit_id, src.source_id),
            le=line_ending,
        )
        if more
        else None,
    )


@takes(ReadLogArgs)
def read_log(svc: Units, args: ReadLogArgs) -> ReadLogResult:
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
    files = applog.log_files(svc.host.log_path, svc.host.log_backups)
    if offset is not None:
        page = applog.forward(files, grep=grep or None, count=count, start=offset)
    else:
        page = applog.newest(files, grep=grep or None, count=count, before=before)
    budget = RESULT_BYTES - PAGE_OVERHEAD - json_size(grep or "")
    redact = svc.host.redact

    def size(line: tuple[int, str]) -> int:
        return json_size(line[1]) + len(str(line[0])) + 1

    # Forward: the oldest lines that fit; back: the newest. Only the lines weighed are redacted (one past the last
    # that fits): a page of long lines keeps a few of the `count` found, and redacting them all was 80% of a call.
    ordered = page.lines if offset is not None else reversed(page.lines)
    kept = [*fitting(((number, redact(text)) for number, text in ordered), budget, size)]
    if offset is None:
        kept.reverse()
    truncated = len(kept) < len(page.lines)
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
