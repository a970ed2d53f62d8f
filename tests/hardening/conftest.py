"""Fixtures of the hardening suite: the figures report, and the unit server served over loopback HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Generator
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

from .report import REPORT, Report


@pytest.fixture(scope="session")
def figures() -> Report:
    """Each test records its figures here; they are written to reports/ when the session ends (tests/conftest.py:
    by the controller under pytest-xdist, from every worker's share)."""
    return REPORT


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, object, object]:
    """Expected failures of this suite are open findings in the report; once such a test passes, it is closed."""
    report = yield
    assert isinstance(report, pytest.TestReport)
    if report.when == "call":
        REPORT.outcome(item.nodeid, getattr(report, "wasxfail", None) or None)
        module = "" if item.module is None else item.module.__name__.rpartition(".")[2]
        for section, modules in ATTACK_ROUNDS.items():
            if module in modules:
                REPORT.case(section, getattr(item, "originalname", item.name), report.passed)
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

# Security round 4 (issue 34), items 2, 4, 5 and 6: a diff that froze the server, the token in a test's reach,
# the confirmations' guarantees, risks and bounds. (Items 1, 3, 7 and 8 have their own set.)
ROUND4_ITEMS_2456 = {
    "test_confirmation_guarantees",
    "test_diff_freeze",
    "test_risk_and_bounds",
    "test_token_in_reach",
}

# Items 1, 3, 7 and 8: the folder above the data dir, a schema another role made, two workers with one identity,
# an unread stderr.
ROUND4_ITEMS_1378 = {
    "test_data_dir_parents",
    "test_foreign_pg_schema",
    "test_worker_identity",
    "test_unread_stderr",
}

ROUND4_PARENTS_SCHEMAS_WORKERS_STDERR = "round4_parents_schemas_workers_stderr"
ATTACK_ROUNDS = {
    "round3_attacks": ROUND3_MODULES,
    "round4_attacks_2456": ROUND4_ITEMS_2456,
    ROUND4_PARENTS_SCHEMAS_WORKERS_STDERR: ROUND4_ITEMS_1378,
}
"""The report's section of each round's attacks, and the modules whose tests are its attacks."""


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
