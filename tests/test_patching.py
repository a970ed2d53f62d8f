"""Pure text edits: exact replacement and unified diffs, line endings kept."""

from __future__ import annotations

import difflib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unit_mcp import patching
from unit_mcp.errors import AmbiguousMatch, InvalidArgument, InvalidPatch, NoMatch, PatchConflict
from unit_mcp.patching import Lines, apply_unified_diff, line_ending_kind, replace_exact, unified_diff

line = st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=10)
common = st.sampled_from(["", "a", "b", "def f():", "    return 1", "x = 1"])
lf_text = st.one_of(
    st.lists(common | line, max_size=15).map("\n".join),
    st.lists(common | line, max_size=15).map(lambda ls: "".join(s + "\n" for s in ls)),
)


@settings(max_examples=400, deadline=None)
@given(lf_text, lf_text)
def test_applying_the_diff_between_two_texts_to_the_first_yields_the_second(a: str, b: str) -> None:
    if a == b:
        assert unified_diff(a, b, "m.py") == ""
        return
    patched, hunks = apply_unified_diff(a, unified_diff(a, b, "m.py"), "m.py")
    assert patched == b
    assert hunks >= 1


@pytest.mark.parametrize(
    ("a", "b"), [("", "++"), ("--\n", "x\n"), ("x\n", "x\n++ y\n"), ("--- a\n", "+++ b\n"), ("a\n--\n", "a\n")]
)
def test_a_removed_or_added_line_that_looks_like_a_file_header_stays_a_hunk_line(a: str, b: str) -> None:
    """A removed `--x` line is `---x` in the diff and an added `++x` line is `+++x`: only the first two lines of a
    diff are its headers (this once dropped the no-newline marker of an added `++` line)."""
    diff = unified_diff(a, b, "m.py")
    assert diff.count("--- a/m.py") == 1 and diff.count("+++ b/m.py") == 1
    assert apply_unified_diff(a, diff, "m.py")[0] == b


def whole_file_diff(a: str, b: str) -> str:
    """difflib over every line of both texts: what the windowed `unified_diff` must reproduce."""

    def lines(text: str) -> list[str]:  # split on "\n" only, as the patcher does
        return [line for line in re.split("(?<=\n)", text) if line]

    out: list[str] = []
    for index, line in enumerate(difflib.unified_diff(lines(a), lines(b), "a/m.py", "b/m.py")):
        out.append(line.rstrip("\n") + "\n" if index < 2 else line)
        if not line.endswith("\n"):
            out.append("\n\\ No newline at end of file\n")
    return "".join(out)


@settings(max_examples=400, deadline=None)
@given(lf_text, lf_text, st.sampled_from([1, 2, 3, 7, 4096]))
def test_the_windowed_diff_applies_and_matches_the_whole_file_diff_where_lines_are_unique(
    a: str, b: str, block: int
) -> None:
    """The windowed diff always turns `a` into `b`. Where a line repeats, difflib on the window may align the
    repeats differently from difflib on the whole file (both right: `'\n\n\n\na\n'` → `'a\n\n\n\na\n'` adds
    the first `a` or the second); where every line is unique the alignment is forced and the two are equal."""
    saved = patching._BLOCK
    patching._BLOCK = block  # small blocks exercise the block-by-block prefix comparison
    try:
        diff = unified_diff(a, b, "m.py")
    finally:
        patching._BLOCK = saved
    if a == b:
        assert diff == ""
        return
    assert apply_unified_diff(a, diff, "m.py")[0] == b
    if len(set(a.splitlines())) == len(a.splitlines()) and len(set(b.splitlines())) == len(b.splitlines()):
        assert diff == whole_file_diff(a, b)


@settings(max_examples=200, deadline=None)
@given(lf_text, lf_text)
def test_a_diff_applied_to_a_crlf_file_keeps_it_crlf(a: str, b: str) -> None:
    if a == b or "\n" not in a:  # a file without newlines has no ending to keep
        return
    crlf = a.replace("\n", "\r\n")
    patched, _ = apply_unified_diff(crlf, unified_diff(a, b, "m.py"), "m.py")
    assert patched == b.replace("\n", "\r\n")


