"""Putting sources back across units: `unit_rollback` (to a checkpoint) and `unit_revert_change` (one change
undone). Each plans its targets from the change log and ends in `commit`, all or nothing."""

from __future__ import annotations

from collections.abc import Callable

from ..arguments import RevertChangeArgs, RollbackArgs, takes
from ..changelog import Change, Checkpoint
from ..errors import NotSupported, StaleHash, UnitError, UnknownChange, UnknownCheckpoint
from ..models import RestoreConflict, RestoredSource, RevertChangeResult, RollbackResult
from ..patching import unified_diff
from ._checkpoints import Since, content, content_targets
from ._commit import commit
from ._plan import Committed, Plan, Target, hash_or_none
from ._units import Units

MAX_PAGE_BYTES = 60_000
"""The diffs of a dry run stop before their JSON passes this (results stay under 80 KB)."""
MAX_SHOWN_DIFF = 8000
"""Characters of each source's diff a rollback's or a revert's dry run shows."""


@takes(RollbackArgs)
def rollback(svc: Units, args: RollbackArgs) -> RollbackResult:
    """Every source changed since the checkpoint back to its bytes at the checkpoint; a source changed outside the
    tools since then is a conflict, left alone unless `force`. A checkpoint that holds content (`_checkpoints`) puts
    back every source of its units from it (and their state, if it kept it); one of the change log alone (taken
    before the blob store) knows only what the log recorded."""

    def checkpoint() -> Checkpoint:
        found = svc.change_log.get_checkpoint(args.checkpoint_id)
        if found is None:
            raise UnknownCheckpoint(f"There is no checkpoint {args.checkpoint_id} in the change log.")
        return found

    def plan() -> Plan[RollbackResult]:
        mark = checkpoint()
        if not args.dry_run:
            svc.require_writable()
        since: dict[tuple[str, str], Since] = {}
        for change in svc.change_log.changes_after(mark.after_change):
            if change.outcome not in ("applied", "outside"):
                continue
            for s in change.sources:
                entry = since.setdefault(
                    (s.unit_id, s.source_id), Since(s.action != "unknown", s.data_before, s.hash_before)
                )
                entry.expected = s.hash_after
                entry.outside = entry.outside or change.outcome == "outside"
        targets: list[Target] = []
        conflicts: list[RestoreConflict] = []
        states = None
        if mark.content:
            tree = content(svc, mark)
            targets, conflicts = content_targets(svc, mark, tree, since, args.force)
            states = tree.states
            since.clear()
        for (unit_id, source_id), entry in sorted(since.items()):
            try:
                src = svc.source(unit_id, source_id)
                current = svc.read_or_none(src)
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
            now = hash_or_none(current)
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
            targets.append(Target(src, current, entry.data))

        def answer(done: Committed) -> RollbackResult:
            return RollbackResult(
                checkpoint_id=mark.id,
                dry_run=args.dry_run,
                sources=_shown(targets, done),
                conflicts=conflicts,
                reloaded=[*done.reloads],
                restored_state=sorted(u for u, r in done.reloads.items() if r.restored_state and u in (states or {})),
                change_id=done.change_id,
                already_applied=done.already_applied,
            )

        return Plan(targets, answer, states)

    def replayed() -> Plan[RollbackResult] | None:
        """The newest rollback since the checkpoint, as the first call of a repeat."""
        mark = checkpoint()
        for change in reversed(svc.change_log.changes_after(mark.after_change)):
            if change.tool == "unit_rollback" and change.outcome == "applied" and change.sources:
                return _rolled_back(svc, mark, change)
        return None

    return commit(svc, "unit_rollback", None, None, plan, dry_run=args.dry_run, replayed=replayed)


