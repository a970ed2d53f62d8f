"""What a patch asks for, checked once: an exact replacement or a unified diff, applied exactly or by a tolerant
matcher that is never wrong (`patching`), and undone (to recognise a repeat)."""

from __future__ import annotations

from dataclasses import dataclass

from ..arguments import ApplyPatchArgs
from ..errors import InvalidArgument
from ..patching import Edit, apply_unified_diff, edit_diff, edit_exact, replace_exact, reverse_unified_diff
from ._units import Units


@dataclass(frozen=True)
class Patch:
    """A patch's arguments, checked: an exact replacement or a unified diff, which can also be undone."""

    mode: str
    source_id: str
    label: str
    patch: str | None = None
    old: str = ""
    new: str = ""
    replace_all: bool = False

    @classmethod
    def of(cls, svc: Units, args: ApplyPatchArgs) -> Patch:
        patch, old, new = args.patch, args.old, args.new
        if patch is not None and (old is not None or new is not None):
            raise InvalidArgument(
                "Pass either `patch` or `old`+`new`, not both.", hint="Use one editing mode per call."
            )
        for name, value in (("patch", patch), ("old", old), ("new", new)):
            if value is not None:
                svc.check_size(name, value)
        label = f"{args.source_id} of unit {args.unit_id}"
        if patch is not None:
            if not patch.strip():
                raise InvalidArgument("`patch` is empty.", hint="Send a unified diff with at least one @@ hunk.")
            return cls("diff", args.source_id, label, patch=patch)
        if old is None or new is None:
            raise InvalidArgument(
                "Pass `patch` (a unified diff) or both `old` and `new`.",
                hint="For an exact replacement give `old` (text to find) and `new` (its replacement; may be empty).",
            )
        return cls("exact", args.source_id, label, old=old, new=new, replace_all=args.replace_all)

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


def _compiles(text: str) -> bool:
    """Whether a loosely matched edit of a Python source still compiles (an exact one is compiled by `commit`)."""
    try:
        compile(text, "<edit>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True