@settings(max_examples=200, deadline=None)
@given(st.lists(common | line, min_size=1, max_size=10), st.data())
def test_exact_replacement_of_a_unique_line_changes_only_that_line(lines: list[str], data: st.DataObject) -> None:
    marker = "UNIQUE_MARKER_LINE"
    index = data.draw(st.integers(0, len(lines)))
    text = "\n".join([*lines[:index], marker, *lines[index:]]) + "\n"
    new_text, count = replace_exact(text, marker, "replaced")
    assert count == 1
    assert new_text == text.replace(marker, "replaced")


def test_lines_round_trip_keeps_mixed_endings() -> None:
    text = "a\r\nb\nc\r\nd"
    assert Lines.parse(text).render() == text
    assert line_ending_kind(text) == "mixed"
    assert line_ending_kind("a\r\nb\r\n") == "crlf"
    assert line_ending_kind("a\nb") == "lf"
    assert line_ending_kind("abc") == "none"


def test_exact_replacement_matches_lf_old_against_crlf_text_and_keeps_crlf() -> None:
    text = "def f():\r\n    return 1\r\n\r\nx = 2\r\n"
    new_text, _ = replace_exact(text, "def f():\n    return 1\n", "def f():\n    return 42\n    # done\n")
    assert new_text == "def f():\r\n    return 42\r\n    # done\r\n\r\nx = 2\r\n"


def test_ambiguous_old_reports_count_and_lines() -> None:
    text = "x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n"
    with pytest.raises(AmbiguousMatch) as caught:
        replace_exact(text, "x = 1", "x = 9")
    assert caught.value.details["matches"] == 3
    assert caught.value.details["lines"] == [1, 3, 5]
    assert "3 times" in caught.value.message and "1, 3, 5" in caught.value.message


def test_replace_all_replaces_every_match() -> None:
    new_text, count = replace_exact("x = 1\nx = 1\n", "x = 1", "x = 2", replace_all=True)
    assert (new_text, count) == ("x = 2\nx = 2\n", 2)


def test_missing_old_is_no_match_with_zero_count() -> None:
    with pytest.raises(NoMatch) as caught:
        replace_exact("a\n", "b", "c")
    assert caught.value.details == {"matches": 0}


@pytest.mark.parametrize(("old", "new"), [("", "x"), ("a", "a")])
def test_empty_or_identical_old_is_refused(old: str, new: str) -> None:
    with pytest.raises(InvalidArgument):
        replace_exact("a\n", old, new)


def test_hunk_is_found_at_an_offset() -> None:
    before = "one\ntwo\nthree\nfour\n"
    patch = "@@ -1,3 +1,3 @@\n two\n-three\n+THREE\n four\n"  # claims line 1, context really starts at line 2
    assert apply_unified_diff(before, patch, "m.py") == ("one\ntwo\nTHREE\nfour\n", 1)


def test_hunk_whose_context_changed_is_reported_with_expected_and_actual_lines() -> None:
    patch = "--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,2 @@\n alpha\n-beta\n+BETA\n"
    with pytest.raises(PatchConflict) as caught:
        apply_unified_diff("alpha\ngamma\n", patch, "m.py")
    assert caught.value.details["hunk"] == 1
    assert caught.value.details["expected_lines"] == ["alpha", "beta"]
    assert caught.value.details["actual_lines"] == ["alpha", "gamma"]


def test_patch_for_another_file_is_refused() -> None:
    patch = "--- a/other.py\n+++ b/other.py\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(InvalidPatch, match=r"other\.py"):
        apply_unified_diff("a\n", patch, "m.py")


def test_patch_touching_two_files_is_refused() -> None:
    one = "--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    two = "--- a/n.py\n+++ b/n.py\n@@ -1 +1 @@\n-a\n+b\n"
    with pytest.raises(InvalidPatch, match="2 files"):
        apply_unified_diff("a\n", one + two, "m.py")


