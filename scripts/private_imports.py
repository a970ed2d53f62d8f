"""Where tests and scripts reach into private modules of unit_mcp (a module or package named `_x`), per module.

    .venv/bin/python scripts/private_imports.py            # a table per private module, then the total
    .venv/bin/python scripts/private_imports.py --where    # and each place: file:line

Counts every form: `from unit_mcp.a._b import x` (one line or many), `from unit_mcp.a import _b`,
`import unit_mcp.a._b`, a string that is a dotted name inside a private module (what
`importlib.import_module(...)` and `monkeypatch.setattr("...")` take), and any of these in a string that is
Python code (a script a test writes or runs with `python -c`). tests/support is the one place that may
reach inside (issue 41, item 4): its references are listed apart and left out of the total. tests/test_layout.py
holds the total to a ceiling.
"""

from __future__ import annotations

import argparse
import ast
import re
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SUPPORT = Path("tests") / "support"
DOTTED = re.compile(r"unit_mcp(\.[A-Za-z_][A-Za-z0-9_]*)+")


@dataclass(frozen=True)
class Reach:
    """One reference from a file to a private module: the module's dotted name and where it is written."""

    module: str
    path: Path
    line: int


def _private_module(dotted: str, package_root: Path) -> str | None:
    """The longest prefix of `dotted` that is a module or package of unit_mcp, if any part of it is private."""
    parts = dotted.split(".")
    found = None
    for end in range(1, len(parts) + 1):
        where = package_root.joinpath(*parts[:end])
        if where.with_suffix(".py").is_file() or (where / "__init__.py").is_file():
            found = parts[:end]
        else:
            break
    if found is None:
        return None
    private = [part for part in found if part.startswith("_") and not part.startswith("__")]
    return ".".join(found) if private else None


def reaches_in(source: str, path: Path, package_root: Path) -> list[Reach]:
    """Every reference in one Python source to a private module of the package under `package_root`."""
    found: list[Reach] = []
    if "unit_mcp" not in source:
        return found
    for node in ast.walk(ast.parse(source, str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            names = [node.value]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "unit_mcp" in node.value:
            found += _in_code(node.value, path, package_root, node.lineno)
        if names:
            modules = {_private_module(name, package_root) for name in names if name.split(".")[0] == "unit_mcp"}
            found += [Reach(module, path, node.lineno) for module in sorted(m for m in modules if m)]
    return found


def _in_code(text: str, path: Path, package_root: Path, line: int) -> list[Reach]:
    """The references in a string that is Python code (a script a test writes or runs with `-c`), at its line."""
    try:
        inner = reaches_in(textwrap.dedent(text), path, package_root)
    except SyntaxError:
        return []
    return [Reach(reach.module, path, line + reach.line - 1) for reach in inner]


def repository_reaches(repo: Path = REPO) -> list[Reach]:
    """Every reference from tests/ and scripts/ (Python files) to a private module of unit_mcp."""
    found: list[Reach] = []
    for top in ("tests", "scripts"):
        for path in sorted((repo / top).rglob("*.py")):
            found += reaches_in(path.read_text(), path.relative_to(repo), repo)
    return found


def outside_support(found: list[Reach]) -> list[Reach]:
    """The references that count: those not in tests/support."""
    return [reach for reach in found if not reach.path.is_relative_to(SUPPORT)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--where", action="store_true", help="list each reference as file:line")
    where = parser.parse_args().where
    found = repository_reaches()
    counted = outside_support(found)
    for title, reaches in (("tests and scripts", counted), ("tests/support", [r for r in found if r not in counted])):
        print(f"{title}:")
        for module, count in sorted(Counter(r.module for r in reaches).items(), key=lambda item: (-item[1], item[0])):
            print(f"  {count:3d}  {module}")
            if where:
                for reach in reaches:
                    if reach.module == module:
                        print(f"         {reach.path}:{reach.line}")
        print(f"  {len(reaches):3d}  total in {len({r.module for r in reaches})} modules")


if __name__ == "__main__":
    main()
