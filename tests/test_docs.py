"""Every code block of README.md and docs/**/*.md is run or checked, so the docs cannot drift from the code.

- python: compiled (top-level `await` allowed) and its imports executed against the real package; a block marked
  `<!-- docs: run, prints TEXT -->` runs in its own interpreter and must print TEXT.
- bash: `bash -n` parses it, and each `unit-mcp …` / `python -m unit_mcp… ` / `scripts/serve …` command names only
  subcommands and options its real parser has.
- json and toml: parsed.
- anything else, or a block that cannot be checked: marked `<!-- docs: not checked: WHY -->` on the line before it.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from unit_mcp import cli, server, units
from unit_mcp.agent import _cli as agent_cli
from unit_mcp.fleet import _cli as fleet_cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
MARKER = re.compile(r"<!-- docs: (run, prints (?P<prints>.+?)|not checked: (?P<why>.+?)) -->")
PARSERS = {
    "serve": server.command_parser,
    "agent": agent_cli.command_parser,
    "fleet": fleet_cli.command_parser,
    "units": units.command_parser,
}
MODULES = {"unit_mcp.server": "serve", "unit_mcp.agent": "agent", "unit_mcp.fleet": "fleet", "unit_mcp.units": "units"}
OPERATORS = set("|&;()<>")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    text: str
    marker: re.Match[str] | None

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    start: int | None = None
    for number, line in enumerate(lines, 1):
        if not line.startswith("```"):
            continue
        if start is None:
            start = number
            continue
        before = next((text for text in reversed(lines[: start - 1]) if text.strip()), "")
        lang = lines[start - 1][3:].strip()
        found.append(Block(path, start, lang, "\n".join(lines[start : number - 1]) + "\n", MARKER.search(before)))
        start = None
    assert start is None, f"{path.relative_to(REPO)}:{start}: a code block is never closed"
    return found


ALL = [block for path in DOCS for block in blocks(path)]


def test_the_docs_have_blocks_to_check() -> None:
    assert len(ALL) > 30 and {"README.md", "agent.md", "clients.md"} <= {block.path.name for block in ALL}


@pytest.mark.parametrize("block", ALL, ids=str)
def test_block(block: Block, tmp_path: Path) -> None:
    if block.marker is not None and block.marker["why"]:
        return  # marked, with the reason, as not checkable
    if block.lang == "python":
        check_python(block, tmp_path)
    elif block.lang == "bash":
        check_shell(block)
    elif block.lang == "json":
        json.loads(block.text)
    elif block.lang == "toml":
        tomllib.loads(block.text)
    else:
        pytest.fail(f"{block}: a {block.lang or 'plain'} block: label it python, bash, json or toml, or mark it "
                    "<!-- docs: not checked: WHY --> on the line before")  # fmt: skip


def check_python(block: Block, tmp_path: Path) -> None:
    tree = compile(block.text, str(block), "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    imports = [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]
    exec(compile(ast.Module(body=imports, type_ignores=[]), str(block), "exec"), {})  # the names exist
    if block.marker is None:
        return
    script = tmp_path / "example.py"
    script.write_text(block.text, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path)},  # the examples' temporary stores land in tmp_path
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{block}: {done.stderr}"
    assert block.marker["prints"] in done.stdout, f"{block} printed {done.stdout!r}"


def check_shell(block: Block) -> None:
    parsed = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, check=False)
    assert parsed.returncode == 0, f"{block}: bash cannot parse it: {parsed.stderr}"
    for line in block.text.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command: list[str] = []
        for word in [*lexer, ";"]:
            if set(word) <= OPERATORS:
                check_command(command, block)
                command = []
            else:
                command.append(word)


def check_command(words: list[str], block: Block) -> None:
    """The subcommands and options of a unit-mcp command, against its real parser."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # NAME=value before the command
    if not words:
        return
    program = words[0].rsplit("/", 1)[-1]
    if program == "serve" and words[0].endswith("scripts/serve"):
        name, rest = "serve", words[1:]
    elif program == "unit-mcp" or (program.startswith("python") and words[1:3] == ["-m", "unit_mcp"]):
        rest = words[1:] if program == "unit-mcp" else words[3:]
        if not rest or rest[0].startswith("-"):
            walk(cli.parser(), rest, block)
            return
        name, rest = rest[0], rest[1:]
        assert name in cli.COMMANDS, f"{block}: unit-mcp has no command {name!r}"
    elif program.startswith("python") and len(words) > 2 and words[1] == "-m" and words[2] in MODULES:
        name, rest = MODULES[words[2]], words[3:]
    else:
        return
    walk(PARSERS[name](), rest, block)


def walk(parser: argparse.ArgumentParser, words: list[str], block: Block) -> None:
    index = 0
    while index < len(words):
        word = words[index].strip("[]")
        if word.startswith("-") and word not in ("-", "--"):
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            assert action is not None, f"{block}: `{parser.prog}` has no option {word.split('=', 1)[0]}"
            index += action.nargs != 0 and "=" not in word
        elif word not in ("", "...", "…"):
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is not None:
                assert word in sub.choices, (
                    f"{block}: `{parser.prog}` has no subcommand {word!r} ({', '.join(sub.choices)})"
                )
                parser = sub.choices[word]
        index += 1


LINK = re.compile(r"\]\((?!https?://|mailto:|#)([^)\s#]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_names_a_file_of_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    dead = [target for target in LINK.findall(text) if not (path.parent / target).exists()]
    assert not dead, f"{path.relative_to(REPO)} links to what does not exist: {dead}"
