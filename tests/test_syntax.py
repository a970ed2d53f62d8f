"""The dry run's syntax shortcut never accepts a source that a full compile() refuses."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unit_mcp.syntax import SyntaxCache

STATEMENTS = [
    "x = 1\n",
    "y = (1,\n     2)\n",
    "def f(a):\n    return a\n",
    "@staticmethod\ndef g():\n    pass\n",
    "class C:\n    z = 1\n\n    def m(self):\n        return self\n",
    's = """a\nb = 2\n"""\n',
    "a = 1; b = 2\n",
    "t = 1 + \\\n    2\n",
    "# a comment\n",
    "\n",
    "if x:\n    pass\nelse:\n    pass\n",
    "try:\n    pass\nexcept Exception:\n    pass\n",
    "for i in range(3):\n    break\n",
    "async def h():\n    await h()\n",
    "x\\\n",  # with the statement after it: one logical line continued by a backslash
    "\\\n",  # a blank line continued into the next statement
    "u = 1\r\n",
]
FRAGMENTS = [
    "",
    "\n",
    "(",
    ")",
    '"""',
    "'",
    "\\\n",
    "    ",
    "\t",
    ":",
    "else:\n",
    "elif x:\n",
    "except:\n",
    "@dec\n",
    "def f(:\n",
    "global x\n",
    "nonlocal x\n",
    "from __future__ import annotations\n",
    "return 1\n",
    "yield 1\n",
    "await x\n",
    "break\n",
    "x = 2\n",
    "    x = 2\n",
    "if x:\n",
    "# -*- coding: latin-1 -*-\n",
    "\r",
    "\r\n",
    "\ufeff",
    "#",
    "f(x for x in y, 1)\n",
    "del f()\n",
    "lambda: (yield)\n",
    "class D(x=1, x=2): pass\n",
    "def k(a, a): pass\n",
    "x: int = 1\n",
    "*a = 1\n",
    "é = 'ü'\n",
]


def key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def compiles(text: str) -> bool:
    try:
        compile(text.encode("utf-8", "surrogatepass"), "m.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


sources = st.lists(st.sampled_from(STATEMENTS), max_size=8).map("".join).filter(compiles)
edit_text = st.lists(st.sampled_from(FRAGMENTS + STATEMENTS), max_size=3).map("".join)


@pytest.mark.filterwarnings("ignore::SyntaxWarning")
@settings(max_examples=1500, deadline=None)
@given(
    sources,
    st.lists(st.tuples(st.booleans(), st.integers(0, 400), st.integers(0, 40), edit_text), min_size=1, max_size=4),
)
def test_a_proven_edit_compiles_in_full(source: str, edits: list[tuple[bool, int, int, str]]) -> None:
    """A chain of edits (each proven one teaches the cache the edited source's statements) at random places,
    often at the start of a line, where statement boundaries are."""
    cache = SyntaxCache()
    before = source
    for at_line_start, at, length, text in edits:
        if at_line_start:
            line_starts = [0] + [i + 1 for i, c in enumerate(before) if c == "\n"]
            at = line_starts[at % len(line_starts)]
        at = min(at, len(before))
        after = before[:at] + text + before[at + length :]
        if cache.compiles(key(before), before, key(after), after):
            assert compiles(after), (before, after)
        if compiles(after):
            before = after


def test_a_local_edit_is_proven_without_a_full_compile() -> None:
    """The shortcut is taken for what an agent does most: change one statement of a file that compiles."""
    lines = [f"VALUE_{n:04d} = {n}  # padding\n" for n in range(300)]
    before = '"""A unit."""\n' + "".join(lines) + "def f(a):\n    return a\n"
    after = before.replace("VALUE_0001 = 1  #", "VALUE_0001 = 2  #")
    cache = SyntaxCache()
    assert cache.compiles(key(before), before, key(after), after)
    assert cache.knows(key(after))
    again = after.replace("    return a\n", "    return a + 1\n")
    assert cache.compiles(key(after), after, key(again), again)
    broken = after.replace("    return a\n", "    return a +\n")
    assert not cache.compiles(key(after), after, key(broken), broken)
    # A line continued by a backslash is no statement boundary: removing what follows it leaves a dangling `\`.
    continued = "x = 1\n\\\ny = 2\n"
    assert not cache.compiles(key(continued), continued, key("x = 1\n\\\n"), "x = 1\n\\\n")
    # Edits that could break other statements are left to the full compile.
    for risky in ("global VALUE_0002\n", "from __future__ import annotations\n"):
        assert not cache.compiles(key(after), after, key(risky + after), risky + after)
