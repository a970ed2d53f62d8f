"""Every code block of README.md and docs/**/*.md is run or checked, so the docs cannot drift from the code.

- python: compiled (top-level `await` allowed) and its imports executed against the real package; a block marked
  `<!-- docs: run, prints TEXT -->` runs in its own interpreter and must print TEXT.
- bash: `bash -n` parses it, and each `unit-mcp …` / `python -m unit_mcp… ` / `scripts/serve …` command names only
  subcommands and options its real parser has.
- json and toml: parsed.
- anything else, or a block that cannot be checked: marked `<!-- docs: not checked: WHY -->` on the line before it.

Beyond the blocks: a command in an inline code span is checked like a bash one; every `--option` a page names
anywhere is an option of one of our parsers (or of another program the page shows, listed in OTHER_PROGRAMS);
the risk tables list every tool under its risk; docs/python.md has a row for every public method of
`UnitService`, with its real signature, and names every refusal code; docs/operations.md names every option of
`unit-mcp serve`; the OpenCode provider of docs/agent.md is the one the OpenCode tests use.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
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

from unit_mcp import UnitError, UnitService, cli, tool_risks

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md"))]
MARKER = re.compile(r"<!-- docs: (run, prints (?P<prints>.+?)|not checked: (?P<why>.+?)) -->")
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


PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*:?")
"""A word like COMMAND in `unit-mcp COMMAND --help`: any subcommand."""


def check_command(words: list[str], block: Block | str) -> None:
    """The subcommands and options of a unit-mcp command against its real parser; of a script or
    `python -m unit_mcp.testing` against what its --help lists."""
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words = words[1:]  # NAME=value before the command
    if not words:
        return
    program = words[0].rsplit("/", 1)[-1]
    if program.startswith("python") and len(words) > 1 and words[1].startswith("scripts/"):
        words, program = words[1:], words[1].rsplit("/", 1)[-1]  # python scripts/x.py: the script
    if program == "serve" and words[0].endswith("scripts/serve"):
        name, rest = "serve", words[1:]
    elif program == "unit-mcp" or (program.startswith("python") and words[1:3] == ["-m", "unit_mcp"]):
        rest = words[1:] if program == "unit-mcp" else words[3:]
        if not rest or rest[0].startswith("-"):
            walk(cli.parser(), rest, block)
            return
        name, rest = rest[0], rest[1:]
        if PLACEHOLDER.fullmatch(name):
            return
        assert name in cli.COMMANDS, f"{block}: unit-mcp has no command {name!r}"
    elif program.startswith("python") and len(words) > 2 and words[1] == "-m" and words[2] in MODULES:
        name, rest = MODULES[words[2]], words[3:]
    elif program.startswith("python") and words[1:3] == ["-m", "unit_mcp.testing"]:
        check_help_options(("-m", "unit_mcp.testing"), words[3:], block)
        return
    elif words[0].startswith(("scripts/", "./scripts/")) and (program.endswith(".py") or program == "test"):
        script = "scripts/" + program
        if (REPO / script).is_file():
            check_help_options(("-m", "pytest") if program == "test" else (script,), words[1:], block)
        return
    else:
        return
    walk(cli.command_parser(name), rest, block)


@functools.cache
def help_text(argv: tuple[str, ...]) -> str:
    """What `python ARGV --help` prints, as a user reads it."""
    done = subprocess.run(
        [sys.executable, *argv, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"python {' '.join(argv)} --help failed: {done.stderr}"
    return done.stdout


def help_options(argv: tuple[str, ...]) -> set[str]:
    return set(OPTION.findall(help_text(argv)))


def check_help_options(argv: tuple[str, ...], words: list[str], block: Block | str) -> None:
    """Each option is one the program's --help lists; a value of `--only` (scripts/bench.py) names sections it
    lists."""
    shown = "scripts/test" if argv == ("-m", "pytest") else " ".join(argv).removeprefix("-m ")
    for index, word in enumerate(words):
        option = word.strip("[]").split("=", 1)[0]
        if OPTION.fullmatch(option):
            assert option in help_options(argv), f"{block}: `{shown}` has no option {option}"
        if option == "--only" and argv == ("scripts/bench.py",):
            value = word.split("=", 1)[1] if "=" in word else words[index + 1] if index + 1 < len(words) else ""
            sections = set(re.findall(r"[a-z_]+", help_text(argv).rsplit("--only ONLY", 1)[1].split("--", 1)[0]))
            unknown = [name for name in value.split(",") if name not in sections]
            assert not unknown, f"{block}: `scripts/bench.py --only` has no section {', '.join(unknown)}"


def walk(parser: argparse.ArgumentParser, words: list[str], block: Block | str) -> None:
    index = 0
    while index < len(words):
        word = words[index].strip("[]")
        if word.startswith("-") and word not in ("-", "--"):
            action = parser._option_string_actions.get(word.split("=", 1)[0])
            assert action is not None, f"{block}: `{parser.prog}` has no option {word.split('=', 1)[0]}"
            index += action.nargs != 0 and "=" not in word
        elif word not in ("", "...", "…"):
            sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
            if sub is not None and PLACEHOLDER.fullmatch(word):
                return  # `unit-mcp agent COMMAND --help`: no one parser to check the rest against
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


OPTION = re.compile(r"(?<![\w/.-])--[A-Za-z][\w-]*")
OTHER_PROGRAMS = {
    "claude": {"--mcp-config", "--strict-mcp-config", "--tools", "--allowedTools", "--settings"},
    "the MCP Inspector": {"--cli", "--config", "--server", "--method", "--header"},
    "opencode": {"--format", "--dir", "--attach", "--continue"},
    "codex": {"--strict-config", "--ephemeral"},
    "git": {"--only"},
    "uvicorn": {"--reload"},
}
"""Options of other programs the pages show, by program: their own docs are the reference for these."""
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def prose(text: str) -> list[tuple[int, str]]:
    """The lines of a page outside its code blocks, numbered."""
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((number, line))
    return lines


def scripts_named(text: str) -> set[tuple[str, ...]]:
    """The programs a page names whose options come from their --help (this repository's scripts)."""
    named = {("-m", "unit_mcp.testing")} if "unit_mcp.testing" in text else set()
    named |= {(script,) for script in re.findall(r"scripts/\w+\.py", text) if (REPO / script).is_file()}
    return named | ({("-m", "pytest")} if "scripts/test" in text else set())


@functools.cache
def our_options() -> frozenset[str]:
    """Every option of every parser of the `unit-mcp` command, however deep."""
    found: set[str] = set()
    pending = [cli.parser(), *(cli.command_parser(name) for name in cli.COMMANDS)]
    while pending:
        parser = pending.pop()
        for action in parser._actions:
            found.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                pending.extend(action.choices.values())
    return frozenset(found)


def option_problems(name: str, text: str) -> list[str]:
    """A page's stale options: in a command written in an inline code span (checked as a bash block's command),
    and anywhere else, an option no parser of ours (nor another program the page shows) has."""
    problems: list[str] = []
    for number, line in prose(text):
        for span in SPAN.findall(line):
            if ": error:" in span:  # an error line as printed, not a command
                continue
            try:
                lexer = shlex.shlex(span, posix=True, punctuation_chars=True)
                lexer.whitespace_split = True
                words = list(lexer)
            except ValueError:
                continue
            command: list[str] = []
            for word in [*words, ";"]:
                if set(word) <= OPERATORS:
                    try:
                        check_command(command, f"{name}:{number}")
                    except AssertionError as exc:
                        problems.append(str(exc).split("\n")[0])
                    command = []
                else:
                    command.append(word)
    known = set(our_options()).union(*OTHER_PROGRAMS.values())
    for argv in scripts_named(text):
        known |= help_options(argv)
    for number, line in enumerate(text.splitlines(), 1):
        problems += [f"{name}:{number}: no parser has the option {option}" for option in OPTION.findall(line)
                     if option not in known]  # fmt: skip
    return problems


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_option_a_page_names_exists(path: Path) -> None:
    problems = option_problems(str(path.relative_to(REPO)), path.read_text(encoding="utf-8"))
    assert not problems, "\n".join(problems)


def test_a_planted_stale_option_fails_the_check(tmp_path: Path) -> None:
    """The check is not blind: a temporary copy of a page with a stale option planted in prose, in a command, or
    on the wrong subcommand fails it, naming the option."""
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    assert option_problems("operations.md", text) == []
    end = len(text.splitlines()) + 2  # the planted line

    def planted(line: str) -> list[str]:
        copy = tmp_path / "operations.md"
        copy.write_text(f"{text}\n{line}\n", encoding="utf-8")
        return option_problems("operations.md", copy.read_text(encoding="utf-8"))

    assert planted("Start it with `--units-dir DIR`.") == [f"operations.md:{end}: no parser has the option --units-dir"]
    assert f"operations.md:{end}: `unit-mcp serve` has no option --env" in planted("`scripts/serve --env FILE`")
    assert planted("`unit-mcp units copy --stdio SRC DST`") == [
        f"operations.md:{end}: `unit-mcp units copy` has no option --stdio"  # an option of serve, not of copy
    ]
    assert planted("`scripts/bench.py --only served,no_such_section`") == [
        f"operations.md:{end}: `scripts/bench.py --only` has no section no_such_section"
    ]


def risk_tables(text: str) -> list[tuple[int, dict[str, str]]]:
    """Each table of a page that lists tools by risk (a `risk` column and a `tools` one, or a `tool` column
    then a `risk` one), as {tool: risk} with the line of its header. A tools cell lists the tools of that risk
    before its first `;` (after it: calls of other tools raised to it)."""
    tables: list[tuple[int, dict[str, str]]] = []
    header: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [cell.split(" ")[0].strip("`").lower() for cell in cells]
            table: dict[str, str] = {}
            if header[:2] == ["tool", "risk"] or {"risk", "tools"} <= set(header):
                tables.append((number, table))
            continue
        if set(cells[0]) <= set("-: ") or not tables or tables[-1][1] is not table:
            continue
        if header[:2] == ["tool", "risk"]:
            table[cells[0].strip("`")] = cells[1].split(" ")[0].strip("`")
        else:
            risk = cells[header.index("risk")].strip("`")
            for tool in re.findall(r"`(unit_\w+)`", cells[header.index("tools")].split(";")[0]):
                assert tool not in table, f"line {number}: {tool} is listed under two risks"
                table[tool] = risk
    return tables


def risk_table_problems(name: str, text: str) -> list[str]:
    every = tool_risks(history=True, local_access=True)
    problems = []
    for line, table in risk_tables(text):
        problems += [f"{name}:{line}: the table lacks {tool} ({risk})" for tool, risk in every.items()
                     if tool not in table]  # fmt: skip
        problems += [f"{name}:{line}: {tool} is listed as {table[tool]}, the server says {risk}"
                     for tool, risk in every.items() if tool in table and table[tool] != risk]  # fmt: skip
        problems += [f"{name}:{line}: the server has no tool {tool}" for tool in table if tool not in every]
    return problems


@pytest.mark.parametrize("page", ["README.md", "docs/confirm.md"])
def test_the_risk_tables_list_every_tool_under_its_risk(page: str) -> None:
    text = (REPO / page).read_text(encoding="utf-8")
    assert risk_tables(text), f"{page} has no table of tools by risk"
    problems = risk_table_problems(page, text)
    assert not problems, "\n".join(problems)


def test_a_tool_missing_from_a_risk_table_fails_the_check() -> None:
    text = (REPO / "docs" / "confirm.md").read_text(encoding="utf-8")
    ((line, _),) = risk_tables(text)
    assert risk_table_problems("confirm.md", text.replace("`unit_history`, ", "")) == [
        f"confirm.md:{line}: the table lacks unit_history (filesystem-read)"
    ]


def service_methods() -> dict[str, str]:
    """Every public method of UnitService (the Python face of the tools) with its call as docs/python.md writes
    it: `name(required, optional=default)`."""
    calls = {}
    for name, method in vars(UnitService).items():
        if name.startswith("_") or not callable(method):
            continue
        parameters = list(inspect.signature(method).parameters.values())[1:]  # the service itself
        shown = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default!r}" for p in parameters]
        calls[name] = f"{name}({', '.join(shown)})"
    return calls


