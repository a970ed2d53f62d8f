"""Fixtures for the browser tests: Debian's chromium driven by Playwright, the page embedded in an application
(mounted under /agents beside the application's runner), the real unit server, and screenshots.

Chromium comes from `scripts/browser-tool` (apt); a missing one fails these tests, it never skips them.
Screenshots go to the test's tmp folder; with UNIT_MCP_UI_SCREENSHOTS=DIR they are also copied to DIR (that is
how the README's pictures are made: `UNIT_MCP_UI_SCREENSHOTS=docs/ui scripts/test tests/ui/test_approval_page.py`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
from agent.conftest import UnitServer, unit_server
from playwright.async_api import Browser, Page, async_playwright, expect
from starlette.applications import Starlette
from starlette.routing import Mount

from unit_mcp.agent import (
    AgentApprovals,
    AgentError,
    AgentRegistry,
    AgentRunner,
    AgentToolSurface,
    OpenAIAgent,
    PendingApprovals,
)
from unit_mcp.agent.ui import AgentUI
from unit_mcp.loopback import LoopbackServer
from unit_mcp.webpage.auth import SESSION_HEADER

__all__ = ["unit_server"]  # the real unit server fixture, shared with the agent tests

AGENT = "unit-agent"
SHOTS_ENV = "UNIT_MCP_UI_SCREENSHOTS"
expect.set_options(timeout=30_000)  # a shared, slow machine: generous, and each wait ends as soon as it holds


def chromium_path() -> str:
    found = os.environ.get("UNIT_MCP_CHROMIUM") or shutil.which("chromium")
    if found is None:
        pytest.fail("chromium is not installed: run scripts/browser-tool (Debian: apt-get install chromium)")
    return found


@asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Debian's chromium, headless, driven by Playwright (also for the hardening suite's page attacks)."""
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium_path(), headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with chromium() as launched:
        yield launched


class Shoot(Protocol):
    def __call__(self, page: Page, name: str, *, readme: bool = False) -> Awaitable[Path]: ...


@pytest.fixture
def shoot(tmp_path: Path) -> Shoot:
    """`await shoot(page, "name")`: a full-page PNG in tmp_path/screenshots; with `readme=True` also one in
    $UNIT_MCP_UI_SCREENSHOTS when that is set."""
    folder = tmp_path / "screenshots"

    async def take(page: Page, name: str, *, readme: bool = False) -> Path:
        folder.mkdir(exist_ok=True)
        path = folder / f"{name}.png"
        await page.screenshot(path=path, full_page=True)
        assert path.stat().st_size > 1000
        copies = os.environ.get(SHOTS_ENV)
        if copies and readme:
            Path(copies).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, Path(copies) / path.name)
        return path

    return take


@dataclass
class Embedded:
    """An application running agent turns with the page mounted at /agents."""

    runner: AgentRunner
    ui: AgentUI
    base: str  # http://127.0.0.1:PORT/agents

    @property
    def login_url(self) -> str:
        return self.ui.login_url(self.base)


@asynccontextmanager
async def embedded(
    tmp_path: Path, server: UnitServer | None, model_url: str, **options: Any
) -> AsyncIterator[Embedded]:
    """The unit agent (OpenAI-compatible, against `model_url`) over the unit server's tools, asking a
    `PendingApprovals` approver, and the page (`AgentUI(**options)`) answering it."""
    surface = AgentToolSurface(AgentApprovals(approver=PendingApprovals()))
    registry = AgentRegistry()
    registry.register(AGENT, lambda deps: OpenAIAgent(id=AGENT, model="m", base_url=model_url, max_steps=5))
    async with AsyncExitStack() as stack:
        if server is not None:
            surface.add_source(await stack.enter_async_context(server.source()))
        runner = await stack.enter_async_context(
            AgentRunner(store=tmp_path / "sessions", registry=registry, tools=surface)
        )
        async with serving(runner, mount="/agents", **options) as (ui, base):
            yield Embedded(runner, ui, base)


@asynccontextmanager
async def serving(
    runner: AgentRunner, *, mount: str | None = None, **options: Any
) -> AsyncIterator[tuple[AgentUI, str]]:
    """The page of `runner` on loopback, alone or mounted at `mount` in an application; (ui, its base URL)."""
    http = LoopbackServer(error=AgentError)
    ui = AgentUI(runner, port=http.bind(), **options)
    await http.start(Starlette(routes=[Mount(mount, app=ui.app)]) if mount else ui.app)
    try:
        yield ui, http.base_url + (mount or "")
    finally:
        await http.stop()


def session_secret(login_page: str) -> str:
    """The page session's secret in the shell a login answers (what the page's script keeps)."""
    found = re.search(r'data-session="([^"]+)"', login_page)
    assert found is not None, login_page
    return found.group(1)


@asynccontextmanager
async def page_client(login_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client logged in with `login_url` (spending it) that sends the page session's header, as the
    page's own script does; its base URL is the page's."""
    base = login_url.split("?")[0].rstrip("/")
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        login = await client.get(login_url)
        assert login.status_code == 200, login.text
        client.headers[SESSION_HEADER] = session_secret(login.text)
        yield client
