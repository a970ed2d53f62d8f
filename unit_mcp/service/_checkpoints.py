"""Checkpoints that hold content: `unit_checkpoint` keeps the bytes of every source in its scope (and, with
`with_state`, each unit's snapshot() state) in the change log's blob store (`blobstore.py`), and a rollback to such
a checkpoint plans its targets from them: every source back to its bytes at the checkpoint, whoever changed it, the
sources created since removed and the ones removed since back."""

from __future__ import annotations

import contextlib
import gc
import json
from collections.abc import Hashable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import paths
from ..arguments import CheckpointArgs, takes
from ..blobstore import BlobMissing, Tree
from ..changelog import Checkpoint
from ..errors import CheckpointIncomplete, SnapshotFailed, UnitError, UnknownSource
from ..loader import LoaderError, Source, UnitKind
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
    locks so no tool write lands half-way; with `with_state`, each loaded unit's snapshot() state too.

    A source whose stamp (`Loader.source_stamps`: a file's inode, size and times, a row's newest version) is the
    same as when it was last hashed is not read again. Units never surveyed are surveyed once before the locks
    are taken, so under them only what changed meanwhile is read."""
    if args.unit_ids is None:
        scope = svc.host.unit_kinds()
    else:
        scope = {u: svc.unit(u) for u in sorted({paths.validate_unit_id(u) for u in args.unit_ids})}
    ids = sorted(scope)
    log = svc.change_log
    read: dict[str, bytes] = {}
    unknown = {unit_id: kind for unit_id, kind in scope.items() if unit_id not in svc.stamps}
    if unknown:  # unlocked, the units never surveyed: every source is read and hashed, then vouched for by stamps
        _survey(svc, unknown, read)
    with locked(svc, ids), _no_collection():
        units = _survey(svc, scope, read)  # only what changed since the last survey is read
        wanted = {h for _, sources in units.values() for h in sources.values()}
        blobs = _read_missing(svc, units, log.missing_blobs(sorted(wanted)), read)
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


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """The cyclic garbage collector paused while the locks are held: a checkpoint of 10,000 units makes ~100,000
    small containers (no cycles) and, in a process whose heap holds 10,000 loaded units, the full collections they
    set off took up to 1.5 s of a 2.3 s checkpoint, all of it under every unit's lock."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


KEPT_BYTES = 64 * 1024 * 1024
"""The bytes a checkpoint keeps of the sources it read while surveying (so that a blob the store lacks is not read
twice); past this, a missing blob is read again."""


def _survey(svc: Units, scope: dict[str, UnitKind], read: dict[str, bytes]) -> dict[str, tuple[str, dict[str, str]]]:
    """unit id -> (kind, source id -> hash) of every source in scope: a source whose stamp matches the one it had
    when last hashed keeps that hash, every other one is read (its bytes kept in `read`, by hash, up to KEPT_BYTES).
    A unit the loader gives no stamps for is hashed in full (`Loader.sources`)."""
    stamps = svc.loader.source_stamps(scope) or {}
    units: dict[str, tuple[str, dict[str, str]]] = {}
    kept_bytes = sum(map(len, read.values()))
    for unit_id, kind in scope.items():
        now = stamps.get(unit_id)
        if now is None:
            svc.stamps.pop(unit_id, None)
            units[unit_id] = (kind, {s.source_id: s.hash for s in svc.loader.sources(unit_id, kind)})
            continue
        known = svc.stamps.get(unit_id, {})
        hashes: dict[str, str] = {}
        kept: dict[str, tuple[Hashable, str]] = {}
        for source_id, stamp in sorted(now.items()):
            last = known.get(source_id)
            if stamp is not None and last is not None and last[0] == stamp:
                hashes[source_id], kept[source_id] = last[1], last
                continue
            try:  # read after the stamp was taken: a stamp that still matches later vouches for these bytes
                data = svc.loader.read(Source(unit_id, kind, source_id))
            except (LoaderError, OSError):
                continue
            hashes[source_id] = digest = paths.hash_bytes(data)
            if stamp is not None:
                kept[source_id] = (stamp, digest)
            if digest not in read and kept_bytes + len(data) <= KEPT_BYTES:
                read[digest] = data
                kept_bytes += len(data)
        svc.stamps[unit_id] = kept
        units[unit_id] = (kind, hashes)
    return units


def _read_missing(
    svc: Units, units: dict[str, tuple[str, dict[str, str]]], missing: set[str], read: dict[str, bytes]
) -> dict[str, bytes]:
    """The bytes of the sources whose hash the store lacks (those read while surveying are not read again); a
    source changed since it was listed goes into the tree with the hash of what was read, one gone since is left
    out."""
    blobs: dict[str, bytes] = {}
    for unit_id, (kind, sources) in units.items():
        for source_id, digest in list(sources.items()):
            if digest not in missing or digest in blobs:
                continue
            if digest in read:
                blobs[digest] = read[digest]
                continue
            try:
                data = svc.loader.read(Source(unit_id, kind, source_id))  # type: ignore[arg-type]
            except (UnknownSource, LoaderError, OSError):
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
