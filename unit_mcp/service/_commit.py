"""The one write transaction: every tool that writes sources ends in `commit`.

A write is planned (read, checked, edited, validated), then, under the locks of every unit it touches (taken in
one order), the plan is checked against what the store holds now (planned again under the locks if it moved),
compiled (one replaced Python source: while its file syncs), written, each unit reloaded with one undo for all,
accepted, and recorded in the change log. A declared
replay (`call_as(replay=True)`) whose result is already in place answers `already_applied` with the first call's
change, for every write tool alike. A dry run plans (and compiles, where its plan asks) and answers, writing and
recording nothing. A write asked to keep only if a test passes runs that test before anything is reloaded.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from .. import paths, tracing
from ..changelog import Outcome
from ..errors import Exists, ReloadFailed, StaleHash, UnitError
from ..loader import Source, StaleSource, Written
from ..models import RunTestsResult
from ..reloading import OWN_STATE, ReloadError
from ._caller import replaying
from ._plan import Committed, Plan, Target, hash_or_none
from ._recording import change_that_made
from ._recording import record as _record
from ._recording import tested as _tested
from ._reloading import reload_unit, undone
from ._testruns import gate as run_gate
from ._units import Units

R = TypeVar("R")
_PLANS = 3
"""Plans made at most for one call: the units a plan touches may change between plans (a rollback's)."""


def commit(
    svc: Units,
    tool: str,
    unit_id: str | None,
    source_id: str | None,
    plan: Callable[[], Plan[R]],
    *,
    dry_run: bool = False,
    replayed: Callable[[], Plan[R] | None] | None = None,
    test: str | None = None,
) -> R:
    """Plan, check, compile, write, reload and record one call of `tool` (see the module). `unit_id` and `source_id`
    are what the change log files the call under; `replayed` gives the plan the first call made, where the caller
    may be repeating it; `test` names the unit's test run against the written sources before anything is reloaded:
    the write is kept (and reloaded) only if it passes, else put back and recorded as rolled back."""
    if dry_run:
        planned = plan()
        if planned.dry_compile:
            _compile(svc, planned.targets)
        return planned.answer(Committed(dry_run=True))
    gate = None if test is None or unit_id is None else functools.partial(run_gate, svc, unit_id, test)
    return _commit(svc, tool, unit_id, source_id, plan, replayed, gate)


@tracing.traced("unit write", unit_mcp__tool="tool", unit_mcp__unit_id="unit_id")
def _commit(
    svc: Units,
    tool: str,
    unit_id: str | None,
    source_id: str | None,
    plan: Callable[[], Plan[R]],
    replayed: Callable[[], Plan[R] | None] | None,
    gate: Callable[[], RunTestsResult] | None,
) -> R:
    started = time.perf_counter()
    written: list[Target] = []
    try:
        committed, answer = _transaction(svc, tool, unit_id, plan, replayed, written, gate)
    except UnitError as exc:
        outcome: Outcome = "refused"
        if written:  # written, then the reload failed
            outcome = "rolled_back" if exc.details.get("source_restored") else "failed"
        _record(svc, tool, unit_id, source_id, outcome, written, started, exc.code, exc.message)
        raise
    except Exception as exc:
        _record(svc, tool, unit_id, source_id, "failed", written, started, "internal_error", type(exc).__name__)
        raise
    said = None if committed.test is None else _tested(committed.test)
    if not committed.kept:
        committed.change_id = _record(
            svc, tool, unit_id, source_id, "rolled_back", written, started, "test_failed", said
        )
    elif not committed.already_applied:  # a repeat wrote nothing: the first call's record stands
        committed.change_id = _record(svc, tool, unit_id, source_id, "applied", written, started, message=said)
    else:
        tracing.set_attributes(
            tracing.current(), unit_mcp__outcome="already_applied", unit_mcp__change_id=committed.change_id
        )
    return answer(committed)


def _transaction(
    svc: Units,
    tool: str,
    unit_id: str | None,
    plan: Callable[[], Plan[R]],
    replayed: Callable[[], Plan[R] | None] | None,
    written: list[Target],
    gate: Callable[[], RunTestsResult] | None,
) -> tuple[Committed, Callable[[Committed], R]]:
    """A call naming its unit (an edit: it writes that unit alone) plans under the unit's lock, not checked again
    (the loader's write checks the hash, against writers outside the tools); one across units plans, then checks."""
    held = set() if unit_id is None else {unit_id}
    with locked(svc, sorted(held)):
        try:
            planned = plan()
        except (StaleHash, Exists):
            if not (replaying() and replayed):
                raise
            planned = None
        for _ in range(_PLANS):
            if planned is None or (not planned.targets and replaying() and replayed):
                repeat = _repeat(svc, tool, replayed) if replayed and replaying() else None
                if repeat is not None:
                    return repeat
                if planned is None:
                    planned = plan()  # not a repeat: its refusal stands
            units = planned.units
            assert not held or set(units) <= held, f"{tool} on unit {unit_id} planned to write units {units}"
            with locked(svc, units):
                if not held and not _in_place(svc, [(t.source, t.hash_before) for t in planned.targets]):
                    planned = plan()  # the store moved since the plan was made: plan again under the locks
                    if not set(planned.units) <= set(units):
                        continue
                committed = _apply(svc, tool, planned, written, gate)
                return committed, planned.answer
    raise StaleHash(f"The sources of this {tool} call kept changing while it was planned; nothing was written.")


def _repeat(
    svc: Units, tool: str, replayed: Callable[[], Plan[R] | None]
) -> tuple[Committed, Callable[[Committed], R]] | None:
    """The first call's plan, if its result is in place: every target holds its `after` bytes. The units are reloaded
    again (the first call may have ended before its reload)."""
    first = replayed()
    if first is None or not first.targets:
        return None
    with locked(svc, first.units):
        if not _in_place(svc, [(t.source, t.hash_after) for t in first.targets]):
            return None
        reloads = {unit_id: reload_unit(svc, unit_id) for unit_id in first.units}
    change = change_that_made(svc, first.targets)
    committed = Committed(reloads=reloads, change_id=None if change is None else change.id, already_applied=True)
    return committed, first.answer


def _in_place(svc: Units, sources: Sequence[tuple[Source, str | None]]) -> bool:
    """Whether every source hashes to its expected hash (None: absent) now."""
    return all(hash_or_none(svc.read_or_none(src)) == expected for src, expected in sources)


@contextlib.contextmanager
def locked(svc: Units, units: Sequence[str]) -> Iterator[None]:
    """The locks of `units`, always taken in sorted order (two calls on the same units never deadlock)."""
    with contextlib.ExitStack() as locks:
        for unit_id in sorted(units):
            locks.enter_context(svc.host.unit_lock(unit_id))
        yield


def _apply(
    svc: Units, tool: str, planned: Plan[Any], written: list[Target], gate: Callable[[], RunTestsResult] | None
) -> Committed:
    """Compile, write, (test,) then reload every unit, all or nothing: if a write, the test or a reload fails, every
    source already written is put back (unless someone else changed it meanwhile: theirs stays) and the units
    reloaded before are reloaded again (with the state they had before, where `states` gave them another). While
    the test runs the application serves the previous version."""
    targets, states = planned.targets, planned.states or {}
    check = planned.compile_beside(svc.compile)
    if check is None and not planned.compiled:
        _compile(svc, targets)  # every target, before any is written
    before = {}  # the state each unit has now, to hand back to it if the call is undone
    for unit_id in sorted(states):
        if svc.host.is_loaded(unit_id):
            supported, state = svc.host.snapshot(unit_id)
            if supported:
                before[unit_id] = state
    undo: list[Callable[[], None]] = []
    accepted: list[Written] = []
    superseded: list[tuple[Target, str | None]] = []

    def undo_all() -> bool:
        while undo:
            undo.pop()()
        return not superseded

    try:
        for target in targets:
            with svc.storage(target.source, "write"):
                undo.append(_put(svc, target, tool, accepted, superseded, check))
            written.append(target)
    except StaleSource as exc:
        undo_all()
        written.clear()
        one = len(targets) == 1
        raise StaleHash(
            f"{targets[0].source.source_id} of unit {targets[0].source.unit_id} was changed by someone else while "
            f"this edit was made: expected {targets[0].hash_before}, found {exc.current_hash}; nothing was written."
            if one
            else f"A source changed while this call wrote (it now hashes to {exc.current_hash}); every source was "
            "put back as it was, nothing changed.",
            expected_hash=targets[0].hash_before if one else None,
            current_hash=exc.current_hash,
        ) from None
    except BaseException:
        undo_all()
        written.clear()
        raise
    committed = Committed()
    if gate is not None and targets:
        try:
            committed.test = gate()
        except BaseException:
            undo_all()
            written.clear()
            raise
        if not committed.test.passed:
            undo_all()
            committed.kept = False
            return committed
    units = sorted({t.source.unit_id for t in targets} | set(states))
    for unit_id in units:
        try:
            committed.reloads[unit_id] = reload_unit(svc, unit_id, undo_all, states.get(unit_id, OWN_STATE))
        except ReloadFailed as failed:
            for done in committed.reloads:  # they run the written sources' code: back to what they ran before
                try:
                    svc.host.reload(done, state=before.get(done, OWN_STATE))
                except ReloadError:
                    svc.host.logger.exception("reloading unit %s again after a failed %s", done, tool)
            raise undone(failed, targets, superseded) from None
    for kept in accepted:
        try:
            svc.loader.accept(kept)
        except Exception:
            svc.host.logger.exception("recording %s in the history failed", kept.source.source_id)
    return committed


def _compile(svc: Units, targets: list[Target]) -> None:
    """Refuse a target whose Python does not compile, and hand the code of those that do to the host."""
    for target in targets:
        if target.after is not None:
            svc.compile(target.source, target.after)


def _put(
    svc: Units,
    target: Target,
    tool: str,
    accepted: list[Written],
    superseded: list[tuple[Target, str | None]],
    check: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """Write one target (checked against the bytes it holds now, and `check`ed beside its sync); returns what puts
    those bytes back."""
    src, before, after = target.source, target.before, target.after
    if after is None:
        assert before is not None
        svc.loader.rollback(Written(src, before, None, tool, token=[]))  # removes it if it still holds `before`
        return lambda: _undo(superseded, target, lambda: svc.loader.create(src, before, tool_call=tool))
    if before is None:
        written = svc.loader.create(src, after, tool_call=tool)
    elif check is not None:
        written = svc.loader.write_checked(
            src, after, expected_hash=target.hash_before or "", tool_call=tool, check=check
        )
    else:
        written = svc.loader.write(src, after, expected_hash=paths.hash_bytes(before), tool_call=tool)
    accepted.append(written)
    return lambda: _undo(superseded, target, lambda: svc.loader.rollback(written))


def _undo(superseded: list[tuple[Target, str | None]], target: Target, put_back: Callable[[], object]) -> None:
    try:
        put_back()
    except StaleSource as exc:  # someone else wrote it meanwhile: their version stays
        superseded.append((target, exc.current_hash))
