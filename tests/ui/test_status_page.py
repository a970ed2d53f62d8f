"""The page's "Working now" in the browser: a turn another process starts shows up live with its step and a
duration that counts, and when that process is killed the row says so (the CLI and the workers: test_status.py in
tests/durable)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from agent.conftest import REPO
from playwright.async_api import Browser, expect

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface
from unit_mcp.testing import ScriptedModel, say

from .conftest import Shoot, serving

pytestmark = pytest.mark.anyio


async def test_in_the_browser_a_running_turn_shows_up_live_counts_its_time_and_its_process_death(
    tmp_path: Path, browser: Browser, shoot: Shoot
) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    runner = AgentRunner(store=data, registry=AgentRegistry(), tools=AgentToolSurface(AgentApprovals()))
    async with ScriptedModel([say("thought", delay=120)]) as model, runner, serving(runner) as (ui, base):
        page = await browser.new_page(viewport={"width": 1100, "height": 500})
        await page.goto(ui.login_url(base))
        await page.get_by_role("link", name="Working now").click()
        await expect(page.locator(".empty")).to_have_text("No turn is running.")
        process = subprocess.Popen(
            [sys.executable, "-m", "unit_mcp.agent", "--data-dir", str(data), "run", "--model", "scripted",
             "--base-url", model.base_url, "--session", "ses-think", "think", "hard"],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            row = page.locator('tr.step[data-session="ses-think"]')
            await expect(row).to_contain_text("model request", timeout=60_000)
            await expect(row).to_contain_text(f"pid {process.pid} on {socket.gethostname()}")
            first = await row.locator("td.num").first.inner_text()
            await expect(row.locator("td.num").first).not_to_have_text(first, timeout=10_000)  # it counts, live
            await shoot(page, "working-now")
            process.kill()
            process.wait(30)
            await expect(row).to_contain_text("no live process", timeout=20_000)  # the dead pid, not a stale beat
        finally:
            process.kill()
            process.wait(30)
