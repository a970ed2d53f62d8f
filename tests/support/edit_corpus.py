"""The edit corpus (issue 37): real edits mined from this repository's history, each rendered as an exact
replacement and as a unified diff and perturbed the ways agents get edits wrong, with the outcome each must have.

One definition for tests/test_edit_corpus.py, `scripts/bench.py --only edits` and `scripts/edits_corpus.py` (which
mines the edits and writes tests/data/edits/corpus.json.xz). The data file holds the file versions and the edits
(a hunk each); the cases are derived here, deterministically, and the file pins each one's expected outcome by a
hash of the bytes it must produce.
"""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from unit_mcp.errors import AmbiguousMatch, NoMatch, PatchConflict, UnitError
from unit_mcp.patching import apply_unified_diff, edit_diff, edit_exact, replace_exact
from unit_mcp.syntax import SyntaxCache

DATA = Path(__file__).resolve().parents[1] / "data" / "edits" / "corpus.json.xz"
SOURCE_ID = "m.py"
MOVED_ON = "  # moved on"
"""What the stale perturbation appends to a kept line: the source moved on under the agent's edit."""

EXACT_PERTURBATIONS = (
    "clean", "trailing_ws", "indent_spaces", "indent_tabs", "crlf", "blank_lines", "json_escaped", "smart_quotes",
    "stale", "duplicate", "truncated_lines", "truncated_mid_line",
)  # fmt: skip
DIFF_PERTURBATIONS = (
    "clean", "trailing_ws", "indent_spaces", "indent_tabs", "crlf", "blank_lines", "json_escaped", "smart_quotes",
    "stale", "duplicate",
)  # fmt: skip


@dataclass(frozen=True)
class BaseEdit:
    """One hunk of a real commit: the file before it, where the hunk starts (0-based line) and its lines, each
    prefixed ' ' (kept), '-' (removed) or '+' (added), newlines included."""

    id: str
    before: str
    line: int
    hunk: tuple[str, ...]

    @property
    def old(self) -> str:
        return "".join(h[1:] for h in self.hunk if h[0] in " -")

    @property
    def new(self) -> str:
        return "".join(h[1:] for h in self.hunk if h[0] in " +")

    @property
    def intended(self) -> str:
        lines = self.before.splitlines(keepends=True)
        size = sum(h[0] in " -" for h in self.hunk)
        return "".join(lines[: self.line]) + self.new + "".join(lines[self.line + size :])


@dataclass(frozen=True)
class Case:
    """One edit as sent: exact (`old`/`new`) or a diff (`patch`), against `source`; `expected` is the text it must
    produce, or None when it must be refused, then `retry_expected` is what a retry from the refusal must produce
    (`meant_line`: the line, from 1, the agent meant, for picking among an ambiguous refusal's places)."""

    id: str
    mode: str
    perturbation: str
    source: str
    old: str = ""
    new: str = ""
    patch: str = ""
    expected: str | None = None
    retry_expected: str | None = None
    meant_line: int = 0


def digest(text: str | None) -> str:
    return "-" if text is None else hashlib.sha256(text.encode()).hexdigest()[:12]


def load(path: Path = DATA) -> tuple[list[BaseEdit], dict[str, str]]:
    """The base edits and the pinned outcome of every case (case id → digest of expected and of retry_expected)."""
    data = json.loads(lzma.decompress(path.read_bytes()))
    blobs = data["blobs"]
    edits = [BaseEdit(e["id"], blobs[e["blob"]], e["line"], tuple(e["hunk"])) for e in data["edits"]]
    return edits, data["cases"]


# -- perturbations -------------------------------------------------------------------------------------------------

_SMART = {"'": "\u2019", '"': "\u201d"}


def _smart(line: str) -> str:
    return "".join(_SMART.get(c, c) for c in line)


