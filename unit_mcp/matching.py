"""Tolerant line matching for edits whose `old` (or a hunk's context) is not in the source as sent.

Each matcher forgives one way agents get a block wrong and finds every place it fits; the caller applies a place
only when there is exactly one. A place maps each line sent to the source line it stands for, so the lines the
edit keeps are taken from the source as they are and only the lines it adds are the agent's (re-indented).
Pure functions on lists of lines without their endings; `nearest` ranks where a block that fits nowhere was
probably meant to go.
"""

from __future__ import annotations

import bisect
import difflib
import itertools
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

LINE_MATCHERS = ("trimmed", "reindented", "blank_lines")
"""In the order they are tried: each forgives what the one before it does, and one thing more."""

TAB = 4
"""The width of a tab in indentation, for telling tab and space indentation apart."""

_SMART = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201c": '"', "\u201d": '"', "\u201e": '"'})


def plain_quotes(text: str) -> str:
    """Typographic quotes made ASCII, one character for one (positions and lines stay where they were)."""
    return text.translate(_SMART)


def has_smart_quotes(text: str) -> bool:
    return plain_quotes(text) != text


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "/": "/"}


def unescape(text: str) -> str:
    """Text left JSON-escaped by a layer above (`\\n`, `\\t`, `\\"`, `\\\\`), decoded; other backslashes stay."""
    out: list[str] = []
    index = 0
    while True:
        at = text.find("\\", index)
        if at < 0 or at + 1 >= len(text):
            out.append(text[index:])
            return "".join(out)
        out.append(text[index:at])
        decoded = _ESCAPES.get(text[at + 1])
        out.append(text[at : at + 2] if decoded is None else decoded)
        index = at + 2


def looks_escaped(text: str) -> bool:
    """A payload that still holds `\\n` where lines should break: no real newline, or fewer than escaped ones."""
    return "\\n" in text and text.count("\\n") > text.count("\n")


def _width(line: str) -> int:
    lead = len(line) - len(line.lstrip(" \t"))
    return len(line[:lead].expandtabs(TAB))


