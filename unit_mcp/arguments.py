"""One input model per tool: the argument names, types, limits and descriptions in one place.

The tool layer validates a call's arguments against these models and derives the tools' input schemas from them;
a `UnitService` method declared with `takes` validates a Python caller's arguments against the same model. Checks
that depend on the server's configuration (`max_source_bytes`, `max_test_timeout`) or on several arguments
together are the service's.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Protocol, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from . import resultlog
from .errors import InvalidArgument
from .tooldecl import Refusal, validated

MAX_LOG_LINES = 1000
MAX_LOG_OFFSET = 10**9
MAX_HISTORY = 1000
MAX_WAIT_S = 240
MAX_VERSION = 2**63 - 1  # the largest integer a store keeps (SQLite's INTEGER)
MAX_CHANGES = 200


class Args(BaseModel):
    """Tool arguments: unknown keys are refused, so a misspelt `expected_hash` cannot be silently ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


A = TypeVar("A", bound=Args)
S = TypeVar("S")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class Operation(Protocol[R_co]):
    """A tool's method made by `takes`, which names the tool's argument model."""

    model: type[Args]

    def __call__(self, *args: Any, **arguments: Any) -> R_co: ...


def checked(model: type[A], tool: str, arguments: Mapping[str, Any]) -> A:
    """`arguments` as `model`, or an `InvalidArgument` naming each one that is wrong, as the tools word it."""
    args = validated(model, tool, arguments)
    if isinstance(args, Refusal):
        raise InvalidArgument(args.message, hint=args.hint)
    return args


def takes(model: type[A], *, name: str | None = None) -> Callable[[Callable[[S, A], R]], Operation[R]]:
    """The one method of a tool (`unit_<name>`, by default the method's name), which takes the tool's `model`: the
    tool layer passes the model it validated; a Python caller passes the arguments (as the model's fields, in their
    order), validated here. Either way they are validated once."""
    signature = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
        + [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=inspect.Parameter.empty if field.is_required() else field.default,
                annotation=field.annotation,
            )
            for name, field in model.model_fields.items()
        ]
    )

    names = tuple(model.model_fields)
    fields = frozenset(names)
    required = frozenset(name for name, field in model.model_fields.items() if field.is_required())

    def decorate(method: Callable[[S, A], R]) -> Operation[R]:
        @functools.wraps(method)
        def call(self: S, *args: Any, **arguments: Any) -> R:
            if len(args) == 1 and not arguments and isinstance(args[0], model):
                result = method(self, args[0])
            elif not args and required <= arguments.keys() <= fields:  # what `bind` would give, without its cost
                result = method(self, checked(model, f"unit_{name or method.__name__}", arguments))
            elif (
                len(args) <= len(names)
                and arguments.keys().isdisjoint(names[: len(args)])
                and required <= (given := {**dict(zip(names, args, strict=False)), **arguments}).keys() <= fields
            ):  # the leading fields given by position, the rest by name: `bind` again, without its cost
                result = method(self, checked(model, f"unit_{name or method.__name__}", given))
            else:
                bound = signature.bind(self, *args, **arguments).arguments
                del bound["self"]
                result = method(self, checked(model, f"unit_{name or method.__name__}", bound))
            if resultlog.recorder is not None:  # the suite's check that no result holds a host path
                resultlog.record(f"unit_{name or method.__name__}", "python", result)
            return result

        if name is not None:
            call.__name__ = call.__qualname__ = name
        call.__signature__ = signature  # type: ignore[attr-defined]
        call.model = model  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate


def _one_spelling(expected_hash: str | None) -> str | None:
    """expected_hash in its one spelling ('sha256:' and lowercase hex)."""
    return None if expected_hash is None else "sha256:" + expected_hash.removeprefix("sha256:").lower()


_UNIT_ID = Field(description="The unit id from unit_list or unit_resolve, e.g. 'counter'.")
_SOURCE_ID = Field(
    description="Path of the file relative to the unit root with '/' separators, as listed by unit_inspect, "
    "e.g. '__init__.py' or 'data/cities.json'. A file unit's only source is '<unit_id>.py'."
)
_DRY_RUN = Field(False, description="Only show the diff and the would-be hash; write nothing.")
ExpectedHash = Annotated[
    str | None,
    Field(pattern=r"^(sha256:)?[0-9a-fA-F]{64}$"),
    AfterValidator(_one_spelling),
]


class NoArgs(Args):
    pass


_CURSOR = Field(
    None, max_length=1000, description="next_cursor of the previous page, to read on; leave out for the first page."
)


class ListArgs(Args):
    cursor: str | None = _CURSOR


class UnitArgs(Args):
    unit_id: str = _UNIT_ID


class ResolveArgs(Args):
    description: str = Field(description="What the unit does or is called, in a few words, e.g. 'click counter'.")
    limit: int = Field(20, ge=1, le=100, description="The most candidates to return (1-100).")
    cursor: str | None = _CURSOR


class ReadSourceArgs(Args):
    unit_id: str = _UNIT_ID
    source_id: str = _SOURCE_ID
    cursor: str | None = _CURSOR


TestName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")]
_TEST = Field(
    None,
    description="Keep the write only if the unit's test passes: its name ('init' runs test_init.py). "
    "The test runs in the test host; the application serves the previous version until it passes, and a failing "
    "or timed-out run puts the write back (kept: false in the result).",
)


