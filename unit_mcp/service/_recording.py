"""The change log's record of one write call (who, which tool, the outcome, the change set: bytes of applied
changes only, and the test a write was kept on), and the lookups that find a first call's record for a replay."""

from __future__ import annotations

import time
from collections.abc import Sequence

from .. import tracing
from ..changelog import Change, Outcome, SourceChange
from ..loader import Source
from ..models import RunTestsResult
from ._caller import caller
from ._plan import Target
from ._units import Units


def tested(test: RunTestsResult) -> str:
    """The test a write was kept on, as the change log says it."""
    how = "passed" if test.passed else "timed out" if test.timed_out else f"failed (exit {test.exit_code})"
    kept = "the write was kept" if test.passed else "the write was put back"
    return f"test_{test.test_name} {how} in {test.duration_ms:.0f} ms; {kept}"


def record(
    svc: Units,
    tool: str,
    unit_id: str | None,
    source_id: str | None,
    outcome: Outcome,
    targets: list[Target],
    started: float,
    code: str | None = None,
    message: str | None = None,
) -> int | None:
    """One record, also set on the write's span (outcome, change id, the sources' hashes); bytes are kept of applied
    changes only. A log that cannot be written is logged, and the call's outcome stands."""
    keep = outcome == "applied"
    sources = [
        SourceChange(
            t.source.unit_id,
            t.source.source_id,
            t.action,
            t.hash_before,
            t.hash_after,
            t.before if keep else None,
            t.after if keep else None,
        )
        for t in targets
    ]
    change_id: int | None = None
    try:
        change_id = svc.change_log.record(
            caller=caller(),
            tool=tool,
            unit_id=None if unit_id is None else str(unit_id)[:200],
            source_id=None if source_id is None else str(source_id)[:1100],
            outcome=outcome,
            error_code=code,
            message=None if message is None else svc.host.redact(message)[:2000],
            duration_ms=(time.perf_counter() - started) * 1000,
            sources=sources,
        )
    except Exception:
        svc.host.logger.exception("recording a call of %s in the change log failed", tool)
    span = tracing.current()
    tracing.set_attributes(
        span,
        unit_mcp__outcome=outcome,
        unit_mcp__change_id=change_id,
        unit_mcp__hashes_before=[t.hash_before or "" for t in targets] or None,
        unit_mcp__hashes_after=[t.hash_after or "" for t in targets] or None,
    )
    if outcome != "applied":
        tracing.fail(span, code or outcome, message if outcome == "refused" else None)
    return change_id


def change_that_made(svc: Units, targets: Sequence[Target]) -> Change | None:
    """The newest applied (or outside) record that took every target from its hash before to its hash after (None:
    no such record: its writer died before recording it)."""
    wanted = {(t.source.unit_id, t.source.source_id, t.hash_before, t.hash_after) for t in targets}
    first = targets[0].source
    for change in svc.change_log.changes(unit_id=first.unit_id, source_id=first.source_id, limit=20):
        made = {(s.unit_id, s.source_id, s.hash_before, s.hash_after) for s in change.sources}
        if change.outcome in ("applied", "outside") and wanted <= made:
            return change
    return None


def bytes_before(svc: Units, src: Source, hash_before: str, hash_after: str) -> bytes | None:
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
