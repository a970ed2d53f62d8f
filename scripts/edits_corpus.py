"""Mine the edit corpus (issue 37) from this repository's history: tests/data/edits/corpus.json.xz.

    .venv/bin/python scripts/edits_corpus.py            # mine up to HEAD, write the data file
    .venv/bin/python scripts/edits_corpus.py --check    # derive every case again and compare with the pins

Each edit is one hunk (3 lines of context, more until its old text is unique in the file) of a commit to a Python
file, its file before the commit kept once per version. The cases (tests/support/edit_corpus.py) are derived from
the edits; the file pins each case's expected bytes by digest, so a change to the derivation shows.
"""

from __future__ import annotations

import argparse
import difflib
import json
import lzma
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.edit_corpus import DATA, BaseEdit, cases, load, pinned  # noqa: E402

MAX_LINES = 2500  # files longer than this are left out (the latency goal is for a 2,000-line source)
PER_FILE = 4  # hunks taken from one file of one commit, spread over it
MAX_HUNK = 40  # lines of one hunk, context included


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def hunks(before: list[str], after: list[str]) -> list[tuple[int, list[str]]]:
    """(first line, hunk lines) of each group of changes, widened until its old text is unique in `before`."""
    text = "".join(before)
    out = []
    for group in difflib.SequenceMatcher(None, before, after, autojunk=False).get_grouped_opcodes(3):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        for _ in range(6):
            old = "".join(before[i1:i2])
            if old.strip() and text.count(old) == 1:
                break
            i1, j1 = max(0, i1 - 1), max(0, j1 - 1)
            i2, j2 = min(len(before), i2 + 1), min(len(after), j2 + 1)
        else:
            continue
        ops = difflib.SequenceMatcher(None, before[i1:i2], after[j1:j2], autojunk=False).get_opcodes()
        lines: list[str] = []
        for tag, a1, a2, b1, b2 in ops:
            if tag == "equal":
                lines += [" " + line for line in before[i1 + a1 : i1 + a2]]
            else:
                lines += ["-" + line for line in before[i1 + a1 : i1 + a2]]
                lines += ["+" + line for line in after[j1 + b1 : j1 + b2]]
        if len(lines) <= MAX_HUNK and all(line.endswith("\n") for line in lines):
            out.append((i1, lines))
    return out


def compiles(text: str) -> bool:
    try:
        compile(text, "m.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def mine(limit: int) -> dict[str, object]:
    head = git("rev-parse", "HEAD").strip()
    commits = git("log", "--format=%H %P", "--no-merges", "--reverse", head, "--", "*.py").splitlines()
    blobs: dict[str, str] = {}
    edits = []
    for row in commits:
        commit, *parents = row.split()
        if len(parents) != 1:
            continue
        changed = git("diff", "--name-status", "--no-renames", parents[0], commit, "--", "*.py").splitlines()
        for entry in changed:
            status, path = entry.split("\t", 1)
            if status != "M":
                continue
            blob = git("rev-parse", f"{parents[0]}:{path}").strip()[:12]
            before = git("show", f"{parents[0]}:{path}")
            after = git("show", f"{commit}:{path}")
            if before.count("\n") > MAX_LINES:
                continue
            if not compiles(before):
                continue
            found = hunks(before.splitlines(keepends=True), after.splitlines(keepends=True))
            step = max(1, len(found) // PER_FILE)
            for line, lines in found[::step][:PER_FILE]:
                if not compiles(BaseEdit("", before, line, tuple(lines)).intended):
                    continue  # a hunk that compiles only with the commit's other hunks: no edit on its own
                blobs[blob] = before
                edits.append({"id": f"{commit[:10]}:{path}:{line + 1}", "blob": blob, "line": line, "hunk": lines})
        if len(edits) >= limit:
            break
    return {"head": head, "blobs": blobs, "edits": edits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=2100, help="stop mining once this many edits are found")
    parser.add_argument("--check", action="store_true", help="derive the cases again and compare with the pins")
    args = parser.parse_args()
    if args.check:
        edits, pins = load()
        derived = {case.id: pinned(case) for edit in edits for case in cases(edit)}
        wrong = sorted(k for k in derived.keys() | pins.keys() if derived.get(k) != pins.get(k))
        print(f"{len(edits)} edits, {len(derived)} cases, {len(wrong)} differ from the pins")
        for key in wrong[:20]:
            print("  ", key)
        sys.exit(1 if wrong else 0)
    data = mine(args.limit)
    base = [BaseEdit(e["id"], data["blobs"][e["blob"]], e["line"], tuple(e["hunk"])) for e in data["edits"]]  # type: ignore[index]
    data["cases"] = {case.id: pinned(case) for edit in base for case in cases(edit)}
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_bytes(lzma.compress(json.dumps(data, sort_keys=True).encode(), preset=9 | lzma.PRESET_EXTREME))
    print(
        f"{len(base)} edits from {len(data['blobs'])} file versions (up to {data['head'][:10]}), "  # type: ignore[arg-type]
        f"{len(data['cases'])} cases: {DATA.relative_to(REPO)} ({DATA.stat().st_size // 1024} KB)"
    )  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
