"""Loader-neutral unit operations: one method per tool, pydantic results, `UnitError` refusals.

Each tool is one method, named like the tool without `unit_`, that takes the tool's argument model (`arguments`):
the tool layer passes the model it validated, a Python caller the arguments themselves (`takes` validates them).
Methods are blocking (storage and process work); async callers run them in a worker thread.

The class below is the table of contents; each concept lives in its own module: `_units` (the shared handle: ids,
reads, text, the loader's refusals), `_commit` (the one write transaction every writing tool ends in; `_plan`,
`_reloading`, `_recording` around it), `_patch` (one source's edit), `_edits`, `_undo`, `_changes`, `_reading`,
`_resolving`, `_testruns` and `_state`.
"""

from __future__ import annotations

from . import _changes, _checkpoints, _edits, _reading, _resolving, _state, _testruns, _undo
from ._caller import call_as
from ._changes import change_record
from ._reading import QUICK_READ_BYTES
from ._reloading import reload_result
from ._units import Units

__all__ = ["QUICK_READ_BYTES", "UnitService", "call_as", "change_record", "reload_result"]


class UnitService(Units):
    """The unit tools over one host (`Units` holds the host, its loader and the server's limits)."""

    # reading
    list = _reading.list_units
    resolve = _resolving.resolve
    index_now = _resolving.current_index
    unit_facts = _resolving.unit_facts
    inspect = _reading.inspect
    read_source = _reading.read_source
    read_source_at_once = _reading.read_source_at_once
    read_log = _reading.read_log
    history = _edits.history
    # writing: each ends in _commit.commit
    apply_patch = _edits.apply_patch
    apply_patch_at_once = _edits.apply_patch_at_once
    create_source = _edits.create_source
    revert = _edits.revert
    rollback = _undo.rollback
    revert_change = _undo.revert_change
    # the change log
    changes = _changes.changes
    checkpoint = _checkpoints.checkpoint
    # test runs
    run_tests = _testruns.run_tests
    test_status = _testruns.test_status
    cancel_test = _testruns.cancel_test
    # state and code as they run
    reload = _state.reload
    snapshot = _state.snapshot
    restore_snapshot = _state.restore_snapshot
    request_local_access = _state.request_local_access
    local_access_question = _state.local_access_question
