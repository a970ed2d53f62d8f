"""Fixtures of the hardening suite: the figures report, and the unit server served over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from unit_mcp import Host, UnitService
from unit_mcp.agent import AgentApprovals, AgentToolSurface, ApprovedEndpoint, McpToolSource
from unit_mcp.agent.approvals import RISKS
from unit_mcp.bridge import Bridge
from unit_mcp.mcphttp import Limits
from unit_mcp.tools import UnitTools

from .report import Report, report_dir

REPORT = Report(report_dir())


@pytest.fixture(scope="session")
def figures() -> Iterator[Report]:
    """Each test records its figures here; they are written to reports/ when the session ends."""
    yield REPORT
    REPORT.write()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    """Expected failures of this suite are open findings in the report; once such a test passes, it is closed."""
    report = yield
    assert isinstance(report, pytest.TestReport)
    if report.when == "call":
        REPORT.outcome(item.nodeid, getattr(report, "wasxfail", None) or None)
        if item.module is not None and item.module.__name__.rpartition(".")[2] in ROUND3_MODULES:
            name = getattr(item, "originalname", item.name)
            held, cases = ROUND3_CASES.get(name, (0, 0))
            ROUND3_CASES[name] = (held + report.passed, cases + 1)
            REPORT.record("round3_attacks", **{name: f"held in {held + report.passed} of {cases + 1} cases"})
        _replayed(item, report)
    return report


# The modules of security round 3 (issue 22): one attack per test, each a break that was reproduced before the
# fix; the report lists every one with whether it held in this run.
ROUND3_MODULES = {
    "test_page_credentials",
    "test_secrets_in_argv",
    "test_data_dir_trust",
    "test_rollback",
    "test_risks",
    "test_test_sandbox",
    "test_idle_sockets",
    "test_huge_source",
    "test_foreign_stores",
}
ROUND3_CASES: dict[str, tuple[int, int]] = {}  # test function -> (cases that held, cases run)


# Security round 4 (issue 34): each round-4 block lists its modules and records into a section of its own, so
# blocks added side by side merge cleanly. This one: items 1, 3, 7 and 8.
ROUND4_PARENTS_SCHEMAS_WORKERS_STDERR = "round4_parents_schemas_workers_stderr"
ROUND4_BLOCKS = {
    ROUND4_PARENTS_SCHEMAS_WORKERS_STDERR: {
        "test_data_dir_parents",
        "test_foreign_pg_schema",
        "test_worker_identity",
        "test_unread_stderr",
    },
}
ROUND4_CASES: dict[str, tuple[int, int]] = {}  # test function -> (cases that held, cases run)


def _replayed(item: pytest.Item, report: pytest.TestReport) -> None:
    """A test of a round-4 block ran: its row says in how many of its cases the attack held."""
    module = item.module.__name__.rpartition(".")[2] if item.module is not None else ""
    for section, modules in ROUND4_BLOCKS.items():
        if module in modules:
            name = getattr(item, "originalname", item.name)
            held, cases = ROUND4_CASES.get(name, (0, 0))
            ROUND4_CASES[name] = (held + report.passed, cases + 1)
            REPORT.record(section, **{name: f"held in {held + report.passed} of {cases + 1} cases"})


@dataclass
class Served:
    host: Host
    bridge: Bridge | ApprovedEndpoint

    @property
    def url(self) -> str:
        assert self.bridge.url is not None
        return self.bridge.url

    @property
    def token(self) -> str | None:
        return self.bridge.token


@pytest.fixture
async def served(host: Host) -> AsyncIterator[Served]:
    """The tools over the default units (examples and fixtures), served by the real bridge on loopback."""
    tools = UnitTools(UnitService(host, test_timeout=30), progress_interval=0.5)
    async with Bridge(tools.server()) as bridge:
        yield Served(host, bridge)


FRONTS = ["bridge", "agent endpoint"]


@pytest.fixture(params=FRONTS)
def front(request: pytest.FixtureRequest) -> str:
    """Which MCP HTTP server a bounds test attacks: the bridge, or an agent endpoint (OpenCode's and Codex's)."""
    param: str = request.param
    return param


@asynccontextmanager
async def serve(host: Host, front: str, **limits: Any) -> AsyncIterator[Bridge | ApprovedEndpoint]:
    """The unit tools behind `front` with the given `Limits`: the bridge itself, or an agent endpoint granting
    every risk in front of a bridge with the default limits."""
    tools = UnitTools(UnitService(host, test_timeout=30), progress_interval=0.5)
    if front == "bridge":
        async with Bridge(tools.server(), limits=Limits(**limits)) as bridge:
            yield bridge
        return
    async with Bridge(tools.server()) as bridge, McpToolSource(bridge.url or "", token=bridge.token) as source:
        surface = AgentToolSurface(AgentApprovals())
        surface.add_source(source)
        async with ApprovedEndpoint(surface, grants=RISKS, limits=Limits(**limits)) as endpoint:
            yield endpoint
