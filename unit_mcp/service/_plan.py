"""What a write call plans (`Plan`: the `Target`s it changes and how it answers) and what `commit` did (`Committed`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Generic, Literal, TypeVar

from ..loader import Source
from ..models import ReloadResult, RunTestsResult
from ._units import hash_or_none

R = TypeVar("R")


@dataclass(frozen=True)
class Target:
    """One source a write changes: from `before` (None: absent) to `after` (None: removed)."""

    source: Source
    before: bytes | None
    after: bytes | None

    @cached_property
    def hash_before(self) -> str | None:
        return hash_or_none(self.before)

    @cached_property
    def hash_after(self) -> str | None:
        return hash_or_none(self.after)

    @property
    def action(self) -> Literal["modified", "created", "removed"]:
        return "removed" if self.after is None else "created" if self.before is None else "modified"


@dataclass
class Committed:
    """What a commit did, for the tool's answer: the units reloaded (in order), the change log's record, and the
    test the write was kept on (`kept` False: it failed and the write was put back)."""

    reloads: dict[str, ReloadResult] = field(default_factory=dict)
    change_id: int | None = None
    already_applied: bool = False
    dry_run: bool = False
    test: RunTestsResult | None = None
    kept: bool = True


@dataclass
class Plan(Generic[R]):
    """The sources a call would write and how it answers once they are written (or not: a dry run)."""

    targets: list[Target]
    answer: Callable[[Committed], R]

    @property
    def units(self) -> list[str]:
        return sorted({t.source.unit_id for t in self.targets})