def _rolled_back(svc: Units, mark: Checkpoint, change: Change) -> Plan[RollbackResult]:
    """A rollback's record as the plan it carried out."""
    targets = [Target(svc.source(s.unit_id, s.source_id), s.data_before, s.data_after) for s in change.sources]
    return Plan(
        targets,
        lambda done: RollbackResult(
            checkpoint_id=mark.id,
            dry_run=False,
            sources=_shown(targets, done),
            conflicts=[],
            reloaded=[*done.reloads],
            change_id=done.change_id,
            already_applied=True,
        ),
    )


@takes(RevertChangeArgs)
def revert_change(svc: Units, args: RevertChangeArgs) -> RevertChangeResult:
    """Every source of one change back to its bytes before it, refused with `stale_hash` if one moved on."""

    def reverted() -> Change:
        change = svc.change_log.change(args.change_id)
        if change is None:
            raise UnknownChange(f"There is no change {args.change_id} in the change log.")
        if change.outcome not in ("applied", "outside") or not change.sources:
            raise NotSupported(
                f"Change {change.id} ({change.outcome}) changed no source; there is nothing to revert.",
                hint="Revert a change whose outcome is applied or outside (unit_changes).",
            )
        return change

    def answer(targets: list[Target]) -> Callable[[Committed], RevertChangeResult]:
        return lambda done: RevertChangeResult(
            reverted_change_id=args.change_id,
            dry_run=args.dry_run,
            sources=_shown(targets, done),
            reloaded=[*done.reloads],
            change_id=done.change_id,
            already_applied=done.already_applied,
        )

    def plan() -> Plan[RevertChangeResult]:
        change = reverted()
        if not args.dry_run:
            svc.require_writable()
        targets = []
        for s in change.sources:
            if s.action == "unknown":
                raise NotSupported(
                    f"Change {change.id} made outside these tools changed {s.source_id} of unit {s.unit_id}, whose "
                    "bytes before it the change log never saw; nothing was reverted.",
                    hint="Edit the source back with unit_apply_patch instead.",
                )
            src = svc.source(s.unit_id, s.source_id)
            current = svc.read_or_none(src)
            now = hash_or_none(current)
            if now != s.hash_after:
                raise StaleHash(
                    f"{s.source_id} of unit {s.unit_id} changed since change {change.id}: it hashes to {now}, the "
                    f"change left {s.hash_after}; nothing was reverted.",
                    expected_hash=s.hash_after,
                    current_hash=now,
                    hint="Revert the later changes first (unit_changes lists them), or edit the source directly.",
                )
            targets.append(Target(src, current, s.data_before))
        return Plan(targets, answer(targets))

    def replayed() -> Plan[RevertChangeResult]:
        change = reverted()
        targets = [Target(svc.source(s.unit_id, s.source_id), s.data_after, s.data_before) for s in change.sources]
        return Plan(targets, answer(targets))

    return commit(svc, "unit_revert_change", None, None, plan, dry_run=args.dry_run, replayed=replayed)


def _shown(targets: list[Target], done: Committed) -> list[RestoredSource]:
    """The targets as a result lists them; a dry run with each diff while the diffs fit in MAX_PAGE_BYTES."""
    shown, budget = [], MAX_PAGE_BYTES
    for target in targets:
        diff = None
        if done.dry_run:
            diff = _diff(target.source.source_id, target.before, target.after)
            budget -= len(diff)
            if budget < 0:
                diff = "[diff left out: the result would pass 80 KB; unit_read_source shows the source now]"
        shown.append(
            RestoredSource(
                unit_id=target.source.unit_id,
                source_id=target.source.source_id,
                action="removed" if target.after is None else "recreated" if target.before is None else "restored",
                hash_before=target.hash_before,
                hash=target.hash_after,
                diff=diff,
            )
        )
    return shown


def _diff(source_id: str, before: bytes | None, after: bytes | None) -> str:
    text = unified_diff(
        (before or b"").decode("utf-8", "replace"), (after or b"").decode("utf-8", "replace"), source_id
    )
    return text if len(text) <= MAX_SHOWN_DIFF else text[:MAX_SHOWN_DIFF] + f"\n... [{len(text) - MAX_SHOWN_DIFF} more]"