def test_patch_creating_a_file_is_refused() -> None:
    patch = "--- /dev/null\n+++ b/m.py\n@@ -0,0 +1 @@\n+a\n"
    with pytest.raises(InvalidPatch, match="create or delete"):
        apply_unified_diff("", patch, "m.py")


def test_garbage_patch_is_invalid() -> None:
    with pytest.raises(InvalidPatch):
        apply_unified_diff("a\n", "@@ -1,5 +1,5 @@\n-a\n+b\n", "m.py")


def test_no_newline_markers_are_honoured() -> None:
    diff = unified_diff("a\nb", "a\nc\n", "m.py")
    assert "\\ No newline at end of file" in diff
    assert apply_unified_diff("a\nb", diff, "m.py")[0] == "a\nc\n"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab\n", max_size=40), st.text(alphabet="ab\n", max_size=40), st.integers(0, 50))
def test_common_suffix_is_the_longest_shared_tail_within_the_limit(a: str, b: str, limit: int) -> None:
    expected = 0
    while expected < min(limit, len(a), len(b)) and a[len(a) - expected - 1] == b[len(b) - expected - 1]:
        expected += 1
    assert patching.common_suffix(a, b, limit) == expected
    big_a, big_b = "x" * 9000 + a, "y" * 9000 + a  # across the 4096-character blocks
    assert patching.common_suffix(big_a, big_b, 10**6) == len(a)
    assert patching.common_suffix("x" + "a" * 9000 + b, "y" + "a" * 9000 + b, 10**6) == 9000 + len(b)


# -- tolerant edits (issue 37) -------------------------------------------------------------------------------------

SOURCE = "".join(
    [
        "import os\n\n\n",
        "def f(x):\n    if x:\n        return 1\n    return 2\n\n\n",
        "def g():\n    s = 'hi'\n    return s\n",
    ]
)
IF_X = "    if x:\n        return 1\n"
TAIL = "    return 2\n\ndef g():\n"  # one blank line where the source has two


def compiles(text: str) -> bool:
    try:
        compile(text, "m.py", "exec")
    except SyntaxError:
        return False
    return True


CASES = [  # old, new, the matcher, the lines it matched, and (what, by what) the source must have changed
    ("    if x:  \n        return 1\n", "    if x:  \n        return 3\n", "trimmed", [5, 6], ("1", "3")),
    ("if x:\n    return 1\n", "if x:\n    return 3\n    # x\n", "reindented", [5, 6], ("1\n", "3\n        # x\n")),
    ("\tif x:\n\t\treturn 1\n", "\tif x:\n\t\treturn 3\n", "reindented", [5, 6], ("1", "3")),
    (IF_X + TAIL, IF_X.replace("1", "4") + TAIL, "blank_lines", [5, 10], ("1", "4")),
    ("def g():\\n    s = 'hi'", 'def g():\\n    s = \\"ho\\"', "unescaped", [10, 11], ("'hi'", '"ho"')),
    ("s = \u2018hi\u2019", "s = \u2018ho\u2019", "quotes", [11, 11], ("'hi'", "'ho'")),
]


@pytest.mark.parametrize(("old", "new", "match", "lines", "change"), CASES)
def test_a_loose_old_that_fits_one_place_applies_and_says_how(
    old: str, new: str, match: str, lines: list[int], change: tuple[str, str]
) -> None:
    """Kept lines stay as the source has them; added lines take the source's indentation; nothing else moves."""
    edit = patching.edit_exact(SOURCE, old, new, compiles=compiles)
    assert (edit.match, edit.lines, edit.count) == (match, [lines], 1)
    assert edit.text == SOURCE.replace(*change, 1)


def test_a_reindented_match_keeps_the_sources_line_endings() -> None:
    crlf = SOURCE.replace("\n", "\r\n")
    edit = patching.edit_exact(crlf, "if x:\n    return 1\n", "if x:\n    return 3\n", compiles=compiles)
    assert edit.text == SOURCE.replace("return 1", "return 3").replace("\n", "\r\n")


