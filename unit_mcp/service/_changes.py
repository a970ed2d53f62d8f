"""The change log's tools: `unit_changes`, `unit_checkpoint`, and the two that put sources back across units,
`unit_rollback` and `unit_revert_change`, which plan their targets and end in `commit`."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime

from .. import paths
from ..arguments import ChangesArgs, takes
from ..changelog import Change, iso_time
from ..errors import InvalidArgument
from ..models import (
    ChangeClient,
    ChangedSource,
    ChangeRecord,
    ChangesResult,
)
from ._units import Units

MAX_LISTED_SOURCES = 20
"""Sources of one record's change set that unit_changes lists (a rollback's may have hundreds)."""
MAX_PAGE_BYTES = 60_000
"""A unit_changes page ends before its JSON passes this (results stay under 80 KB); next_cursor goes on."""
MAX_SHOWN_DIFF = 8000
"""Characters of each source's diff a rollback's or a revert's dry run shows."""
_CURSOR = re.compile(r"before:([1-9][0-9]{0,18})")


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


@takes(ChangesArgs)
def changes(svc: Units, args: ChangesArgs) -> ChangesResult:
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
    log = svc.change_log
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


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("ascii")
    except ValueError:
        return ""
