"""Pure text edits: exact replacement and unified-diff application that keep a file's line endings.

Models write LF; files may be CRLF or mixed. Matching is done on an LF view of
the text, and every newline the edit did not touch keeps its original ending;
newlines the edit introduces take the file's dominant ending.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from unidiff import PatchSet
from unidiff.errors import UnidiffParseError

from .errors import AmbiguousMatch, InvalidArgument, InvalidPatch, NoMatch, PatchConflict


@dataclass(frozen=True)
class Lines:
    """Text as lines without their endings, plus each line's ending ('\\n', '\\r\\n' or '' for the last)."""

    body: list[str]
    endings: list[str]

    @classmethod
    def parse(cls, text: str) -> Lines:
        raw = text.split("\n")
        last = raw.pop()
        endings = ["\r\n" if line.endswith("\r") else "\n" for line in raw]
        body = [line[:-1] if line.endswith("\r") else line for line in raw]
        if last:  # a last line without a newline
            body.append(last)
            endings.append("")
        return cls(body, endings)

    def render(self) -> str:
        return "".join(line + ending for line, ending in zip(self.body, self.endings, strict=True))


def _ending_counts(text: str) -> tuple[int, int]:
    """(LF, CRLF) line endings of text, counted in C: no per-line work on a read or an edit."""
    crlf = text.count("\r\n")
    return text.count("\n") - crlf, crlf


def dominant_ending(text: str) -> str:
    if "\r" not in text:
        return "\n"
    lf, crlf = _ending_counts(text)
    return "\r\n" if crlf > lf else "\n"


def line_ending_kind(text: str) -> str:
    if "\r" not in text:  # one memchr: the common case
        return "lf" if "\n" in text else "none"
    lf, _ = _ending_counts(text)
    return "mixed" if lf else "crlf"


def _to_lf(text: str) -> str:
    return text.replace("\r\n", "\n")


def replace_exact(
    text: str, old: str, new: str, *, replace_all: bool = False, label: str = "source"
) -> tuple[str, int]:
    """Replace `old` by `new`; it must occur exactly once unless replace_all. Returns (new_text, count).

    Each newline of `old` matches LF or CRLF; the replacement's newlines take the
    ending of the text they replace (the file's dominant ending when they replace none).
    """
    if old == "":
        raise InvalidArgument("`old` is empty.", hint="Pass the exact text to replace, or use `patch` to insert.")
    old_lf, new_lf = _to_lf(old), _to_lf(new)
    if old_lf == new_lf:
        raise InvalidArgument(
            "`old` and `new` are identical: nothing would change.", hint="Put the changed text in `new`."
        )
    pattern = re.compile(r"\r?\n".join(re.escape(part) for part in old_lf.split("\n")))
    matches = list(pattern.finditer(text))
    if not matches:
        raise NoMatch(f"`old` was not found in {label} (0 matches).", matches=0)
    line_numbers = [text.count("\n", 0, m.start()) + 1 for m in matches]
    if len(matches) > 1 and not replace_all:
        shown = ", ".join(str(n) for n in line_numbers[:20])
        raise AmbiguousMatch(
            f"`old` matches {len(matches)} times in {label}, at lines {shown}.",
            matches=len(matches),
            lines=line_numbers,
        )
    dominant = dominant_ending(text)
    pieces: list[str] = []
    cursor = 0
    for match in matches:
        matched = match.group(0)
        ending = "\r\n" if "\r\n" in matched else ("\n" if "\n" in matched else dominant)
        pieces.append(text[cursor : match.start()])
        pieces.append(new_lf.replace("\n", ending))
        cursor = match.end()
    pieces.append(text[cursor:])
    return "".join(pieces), len(matches)


def _strip_ending(value: str) -> str:
    if value.endswith("\r\n"):
        return value[:-2]
    return value[:-1] if value.endswith("\n") else value


def _with_headers(patch: str, source_id: str) -> str:
    if any(line.startswith("--- ") for line in patch.splitlines()[:50]):
        return patch
    return f"--- a/{source_id}\n+++ b/{source_id}\n{patch}"