@dataclass(frozen=True)
class Place:
    """Where a block of lines fits: source lines [start, stop), and for each line sent, the source line it stands
    for (None: a blank line the source does not have). `shift` re-indents the lines the edit adds."""

    start: int
    stop: int
    mapping: tuple[int | None, ...]
    shift: int = 0
    tabs: bool = False
    moved: bool = False
    drift: tuple[tuple[int, int], ...] = ()
    """Gaps between two sent non-blank lines, as [first, last] indexes of the sent lines after the first, whose
    blank lines differ in number from the source's: a line added in one could go before those blank lines or
    after them, so such an edit is not applied."""

    def reindent(self, line: str) -> str | None:
        """`line` moved by the place's shift, in the source's indentation style; None if it would go below 0."""
        if not self.moved or not line.strip():
            return line
        width = _width(line) + self.shift
        if width < 0:
            return None
        indent = "\t" * (width // TAB) + " " * (width % TAB) if self.tabs else " " * width
        return indent + line.lstrip(" \t")


def find(body: Sequence[str], old: Sequence[str], kind: str, floor: int = 0) -> list[Place]:
    """Every place at or after `floor` where `old` fits `body` under the matcher `kind`."""
    if not any(line.strip() for line in old):
        return []
    if kind == "trimmed":
        return _trimmed(body, old, floor)
    if kind == "reindented":
        return _reindented(body, old, floor)
    if kind == "blank_lines":
        return _blank_lines(body, old, floor)
    raise ValueError(kind)


def _starts(keys: Sequence[str], first: str, floor: int) -> list[int]:
    return [i for i in range(floor, len(keys)) if keys[i] == first]


def _trimmed(body: Sequence[str], old: Sequence[str], floor: int) -> list[Place]:
    keys = [line.rstrip() for line in body]
    want = [line.rstrip() for line in old]
    size = len(want)
    return [
        Place(i, i + size, tuple(range(i, i + size)))
        for i in _starts(keys, want[0], floor)
        if keys[i : i + size] == want
    ]


def _shift(body: Sequence[str], old: Sequence[str], pairs: Sequence[tuple[int, int]]) -> tuple[int, bool] | None:
    """The one indentation shift taking each sent line of `pairs` (old index, source index) to its source line,
    and whether the source indents with tabs there; None if the shift is not uniform."""
    shifts = {_width(body[s]) - _width(old[o]) for o, s in pairs if old[o].strip()}
    if len(shifts) != 1:
        return None
    tabs = any(body[s].startswith("\t") for _, s in pairs)
    return shifts.pop(), tabs


def _reindented(body: Sequence[str], old: Sequence[str], floor: int) -> list[Place]:
    keys = [line.strip() for line in body]
    want = [line.strip() for line in old]
    size = len(want)
    places = []
    for i in _starts(keys, want[0], floor):
        if keys[i : i + size] != want:
            continue
        shift = _shift(body, old, [(j, i + j) for j in range(size)])
        if shift is not None:
            places.append(Place(i, i + size, tuple(range(i, i + size)), *shift, moved=True))
    return places


def _blank_lines(body: Sequence[str], old: Sequence[str], floor: int) -> list[Place]:
    """Blank lines ignored on both sides; the sent blank lines are then paired with the source's, in order, where
    the source has them (so a blank line the edit removes is removed)."""
    src = [i for i in range(floor, len(body)) if body[i].strip()]
    keys = [body[i].strip() for i in src]
    sent = [j for j, line in enumerate(old) if line.strip()]
    want = [old[j].strip() for j in sent]
    size = len(want)
    places = []
    for k in _starts(keys, want[0], 0):
        if keys[k : k + size] != want:
            continue
        pairs = list(zip(sent, src[k : k + size], strict=True))
        shift = _shift(body, old, pairs)
        if shift is None:
            continue
        mapping: list[int | None] = [None] * len(old)
        for o, s in pairs:
            mapping[o] = s
        # Blank lines sent before, between and after the matched lines stand for the source's own, paired from the
        # matched line outwards while the source has them.
        (first_o, first_s), (last_o, last_s) = pairs[0], pairs[-1]
        s = first_s - 1
        for o in range(first_o - 1, -1, -1):
            if s < floor or body[s].strip():
                break
            mapping[o], s = s, s - 1
        for (o1, s1), (o2, s2) in itertools.pairwise(pairs):
            for o, s in zip(range(o1 + 1, o2), range(s1 + 1, s2), strict=False):
                mapping[o] = s
        s = last_s + 1
        for o in range(last_o + 1, len(old)):
            if s >= len(body) or body[s].strip():
                break
            mapping[o], s = s, s + 1
        mapped = [s for s in mapping if s is not None]
        drift = []
        edges = [(-1, floor - 1), *pairs, (len(old), len(body))]
        for (o1, s1), (o2, s2) in itertools.pairwise(edges):
            inner = range(o1 + 1, o2)
            if any(mapping[o] is None for o in inner) or (o1 >= 0 and o2 < len(old) and s2 - s1 != o2 - o1):
                drift.append((o1 + 1, o2))
        places.append(Place(min(mapped), max(mapped) + 1, tuple(mapping), *shift, moved=True, drift=tuple(drift)))
    return places


Opcode = tuple[str, int, int, int, int]


def opcodes(old: Sequence[str], new: Sequence[str]) -> list[Opcode]:
    return [tuple(op) for op in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()]  # type: ignore[misc]


def rebuild(
    body: Sequence[str], new: Sequence[str], place: Place, ops: Sequence[Opcode]
) -> list[tuple[str, int | None]] | None:
    """The lines that replace source lines [place.start, place.stop): each with the source line it was taken from
    (None: a line the edit adds, re-indented). None if an added line cannot be re-indented, or if lines are added
    where the blank lines differ from the source's (they could go before the blank lines or after)."""
    out: list[tuple[str, int | None]] = []
    cursor = place.start
    mapped = [(i, at) for i, at in enumerate(place.mapping) if at is not None]

    def upto(stop: int) -> None:  # the source lines from the cursor up to `stop`, kept as they are
        nonlocal cursor
        out.extend((body[s], s) for s in range(cursor, stop))
        cursor = max(cursor, stop)

    for tag, i1, i2, j1, j2 in ops:
        if tag != "equal" and j2 > j1 and any(i1 <= last and i2 >= first for first, last in place.drift):
            return None
        for i in range(i1, i2):
            at = place.mapping[i]
            if at is None:
                continue
            upto(at + 1 if tag == "equal" else at)  # a removed line goes; the lines the source has before it stay
            cursor = at + 1
        if tag in ("insert", "replace"):
            added = new[j1:j2]
            if tag == "insert" and added[0].strip() and not added[-1].strip():
                # Blank lines the source has here that were not sent: an addition that ends with its own blank
                # line goes after them (a new paragraph or definition), any other stays with the line before.
                upto(next((at for i, at in mapped if i >= i2), place.stop))
            for line in added:
                moved = place.reindent(line)
                if moved is None:
                    return None
                out.append((moved, None))
    upto(place.stop)
    return out


def nearest(
    body: Sequence[str], old: Sequence[str], *, expected: int | None = None, limit: int = 3
) -> list[tuple[int, int, float]]:
    """Up to `limit` places (start, stop, similarity 0..1) where `old` was most likely meant, best first.

    Sent lines found verbatim (stripped) vote for where the block would start; the best-voted windows (and the
    line a hunk expected) are scored by their similarity to the block as sent."""
    size = len(old)
    if not body or not size:
        return []
    want = [line.strip() for line in old]
    wanted = {k for k in want if len(k) > 1}
    positions: dict[str, list[int]] = defaultdict(list)
    for i, line in enumerate(body):
        key = line.strip()
        if key in wanted:
            positions[key].append(i)
    votes: dict[int, float] = defaultdict(float)
    for j, key in enumerate(want):
        found = positions.get(key, ())
        if 0 < len(found) <= 50:
            weight = min(len(key), 40) / len(found)
            for p in found:
                votes[p - j] += weight
    starts: list[int] = sorted(votes, key=lambda s: -votes[s])[:6]
    if expected is not None:
        starts.append(expected)
    if not votes:
        starts.extend(_close_starts(body, want))
    seen: set[int] = set()
    scored: list[tuple[int, int, float]] = []
    sent = "\n".join(old)
    for start in starts:
        start = max(0, min(start, len(body) - 1))
        if start in seen:
            continue
        seen.add(start)
        stop = min(len(body), start + size)
        matcher = difflib.SequenceMatcher(None, sent, "\n".join(body[start:stop]), autojunk=False)
        scored.append((start, stop, round(matcher.ratio(), 3)))
    scored.sort(key=lambda c: -c[2])
    best: list[tuple[int, int, float]] = []
    for start, stop, score in scored:
        if all(stop <= s or start >= e for s, e, _ in best):
            best.append((start, stop, score))
        if len(best) == limit:
            break
    return best


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


def _close_starts(body: Sequence[str], want: Sequence[str]) -> list[int]:
    """Start lines voted by the sent lines' words (when no sent line is in the source verbatim): each word found in
    the source votes for where the block would start, rare words the most. A regex scan per word, in C."""
    words: dict[str, list[int]] = defaultdict(list)  # word -> the sent lines that hold it
    for j, line in enumerate(want):
        for word in set(_WORD.findall(line)):
            words[word].append(j)
    text = "\n".join(body)
    starts = list(itertools.accumulate((len(line) + 1 for line in body), initial=0))
    votes: dict[int, float] = defaultdict(float)
    for word in sorted(words, key=len, reverse=True)[:12]:
        hits = itertools.islice(re.finditer(rf"\b{word}\b", text), 51)
        found = sorted({bisect.bisect_right(starts, m.start()) - 1 for m in hits})
        if not 0 < len(found) <= 50:
            continue
        for p in found:
            for j in words[word]:
                votes[p - j] += 1 / len(found)
    return sorted(votes, key=lambda s: -votes[s])[:4] or [0]
