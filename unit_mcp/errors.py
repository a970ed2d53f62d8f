"""The one error hierarchy of the service.

Every refusal is a `UnitError` with a stable `code` a client can branch on, a
`message` that names the unit and source (never a host path) and a `hint`
that tells a model what to do next. The tool layer maps it to an MCP
`isError` result in one place.
"""

from __future__ import annotations

from typing import Any, ClassVar


class UnitError(Exception):
    code: ClassVar[str] = "unit_error"
    default_hint: ClassVar[str] = ""

    def __init__(self, message: str, *, hint: str | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.hint = self.default_hint if hint is None else hint
        self.details: dict[str, Any] = details

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message, "hint": self.hint}
        if self.details:
            out["details"] = self.details
        return out

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}" + (f" Hint: {self.hint}" if self.hint else "")


class InvalidArgument(UnitError):
    code = "invalid_argument"
    default_hint = "Correct the argument named in the message and call the tool again."


class UnknownUnit(UnitError):
    code = "unknown_unit"
    default_hint = "Call unit_list (or unit_resolve) to see the unit ids that exist."


class UnitNotLoaded(UnitError):
    code = "not_loaded"
    default_hint = "Fix the unit's load error (see unit_inspect and unit_read_log), then call unit_reload."


class InvalidUnitId(UnitError):
    code = "invalid_unit_id"
    default_hint = "A unit id is a Python identifier of ASCII letters, digits and '_', e.g. 'counter'."


class InvalidSourceId(UnitError):
    code = "invalid_source_id"
    default_hint = (
        "A source id is a path relative to the unit root with '/' separators, e.g. 'helpers.py' or "
        "'pkg/mod.py'; each segment matches [A-Za-z0-9_][A-Za-z0-9._-]*. Call unit_inspect to list them."
    )


class UnknownSource(UnitError):
    code = "unknown_source"
    default_hint = "Call unit_inspect to list the unit's source artifacts, or unit_create_source to add one."


class BinarySource(UnitError):
    code = "binary_source"
    default_hint = "Only UTF-8 text sources can be read or patched."


class StaleHash(UnitError):
    code = "stale_hash"
    default_hint = (
        "The source changed since you read it: call unit_read_source again and redo the edit on the new content."
    )


class NoMatch(UnitError):
    code = "no_match"
    default_hint = (
        "`old` must match the current source exactly, indentation included. "
        "Call unit_read_source and copy the text to replace."
    )


class AmbiguousMatch(UnitError):
    code = "ambiguous_match"
    default_hint = "Include more surrounding lines in `old` so it matches once, or set replace_all=true."


class PatchConflict(UnitError):
    code = "patch_conflict"
    default_hint = "A hunk's context does not match the current source: call unit_read_source and rebuild the diff."


class InvalidPatch(UnitError):
    code = "invalid_patch"
    default_hint = (
        "Send one unified diff for this source only (---/+++ headers optional, @@ hunks with correct counts), "
        "or use old/new exact replacement instead."
    )


class Exists(UnitError):
    code = "exists"
    default_hint = "unit_create_source never overwrites: use unit_apply_patch to change an existing source."


class SourceSyntaxError(UnitError):
    code = "syntax_error"
    default_hint = "Fix the Python syntax at the reported line and column; nothing was written."


class NotSupported(UnitError):
    code = "not_supported"
    default_hint = "This loader or unit kind does not offer the operation; unit_list shows each unit's capabilities."


class ReloadFailed(UnitError):
    code = "reload_failed"
    default_hint = "The previous version is still running. Read the error, fix the source and try again."


class TestTimeout(UnitError):
    __test__ = False  # not a pytest test class
    code = "test_timeout"
    default_hint = "The test run was killed at its timeout: look for an infinite loop or raise `timeout`."


class Cancelled(UnitError):
    code = "cancelled"
    default_hint = "The caller cancelled the call; nothing more was done."


class UnknownRun(UnitError):
    code = "unknown_run"
    default_hint = (
        "Runs are kept for a while after they end, then forgotten: start the tests again with unit_run_tests."
    )


class TooManyRuns(UnitError):
    code = "too_many_runs"
    default_hint = "Wait for a run to end (unit_test_status with wait_s) or stop one with unit_cancel_test."


class TooLarge(UnitError):
    code = "too_large"
    default_hint = "Send a smaller argument."


class SnapshotFailed(UnitError):
    code = "snapshot_failed"
    default_hint = "The unit's snapshot() raised or returned something that is not JSON: fix snapshot()."


class UnknownVersion(UnitError):
    code = "unknown_version"
    default_hint = "Call unit_history to list the versions of the source."


class UnknownChange(UnitError):
    code = "unknown_change"
    default_hint = "Call unit_changes to list the change ids the log keeps (old ones are dropped by its retention)."


class UnknownCheckpoint(UnitError):
    code = "unknown_checkpoint"
    default_hint = (
        "Take a checkpoint with unit_checkpoint before the changes to undo; the log drops a checkpoint once the "
        "changes after it fall out of its retention."
    )


class CheckpointIncomplete(UnitError):
    code = "checkpoint_incomplete"
    default_hint = (
        "Part of this checkpoint's content is gone (the blob store's retention dropped it, or it was damaged); roll "
        "back to a newer checkpoint (unit_checkpoint lists them on the unit page) or edit the sources directly."
    )


class Unavailable(Exception):
    """A database cannot be used right now (unreachable, restarting, or a lock held too long); nothing was written.
    The one outage error of `database`: each store raises its own subclass, with the message its users know."""


class StoreUnavailable(UnitError, Unavailable):
    code = "store_unavailable"
    default_hint = (
        "The units database cannot be used right now (restarting, unreachable or locked by a stuck writer); "
        "nothing was changed. "
        "The server reconnects by itself: call the tool again in a few seconds."
    )


class UnknownSnapshot(UnitError):
    code = "unknown_snapshot"
    default_hint = (
        "Call unit_snapshot to capture the unit's state and pass the snapshot_id it returns; the server keeps only "
        "the newest snapshots, in memory, until it stops."
    )


class RestoreFailed(UnitError):
    code = "restore_failed"
    default_hint = "The unit's restore() raised on the snapshot's state: read the error and fix restore()."


class Declined(UnitError):
    code = "declined"
    default_hint = "A person said no to this call: do not repeat it unchanged; ask them what they want instead."


class Withdrawn(UnitError):
    code = "withdrawn"
    default_hint = "The client went away while the call waited for a person's yes; nothing ran."


class ConfirmationTimeout(UnitError):
    code = "confirmation_timeout"
    default_hint = "Nobody answered in time: ask the person to watch the unit server's page (UNITS_UI_URL), then retry."
