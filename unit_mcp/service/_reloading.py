"""A unit reloaded after a write, as the tools report it: the engine's account of the reload, its span, and the
refusal that says what became of the written sources when it failed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import tracing
from ..errors import ReloadFailed
from ..models import ActivityEvidence, ReloadResult
from ..paging import MAX_FIELD_BYTES, clip
from ..reloading import OWN_STATE, Reloaded, ReloadError
from ._plan import Target
from ._units import Units


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
        blocked_ms=reloaded.blocked_ms,
        window_ms=reloaded.window_ms,
    )


def reload_unit(
    svc: Units, unit_id: str, undo: Callable[[], bool] | None = None, state: Any = OWN_STATE
) -> ReloadResult:
    with tracing.span("unit reload", {"unit_mcp.unit_id": unit_id}) as span:
        try:
            result = reload_result(svc.host.reload(unit_id, rollback_source=undo, state=state))
        except ReloadError as exc:
            tracing.set_attributes(span, unit_mcp__reload__stage=exc.stage)
            tracing.fail(span, "reload_failed")
            raise ReloadFailed(
                f"Reloading unit {unit_id!r} failed at {exc.stage}: {exc.error}.", **exc.evidence
            ) from None
        tracing.set_attributes(
            span,
            unit_mcp__reload__duration_ms=result.duration_ms,
            unit_mcp__reload__blocked_ms=result.blocked_ms,
            unit_mcp__reload__window_ms=result.window_ms,
            unit_mcp__reload__restored_state=result.restored_state,
        )
        return result


def undone(failed: ReloadFailed, targets: list[Target], superseded: list[tuple[Target, str | None]]) -> ReloadFailed:
    """The reload's failure, saying what became of the written sources."""
    details, hint = dict(failed.details), None
    if superseded:
        target, now = superseded[0]
        details["superseded_by"] = now
        said = (
            f" {target.source.source_id} was changed by someone else during the reload (it now "
            f"{'hashes to ' + now if now else 'is gone'}): their version was kept, not overwritten with the previous "
            "one."
        )
        hint = "Call unit_read_source to see the version someone else wrote before you edit again."
    elif len(targets) == 1:
        said = " The previous source was restored and is still running."
    else:
        said = " Every source was put back as it was before this call; nothing changed."
    return ReloadFailed(failed.message + said, hint=hint, **details)