def method_problems(text: str) -> list[str]:
    rows = {match[2]: match[1] for match in re.finditer(r"^\| `((\w+)\(.*?\))` \|", text, re.MULTILINE)}
    problems = []
    for name, call in service_methods().items():
        if name not in rows:
            problems.append(f"docs/python.md has no row for UnitService.{name}: | `{call}` | what it does |")
        elif rows[name] != call:
            problems.append(f"docs/python.md writes `{rows[name]}`; the method is `{call}`")
    problems += [f"docs/python.md has a row for {name}, which UnitService does not have"
                 for name in rows if name not in service_methods()]  # fmt: skip
    return problems


def test_python_md_documents_every_public_method_of_the_service() -> None:
    text = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    problems = method_problems(text)
    assert not problems, "\n".join(problems)
    removed = re.sub(r"^\| `checkpoint\(.*\n", "", text, flags=re.MULTILINE)
    assert method_problems(removed) == [
        f"docs/python.md has no row for UnitService.checkpoint: | `{service_methods()['checkpoint']}` | what it does |"
    ]


def refusal_codes() -> set[str]:
    from unit_mcp import tools  # noqa: F401  (every module that defines a refusal is imported by now)

    found, pending = set(), [UnitError]
    while pending:
        kind = pending.pop()
        found.add(kind.code)
        pending.extend(kind.__subclasses__())
    return found - {UnitError.code}