class ApplyPatchArgs(Args):
    unit_id: str = _UNIT_ID
    source_id: str = _SOURCE_ID
    patch: str | None = Field(
        None, description="A unified diff of this one file (@@ hunks; ---/+++ headers optional). Not with old/new."
    )
    old: str | None = Field(
        None, description="Exact text to replace, copied from unit_read_source (indentation included). Needs `new`."
    )
    new: str | None = Field(None, description="The replacement for `old`; may be empty to delete it.")
    expected_hash: ExpectedHash = Field(
        None, description="The hash unit_read_source returned; the edit is refused if the file changed since."
    )
    replace_all: bool = Field(False, description="Replace every occurrence of `old` instead of requiring one.")
    dry_run: bool = _DRY_RUN
    test: TestName | None = _TEST


class CreateSourceArgs(Args):
    unit_id: str = _UNIT_ID
    source_id: str = Field(
        description="Path of the new file relative to the unit root, e.g. 'helpers.py' or 'test_more.py'; "
        "missing folders are created."
    )
    source: str = Field(description="The full content of the new file (UTF-8 text).")
    test: TestName | None = _TEST


class RunTestsArgs(Args):
    unit_id: str = _UNIT_ID
    test_name: str = Field(
        "init",
        pattern=r"^[A-Za-z0-9_]{1,64}$",
        description="Runs test_<test_name>.py of the unit; 'init' runs test_init.py.",
    )
    timeout: float | None = Field(
        None, gt=0, description="Seconds before the run is killed; the server's default if unset."
    )
    wait: bool = Field(
        True,
        description="Wait for the result (up to the server's longest call, then state 'running'); false answers "
        "at once with a run_id for unit_test_status.",
    )


_RUN_ID = Field(max_length=64, description="The run_id unit_run_tests returned.")


class TestStatusArgs(Args):
    __test__ = False

    run_id: str = _RUN_ID
    wait_s: float = Field(
        0, ge=0, le=MAX_WAIT_S, description="Seconds to wait for the run to end (0-240; the server may cap it)."
    )


class CancelTestArgs(Args):
    __test__ = False

    run_id: str = _RUN_ID


class ReadLogArgs(Args):
    grep: str | None = Field(
        None, max_length=1000, description="Only lines containing this text (case-sensitive substring)."
    )
    lines: int = Field(
        100, ge=1, le=MAX_LOG_LINES, description="How many of the newest matching lines to return (1-1000)."
    )
    offset: int | None = Field(
        None,
        ge=1,
        le=MAX_LOG_OFFSET,
        description="Read forward from this absolute line number (see line_numbers), oldest first.",
    )
    limit: int | None = Field(
        None, ge=1, le=MAX_LOG_LINES, description="Lines to return (instead of `lines`), e.g. with offset."
    )
    before: int | None = Field(
        None,
        ge=1,
        le=MAX_LOG_OFFSET,
        description="Page back: the newest matching lines numbered below this (the first of line_numbers).",
    )
    cursor: str | None = _CURSOR


class HistoryArgs(Args):
    unit_id: str = _UNIT_ID
    source_id: str = _SOURCE_ID
    limit: int = Field(20, ge=1, le=MAX_HISTORY, description="The most versions to return, newest first (1-1000).")
    cursor: str | None = _CURSOR


class RevertArgs(Args):
    unit_id: str = _UNIT_ID
    source_id: str = _SOURCE_ID
    version: int = Field(ge=1, le=MAX_VERSION, description="The version number from unit_history to put back.")
    expected_hash: ExpectedHash = Field(
        None, description="The hash unit_read_source returned; the revert is refused if the file changed since."
    )
    dry_run: bool = _DRY_RUN
    test: TestName | None = _TEST


class ChangesArgs(Args):
    unit_id: str | None = Field(None, description="Only changes of this unit.")
    source_id: str | None = Field(None, description="Only changes of this source of unit_id (needs unit_id).")
    since: str | None = Field(
        None, max_length=40, description="Only changes at or after this ISO 8601 time, e.g. '2026-12-04T13:00:00Z'."
    )
    limit: int = Field(50, ge=1, le=MAX_CHANGES, description="The most records to return, newest first (1-200).")
    cursor: str | None = Field(None, max_length=100, description="next_cursor of the previous page.")


class CheckpointArgs(Args):
    label: str | None = Field(None, max_length=200, description="A name to recognise the checkpoint by.")
    unit_ids: list[str] | None = Field(
        None,
        min_length=1,
        max_length=10_000,
        description="Only these units (default: every unit). A rollback to the checkpoint puts back these only.",
    )
    with_state: bool = Field(
        False,
        description="Also keep each unit's snapshot() state: a rollback to it restores code and state together.",
    )


class RollbackArgs(Args):
    checkpoint_id: int = Field(ge=1, le=MAX_VERSION, description="The checkpoint_id unit_checkpoint returned.")
    dry_run: bool = Field(False, description="Only show each source's diff and the conflicts; write nothing.")
    force: bool = Field(
        False, description="Also put back sources changed outside the tools since the checkpoint (conflicts)."
    )


class RevertChangeArgs(Args):
    change_id: int = Field(ge=1, le=MAX_VERSION, description="The change_id from unit_changes or a write's result.")
    dry_run: bool = _DRY_RUN


class RestoreSnapshotArgs(Args):
    unit_id: str = _UNIT_ID
    snapshot_id: str = Field(
        pattern=r"^snap-[0-9a-f]{12}$", description="The snapshot_id unit_snapshot returned for this unit."
    )


class LocalAccessArgs(Args):
    unit_id: str = _UNIT_ID
    reason: str = Field(
        min_length=1, max_length=500, description="Why the unit tools do not suffice; the person asked reads it."
    )
    minutes: float = Field(30, gt=0, le=24 * 60, description="How long the access lasts (default 30, at most 1440).")
