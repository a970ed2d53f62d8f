"""`unit-mcp`: the subcommands are listed, each is its module's parser (the `python -m` form prints the same
help), and a wrong option ends in one line on stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from unit_mcp import __version__

UNIT_MCP = Path(sys.executable).parent / "unit-mcp"
MODULES = {"serve": "unit_mcp.server", "agent": "unit_mcp.agent", "fleet": "unit_mcp.fleet", "units": "unit_mcp.units"}


def run(*command: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd, check=False)


def test_help_lists_the_subcommands_and_version_prints(tmp_path: Path) -> None:
    listed = run(UNIT_MCP, "--help", cwd=tmp_path)
    assert listed.returncode == 0
    assert [line.split()[0] for line in listed.stdout.split("commands:\n")[1].splitlines()[:4]] == list(MODULES)
    assert run(UNIT_MCP, "--version", cwd=tmp_path).stdout == f"unit-mcp {__version__}\n"
    wrong = run(UNIT_MCP, "sevre", cwd=tmp_path)
    assert (wrong.returncode, wrong.stderr.count("\n")) == (2, 1), wrong.stderr
    assert wrong.stderr.startswith("unit-mcp: error: argument COMMAND: invalid choice: 'sevre' (choose from")


@pytest.mark.parametrize("name", list(MODULES))
def test_each_subcommand_is_its_modules_parser(tmp_path: Path, name: str) -> None:
    command = run(UNIT_MCP, name, "--help", cwd=tmp_path)
    module = run(sys.executable, "-m", MODULES[name], "--help", cwd=tmp_path)
    assert command.returncode == module.returncode == 0, command.stderr + module.stderr
    assert command.stdout == module.stdout and command.stdout.startswith(f"usage: unit-mcp {name} ")
    wrong = run(UNIT_MCP, name, "--no-such-option", cwd=tmp_path)
    assert (wrong.returncode, wrong.stdout) == (2, "")
    assert wrong.stderr.count("\n") == 1 and wrong.stderr.startswith(f"unit-mcp {name}: error: "), wrong.stderr


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["serve", "--port", "99999"], "unit-mcp serve: error: --port 99999 is not a port number"),
        (["units", "copy", "/no/such/folder", "."], "unit-mcp units: error: /no/such/folder is neither a units folder"),
        (["fleet", "--node", "x"], "unit-mcp fleet: error: a node is NAME=URL"),
        (
            ["fleet", "--node", "a=http://127.0.0.1:1", "--stdio", "--port", "1"],
            "unit-mcp fleet: error: --stdio speaks on stdin/stdout and listens on no port; leave out --port",
        ),
        (["fleet", "--node", "a=http://127.0.0.1:1", "--port", "99999"], "unit-mcp fleet: error: --port 99999 is not"),
        (["agent", "run", "--api-key", "k", "hi"], "unit-mcp agent run: error: --api-key puts the API key"),
    ],
)
def test_errors_are_one_line_without_a_traceback(tmp_path: Path, argv: list[str], error: str) -> None:
    done = run(UNIT_MCP, *argv, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith(error), done.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "greeter.py").write_text("def greet():\n    return 'hi'\n")
    src = Path(__file__).resolve().parents[1] / "unit_mcp" / "examples" / "units"
    quiet = run(UNIT_MCP, "units", "copy", src, tmp_path / "dst", cwd=tmp_path)
    assert quiet.returncode == 1 and quiet.stderr.count("\n") == 1 and "already has units greeter" in quiet.stderr
    loud = run(UNIT_MCP, "units", "copy", src, tmp_path / "dst", "--debug", cwd=tmp_path)
    assert loud.returncode == 1 and "Traceback (most recent call last)" in loud.stderr and "SourceExists" in loud.stderr
