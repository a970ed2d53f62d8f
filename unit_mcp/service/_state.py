"""A unit's state and code as they run: `unit_reload`, `unit_snapshot`, `unit_restore_snapshot`, and the escape
hatch `unit_request_local_access`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..arguments import LocalAccessArgs, RestoreSnapshotArgs, UnitArgs, takes
from ..changelog import iso_time
from ..errors import NotSupported, RestoreFailed, SnapshotFailed, UnitNotLoaded, UnknownSnapshot
from ..host import RestoreError
from ..localaccess import LocalAccess
from ..models import LocalAccessResult, LocalFolderHandle, ReloadResult, RestoreSnapshotResult, SnapshotResult
from ..paging import PAGE_OVERHEAD, RESULT_BYTES, json_size
from ..reloading import DrainTimeout
from ._caller import caller
from ._reloading import reload_unit
from ._units import Units


@takes(UnitArgs)
def reload(svc: Units, args: UnitArgs) -> ReloadResult:
    svc.unit(args.unit_id)
    with svc.host.unit_lock(args.unit_id):
        return reload_unit(svc, args.unit_id)


@takes(UnitArgs)
def snapshot(svc: Units, args: UnitArgs) -> SnapshotResult:
    unit_id = args.unit_id
    svc.unit(unit_id)
    if not svc.host.is_loaded(unit_id):
        raise UnitNotLoaded(f"Unit {unit_id!r} is not loaded: {svc.host.load_error(unit_id)}")
    try:
        supported, state = svc.host.snapshot(unit_id)
    except Exception as exc:
        raise SnapshotFailed(f"snapshot() of unit {unit_id!r} raised {svc.host.redact(repr(exc))}.") from None
    try:
        kept = json.dumps(state)
    except (TypeError, ValueError) as exc:
        raise SnapshotFailed(f"snapshot() of unit {unit_id!r} returned a value that is not JSON: {exc}.") from None
    snapshot_id = svc.host.keep_snapshot(unit_id, kept) if supported else None
    shown = _redacted(svc, json.loads(kept))
    if json_size(shown) > RESULT_BYTES - PAGE_OVERHEAD:
        return SnapshotResult(unit_id=unit_id, supported=supported, truncated=True, snapshot_id=snapshot_id)
    return SnapshotResult(unit_id=unit_id, supported=supported, state=shown, snapshot_id=snapshot_id)


def _redacted(svc: Units, value: Any) -> Any:
    """A JSON value with host paths redacted in every string, keys included (restore gets the kept original)."""
    if isinstance(value, str):
        return svc.host.redact(value)
    if isinstance(value, list):
        return [_redacted(svc, item) for item in value]
    if isinstance(value, dict):
        return {svc.host.redact(key): _redacted(svc, item) for key, item in value.items()}
    return value


@takes(RestoreSnapshotArgs)
def restore_snapshot(svc: Units, args: RestoreSnapshotArgs) -> RestoreSnapshotResult:
    """Hand a kept snapshot's state to the unit's restore(); the state before is put back if restore() fails."""
    unit_id, snapshot_id = args.unit_id, args.snapshot_id
    svc.unit(unit_id)
    with svc.host.unit_lock(unit_id):
        if not svc.host.is_loaded(unit_id):
            raise UnitNotLoaded(f"Unit {unit_id!r} is not loaded: {svc.host.load_error(unit_id)}")
        kept = svc.host.kept_snapshot(unit_id, snapshot_id)
        if kept is None:
            raise UnknownSnapshot(f"Unit {unit_id!r} has no kept snapshot {snapshot_id!r}.")
        try:
            restored = svc.host.restore_snapshot(unit_id, json.loads(kept))
        except DrainTimeout as exc:
            raise RestoreFailed(
                f"{svc.host.redact(str(exc))}.",
                hint="The application's uses of the unit did not finish in time; call unit_restore_snapshot again.",
                rolled_back=True,
            ) from None
        except RestoreError as exc:
            back = "its state before was put back" if exc.rolled_back else "its state before could not be put back"
            raise RestoreFailed(
                f"restore() of unit {unit_id!r} raised {svc.host.redact(repr(exc.error))}; {back}.",
                rolled_back=exc.rolled_back,
            ) from None
        except Exception as exc:
            raise SnapshotFailed(f"snapshot() of unit {unit_id!r} raised {svc.host.redact(repr(exc))}.") from None
        if not restored:
            raise NotSupported(
                f"Unit {unit_id!r} has no restore() now, so the snapshot cannot be put back.",
                hint="Add a restore(state) function to the unit (and reload it) to restore snapshots.",
            )
        return RestoreSnapshotResult(unit_id=unit_id, snapshot_id=snapshot_id, restored=True)


def _local_folder(svc: Units, unit_id: str) -> tuple[LocalAccess, Path]:
    """The grants and the real folder local access to `unit_id` would open, or the refusal."""
    access = svc.local_access
    if access is None:
        raise NotSupported(
            "Local access is off on this server.",
            hint="Edit with unit_apply_patch; a person can start the server with --allow-local-access.",
        )
    kind = svc.unit(unit_id)
    folder = svc.loader.unit_folder(unit_id)
    if folder is None and kind == "directory":
        raise NotSupported(
            f"Unit {unit_id!r} lives in a database, not in a local folder.",
            hint="Edit it with unit_apply_patch and unit_create_source.",
        )
    if folder is None:
        raise NotSupported(
            f"Unit {unit_id!r} is a single file ({unit_id}.py), not a folder of its own.",
            hint="Edit it with unit_apply_patch; local access opens directory units only.",
        )
    return access, folder


def local_access_question(svc: Units, args: LocalAccessArgs) -> str:
    """What the person is asked before a grant (a request that could not be granted is refused before)."""
    _, folder = _local_folder(svc, args.unit_id)
    return (
        f"Open {folder} to OpenCode's own read and edit tools for {args.minutes:g} minutes, without the "
        f"stale-content check, path containment or a rollback of a failed reload. Reason given: {args.reason}"
    )


@takes(LocalAccessArgs)
def request_local_access(svc: Units, args: LocalAccessArgs) -> LocalAccessResult:
    """The escape hatch: once a person said yes (the tool layer asks), OpenCode's own read and edit tools may
    work in the unit's folder for `minutes`, through a link that stops leading there when the access ends."""
    access, folder = _local_folder(svc, args.unit_id)
    grant = access.grant(args.unit_id, folder, args.reason, args.minutes, caller())
    return LocalAccessResult(
        grant_id=grant.id,
        unit_id=args.unit_id,
        source_handle=LocalFolderHandle(kind="local-folder", path=str(grant.link), folder=str(folder)),
        expires_at=iso_time(grant.expires),
        restart="OpenCode reads its permissions when it starts: quit it and start it again from $OPENCODE_CMD "
        "(add --continue to go on with this conversation). Use the path above; the unit's folder itself, "
        "every other path, the shell and the web stay denied. Edits there skip the stale-content check "
        "and are reloaded by the file watcher.",
    )
