"""Checkpoints that hold content: `unit_checkpoint` keeps the bytes of every source in its scope (and, with
`with_state`, each unit's snapshot() state) in the change log's blob store (`blobstore.py`), and a rollback to such
a checkpoint plans its targets from them: every source back to its bytes at the checkpoint, whoever changed it, the
sources created since removed and the ones removed since back."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import paths
from ..arguments import CheckpointArgs, takes
from ..blobstore import BlobMissing, Tree
from ..changelog import Checkpoint
from ..errors import CheckpointIncomplete, SnapshotFailed, UnitError, UnknownSource
from ..loader import Source
from ..models import CheckpointResult, RestoreConflict
from ._caller import caller
from ._commit import locked
from ._plan import Target
from ._units import Units


@dataclass
class Since:
    """What the change log says of one source since a checkpoint."""

    known: bool
    data: bytes | None
    hash: str | None
    expected: str | None = None
    outside: bool = False


@takes(CheckpointArgs)
def checkpoint(svc: Units, args: CheckpointArgs) -> CheckpointResult:
    """Every source of the units in scope into the blob store (only the blobs it lacks are read), under the units'
    locks so no tool write lands half-way; with `with_state`, each loaded unit's snapshot() state too."""
    kinds = svc.host.unit_kinds()
    ids = sorted(kinds) if args.unit_ids is None else sorted({paths.validate_unit_id(u) for u in args.unit_ids})
    for unit_id in ids:
        svc.unit(unit_id)
    log = svc.change_log
    with locked(svc, ids):
        units: dict[str, tuple[str, dict[str, str]]] = {}
        for unit_id in ids:
            kind = svc.unit(unit_id)
            units[unit_id] = (kind, {s.source_id: s.hash for s in svc.loader.sources(unit_id, kind)})
        wanted = {h for _, sources in units.values() for h in sources.values()}
        blobs = _read_missing(svc, units, log.missing_blobs(sorted(wanted)))
        states = _states(svc, ids) if args.with_state else None
        made = log.checkpoint(args.label, caller(), Tree(units, states), blobs)
    return CheckpointResult(
        checkpoint_id=made.id,
        time=made.time,
        label=made.label,
        after_change_id=made.after_change,
        units=len(units),
        sources=sum(len(s) for _, s in units.values()),
        bytes_added=made.bytes_added,
        with_state=states is not None,
    )


def _read_missing(svc: Units, units: dict[str, tuple[str, dict[str, str]]], missing: set[str]) -> dict[str, bytes]:
    """The bytes of the sources whose hash the store lacks; a source changed since it was listed goes into the tree
    with the hash of what was read, one gone since is left out."""
    blobs: dict[str, bytes] = {}
    for unit_id, (kind, sources) in units.items():
        for source_id, digest in list(sources.items()):
            if digest not in missing or digest in blobs:
                continue
            try:
                data = svc.loader.read(Source(unit_id, kind, source_id))  # type: ignore[arg-type]
            except UnknownSource:
                del sources[source_id]
                continue
            sources[source_id] = paths.hash_bytes(data)
            blobs[sources[source_id]] = data
    return blobs


def _states(svc: Units, ids: list[str]) -> dict[str, Any]:
    """unit id → its snapshot() state (JSON), for the loaded units that have snapshot()."""
    states: dict[str, Any] = {}
    for unit_id in ids:
        if not svc.host.is_loaded(unit_id):
            continue
        try:
            supported, state = svc.host.snapshot(unit_id)
        except Exception as exc:
            raise SnapshotFailed(f"snapshot() of unit {unit_id!r} raised {svc.host.redact(repr(exc))}.") from None
        if not supported:
            continue
        try:
            states[unit_id] = json.loads(json.dumps(state))
        except (TypeError, ValueError) as exc:
            raise SnapshotFailed(f"snapshot() of unit {unit_id!r} returned a value that is not JSON: {exc}.") from None
    return states


def content(svc: Units, mark: Checkpoint) -> Tree:
    """What a content checkpoint holds, refused with `checkpoint_incomplete` if its tree or state is gone."""
    try:
        tree = svc.change_log.checkpoint_tree(mark.id)
    except BlobMissing as exc:
        raise _incomplete(mark, exc) from None
    assert tree is not None
    return tree


def _incomplete(mark: Checkpoint, exc: BlobMissing) -> CheckpointIncomplete:
    return CheckpointIncomplete(
        f"Checkpoint {mark.id} cannot be rolled back to: {exc}; nothing was written.", blob=exc.digest
    )


def content_targets(
    svc: Units, mark: Checkpoint, tree: Tree, since: Mapping[tuple[str, str], Since], force: bool
) -> tuple[list[Target], list[RestoreConflict]]:
    """Every source of the checkpoint's units that differs from its bytes there, as a target; a source changed
    since by someone the change log does not show as expected (outside the tools, or with no record) is a conflict
    unless `force`. Every blob needed is read and checked before anything is planned."""
    wanted: list[tuple[Source, str | None]] = []
    conflicts: list[RestoreConflict] = []
    for unit_id, (_, sources) in sorted(tree.units.items()):
        try:
            kind = svc.unit(unit_id)
            now = {s.source_id: s.hash for s in svc.loader.sources(unit_id, kind)}
        except UnitError as exc:
            conflicts.append(
                RestoreConflict(
                    unit_id=unit_id, source_id="*", reason=exc.message, current_hash=None, expected_hash=None
                )
            )
            continue
        for source_id in sorted(set(sources) | set(now)):
            then, current = sources.get(source_id), now.get(source_id)
            if then == current:
                continue
            entry = since.get((unit_id, source_id))
            reason = None
            if entry is None:
                reason = "changed since the checkpoint with no record of it in the change log"
            elif entry.outside:
                reason = "changed outside these tools since the checkpoint"
            elif current != entry.expected:
                reason = "changed outside these tools since the change log's last record of it"
            if reason is not None and not force:
                expected = None if entry is None else entry.expected
                conflicts.append(
                    RestoreConflict(
                        unit_id=unit_id,
                        source_id=source_id,
                        reason=reason,
                        current_hash=current,
                        expected_hash=expected,
                    )
                )
                continue
            wanted.append((Source(unit_id, kind, source_id), then))
    try:
        blobs = svc.change_log.blobs([h for _, h in wanted if h is not None])
    except BlobMissing as exc:
        raise _incomplete(mark, exc) from None
    targets = []
    for src, then in wanted:
        after = None if then is None else blobs[then]
        before = svc.read_or_none(src)
        if before != after:
            targets.append(Target(src, before, after))
    return targets, conflicts