def test_an_exact_match_is_unchanged_and_says_exact() -> None:
    edit = patching.edit_exact(SOURCE, "    return 2\n", "    return 3\n")
    assert (edit.text, edit.count, edit.match, edit.lines) == (
        replace_exact(SOURCE, "    return 2\n", "    return 3\n")[0],
        1,
        "exact",
        [[7, 7]],
    )


def test_a_loose_match_whose_result_would_not_compile_is_refused_with_its_place() -> None:
    with pytest.raises(NoMatch) as caught:
        patching.edit_exact(SOURCE, "if x:\n    return 1\n", "if x:\nreturn 3\n", compiles=compiles)
    assert caught.value.details["reason"] == "unsure"
    assert caught.value.details["candidates"][0]["lines"] == [5, 6]


def test_a_miss_carries_the_nearest_place_a_diff_and_the_hash_within_a_few_kb() -> None:
    text = "".join(f"def f{n}(x):\n    return x + {n}\n\n\n" for n in range(500))  # 2,000 lines
    with pytest.raises(NoMatch) as caught:
        patching.edit_exact(text, "def f250(y):\n    return x + 250\n", "def f250(y):\n    return y\n",
                            compiles=compiles, current_hash="sha256:abc")  # fmt: skip
    details = caught.value.details
    assert details["current_hash"] == "sha256:abc" and details["matches"] == 0
    best = details["candidates"][0]
    assert best["lines"] == [1001, 1002]
    assert best["text"] == "def f250(x):\n    return x + 250\n"
    assert "-def f250(y):" in best["diff"] and "+def f250(x):" in best["diff"]
    assert 0.8 < best["similarity"] < 1
    assert len(json.dumps(caught.value.to_dict())) < 6000


def test_an_ambiguous_old_lists_every_place_with_context_to_tell_them_apart() -> None:
    text = "a = 1\nx = 1\nb = 2\nx = 1\nc = 3\n"
    with pytest.raises(AmbiguousMatch) as caught:
        patching.edit_exact(text, "x = 1", "x = 2")
    details = caught.value.details
    assert details["lines"] == [2, 4]
    assert [(c["line"], c["before"], c["after"]) for c in details["candidates"]] == [
        (2, "a = 1\n", "\nb = 2\nx = 1\n"),
        (4, "x = 1\nb = 2\n", "\nc = 3\n"),
    ]
    retry = details["candidates"][1]["before"][-6:] + "x = 1"  # a longer `old` from the refusal alone
    assert patching.edit_exact(text, retry, "b = 2\nx = 2").text == "a = 1\nx = 1\nb = 2\nx = 2\nc = 3\n"


def test_an_old_cut_short_is_refused_with_the_whole_old() -> None:
    with pytest.raises(NoMatch) as caught:
        patching.edit_exact(SOURCE, "def f(x):\n    if x:\n", "def f(x):\n    if y:\n        return 1\n")
    assert caught.value.details["reason"] == "cut_short"
    whole = caught.value.details["candidates"][0]["text"]
    assert whole == "def f(x):\n    if x:\n        return 1\n"
    edit = patching.edit_exact(SOURCE, whole, "def f(x):\n    if y:\n        return 1\n")
    assert edit.text == SOURCE.replace("if x:", "if y:")


def test_a_diff_with_loose_context_applies_and_a_stale_one_is_refused_with_candidates() -> None:
    patch = "@@ -5,2 +5,2 @@\n     if x:  \n-        return 1\n+        return 5\n"
    edit = patching.edit_diff(SOURCE, patch, "m.py", compiles=compiles)
    assert (edit.match, edit.lines) == ("trimmed", [[5, 6]])
    assert edit.text == SOURCE.replace("return 1", "return 5")
    stale = "@@ -5,2 +5,2 @@\n     if y:\n-        return 1\n+        return 5\n"
    with pytest.raises(PatchConflict) as caught:
        patching.edit_diff(SOURCE, stale, "m.py", current_hash="sha256:abc")
    details = caught.value.details
    assert details["current_hash"] == "sha256:abc" and details["candidates"][0]["lines"] == [5, 6]
    json.dumps(details)


