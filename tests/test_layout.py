"""Tests and scripts use unit_mcp through its public faces (issue 41, item 4): a private module (`_x`) is reached
only from tests/support, the one place that may reach inside. `scripts/private_imports.py` counts every form;
`.venv/bin/python scripts/private_imports.py --where` lists each reference by module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def load_counter() -> ModuleType:
    spec = importlib.util.spec_from_file_location("private_imports", REPO / "scripts" / "private_imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while being made
    spec.loader.exec_module(module)
    return module


counter = load_counter()

# Every form of reaching in, written with `{p}` for the package so that this file itself reaches nothing.
REACHING = """
from {p}.agent._durable import recover
from {p}.agent.codex._home import (
    CodexHome,
)
from {p}.agent import _cli as agent_cli, toolnames
import {p}.agent.opencode._client
import {p}.service._units as units
importlib.import_module("{p}.agent._inbox")
monkeypatch.setattr("{p}.agent._durable.DEAD_AFTER", 1.0)
subprocess.run([sys.executable, "-c", "from {p}._lazy import lazy_exports"])
"""
PUBLIC = """
from {p}.agent import DurableClient, status
from {p}.agent.opencode import read_reply
from {p}.cli import command_parser
import {p}.__main__
from {p}.pgloader import SCHEMA
monkeypatch.setattr("{p}.agent.sessions.STALE_SECONDS", 0.5)
text = "see {p}._lazy for why"
"""


def test_every_form_of_reaching_into_a_private_module_is_counted() -> None:
    found = counter.reaches_in(REACHING.format(p="unit_mcp"), Path("tests/test_x.py"), REPO)
    assert [(reach.line, reach.module.removeprefix("unit_mcp.")) for reach in found] == [
        (2, "agent._durable"),
        (3, "agent.codex._home"),
        (6, "agent._cli"),
        (7, "agent.opencode._client"),
        (8, "service._units"),
        (9, "agent._inbox"),
        (10, "agent._durable"),
        (11, "_lazy"),
    ]


def test_public_faces_and_private_names_of_public_modules_are_not_counted() -> None:
    """A private name of a public module (`pgloader._DDL`) is not a private module; the count leaves it alone."""
    assert counter.reaches_in(PUBLIC.format(p="unit_mcp"), Path("tests/test_x.py"), REPO) == []


def test_only_tests_support_reaches_into_private_modules() -> None:
    found = counter.repository_reaches(REPO)
    outside = counter.outside_support(found)
    assert not outside, "reach these through a public face or tests/support:\n" + "\n".join(
        f"{reach.path}:{reach.line} {reach.module}" for reach in outside
    )
    assert found, "tests/support reaches inside (the Codex parts, the DBOS contract): the count found nothing"
    assert {reach.path.parts[:2] for reach in found} == {("tests", "support")}


def test_no_module_of_the_service_is_over_300_lines() -> None:
    """The service is split by concept around one write transaction (issue 41): each module stays readable."""
    lengths = {p.name: len(p.read_text().splitlines()) for p in (REPO / "unit_mcp" / "service").glob("*.py")}
    assert len(lengths) > 10, lengths
    assert {name: n for name, n in lengths.items() if n > 300} == {}
