"""An edit of one source (`unit_apply_patch`, and `unit_revert`'s whole replacement): what the patch asks for
(an exact replacement or a unified diff, applied exactly or by a tolerant matcher that is never wrong), the plan
`commit` writes, its answer, and the first call of a declared replay."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from .. import paths
from ..arguments import ApplyPatchArgs
from ..errors import InvalidArgument, UnitError
from ..loader import Source
from ..models import ApplyPatchResult
from ..paging import RESULT_BYTES, clip
from ..patching import (
    Edit,
    apply_unified_diff,
    edit_diff,
    edit_exact,
    replace_exact,
    reverse_unified_diff,
    unified_diff,
)
from ._plan import Committed, Plan, Target
from ._recording import bytes_before
from ._units import Units

MAX_MATCHED = 100
"""Places a result lists in `matched_lines` (a replace_all may change thousands; the result stays under 80 KB)."""


@dataclass(frozen=True)
class Patch:
    """A patch's arguments, checked: applied, undone, and found already made by its first call (`first_call`, which
    `commit` asks only of a declared replay)."""

    svc: Units = field(compare=False, repr=False)
    unit_id: str
    source_id: str
    expected_hash: str | None
    mode: str
    patch: str | None = None
    old: str = ""
    new: str = ""
    replace_all: bool = False

    @classmethod
    def of(cls, svc: Units, args: ApplyPatchArgs) -> Patch:
        """The patch `args` ask for: one editing mode (a check of several arguments, which the input schema does not
        state), its texts within the server's source limit."""
        patch, old, new = args.patch, args.old, args.new
        if patch is not None and (old is not None or new is not None):
            raise InvalidArgument(
                "Pass either `patch` or `old`+`new`, not both.", hint="Use one editing mode per call."
            )
        for name, value in (("patch", patch), ("old", old), ("new", new)):
            if value is not None:
                svc.check_size(name, value)
        where = (svc, args.unit_id, args.source_id, args.expected_hash)
        if patch is not None:
            if not patch.strip():
                raise InvalidArgument("`patch` is empty.", hint="Send a unified diff with at least one @@ hunk.")
            return cls(*where, "diff", patch=patch)
        if old is None or new is None:
            raise InvalidArgument(
                "Pass `patch` (a unified diff) or both `old` and `new`.",
                hint="For an exact replacement give `old` (text to find) and `new` (its replacement; may be empty).",
            )
        return cls(*where, "exact", old=old, new=new, replace_all=args.replace_all)

    @property
    def label(self) -> str:
        return f"{self.source_id} of unit {self.unit_id}"

    def apply(self, text: str, current_hash: str | None = None) -> Edit:
        """The edit of `text`, found exactly or by a tolerant matcher that fits one place only (and, for Python,
        whose result compiles); a refusal carries the nearest places and `current_hash`."""
        compiles = _compiles if self.source_id.endswith(".py") else None
        if self.patch is not None:
            return edit_diff(text, self.patch, self.source_id, compiles=compiles, current_hash=current_hash)
        return edit_exact(
            text,
            self.old,
            self.new,
            replace_all=self.replace_all,
            label=self.label,
            compiles=compiles,
            current_hash=current_hash,
        )

    def undo(self, text: str) -> tuple[str, int]:
        if self.patch is not None:
            return apply_unified_diff(text, reverse_unified_diff(self.patch, self.source_id), self.source_id)
        return replace_exact(text, self.new, self.old, replace_all=self.replace_all, label=self.label)

    def first_call(self) -> Plan[ApplyPatchResult] | None:
        """The first call of a repeated patch: the edit of the bytes hashing to `expected_hash`, if it makes what the
        source holds now. Those bytes come from the change log's record of the write or, when the writer died before
        recording it, from undoing the edit; the hash proves them."""
        svc, expected = self.svc, self.expected_hash
        if expected is None:
            return None
        src, data, text, current = svc.editable(self.unit_id, self.source_id, None, write=True)
        befores = [] if (logged := bytes_before(svc, src, expected, current)) is None else [logged]
        with contextlib.suppress(UnitError):
            befores.append(svc.encode(src, self.undo(text)[0]))
        for before in befores:
            if paths.hash_bytes(before) != expected:
                continue
            before_text = svc.text(src, before)
            try:
                after = self.apply(before_text)
            except UnitError:
                continue
            if svc.encode(src, after.text) == data:
                return edit_plan(svc, src, before, before_text, expected, after, self.mode, dry_run=False)
        return None


def edit_plan(
    svc: Units, src: Source, data: bytes, text: str, current: str, edit: Edit, mode: str, dry_run: bool
) -> Plan[ApplyPatchResult]:
    """An edit of `src` from `text` (its bytes `data`, which hash to `current`) to `edit.text`. `commit` compiles a
    write in full (the reload runs that code; the statement map is only kept current, beside the write's sync), and
    a dry run unless the edited statements alone prove the source compiles."""
    new_text = edit.text
    changed = new_text != text
    new_data = svc.encode(src, new_text)
    new_hash = paths.hash_bytes(new_data)
    python = changed and src.source_id.endswith(".py")
    proven = python and dry_run and svc.syntax.compiles(current, text, new_hash, new_text, learn=False)
    diffs: list[str] = []

    def diff() -> str:
        if not diffs:
            diffs.append(clip(unified_diff(text, new_text, src.source_id), RESULT_BYTES // 2))
        return diffs[0]

    def meanwhile() -> None:
        """A write's diff, and the new source's statement map (a chain of written edits stays cheap to prove)."""
        diff()
        if python and svc.syntax.knows(current):
            svc.syntax.compiles(current, text, new_hash, new_text)

    def answer(done: Committed) -> ApplyPatchResult:
        return ApplyPatchResult(
            unit_id=src.unit_id,
            source_id=src.source_id,
            mode=mode,  # type: ignore[arg-type]
            dry_run=dry_run,
            changed=changed,
            replacements=edit.count,
            hash_before=current,
            hash=new_hash,
            diff=diff(),
            reload=done.reloads.get(src.unit_id),
            change_id=done.change_id,
            already_applied=done.already_applied,
            test=done.test,
            kept=done.kept,
            match=edit.match,
            matched_lines=edit.lines[:MAX_MATCHED],
        )

    targets = [Target.hashed(src, data, new_data, current, new_hash)] if changed else []
    return Plan(targets, answer, dry_compile=changed and not proven, meanwhile=None if dry_run else meanwhile)


def _compiles(text: str) -> bool:
    """Whether a loosely matched edit of a Python source still compiles (an exact one is compiled by `commit`)."""
    try:
        compile(text, "<edit>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True
