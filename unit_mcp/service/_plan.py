"""What a write call plans (`Plan`: the `Target`s it changes and how it answers) and what `commit` did (`Committed`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, Literal, TypeVar

from .. import paths
from ..loader import Source
from ..models import ReloadResult, RunTestsResult

R = TypeVar("R")


def hash_or_none(data: bytes | None) -> str | None:
    return None if data is None else paths.hash_bytes(data)


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

    @classmethod
    def hashed(cls, source: Source, before: bytes, after: bytes, hash_before: str, hash_after: str) -> Target:
        """A target whose maker hashed both sides already (an edit's plan): not hashed again."""
        target = cls(source, before, after)
        target.__dict__.update(hash_before=hash_before, hash_after=hash_after)  # the cached properties' values
        return target

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
    states: dict[str, Any] | None = None
    """unit id → the state its restore() gets on the reload (a checkpoint's), instead of the state it has now; these
    units are reloaded even where no source of theirs changes."""
    dry_compile: bool = False
    """A dry run compiles the targets' Python as a write does (an edit's dry run answers whether it would compile;
    one whose edited statements alone prove it, and a rollback's, which shows what it would put back, do not)."""
    compiled: bool = False
    """The plan compiled its targets' Python already (a create refuses a syntax error before anything else): the
    write does not compile them again."""
    meanwhile: Callable[[], None] | None = None
    """Work the answer needs that does not depend on the write (an edit's diff, the new source's statement map):
    a write of one Python source runs it beside the file's sync, once the source compiled; else the answer does."""

    def compile_beside(self, compile_source: Callable[[Source, bytes], None]) -> Callable[[], None] | None:
        """The check `Loader.write_checked` runs beside the sync of the one Python source this plan replaces (the
        folder loader replaces the file only if it passed): its compile, then `meanwhile`. None: the plan writes
        several sources or another kind, compiled before any is written."""
        if len(self.targets) != 1:
            return None
        source, before, after = self.targets[0].source, self.targets[0].before, self.targets[0].after
        if before is None or after is None or not source.source_id.endswith(".py"):
            return None
        meanwhile = self.meanwhile

        def check() -> None:
            compile_source(source, after)
            if meanwhile is not None:
                with contextlib.suppress(Exception):  # the answer works it out again, and raises there
                    meanwhile()

        return check

    @property
    def units(self) -> list[str]:
        return sorted({t.source.unit_id for t in self.targets} | set(self.states or ()))