def test_python_md_names_every_refusal_code() -> None:
    text = (REPO / "docs" / "python.md").read_text(encoding="utf-8")
    missing = sorted(code for code in refusal_codes() if f"`{code}`" not in text)
    assert not missing, f"docs/python.md does not name the refusal codes {missing}"


def test_operations_md_names_every_option_of_serve() -> None:
    text = (REPO / "docs" / "operations.md").read_text(encoding="utf-8")
    options = {option for action in cli.command_parser("serve")._actions for option in action.option_strings}
    missing = sorted(option for option in options if option.startswith("--") and option != "--help"
                     and not re.search(re.escape(option) + r"(?![\w-])", text))  # fmt: skip
    assert not missing, f"docs/operations.md does not name these options of unit-mcp serve: {missing}"


def test_agent_md_shows_the_opencode_provider_the_tests_use() -> None:
    """One source: tests/opencode reads its scripted-model provider from docs/agent.md; what the page shows is that
    config with only the base URL left to fill."""
    from opencode.opencode_stack import MODEL, documented_provider, scripted_provider

    shown = documented_provider()
    assert shown["model"] == shown["small_model"] == MODEL
    assert shown["provider"]["scripted"]["options"]["baseURL"] == "http://127.0.0.1:PORT/v1"
    used = scripted_provider("http://127.0.0.1:5/v1")
    assert used == {**shown, "provider": {"scripted": {**shown["provider"]["scripted"], "options": {
        **shown["provider"]["scripted"]["options"], "baseURL": "http://127.0.0.1:5/v1"}}}}  # fmt: skip
    assert documented_provider()["provider"]["scripted"]["options"]["baseURL"] == "http://127.0.0.1:PORT/v1"


