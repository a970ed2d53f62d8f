"""`unit_resolve`: each unit's facts (ids, files, docstring, public names, test names) in an index kept up to date
unit by unit as the host reloads them."""

from __future__ import annotations

from ..arguments import ResolveArgs, takes
from ..errors import InvalidArgument
from ..loader import LoaderError, Source, UnitKind, primary_source_id
from ..models import ResolveResult
from ..paging import PAGE_OVERHEAD, RESULT_BYTES, binding, decode_cursor, encode_cursor, fitting, json_size, size_of
from ..resolve import ResolveIndex, UnitFacts, source_facts
from ._units import Units


def unit_facts(svc: Units, unit_id: str, kind: UnitKind) -> UnitFacts:
    """What resolve knows of one unit, read from its sources: ids, files, docstrings, public names, routes, the
    names of its tests."""
    source_ids = svc.loader.source_ids(unit_id, kind)
    fields: list[tuple[str, str]] = [("unit_id", unit_id), ("module", svc.host.module_name(unit_id))]
    primary = primary_source_id(unit_id, kind)
    for source_id in source_ids:
        fields.append(("file", source_id))
        if source_id.startswith("test_") and source_id.endswith(".py"):
            fields.append(("test", source_id.removeprefix("test_").removesuffix(".py")))
            continue
        if not source_id.endswith(".py"):
            continue
        try:
            text = svc.loader.read(Source(unit_id, kind, source_id)).decode("utf-8")
        except (OSError, LoaderError, UnicodeDecodeError):
            continue
        fields.extend(fact for fact in source_facts(text) if fact[0] != "docstring" or source_id == primary)
    return UnitFacts(unit_id, tuple(fields))


def current_index(svc: Units) -> ResolveIndex:
    """The resolve index, built from every unit on first use and then brought up to date unit by unit."""
    with svc.index_lock:
        if svc.index is None:
            svc.stale_units.clear()
            svc.index = ResolveIndex()
            for unit_id, kind in svc.host.unit_kinds().items():
                svc.index.update(unit_id, unit_facts(svc, unit_id, kind))
        while svc.stale_units:
            unit_id = svc.stale_units.pop()
            now = svc.host.unit_kind(unit_id)
            svc.index.update(unit_id, None if now is None else unit_facts(svc, unit_id, now))
        return svc.index


@takes(ResolveArgs)
def resolve(svc: Units, args: ResolveArgs) -> ResolveResult:
    if not args.description.strip():
        raise InvalidArgument("description is empty.", hint="Describe the unit in a few words, e.g. 'click counter'.")
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
    ranked = current_index(svc).query(description, start + args.limit + 1)
    page = ranked[start : start + args.limit]
    more = len(ranked) > start + args.limit
    budget = RESULT_BYTES - PAGE_OVERHEAD - json_size(args.description)
    candidates = [*fitting(page, budget, size_of)]
    if not more and len(candidates) == len(page):
        return ResolveResult(description=args.description, candidates=candidates)
    cursor = encode_cursor("unit_resolve", start=start + len(candidates), description=binding(description))
    return ResolveResult(
        description=args.description, candidates=candidates, truncated=len(candidates) < len(page), next_cursor=cursor
    )
