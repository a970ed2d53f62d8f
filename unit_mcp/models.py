"""Result models of the service: one source for the schema, the validation and the docs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceArtifact(_Model):
    source_id: str = Field(description="Path relative to the unit root, '/' separators.")
    kind: Literal["python", "text", "binary"]
    size: int
    hash: str = Field(description="'sha256:<hex>' of the raw bytes.")
    primary: bool


class SourceHandle(_Model):
    kind: Literal["directory", "file"]
    source_id: str = Field(description="The primary source artifact.")
    primary: bool = Field(default=True, description="The handle names the unit's primary source.")
    size: int | None = Field(default=None, description="Size of the primary source in bytes (unit_inspect only).")
    hash: str | None = Field(default=None, description="'sha256:<hex>' of the primary source (unit_inspect only).")


LoaderCapability = Literal["read", "write", "create", "history"]
_LOADER_CAPABILITIES = Field(description="What the unit's loader offers; 'history' adds unit_history and unit_revert.")


class Replica(_Model):
    """A unit in a store several servers share (PostgreSQL): what this server serves against what is stored."""

    served_version: int | None = Field(description="The version this server serves (None: not watching the store).")
    stored_version: int | None = Field(description="The newest version stored for the unit (any of its sources).")
    behind: bool = Field(description="This server serves an older version than the stored one.")
    reload_error: str | None = Field(default=None, description="Why the newest version did not load here.")


_REPLICA = Field(default=None, description="Set for stores shared by several servers: the version served here.")


class UnitSummary(_Model):
    unit_id: str
    loader: str
    source_handle: SourceHandle
    edit_capabilities: list[str]
    test_capabilities: list[str] = Field(description="Test names runnable with unit_run_tests.")
    commit_capability: bool = Field(description="Every accepted write is recorded as a version (history).")
    loader_capabilities: list[LoaderCapability] = _LOADER_CAPABILITIES
    loaded: bool
    load_error: str | None = None
    replica: Replica | None = _REPLICA


_TRUNCATED = Field(default=False, description="The answer was cut to fit one result; next_cursor continues it.")
_TEST_RUN = Field(default=None, description="The run of the test the write was kept on (`test`), passed or not.")
_KEPT = Field(default=True, description="False when the test failed and the write was put back: nothing changed.")
_ALREADY_APPLIED = Field(
    default=False,
    description="A repeat of a call whose write is in place already (a replayed step): nothing was written again.",
)
_NEXT_CURSOR = Field(
    default=None, description="Pass it as cursor (with the same other arguments) for the next page; null at the end."
)


class UnitListResult(_Model):
    units: list[UnitSummary]
    truncated: bool = _TRUNCATED
    next_cursor: str | None = _NEXT_CURSOR


class Evidence(_Model):
    field: str = Field(
        description="What matched: unit_id, module, file, docstring, symbol, route, test or function_doc; or"
        " ranker: which ranker answered (meaning, with the cosine, or lexical)."
    )
    value: str
    matched: list[str] = Field(description="Query terms found in the value.")


class Candidate(_Model):
    unit_id: str
    confidence: float = Field(ge=0.0, le=1.0)
    evidence: list[Evidence]
    summary: str | None = Field(default=None, description="The first line of the unit's docstring.")


class ResolveResult(_Model):
    description: str
    candidates: list[Candidate]
    truncated: bool = _TRUNCATED
    next_cursor: str | None = _NEXT_CURSOR


class Lifecycle(_Model):
    init: str | None
    drop: str | None
    snapshot: str | None
    restore: str | None


class InspectResult(_Model):
    unit_id: str
    loader: str
    loader_capabilities: list[LoaderCapability] = _LOADER_CAPABILITIES
    module: str
    source_handle: SourceHandle
    loaded: bool
    load_error: str | None = None
    docstring: str | None = None
    lifecycle: Lifecycle
    activities: list[str]
    edit_capabilities: list[str]
    test_capabilities: list[str]
    source_artifacts: list[SourceArtifact]
    replica: Replica | None = _REPLICA
    truncated: bool = Field(
        default=False, description="Lists or texts were cut to fit one result (a unit of thousands of files)."
    )


class ReadSourceResult(_Model):
    unit_id: str
    source_id: str
    content: str
    hash: str
    size: int
    line_ending: Literal["lf", "crlf", "mixed", "none"]
    offset: int = Field(default=0, description="Byte offset of content in the source (0 unless paged).")
    truncated: bool = Field(
        default=False, description="content is one page of the source; next_cursor reads on. hash covers the whole."
    )
    next_cursor: str | None = _NEXT_CURSOR


class ActivityEvidence(_Model):
    active_activity_before: str | None
    active_activity_after: str | None
    reactivation_attempted: bool
    registered_after: bool = Field(description="The activity active before is registered again after the reload.")
    has_active_session_after: bool
    error: str | None = None


class ReloadResult(_Model):
    unit_id: str
    reloaded: bool
    restored_state: bool = Field(description="snapshot() state was handed to restore().")
    activity: ActivityEvidence
    duration_ms: float
    blocked_ms: float = Field(
        default=0.0,
        description="How long new uses of the unit by the application waited: the drain of the uses in flight plus "
        "the window.",
    )
    window_ms: float = Field(
        default=0.0, description="The window itself (snapshot, migrate, drop, swap, init, restore)."
    )


class ApplyPatchResult(_Model):
    unit_id: str
    source_id: str
    mode: Literal["exact", "diff", "revert"]
    dry_run: bool
    changed: bool
    replacements: int = Field(description="Occurrences replaced (exact mode), hunks applied (diff mode) or 1 (revert).")
    hash_before: str
    hash: str = Field(description="Hash of the source after the edit (the would-be hash on a dry run).")
    diff: str = Field(description="Unified diff of the change.")
    reload: ReloadResult | None = None
    change_id: int | None = Field(default=None, description="The change log's record of this write (not of a dry run).")
    already_applied: bool = _ALREADY_APPLIED
    test: RunTestsResult | None = _TEST_RUN
    kept: bool = _KEPT
    match: str = Field(
        default="exact",
        description="How `old` or each hunk was found: exact, trimmed, reindented, blank_lines, unescaped, quotes "
        "(several joined by '+'); a loose match is applied only where it fits one place.",
    )
    matched_lines: list[list[int]] = Field(
        default_factory=list,
        description="[first, last] source lines each match covered, before the edit (the first 100).",
    )


class CreateSourceResult(_Model):
    unit_id: str
    source_id: str
    hash: str
    size: int
    reload: ReloadResult | None = Field(description="The reload after the write (none when a test put it back).")
    change_id: int | None = Field(default=None, description="The change log's record of this write.")
    already_applied: bool = _ALREADY_APPLIED
    test: RunTestsResult | None = _TEST_RUN
    kept: bool = _KEPT


class RunTestsResult(_Model):
    unit_id: str
    test_name: str
    runner: Literal["main", "pytest"]
    passed: bool
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool = Field(description="The output was cut (its start and end kept); not set by redaction alone.")
    duration_ms: float
    timed_out: bool
    redacted: bool = Field(
        default=False, description="Host paths or secrets in the output were replaced (<units>, <data>, <token>, ...)."
    )
    run_id: str | None = Field(
        default=None, description="The run's id: unit_test_status and unit_cancel_test take it (kept for a while)."
    )
    state: Literal["finished", "running"] = Field(
        default="finished",
        description="'running': the tests have not ended yet (wait=false, or past the server's longest call); "
        "ask unit_test_status with run_id. Until then passed is false and the output empty.",
    )


class CancelTestResult(_Model):
    run_id: str
    cancelled: bool = Field(description="The run was still running and its processes were killed.")
    state: Literal["finished", "running"]


class ReadLogResult(_Model):
    lines: list[str] = Field(description="The matching lines, oldest first.")
    line_numbers: list[int] = Field(
        description="The absolute line number of each line (line 1 is the oldest kept line; a log rotation "
        "renumbers). Pass one as offset to read forward from it, or as before to page back."
    )
    returned: int
    has_more: bool = Field(
        description="More matching lines exist beyond this page: older ones (newest-first reading, page back "
        "with before=line_numbers[0]), or newer ones when reading forward from offset."
    )
    total_lines: int = Field(description="Lines in the kept log: the number of its newest line.")
    grep: str | None = None
    truncated: bool = _TRUNCATED
    next_cursor: str | None = _NEXT_CURSOR


class SnapshotResult(_Model):
    unit_id: str
    supported: bool
    state: Any = Field(
        default=None,
        description="Any JSON value: what the unit's snapshot() returned (host paths shown as <units>...).",
    )
    snapshot_id: str | None = Field(
        default=None,
        description="Pass it to unit_restore_snapshot to put this state back later; null without snapshot() or when "
        "the state is too large to keep.",
    )
    truncated: bool = Field(default=False, description="The state was too large for one result and is left out.")


class RestoreSnapshotResult(_Model):
    unit_id: str
    snapshot_id: str
    restored: bool = Field(description="The snapshot's state was handed to the unit's restore().")


class HistoryVersion(_Model):
    version: int = Field(description="Pass it to unit_revert; larger is newer.")
    hash: str
    size: int
    time: str = Field(description="When the version was written, ISO 8601.")
    tool_call: str | None = Field(description="The tool that wrote it; null for a change made outside the tools.")


class HistoryResult(_Model):
    unit_id: str
    source_id: str
    versions: list[HistoryVersion] = Field(description="Newest first.")
    truncated: bool = _TRUNCATED
    next_cursor: str | None = _NEXT_CURSOR


class ChangeClient(_Model):
    name: str | None = Field(description="The MCP client's clientInfo name; null for a change made outside MCP.")
    version: str | None
    session_id: str | None = Field(
        description="A digest of the client's MCP session, where the transport has one: it tells sessions apart "
        "and is never the session id itself."
    )


class ChangedSource(_Model):
    unit_id: str
    source_id: str
    action: Literal["modified", "created", "removed", "unknown"] = Field(
        description="unknown: an outside change to a source whose previous bytes the log never saw."
    )
    hash_before: str | None
    hash_after: str | None


class ChangeRecord(_Model):
    change_id: int = Field(description="Pass it to unit_revert_change; larger is newer.")
    time: str = Field(description="When the outcome was known, ISO 8601 UTC.")
    client: ChangeClient
    tool: str | None = Field(description="The tool called; null for a change made outside the tools.")
    unit_id: str | None = Field(description="The unit the call named; null for a call across units.")
    source_id: str | None
    outcome: Literal[
        "applied",
        "refused",
        "rolled_back",
        "failed",
        "outside",
        "asked",
        "approved",
        "declined",
        "unanswered",
        "withdrawn",
    ] = Field(
        description="applied: written and reloaded; refused: nothing written; rolled_back: the reload failed and "
        "the previous source was put back; failed: an unexpected error; outside: changed outside these tools; "
        "asked, approved, declined, unanswered, withdrawn: a call that waited for a person's yes (--confirm)."
    )
    error_code: str | None
    message: str | None = Field(description="The refusal or failure, as the caller got it.")
    hash_before: str | None = Field(description="Of a one-source change; see sources for more.")
    hash_after: str | None
    duration_ms: float
    sources: list[ChangedSource] = Field(
        description="The change set: the sources the call changed or tried to (the first 20; see sources_total)."
    )
    sources_total: int = Field(description="How many sources the change set has.")


class ChangesResult(_Model):
    changes: list[ChangeRecord] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="Pass it as cursor for the next (older) page; null on the last.")
    latest_change_id: int = Field(description="The newest change id in the log, whatever the filters.")


class CheckpointResult(_Model):
    checkpoint_id: int = Field(description="Pass it to unit_rollback.")
    time: str
    label: str | None
    after_change_id: int = Field(description="A rollback undoes every change after this one.")
    units: int = Field(0, description="Units whose sources (and state, with with_state) the checkpoint holds.")
    sources: int = Field(0, description="Sources it holds, by content (whoever wrote them).")
    bytes_added: int = Field(0, description="Bytes added to the blob store (an unchanged source costs nothing).")
    with_state: bool = False


class RestoredSource(_Model):
    unit_id: str
    source_id: str
    action: Literal["restored", "removed", "recreated"]
    hash_before: str | None = Field(description="The source's hash before this call (null: absent).")
    hash: str | None = Field(description="Its hash after (null: removed).")
    diff: str | None = Field(default=None, description="Unified diff of what the call does (dry run).")


class RestoreConflict(_Model):
    unit_id: str
    source_id: str
    reason: str
    current_hash: str | None
    expected_hash: str | None = Field(description="What the change log says the source should hold now.")


class RollbackResult(_Model):
    checkpoint_id: int
    dry_run: bool
    sources: list[RestoredSource] = Field(description="Every source put back (or to be, on a dry run).")
    conflicts: list[RestoreConflict] = Field(
        description="Sources changed outside the tools since the checkpoint: left alone (unless force)."
    )
    reloaded: list[str] = Field(description="The units reloaded.")
    restored_state: list[str] = Field(
        default_factory=list, description="Units whose restore() got the checkpoint's state (with_state)."
    )
    change_id: int | None = Field(default=None, description="The change log's record of this rollback.")
    already_applied: bool = _ALREADY_APPLIED


class RevertChangeResult(_Model):
    reverted_change_id: int
    dry_run: bool
    sources: list[RestoredSource]
    reloaded: list[str]
    change_id: int | None = Field(default=None, description="The change log's record of this revert.")
    already_applied: bool = _ALREADY_APPLIED


class LocalFolderHandle(_Model):
    kind: Literal["local-folder"] = Field(description="What the handle is (always sent: results leave defaults out).")
    path: str = Field(description="Read and edit the unit's files under this folder, with OpenCode's own tools.")
    folder: str = Field(description="The unit's real folder, which `path` leads to while the access lasts.")


class LocalAccessResult(_Model):
    grant_id: str = Field(description="Edits made meanwhile are in unit_changes under this id (client session).")
    unit_id: str
    source_handle: LocalFolderHandle
    expires_at: str = Field(description="ISO 8601 UTC; revoked earlier on the unit server's page, it ends then.")
    restart: str = Field(description="What to do before the access takes effect.")


ApplyPatchResult.model_rebuild()
CreateSourceResult.model_rebuild()
