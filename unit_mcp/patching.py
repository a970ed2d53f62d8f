"""Pure text edits: exact replacement and unified-diff application that keep a file's line endings.

Models write LF; files may be CRLF or mixed. Matching is done on an LF view of
the text, and every newline the edit did not touch keeps its original ending;
newlines the edit introduces take the file's dominant ending.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from unidiff import Hunk, PatchedFile, PatchSet
from unidiff.errors import UnidiffParseError

from .errors import AmbiguousMatch, InvalidArgument, InvalidPatch, NoMatch, PatchConflict
from .matching import (
    LINE_MATCHERS,
    Opcode,
    Place,
    find,
    has_smart_quotes,
    looks_escaped,
    nearest,
    opcodes,
    plain_quotes,
    rebuild,
    unescape,
)


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
    return text.replace("\r\n", "\n") if "\r" in text else text  # the scan for a CR alone is a memchr


def replace_exact(
    text: str, old: str, new: str, *, replace_all: bool = False, label: str = "source"
) -> tuple[str, int]:
    """Replace `old` by `new`; it must occur exactly once unless replace_all. Returns (new_text, count).

    Each newline of `old` matches LF or CRLF; the replacement's newlines take the
    ending of the text they replace (the file's dominant ending when they replace none).
    """
    old_lf, new_lf = _checked(old, new)
    matches = _occurrences(text, old_lf)
    if not matches:
        raise NoMatch(f"`old` was not found in {label} (0 matches).", matches=0)
    if len(matches) > 1 and not replace_all:
        raise _ambiguous(text, matches, label)
    return _splice(text, matches, new_lf), len(matches)


def _checked(old: str, new: str) -> tuple[str, str]:
    """`old` and `new` with LF newlines, refused when empty or identical."""
    if old == "":
        raise InvalidArgument("`old` is empty.", hint="Pass the exact text to replace, or use `patch` to insert.")
    old_lf, new_lf = _to_lf(old), _to_lf(new)
    if old_lf == new_lf:
        raise InvalidArgument(
            "`old` and `new` are identical: nothing would change.", hint="Put the changed text in `new`."
        )
    return old_lf, new_lf


def _occurrences(text: str, old_lf: str) -> list[re.Match[str]]:
    """Where `old_lf` occurs in text, each of its newlines matching LF or CRLF."""
    pattern = re.compile(r"\r?\n".join(re.escape(part) for part in old_lf.split("\n")))
    return list(pattern.finditer(text))


def _splice(text: str, matches: list[re.Match[str]], new_lf: str) -> str:
    """`new_lf` in place of each match, its newlines taking the ending of the text they replace."""
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
    return "".join(pieces)


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


def _parse_patch(patch: str, source_id: str) -> PatchedFile:
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
    return patched


def apply_unified_diff(text: str, patch: str, source_id: str) -> tuple[str, int]:
    """Apply a unified diff for `source_id` to text. Hunks are found by their context; returns (text, hunks)."""
    edit = _apply_hunks(text, _parse_patch(patch, source_id), source_id, tolerant=False)
    return edit.text, edit.count


def _apply_hunks(
    text: str,
    patched: PatchedFile,
    source_id: str,
    *,
    tolerant: bool,
    compiles: Compiles | None = None,
    current_hash: str | None = None,
) -> Edit:
    lines = Lines.parse(text)
    body, endings = list(lines.body), list(lines.endings)
    dominant = dominant_ending(text)
    delta = 0
    floor = 0
    moved = 0  # lines added minus removed by the hunks applied so far: maps back to the lines of `text`
    kinds: list[str] = []
    spans: list[list[int]] = []
    loose: list[tuple[list[str], int, int]] = []  # the hunks matched loosely: their old lines, where (in `text`)
    for number, hunk in enumerate(patched, start=1):
        old_lines = [_strip_ending(line.value) for line in hunk if line.line_type in (" ", "-")]
        expected = (hunk.source_start - 1 if hunk.source_length else hunk.source_start) + delta
        at = _locate(body, old_lines, max(expected, floor), floor)
        if at is not None:
            seg_body, seg_end = _hunk_segment(hunk, body, endings, at, dominant)
            stop = at + len(old_lines)
            if seg_end and stop < len(body) and not seg_end[-1]:
                seg_end[-1] = dominant
            kinds.append("exact")
        else:
            if not tolerant:
                shown_at = min(max(expected, 0), len(body))
                raise PatchConflict(
                    f"Hunk {number} of the patch for {source_id} does not apply: its context and removed lines "
                    f"were not found (expected near line {shown_at + 1}).",
                    hunk=number,
                    expected_lines=old_lines,
                    actual_lines=body[shown_at : shown_at + len(old_lines)],
                )
            found = _tolerant_hunk(Lines(body, endings), hunk, old_lines, floor, f"hunk {number} of {source_id}")
            if found is None:
                raise _conflict(body, old_lines, number, source_id, expected, current_hash)
            kind, at, stop, seg_body, seg_end = found
            kinds.append(kind)
            loose.append((old_lines, at - moved, stop - moved))
        spans.append([at - moved + 1, stop - moved])
        body[at:stop] = seg_body
        endings[at:stop] = seg_end
        delta += (at - expected) + len(seg_body) - (stop - at)
        floor = at + len(seg_body)
        moved += len(seg_body) - (stop - at)
    out = Lines(body, endings).render()
    match = "+".join(dict.fromkeys(k for k in kinds if k != "exact")) or "exact"
    if match != "exact" and compiles is not None and not compiles(out):
        raise PatchConflict(
            f"The patch for {source_id} applies only {match} (at lines "
            f"{', '.join(f'{a}-{b}' for a, b in spans)}), and the edited source would not compile; nothing was "
            "changed.",
            hint="Rebuild the diff from the source as it is: the lines were matched loosely and the result is wrong.",
            matches=0,
            match=match,
            lines=spans,
            candidates=[c for sent, a, b in loose for c in _candidates(lines.body, sent, True, first=(a, b))[:1]],
            **({} if current_hash is None else {"current_hash": current_hash}),
        )
    return Edit(out, len(patched), match, spans)


def _hunk_segment(
    hunk: Hunk, body: list[str], endings: list[str], at: int, dominant: str
) -> tuple[list[str], list[str]]:
    """The lines (and endings) a hunk found exactly at `at` puts in place of its context and removed lines."""
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
    return seg_body, seg_end


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
    suffix = common_suffix(a, b, min(len(a), len(b)) - head)
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


# -- tolerant edits ------------------------------------------------------------------------------------------------

Compiles = Callable[[str], bool]
"""Whether an edited source still compiles (the caller's check, e.g. Python's for a .py source)."""

_CONTEXT = 2  # lines of context shown around each place an ambiguous `old` fits
_SHOWN_PLACES = 10  # places shown with their context (all are listed by line)
_TEXT_CAP = 2000  # characters of the first candidate's text (the others get a third)
_SHOWN_LINES = 8  # a conflicting hunk's expected and actual lines shown (its candidates show the rest)
_DIFF_CAP = 1200  # characters of the diff between what was sent and what is there (the others get a third)


@dataclass(frozen=True)
class Edit:
    """An edit that applied: the new text, how many places (or hunks) changed, which matcher found them
    (`exact`, `trimmed`, `reindented`, `blank_lines`, `unescaped`, `quotes`; a diff's several joined by '+'),
    and the lines of the text before the edit that each place covered, [first, last], counted from 1."""

    text: str
    count: int
    match: str
    lines: list[list[int]]


def edit_exact(
    text: str,
    old: str,
    new: str,
    *,
    replace_all: bool = False,
    label: str = "source",
    compiles: Compiles | None = None,
    current_hash: str | None = None,
) -> Edit:
    """`replace_exact`, and when `old` is not in the text as sent, the matchers that forgive trailing whitespace,
    an indentation shift, blank-line drift, JSON escapes left in and typographic quotes, tried in that order.

    A loose match applies only where it fits exactly one place and the result passes `compiles`; otherwise the
    refusal carries the places `old` most likely meant (and `current_hash`), so the next try needs no new read.
    An exact `old` that the text continues the way `new` ends is refused as cut short.
    """
    old_lf, new_lf = _checked(old, new)
    matches = _occurrences(text, old_lf)
    if len(matches) > 1 and not replace_all:
        raise _ambiguous(text, matches, label)
    if matches:
        if len(matches) == 1:
            _refuse_cut_short(text, matches[0], old_lf, new_lf, label, current_hash)
        spans = [_line_span(text, m.start(), m.end()) for m in matches]
        return Edit(_splice(text, matches, new_lf), len(matches), "exact", spans)
    lines = Lines.parse(text)
    tried: list[str] = []
    refused: tuple[int, int] | None = None
    for kind, keys, sent_old, sent_new in _variants(text, old_lf, new_lf):
        tried.append(kind)
        outcome = _attempt(text, lines, kind, keys, sent_old, sent_new, new_lf, label, compiles)
        if isinstance(outcome, Edit):
            return outcome
        if outcome is not None:
            refused = outcome
            break
    probe = unescape(old_lf) if looks_escaped(old_lf) else old_lf
    raise _no_match(lines.body, _as_lines(probe), label, current_hash, probe.endswith("\n"), refused, tried)


def _variants(text: str, old_lf: str, new_lf: str) -> list[tuple[str, str, str, str]]:
    """The tolerant attempts in order: (matcher, the text matched against, old, new)."""
    out = [(kind, text, old_lf, new_lf) for kind in LINE_MATCHERS]
    if looks_escaped(old_lf) or '\\"' in old_lf:
        out.append(("unescaped", text, unescape(old_lf), unescape(new_lf)))
    if has_smart_quotes(old_lf) or has_smart_quotes(text):
        out.append(("quotes", plain_quotes(text), plain_quotes(old_lf), plain_quotes(new_lf)))
    return out


def _attempt(
    text: str,
    lines: Lines,
    kind: str,
    keys: str,
    old_lf: str,
    new_lf: str,
    sent_new: str,
    label: str,
    compiles: Compiles | None,
) -> Edit | tuple[int, int] | None:
    """One tolerant attempt (`sent_new`: `new` as sent, before the attempt's decoding): the edit when it fits one
    place and the result compiles; that place's line range (start, stop) when it fits one place but the result
    would not compile or the added lines' place is unsure; None when it fits nowhere. Raises AmbiguousMatch when it
    fits several."""
    derived = kind in ("unescaped", "quotes")
    if derived:  # the old text, decoded or with plain quotes, may now be found as it is
        found = _occurrences(keys, old_lf)
        if len(found) > 1:
            raise _ambiguous(text, found, label, kind=kind)
        if found:
            span = _line_range(text, found[0])
            kept = kind == "quotes" and has_smart_quotes(text[found[0].start() : found[0].end()])
            out = _splice(text, found, sent_new if kept else new_lf)
            if compiles is not None and not compiles(out):
                return span
            return Edit(out, 1, kind, [_line_span(text, found[0].start(), found[0].end())])
    blocks = _blocks(old_lf, new_lf)
    if blocks is None:
        return None
    old_block, new_block = blocks
    key_lines = Lines.parse(keys).body if kind == "quotes" else lines.body
    for matcher in LINE_MATCHERS if derived else (kind,):
        places = _unique(find(key_lines, old_block, matcher), key_lines, old_block, 0)
        if len(places) > 1:
            raise _ambiguous_places(lines.body, places, label, matcher)
        if not places:
            continue
        place = places[0]
        raw = _blocks(old_lf, sent_new)
        if kind == "quotes" and raw and any(has_smart_quotes(body) for body in lines.body[place.start : place.stop]):
            new_block = raw[1]  # the source has typographic quotes there: `new` keeps those it was sent with
        replaced = _apply_place(lines, new_block, place, opcodes(old_block, new_block))
        if replaced is None:
            return place.start, place.stop
        out = replaced.render()
        if compiles is not None and not compiles(out):
            return place.start, place.stop
        return Edit(out, 1, kind if derived else matcher, [[place.start + 1, place.stop]])
    return None


def _unique(places: list[Place], keys: list[str], old_block: list[str], floor: int) -> list[Place]:
    """`places`, or when there is one, every place the loosest matcher finds: a block that fits once as sent but
    twice once indentation and blank lines are forgiven is ambiguous too."""
    if len(places) != 1:
        return places
    loosest = find(keys, old_block, LINE_MATCHERS[-1], floor)
    return loosest if len(loosest) > 1 else places


def _as_lines(text_lf: str) -> list[str]:
    return (text_lf[:-1] if text_lf.endswith("\n") else text_lf).split("\n")


def _blocks(old_lf: str, new_lf: str) -> tuple[list[str], list[str]] | None:
    """`old` and `new` as whole lines (None when only one of them ends with a newline: no line-wise match)."""
    if old_lf.endswith("\n") != new_lf.endswith("\n") and new_lf:
        return None
    return _as_lines(old_lf), _as_lines(new_lf) if new_lf or not old_lf.endswith("\n") else []


def _apply_place(lines: Lines, new_block: list[str], place: Place, ops: list[Opcode]) -> Lines | None:
    """`lines` with the block at `place` rebuilt: kept lines as the source has them, added lines with the file's
    dominant ending; the block's last line keeps the block's last ending. None if it cannot be re-indented."""
    rebuilt = rebuild(lines.body, new_block, place, ops)
    if rebuilt is None:
        return None
    crlf = sum(ending == "\r\n" for ending in lines.endings)
    dominant = "\r\n" if crlf * 2 > len(lines.endings) else "\n"
    body = lines.body[: place.start]
    endings = lines.endings[: place.start]
    for line, source in rebuilt:
        body.append(line)
        endings.append(dominant if source is None else lines.endings[source])
    if rebuilt:
        endings[-1] = lines.endings[place.stop - 1]
    return Lines(body + lines.body[place.stop :], endings + lines.endings[place.stop :])


def _line_span(text: str, start: int, end: int) -> list[int]:
    """[first, last] line (from 1) of text[start:end]."""
    first = text.count("\n", 0, start) + 1
    return [first, first + text.count("\n", start, max(start, end - 1))]


def _line_range(text: str, match: re.Match[str]) -> tuple[int, int]:
    first, last = _line_span(text, match.start(), match.end())
    return first - 1, last


def _around(text: str, start: int, end: int) -> tuple[str, str]:
    """The text from `_CONTEXT` lines above `start` up to it, and from `end` to the end of `_CONTEXT` lines below."""
    begin = text.rfind("\n", 0, start) + 1
    for _ in range(_CONTEXT):
        if begin == 0:
            break
        begin = text.rfind("\n", 0, begin - 1) + 1
    stop = end
    for _ in range(_CONTEXT + (0 if end == 0 or text[end - 1] == "\n" else 1)):
        newline = text.find("\n", stop)
        stop = len(text) if newline < 0 else newline + 1
    return _to_lf(text[begin:start])[-_TEXT_CAP // 4 :], _to_lf(text[end:stop])[: _TEXT_CAP // 4]


def _refuse_cut_short(
    text: str, match: re.Match[str], old_lf: str, new_lf: str, label: str, current_hash: str | None
) -> None:
    """Refuse an `old` that stops short of what `new` still ends with: the text goes on (to a line's end) exactly
    the way `new` ends, so replacing only `old` would leave that ending twice."""
    rest = text[match.end() : match.end() + 2 * len(new_lf) + 2]  # a tail `new` ends with is no longer than `new`
    if "\r" in rest:
        rest = _to_lf(rest)
    final = new_lf.rstrip("\n")[-1:]
    if not final or final + "\n" not in rest:  # such a tail ends a line of `rest` the way `new` ends: quick no
        return
    with_newline = new_lf.endswith("\n")  # a tail ends with its newline exactly when `new` does
    cut = 0
    at = 0
    for _ in range(10):
        newline = rest.find("\n", at)
        if newline < 0:
            break
        tail = rest[: newline + with_newline]
        if tail.strip() and new_lf.endswith(tail) and not old_lf.endswith(tail):
            cut = len(tail)
        at = newline + 1
    if not cut:
        return
    first = text.count("\n", 0, match.start()) + 1
    whole = old_lf + rest[:cut]
    last = first + whole.count("\n", 0, len(whole) - 1)
    raise NoMatch(
        f"`old` stops short in {label}: the source goes on after it the way `new` ends, so the edit would leave "
        f"that ending twice; nothing was changed.",
        hint="Resend with `old` set to the candidate's text (your `old` and what follows it), `new` unchanged.",
        matches=0,
        reason="cut_short",
        candidates=[{"lines": [first, last], "similarity": 1.0, "text": whole[:_TEXT_CAP]}],
        **({} if current_hash is None else {"current_hash": current_hash}),
    )


def _ambiguous(text: str, matches: list[re.Match[str]], label: str, *, kind: str = "exact") -> AmbiguousMatch:
    """`old` fits several places: each one's line, and for the first few the text just before and after it
    (`before + old + after` is the source's text there, so a longer `old` is one concatenation away)."""
    lines = [text.count("\n", 0, m.start()) + 1 for m in matches]
    places = []
    for line, match in zip(lines[:_SHOWN_PLACES], matches, strict=False):
        before, after = _around(text, match.start(), match.end())
        places.append({"line": line, "before": before, "after": after})
    return _ambiguity(lines, places, label, kind)


def _ambiguous_places(body: list[str], places: list[Place], label: str, kind: str) -> AmbiguousMatch:
    lines = [p.start + 1 for p in places]
    shown = []
    for place in places[:_SHOWN_PLACES]:
        before = "".join(line + "\n" for line in body[max(0, place.start - _CONTEXT) : place.start])
        after = "".join(line + "\n" for line in body[place.stop : place.stop + _CONTEXT])
        shown.append({"line": place.start + 1, "before": before[-_TEXT_CAP // 4 :], "after": after[: _TEXT_CAP // 4]})
    return _ambiguity(lines, shown, label, kind)


def _ambiguity(lines: list[int], places: list[dict[str, Any]], label: str, kind: str) -> AmbiguousMatch:
    shown = ", ".join(str(n) for n in lines[:20])
    how = "" if kind == "exact" else f" once {kind.replace('_', ' ')} (and nowhere exactly)"
    return AmbiguousMatch(
        f"`old` matches {len(lines)} times in {label}{how}, at lines {shown}.",
        matches=len(lines),
        lines=lines[:100],
        match=kind,
        candidates=places,
    )


def _candidates(
    body: list[str],
    sent: list[str],
    newline: bool,
    *,
    expected: int | None = None,
    first: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """The places `sent` most likely meant, best first, each with its lines, its text (a next `old` as it is), a
    diff from what was sent to what is there, and a similarity; bounded to a few KB in all."""
    ranked = nearest(body, sent, expected=expected)
    if first is not None:
        ranked = [(first[0], first[1], 1.0), *[r for r in ranked if r[1] <= first[0] or r[0] >= first[1]]][:3]
    sent_text = "".join(line + "\n" for line in sent)
    out = []
    for index, (start, stop, score) in enumerate(ranked):
        there = "".join(line + "\n" for line in body[start:stop])
        diff = "".join(difflib.unified_diff(sent_text.splitlines(True), there.splitlines(True), "sent", "source", n=1))
        cap = 1 if index == 0 else 3
        text = there if newline else there[:-1]
        candidate: dict[str, Any] = {
            "lines": [start + 1, stop],
            "similarity": score,
            "text": text[: _TEXT_CAP // cap],
            "diff": diff[: _DIFF_CAP // cap],
        }
        if len(text) > _TEXT_CAP // cap or len(diff) > _DIFF_CAP // cap:
            candidate["cut"] = True
        out.append(candidate)
    return out


def _no_match(
    body: list[str],
    sent: list[str],
    label: str,
    current_hash: str | None,
    newline: bool,
    refused: tuple[int, int] | None,
    tried: list[str],
) -> NoMatch:
    candidates = _candidates(body, sent, newline, first=refused)
    where = f", nearest at lines {candidates[0]['lines'][0]}-{candidates[0]['lines'][1]}" if candidates else ""
    if refused is not None:
        message = (
            f"`old` fits {label} only loosely (at lines {refused[0] + 1}-{refused[1]}), and there the edited source "
            "would not compile, or where the added lines go is unsure (next to blank lines that differ from the "
            "source's); nothing was changed."
        )
    else:
        message = f"`old` was not found in {label} (0 matches, none with {', '.join(tried)}{where})."
    return NoMatch(
        message,
        hint="Resend with `old` set to a candidate's `text` (the source as it is there; its `diff` shows how it "
        "differs from what you sent), and `new` changed to match. No need to read the source again.",
        matches=0,
        reason="unsure" if refused is not None else "not_found",
        tried=tried,
        candidates=candidates,
        **({} if current_hash is None else {"current_hash": current_hash}),
    )


def edit_diff(
    text: str, patch: str, source_id: str, *, compiles: Compiles | None = None, current_hash: str | None = None
) -> Edit:
    """`apply_unified_diff`, and for a hunk whose context and removed lines are not in the text as sent, the
    line matchers (trailing whitespace, indentation shift, blank-line drift, typographic quotes): applied only where
    a hunk fits one place at or after the previous hunk and the result passes `compiles`. A patch left
    JSON-escaped on one line is decoded first. A hunk that fits nowhere is refused with its nearest places."""
    escaped = "\n" not in patch.strip("\n") and "\\n" in patch
    edit = _apply_hunks(
        text,
        _parse_patch(unescape(patch) if escaped else patch, source_id),
        source_id,
        tolerant=True,
        compiles=compiles,
        current_hash=current_hash,
    )
    if escaped:
        return Edit(
            edit.text, edit.count, "unescaped" if edit.match == "exact" else f"unescaped+{edit.match}", edit.lines
        )
    return edit


def _hunk_ops(hunk: Hunk) -> tuple[list[str], list[Opcode]]:
    """A hunk's new lines (context and added) and the opcodes from its old lines to them (removed lines and the
    added lines after them make one `replace`, as difflib would say)."""
    new: list[str] = []
    ops: list[Opcode] = []
    i = j = 0
    for line in hunk:
        kind = line.line_type
        if kind == " ":
            ops.append(("equal", i, i + 1, j, j + 1))
            new.append(_strip_ending(line.value))
            i, j = i + 1, j + 1
            continue
        if kind not in "-+":
            continue
        if kind == "-":
            i += 1
        else:
            new.append(_strip_ending(line.value))
            j += 1
        if ops and ops[-1][0] != "equal":
            _, i1, _, j1, _ = ops.pop()
        else:
            i1, j1 = (i - 1, j) if kind == "-" else (i, j - 1)
        tag = "delete" if j == j1 else "insert" if i == i1 else "replace"
        ops.append((tag, i1, i, j1, j))
    return new, ops


def _tolerant_hunk(
    lines: Lines, hunk: Hunk, old_lines: list[str], floor: int, label: str
) -> tuple[str, int, int, list[str], list[str]] | None:
    """(matcher, start, stop, new lines, their endings) for a hunk found loosely at one place at or after `floor`;
    None when it fits nowhere; AmbiguousMatch when it fits several."""
    if not old_lines:
        return None
    new_block, ops = _hunk_ops(hunk)
    plain = [plain_quotes(line) for line in lines.body]
    attempts = [(kind, lines.body, old_lines, new_block, kind) for kind in LINE_MATCHERS]
    if plain != lines.body or any(has_smart_quotes(line) for line in old_lines):
        quoted = [plain_quotes(line) for line in old_lines]
        attempts += [("quotes", plain, quoted, [plain_quotes(n) for n in new_block], k) for k in LINE_MATCHERS]
    for name, keys, sent, new, matcher in attempts:
        places = _unique(find(keys, sent, matcher, floor), keys, sent, floor)
        if len(places) > 1:
            raise _ambiguous_places(lines.body, places, label, name)
        if not places:
            continue
        place = places[0]
        if name == "quotes" and any(has_smart_quotes(lines.body[i]) for i in range(place.start, place.stop)):
            new = new_block
        replaced = _apply_place(lines, new, place, ops)
        if replaced is None:
            return None
        size = len(replaced.body) - len(lines.body) + place.stop - place.start
        return (
            name,
            place.start,
            place.stop,
            replaced.body[place.start : place.start + size],
            replaced.endings[place.start : place.start + size],
        )
    return None


def _conflict(
    body: list[str], old_lines: list[str], number: int, source_id: str, expected: int, current_hash: str | None
) -> PatchConflict:
    shown_at = min(max(expected, 0), len(body))
    candidates = _candidates(body, old_lines, True, expected=shown_at)
    where = f"; nearest at lines {candidates[0]['lines'][0]}-{candidates[0]['lines'][1]}" if candidates else ""
    return PatchConflict(
        f"Hunk {number} of the patch for {source_id} does not apply: its context and removed lines were not found, "
        f"not even loosely (expected near line {shown_at + 1}{where}).",
        hint="Rebuild the hunk from a candidate's `text` (the source as it is there; its `diff` shows how it "
        "differs from your hunk's context and removed lines), or send old/new. No need to read the source again.",
        hunk=number,
        expected_lines=[line[:200] for line in old_lines[:_SHOWN_LINES]],
        actual_lines=[line[:200] for line in body[shown_at : shown_at + min(len(old_lines), _SHOWN_LINES)]],
        candidates=candidates,
        **({} if current_hash is None else {"current_hash": current_hash}),
    )