def _patched_name(name: str) -> str:
    name = name.strip().strip('"')
    for prefix in ("a/", "b/"):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def apply_unified_diff(text: str, patch: str, source_id: str) -> tuple[str, int]:
    """Apply a unified diff for `source_id` to text. Hunks are found by their context; returns (text, hunks)."""
    patch = _to_lf(patch)
    if not patch.endswith("\n"):
        patch += "\n"
    try:
        patch_set = PatchSet(_with_headers(patch, source_id))
    except UnidiffParseError as exc:
        raise InvalidPatch(f"The patch for {source_id} is not a valid unified diff: {exc}.") from None
    if len(patch_set) != 1:
        raise InvalidPatch(f"The patch touches {len(patch_set)} files; it must touch only {source_id}.")
    patched = patch_set[0]
    raw_names = {_patched_name(patched.source_file), _patched_name(patched.target_file)}
    if "/dev/null" in raw_names:
        raise InvalidPatch("A patch cannot create or delete a source.", hint="Use unit_create_source to add a file.")
    names = raw_names - {""}
    if names and names != {source_id}:
        raise InvalidPatch(
            f"The patch is for {', '.join(sorted(names))}, not {source_id}.",
            hint=f"Use headers '--- a/{source_id}' and '+++ b/{source_id}', or none.",
        )
    if len(patched) == 0:
        raise InvalidPatch(f"The patch for {source_id} has no hunks.")

    lines = Lines.parse(text)
    body, endings = list(lines.body), list(lines.endings)
    dominant = dominant_ending(text)
    delta = 0
    floor = 0
    for number, hunk in enumerate(patched, start=1):
        old_lines = [_strip_ending(line.value) for line in hunk if line.line_type in (" ", "-")]
        expected = (hunk.source_start - 1 if hunk.source_length else hunk.source_start) + delta
        at = _locate(body, old_lines, max(expected, floor), floor)
        if at is None:
            shown_at = min(max(expected, 0), len(body))
            raise PatchConflict(
                f"Hunk {number} of the patch for {source_id} does not apply: its context and removed lines "
                f"were not found (expected near line {shown_at + 1}).",
                hunk=number,
                expected_lines=old_lines,
                actual_lines=body[shown_at : shown_at + len(old_lines)],
            )
        seg_body: list[str] = []
        seg_end: list[str] = []
        index = at
        previous = ""
        for line in hunk:
            kind = line.line_type
            if kind == "\\":
                if previous in (" ", "+") and seg_end:
                    seg_end[-1] = ""
                continue
            if kind == " ":
                seg_body.append(body[index])
                seg_end.append(endings[index] or dominant)
                index += 1
            elif kind == "-":
                index += 1
            elif kind == "+":
                seg_body.append(_strip_ending(line.value))
                seg_end.append(dominant)
            previous = kind
        stop = at + len(old_lines)
        if seg_end and stop < len(body) and not seg_end[-1]:
            seg_end[-1] = dominant
        body[at:stop] = seg_body
        endings[at:stop] = seg_end
        delta += (at - expected) + len(seg_body) - len(old_lines)
        floor = at + len(seg_body)
    return Lines(body, endings).render(), len(patched)


def reverse_unified_diff(patch: str, source_id: str) -> str:
    """The diff that undoes `patch` (a repeated edit finds the text it started from)."""
    patch = _to_lf(patch)
    if not patch.endswith("\n"):
        patch += "\n"
    try:
        patched = PatchSet(_with_headers(patch, source_id))[0]
    except (UnidiffParseError, IndexError):
        raise InvalidPatch(f"The patch for {source_id} is not a valid unified diff.") from None
    out = [f"--- a/{source_id}\n", f"+++ b/{source_id}\n"]
    for hunk in patched:
        out.append(f"@@ -{hunk.target_start},{hunk.target_length} +{hunk.source_start},{hunk.source_length} @@\n")
        for line in hunk:
            out.append({"-": "+", "+": "-"}.get(line.line_type, line.line_type) + line.value)
    return "".join(out)