def test_a_json_escaped_diff_is_decoded() -> None:
    patch = json.dumps(unified_diff(SOURCE, SOURCE.replace("return 2", "return 7"), "m.py"))[1:-1]
    edit = patching.edit_diff(SOURCE, patch, "m.py")
    assert (edit.text, edit.match) == (SOURCE.replace("return 2", "return 7"), "unescaped")


block = st.lists(st.sampled_from(["x = 1", "y = 2", "if a:", "    pass", "return b", "z = [1, 2]"]), min_size=1,
                 max_size=4)  # fmt: skip
filler = st.lists(st.sampled_from(["", "w = 0", "# note", "v = w"]), max_size=4)


@settings(max_examples=300, deadline=None)
@given(block, filler, filler, st.sampled_from(["  ", "\t"]), st.booleans())
def test_a_loose_match_never_applies_where_two_places_fit(
    lines: list[str], head: list[str], middle: list[str], junk: str, indent: bool
) -> None:
    text = "\n".join([*head, *lines, *middle, *(("    " + line) if indent else line for line in lines)]) + "\n"
    old = "".join(line + junk + "\n" for line in lines)  # found exactly nowhere, loosely twice
    if old in text:
        return
    with pytest.raises((AmbiguousMatch, NoMatch)):
        patching.edit_exact(text, old, old.replace(junk, "") + "q = 9\n")


@settings(max_examples=300, deadline=None)
@given(block, filler, filler, st.sampled_from(["  ", "    ", "\t"]))
def test_an_exact_match_wins_over_a_loose_one(lines: list[str], head: list[str], middle: list[str], junk: str) -> None:
    loose = [junk + line for line in lines]  # the same block, shifted, elsewhere
    text = "\n".join([*head, *loose, *middle, *lines]) + "\n"
    old = "".join(line + "\n" for line in lines)
    new = old + "q = 9\n"
    try:
        expected = replace_exact(text, old, new)[0]
    except AmbiguousMatch:
        return
    edit = patching.edit_exact(text, old, new)
    assert (edit.text, edit.match) == (expected, "exact")


@settings(max_examples=300, deadline=None)
@given(block, filler, filler, st.sampled_from(["", "  "]), st.booleans())
def test_a_diff_and_the_equivalent_exact_edit_give_the_same_bytes(
    lines: list[str], head: list[str], tail: list[str], junk: str, crlf: bool
) -> None:
    text = "\n".join([*head, "START", *lines, "END", *tail]) + "\n"
    old_lines = ["START", *lines, "END"]
    new_lines = ["START", *lines, "added = 1", "END"]
    eol = "\r\n" if crlf else "\n"
    text = text.replace("\n", eol)
    old = "".join(line + junk + "\n" for line in old_lines)
    new = "".join(line + junk + "\n" for line in new_lines)
    start = len(head) + 1
    hunk = [" " + line + junk + "\n" for line in old_lines[:-1]] + [f"+added = 1{junk}\n", f" END{junk}\n"]
    patch = f"@@ -{start},{len(old_lines)} +{start},{len(new_lines)} @@\n" + "".join(hunk)
    try:
        by_exact = patching.edit_exact(text, old, new)
    except (AmbiguousMatch, NoMatch):
        return
    by_diff = patching.edit_diff(text, patch, "m.py")
    assert by_exact.text == by_diff.text
    assert by_exact.lines == by_diff.lines


def test_a_loose_hunk_then_an_exact_one_both_land() -> None:
    text = "".join(f"def f{n}():\n    return {n}\n\n\n" for n in range(6))
    patch = (
        "@@ -1,3 +1,3 @@\n def f0():  \n-    return 0\n+    return 10\n \n"  # loose: trailing whitespace sent
        "@@ -17,2 +17,3 @@\n def f4():\n     return 4\n+    # four\n"
    )
    edit = patching.edit_diff(text, patch, "m.py", compiles=compiles)
    assert edit.match == "trimmed" and edit.lines == [[1, 3], [17, 18]]
    assert edit.text == text.replace("return 0", "return 10").replace("return 4\n", "return 4\n    # four\n")