def _indent(line: str, tabs: bool) -> str:
    if not line.strip():
        return line
    if not tabs:
        return "    " + line
    lead = len(line) - len(line.lstrip(" "))
    return "\t" * (lead // 4) + " " * (lead % 4) + line[lead:]


def _loose_places(source: str, old: str) -> int:
    """How many places `old` fits `source` with each line stripped and blank lines ignored: an independent count
    of where an edit could loosely have been meant (more than one: its intent is ambiguous, it must be refused)."""
    src = [line.strip() for line in source.splitlines() if line.strip()]
    want = [line.strip() for line in old.splitlines() if line.strip()]
    if not want:
        return 0
    return sum(src[i : i + len(want)] == want for i in range(len(src) - len(want) + 1))


def _added_next_to(hunk: tuple[str, ...], left: int, right: int) -> bool:
    """Whether the blank run around a drifted blank line (between hunk lines `left` and `right`) is bordered by a
    change that adds lines: whether the added lines go before or after the blank line is then not known."""
    while left >= 0 and hunk[left][0] == " " and not hunk[left][1:].strip():
        left -= 1
    while right < len(hunk) and hunk[right][0] == " " and not hunk[right][1:].strip():
        right += 1
    run: list[str] = []
    for index, step in ((left, -1), (right, 1)):
        while 0 <= index < len(hunk) and hunk[index][0] in "-+":
            run.append(hunk[index][0])
            index += step
    return "+" in run


def _lines_of(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def _with_line(text: str, index: int, line: str) -> str:
    lines = _lines_of(text)
    lines[index] = line
    return "".join(lines)


def _hunk_patch(hunk: list[str], line: int, eol: str = "\n") -> str:
    old_size = sum(h[0] in " -" for h in hunk)
    new_size = sum(h[0] in " +" for h in hunk)
    head = f"--- a/{SOURCE_ID}\n+++ b/{SOURCE_ID}\n@@ -{line + 1},{old_size} +{line + 1},{new_size} @@\n"
    return (head + "".join(hunk)).replace("\n", eol)


def cases(edit: BaseEdit) -> Iterator[Case]:
    """Every case of one edit, exact and diff, each perturbation that fits it."""
    for mode, names in (("exact", EXACT_PERTURBATIONS), ("diff", DIFF_PERTURBATIONS)):
        for name in names:
            case = _perturbed(edit, mode, name)
            if case is not None:
                yield case


def _perturbed(edit: BaseEdit, mode: str, name: str) -> Case | None:
    hunk = list(edit.hunk)
    source, intended = edit.before, edit.intended
    cid = f"{edit.id}/{mode}/{name}"
    kept = [i for i, h in enumerate(hunk) if h[0] == " " and h[1:].strip()]
    retry: str | None = None
    refuse = False
    meant = 0
    if name == "trailing_ws":
        if not kept:
            return None
        hunk = [h[:-1] + "  \n" if i in kept[::2] or (h[0] == "-" and h[1:].strip()) else h for i, h in enumerate(hunk)]
    elif name in ("indent_spaces", "indent_tabs"):
        if name == "indent_tabs" and not any(h[1:].startswith("    ") for h in hunk):
            return None
        hunk = [h[0] + _indent(h[1:], name == "indent_tabs") for h in hunk]
    elif name == "crlf":
        source, intended = source.replace("\n", "\r\n"), intended.replace("\n", "\r\n")
    elif name == "blank_lines":
        blanks = [i for i, h in enumerate(hunk) if h[0] == " " and not h[1:].strip()]
        if blanks:
            del hunk[blanks[0]]
            left, right = blanks[0] - 1, blanks[0] + 1
        elif kept:
            hunk.insert(kept[0] + 1, " \n")
            left, right = kept[0], kept[0] + 1
        else:
            return None
        if _added_next_to(edit.hunk, left, right):
            retry, refuse = intended, True  # lines added next to the drift: before or after the blank line?
    elif name == "smart_quotes":
        if not any(q in h for h in hunk for q in "'\"" if h[0] in " -"):
            return None
        hunk = [h[0] + _smart(h[1:]) for h in hunk]
    elif name == "stale":
        lines = _lines_of(source)
        movable = [i for i in kept if lines.count(hunk[i][1:]) == 1 and _lines_of(intended).count(hunk[i][1:]) == 1]
        if not movable:
            return None
        target = hunk[movable[len(movable) // 2]][1:]
        moved = target[:-1] + MOVED_ON + "\n"
        source = source.replace(target, moved)
        retry, intended, refuse = intended.replace(target, moved), intended, True
    elif name == "duplicate":
        if not edit.old.strip():
            return None
        source, intended = source + "\n" + edit.old, intended + "\n" + edit.old
        refuse = mode == "exact"
        retry = intended if refuse else None
        meant = edit.line + 1
    elif name == "truncated_lines":
        tail = 0
        while tail < len(hunk) and hunk[-1 - tail][0] == " ":
            tail += 1
        if not tail or not any(h[1:].strip() for h in hunk[len(hunk) - tail :]):
            return None
        retry, refuse = intended, True
        old = "".join(h[1:] for h in hunk[: len(hunk) - tail] if h[0] in " -")
        if not old.strip():
            return None
        return _final(cid, mode, name, source, old, edit.new, "", None, retry, meant)
    elif name == "truncated_mid_line":
        last = edit.old.rstrip("\n").rsplit("\n", 1)[-1]
        if len(last.strip()) < 8 or not edit.new.endswith(last + "\n") or not edit.old.endswith(last + "\n"):
            return None
        old = edit.old[: len(edit.old) - 1 - len(last) // 2]
        return _final(cid, mode, name, source, old, edit.new, "", None, intended, meant)
    old = "".join(h[1:] for h in hunk if h[0] in " -")
    new = "".join(h[1:] for h in hunk if h[0] in " +")
    loose = name not in ("clean", "crlf", "stale", "duplicate", "json_escaped")
    if loose and (old in source or _loose_places(source, old) > 1):
        return None  # the perturbed text is found as it is, or fits two places: no one intent to test
    patch = ""
    if mode == "diff":
        patch = _hunk_patch(hunk, edit.line, "\r\n" if name == "crlf" else "\n")
        if name == "crlf":
            source, intended = edit.before, edit.intended  # a CRLF patch on an LF source
        old = new = ""
    if name == "json_escaped":
        escape: Callable[[str], str] = lambda s: json.dumps(s, ensure_ascii=False)[1:-1]  # noqa: E731
        old, new, patch = escape(old), escape(new), escape(patch)
        if (mode == "exact" and (old == edit.old or old in source)) or (mode == "diff" and "\\n" not in patch):
            return None
    if name == "crlf" and mode == "exact":
        source, intended = edit.before.replace("\n", "\r\n"), edit.intended.replace("\n", "\r\n")
    return _final(cid, mode, name, source, old, new, patch, None if refuse else intended, retry, meant)


def _final(
    cid: str,
    mode: str,
    name: str,
    source: str,
    old: str,
    new: str,
    patch: str,
    expected: str | None,
    retry: str | None,
    meant: int,
) -> Case:
    return Case(cid, mode, name, source, old, new, patch, expected, retry, meant)


# -- running a case ------------------------------------------------------------------------------------------------


class Compiler:
    """Python's check of an edited source, as the service makes it: the statements the edit touched when that
    proves it, the whole source otherwise."""

    def __init__(self) -> None:
        self._syntax = SyntaxCache(size=8)

    def for_source(self, before: str) -> Callable[[str], bool]:
        key = hashlib.sha256(before.encode()).hexdigest()

        def compiles(after: str) -> bool:
            if self._syntax.compiles(key, before, "after", after, learn=False):
                return True
            try:
                compile(after, SOURCE_ID, "exec", dont_inherit=True)
            except (SyntaxError, ValueError):
                return False
            return True

        return compiles


@dataclass
class Outcome:
    """What became of one case: applied (its bytes right or wrong) or refused (with a candidate or not, and
    whether a retry built only from the refusal's content produced the right bytes)."""

    applied: bool
    right: bool
    match: str = ""
    code: str = ""
    candidate: bool = False
    retried: bool = False
    detail_bytes: int = 0


def run(case: Case, compiler: Compiler | None, *, tolerant: bool = True) -> Outcome:
    """Send the case once (the tolerant API, or with `tolerant=False` the exact-only one), and when it is refused,
    once more from the refusal alone."""
    compiles = compiler.for_source(case.source) if compiler is not None else None
    try:
        if not tolerant:
            if case.mode == "exact":
                text, _ = replace_exact(case.source, case.old, case.new)
            else:
                text, _ = apply_unified_diff(case.source, case.patch, SOURCE_ID)
            return Outcome(True, text == case.expected, "exact")
        if case.mode == "exact":
            edit = edit_exact(case.source, case.old, case.new, compiles=compiles, current_hash="sha256:x")
        else:
            edit = edit_diff(case.source, case.patch, SOURCE_ID, compiles=compiles, current_hash="sha256:x")
        return Outcome(True, edit.text == case.expected, edit.match)
    except UnitError as exc:
        details = exc.details
        candidates = details.get("candidates") or []
        outcome = Outcome(False, case.expected is None, code=exc.code, candidate=bool(candidates))
        outcome.detail_bytes = len(json.dumps(exc.to_dict()))
        if tolerant and candidates:
            retried = retry(case, exc, compiles)
            outcome.retried = retried is not None and retried == (case.retry_expected or case.expected)
        return outcome


def _sent(case: Case) -> tuple[str, str]:
    """What the agent meant as old and new (a diff's hunk lines), decoded if it was sent escaped."""
    from unit_mcp.matching import looks_escaped, unescape

    if case.mode == "exact":
        old, new = case.old, case.new
        if looks_escaped(old):
            old, new = unescape(old), unescape(new)
        return old.replace("\r\n", "\n"), new.replace("\r\n", "\n")
    patch = unescape(case.patch) if "\n" not in case.patch.strip("\n") else case.patch
    body = [line for line in patch.replace("\r\n", "\n").splitlines(keepends=True) if line[:1] in " -+"][2:]
    return "".join(h[1:] for h in body if h[0] in " -"), "".join(h[1:] for h in body if h[0] in " +")


def retry(case: Case, refusal: UnitError, compiles: Callable[[str], bool] | None) -> str | None:
    """The agent's second try, built only from the refusal and what it sent: the nearest candidate's text as
    `old` (and the refusal's diff applied to its `new`), or, for an ambiguous `old`, the context of the place it
    meant added to both."""
    old, new = _sent(case)
    details = refusal.details
    candidates = details["candidates"]
    if isinstance(refusal, AmbiguousMatch):
        meant = [c for c in candidates if c["line"] == case.meant_line] or candidates[:1]
        before = meant[0]["before"]
        old, new = before + old, before + new
    elif details.get("reason") == "cut_short":
        old = candidates[0]["text"]
    else:
        assert isinstance(refusal, NoMatch | PatchConflict)
        old, new = candidates[0]["text"], _merged(new, candidates[0].get("diff", ""))
        if old == new:
            return None
    try:
        return edit_exact(case.source, old, new, compiles=compiles).text
    except UnitError:
        return None


def _merged(new: str, diff: str) -> str:
    """`new` with the changes of `diff` (from what was sent to what the source has) made where `new` still has
    the sent lines: what an agent does with the refusal's diff (a change where `new` differs is left out)."""
    lines = diff.splitlines(keepends=True)[2:]
    runs: list[tuple[str, str, str]] = []  # (the line before, removed, added)
    before, removed, added = "", "", ""
    for line in [*lines, " \n"]:
        if line[0] in "-+":
            removed += line[1:] if line[0] == "-" else ""
            added += line[1:] if line[0] == "+" else ""
            continue
        if removed or added:
            runs.append((before, removed, added))
        before, removed, added = (line[1:] if line[0] == " " else ""), "", ""
    for before, removed, added in runs:
        if removed and new.count(removed) == 1:
            new = new.replace(removed, added)
        elif not removed and before and new.count(before) == 1:
            new = new.replace(before, before + added)
    return new


def pinned(case: Case) -> str:
    """The pin the data file keeps for a case: the digests of its expected and retry bytes."""
    return f"{digest(case.expected)}:{digest(case.retry_expected)}"


@dataclass
class Tally:
    """Counts over a set of cases, by what was expected of them."""

    cases: int = 0
    meant: int = 0  # cases whose intent is unambiguous: they must apply with the expected bytes
    applied_right: int = 0
    misapplied: int = 0  # applied with bytes other than the expected: never acceptable
    refused: int = 0  # refused, of all cases
    refused_with_candidate: int = 0
    retried_right: int = 0
    detail_bytes_max: int = 0

    def add(self, case: Case, outcome: Outcome) -> None:
        self.cases += 1
        self.meant += case.expected is not None
        if outcome.applied:
            self.applied_right += outcome.right and case.expected is not None
            self.misapplied += not outcome.right
        else:
            self.refused += 1
            self.refused_with_candidate += outcome.candidate
            self.retried_right += outcome.retried
            self.detail_bytes_max = max(self.detail_bytes_max, outcome.detail_bytes)

    def figures(self) -> dict[str, Any]:
        return {
            "cases": self.cases,
            "meant": self.meant,
            "applied_right": self.applied_right,
            "first_try": round(self.applied_right / self.meant, 4) if self.meant else None,
            "misapplied": self.misapplied,
            "refused": self.refused,
            "refused_with_candidate": self.refused_with_candidate,
            "retry_right": round(self.retried_right / self.refused, 4) if self.refused else None,
            "refusal_bytes_max": self.detail_bytes_max,
        }


def evaluate(
    edits: list[BaseEdit], *, tolerant: bool = True, keep: Callable[[Case], bool] = lambda case: True
) -> tuple[Tally, dict[str, Tally], list[tuple[Case, Outcome]]]:
    """Every case of `edits` run once: the total, a tally per mode/perturbation, and the misapplied cases."""
    compiler = Compiler()
    total = Tally()
    by: dict[str, Tally] = {}
    wrong: list[tuple[Case, Outcome]] = []
    for edit in edits:
        for case in cases(edit):
            if not keep(case):
                continue
            outcome = run(case, compiler, tolerant=tolerant)
            total.add(case, outcome)
            by.setdefault(f"{case.mode}/{case.perturbation}", Tally()).add(case, outcome)
            if outcome.applied and not outcome.right:
                wrong.append((case, outcome))
    return total, by, wrong