def _locate(body: list[str], needle: list[str], expected: int, floor: int) -> int | None:
    """Nearest position at or after floor where needle occurs, searching outward from expected."""
    if not needle:
        return min(max(expected, floor), len(body))
    limit = len(body) - len(needle)
    if limit < floor:
        return None
    for distance in range(0, max(limit - floor, expected - floor, 0) + 1):
        for candidate in (expected - distance, expected + distance) if distance else (expected,):
            if floor <= candidate <= limit and body[candidate : candidate + len(needle)] == needle:
                return candidate
    return None


def _keepends(text: str) -> list[str]:
    """Lines with their '\n' (split on '\n' only: other separators are ordinary characters here)."""
    lines = [line + "\n" for line in text.split("\n")]
    last = lines.pop()[:-1]
    if last:
        lines.append(last)
    return lines


_RANGE = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def common_prefix(a: str, b: str) -> int:
    """Length of the common prefix of a and b, compared a block at a time in C, then bisected."""
    limit = min(len(a), len(b))
    at = 0
    while at < limit and a[at : at + _BLOCK] == b[at : at + _BLOCK]:
        at += _BLOCK
    if at >= limit:
        return limit
    lo, hi = at, min(at + _BLOCK, limit)
    if a[at:hi] == b[at:hi]:
        return hi
    while hi - lo > 1:  # a[at:lo] == b[at:lo] and a[at:hi] != b[at:hi]
        mid = (lo + hi) // 2
        if a[at:mid] == b[at:mid]:
            lo = mid
        else:
            hi = mid
    return lo


_BLOCK = 4096


def common_suffix(a: str, b: str, limit: int) -> int:
    """Length of the common suffix of a and b, at most `limit`: `common_prefix` from the end, without reversed
    copies of the texts."""
    limit = min(limit, len(a), len(b))
    end_a, end_b = len(a), len(b)
    at = 0
    while at < limit:
        step = min(at + _BLOCK, limit)
        if a[end_a - step : end_a - at] != b[end_b - step : end_b - at]:
            break
        at = step
    else:
        return limit
    lo, hi = at, min(at + _BLOCK, limit)
    while hi - lo > 1:  # the last lo characters match, the last hi do not
        mid = (lo + hi) // 2
        if a[end_a - mid : end_a - lo] == b[end_b - mid : end_b - lo]:
            lo = mid
        else:
            hi = mid
    return lo


def unified_diff(before: str, after: str, source_id: str, *, context: int = 3) -> str:
    """A unified diff of before → after that unidiff and `patch` read back, with no-newline markers.

    difflib runs only on the lines between the common head and tail (plus context), found by comparing the
    texts in C, so the cost follows the size of the change, not of the file.
    """
    a, b = _to_lf(before), _to_lf(after)
    if a == b:
        return ""
    head = a.rfind("\n", 0, common_prefix(a, b)) + 1  # start of the first line that differs
    suffix = min(common_prefix(a[::-1], b[::-1]), min(len(a), len(b)) - head)
    newline = a.find("\n", len(a) - suffix)  # the first line whose preceding newline is in the common suffix
    tail = len(a) if newline == -1 else newline + 1
    start = head
    for _ in range(context):
        if start == 0:
            break
        start = a.rfind("\n", 0, start - 1) + 1
    end = tail
    for _ in range(context):
        if end >= len(a):
            break
        newline = a.find("\n", end)
        end = len(a) if newline == -1 else newline + 1
    offset = a.count("\n", 0, start)

    def shift(match: re.Match[str]) -> str:
        return f"@@ -{int(match[1]) + offset}{match[2]} +{int(match[3]) + offset}{match[4]} @@"

    out: list[str] = []
    a_window, b_window = _keepends(a[start:end]), _keepends(b[start : end + len(b) - len(a)])
    for index, line in enumerate(
        difflib.unified_diff(a_window, b_window, f"a/{source_id}", f"b/{source_id}", n=context)
    ):
        if index < 2:  # the two file headers (a removed "--x" or added "++x" line also starts with "---"/"+++")
            out.append(line.rstrip("\n") + "\n")
            continue
        if line.startswith("@@"):
            line = _RANGE.sub(shift, line)
        out.append(line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)
