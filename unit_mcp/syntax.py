"""Proving that an edited Python source compiles by compiling only the top-level statements the edit touched.

When the source before compiles and the edited lines compile on their own between two top-level statement
starts, the whole source compiles too. Whatever the shortcut cannot prove, every rejection included, is left to
the full `compile()`, so a dry run refuses exactly what the real edit would.
"""

from __future__ import annotations

import ast
import bisect
import threading
from collections import OrderedDict

from .patching import common_prefix, common_suffix

_CROSS_STATEMENT = ("global", "nonlocal", "__future__")


class SyntaxCache:
    """Where the top-level statements start in sources known to compile, keyed by content hash (LRU)."""

    def __init__(self, size: int = 64) -> None:
        self._starts: OrderedDict[str, list[int]] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def _get(self, key: str) -> list[int] | None:
        with self._lock:
            starts = self._starts.get(key)
            if starts is not None:
                self._starts.move_to_end(key)
            return starts

    def _put(self, key: str, starts: list[int]) -> None:
        with self._lock:
            self._starts[key] = starts
            self._starts.move_to_end(key)
            while len(self._starts) > self._size:
                self._starts.popitem(last=False)

    def knows(self, key: str) -> bool:
        with self._lock:
            return key in self._starts

    def compiles(self, before_key: str, before: str, after_key: str, after: str, *, learn: bool = True) -> bool:
        """True only if `after` (the edited `before`) is proven to compile; False means: compile it in full.

        With `learn`, keeps the statement starts of a proven `after`, so a chain of written edits stays cheap (a
        dry run need not). The first look at a `before` not seen yet parses it whole, once."""
        if not _plain_header(after):
            return False
        before_starts = self._get(before_key)
        if before_starts is None:
            # Kept empty when there is no shortcut for this source, so it is not parsed again on every dry run.
            before_starts = (_statement_starts(before) if _local(before) else None) or []
            self._put(before_key, before_starts)
        if not before_starts:
            return False
        head = common_prefix(before, after)
        tail = common_suffix(before, after, min(len(before), len(after)) - head)
        changed_end = len(before) - tail
        # The last statement start at or before the first change, and the first one past the last changed
        # character (so the newline ending the edited lines is unchanged); the end of the file otherwise.
        start = before_starts[bisect.bisect_right(before_starts, head) - 1]
        index = bisect.bisect_left(before_starts, changed_end + 1)
        end = before_starts[index] if index < len(before_starts) else len(before)
        shift = len(after) - len(before)
        middle = after[start : end + shift]
        # `before` had no cross-statement construct, so `after` has one only if `middle` does (none of them spans
        # a line break, and the middle starts and ends at one).
        middle_starts = _statement_starts(middle) if _local(middle) else None
        if middle_starts is None:
            return False
        if not learn:
            return True
        after_starts = [s for s in before_starts if s < start]
        after_starts += [start + s for s in middle_starts]
        after_starts += [s + shift for s in before_starts[index:]]
        self._put(after_key, sorted(set(after_starts)))
        return True


def _local(text: str) -> bool:
    """No construct whose validity hangs on other statements (module-level `global`/`nonlocal`, `__future__`
    imports), and no lone CR (it ends a line for Python but not for this module's line offsets)."""
    return not any(word in text for word in _CROSS_STATEMENT) and text.count("\r") == text.count("\r\n")


def _plain_header(text: str) -> bool:
    """No BOM and no encoding declaration (which only the first two lines can hold)."""
    second_newline = text.find("\n", text.find("\n") + 1)
    return not text.startswith("\ufeff") and "coding" not in (text if second_newline < 0 else text[:second_newline])


def _statement_starts(source: str) -> list[int] | None:
    """Character offsets of the lines where a top-level statement starts in column 0 (so on a line of its own),
    not continued from the line before (the file's start included), or None if the source does not compile."""
    try:
        tree = ast.parse(source)
        compile(tree, "<syntax-check>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    line_offsets = [0]
    at = source.find("\n")
    while at >= 0:
        line_offsets.append(at + 1)
        at = source.find("\n", at + 1)
    starts = [0]
    for node in tree.body:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
        if node.col_offset == 0 and first - 1 < len(line_offsets):
            offset = line_offsets[first - 1]
            # Not after a line ending in a backslash: that line continues into this one.
            if not source[max(0, offset - 3) : offset].rstrip("\r\n").endswith("\\"):
                starts.append(offset)
    return sorted(set(starts))