def test_the_code_names_only_pages_and_sections_that_exist() -> None:
    """A help text or message that sends a user to `docs/X.md` (or to a section of it: `docs/X.md: Tests`,
    `docs/X.md, "Hooks"`) sends them to a page, and a heading or bold label, that exists."""
    problems = []
    for path in sorted((REPO / "unit_mcp").glob("**/*.py")):
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(REPO)
        for page in sorted(set(re.findall(r"(?<![\w/])(?:docs/[\w/.-]+\.md|README(?:\.md)?)", text))):
            if page.startswith("docs/") and not (REPO / page).is_file():
                problems.append(f"{where} names {page}, which does not exist")
        for page, section in re.findall(r"(?<![\w/])(docs/[\w/.-]+\.md|README(?:\.md)?)[:,] \"?([A-Z][\w ]*\w)", text):
            file = REPO / (page if page.startswith("docs/") else "README.md")
            body = file.read_text(encoding="utf-8") if file.is_file() else ""
            if not re.search(rf"^(#+ |- \*\*|\*\*){re.escape(section)}\b", body, re.MULTILINE):
                problems.append(f"{where} sends the reader to {page}: {section}, a section it does not have")
    assert not problems, "\n".join(problems)


def test_units_copy_help_names_every_kind_of_store() -> None:
    parser = cli.command_parser("units")
    sub = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    for shown in (parser.format_help(), sub.choices["copy"].format_help()):
        assert all(kind in shown for kind in ("folder", "sqlite:PATH", "postgresql://")), shown


def test_fleet_md_names_every_fleet_tool_and_each_risk_above_normal() -> None:
    from unit_mcp.fleet.server import TOOLS as FLEET_TOOLS

    text = (REPO / "docs" / "fleet.md").read_text(encoding="utf-8")
    missing = [tool.name for tool in FLEET_TOOLS if f"`{tool.name}`" not in text]
    assert not missing, f"docs/fleet.md does not name the fleet tools {missing}"
    unsaid = [tool.name for tool in FLEET_TOOLS if tool.risk != "normal"
              and not re.search(rf"`{tool.name}`\s+is\s+`{tool.risk}`", text)]  # fmt: skip
    assert not unsaid, f"docs/fleet.md does not say the risk of {unsaid} (`NAME` is `RISK`)"


@pytest.mark.parametrize("path", DOCS, ids=lambda path: str(path.relative_to(REPO)))
def test_every_extra_a_page_names_exists(path: Path) -> None:
    extras = set(
        tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    )
    text = path.read_text(encoding="utf-8")
    named = {extra for group in re.findall(r"unit-mcp\[([\w,]+)\]", text) for extra in group.split(",")}
    named |= set(re.findall(r"the `?(\w+)`? extra\b", text))
    assert named <= extras, f"{path.relative_to(REPO)} names extras unit-mcp does not have: {sorted(named - extras)}"


def test_every_option_of_the_command_is_named_in_a_page() -> None:
    """The other direction: an option the `unit-mcp` command has that no page names is undocumented."""
    text = "\n".join(path.read_text(encoding="utf-8") for path in DOCS)
    missing = sorted(option for option in our_options() if option.startswith("--") and option != "--help"
                     and not re.search(re.escape(option) + r"(?![\w-])", text))  # fmt: skip
    assert not missing, f"no page names these options of unit-mcp: {missing}"
