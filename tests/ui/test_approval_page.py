"""The approval page in a real browser (Debian's chromium, headless, driven by Playwright): turns of the unit
agent (the scripted model) against the real unit server wait for approval, the page shows them live, and the
buttons answer them through the runner."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
from agent.conftest import UnitServer, agent_cli, ask_on_a_terminal_then_die
from playwright.async_api import Browser, Page, expect
from support.server_process import ServerProcess

from unit_mcp.agent import TurnStatus
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import AGENT, Shoot, embedded

pytestmark = pytest.mark.anyio
PATCH = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello, {name}!", "new": "Howdy, {name}!"}


def patch_steps() -> list:
    return [call(tool_call("unit_apply_patch", PATCH)), say("Done: {{last}}", when=Match(last_role="tool"))]


async def logged_in(browser: Browser, url: str) -> Page:
    page = await browser.new_page(viewport={"width": 1100, "height": 800})
    response = await page.goto(url)
    assert response is not None and response.ok
    await expect(page).not_to_have_url(re.compile("token="))  # spent, gone from the address bar and the history
    return page


async def test_a_waiting_call_appears_live_and_approving_runs_it_exactly_once(
    tmp_path: Path, unit_server: UnitServer, browser: Browser, shoot: Shoot
) -> None:
    greeter = unit_server.units_root / "greeter.py"
    async with ScriptedModel(patch_steps()) as model, embedded(tmp_path, unit_server, model.base_url) as app:
        page = await logged_in(browser, app.login_url)
        await expect(page.locator(".empty")).to_have_text("Nothing waits for an answer.")
        await expect(page.locator("#live-state")).to_have_text("live")
        await page.evaluate("window.__loadedOnce = true")

        session = await app.runner.create_session(AGENT, title="make greeter say howdy")
        handle = await app.runner.run_turn(session.id, "make greeter say howdy")
        request = page.locator(".request")
        await expect(request).to_have_count(1)  # arrived over the event stream: no reload
        assert await page.evaluate("window.__loadedOnce") is True
        await expect(request.locator(".tool")).to_have_text("unit_apply_patch")
        await expect(request.locator(".badge")).to_have_text("shell")
        await expect(request.locator(".where")).to_contain_text(session.id)
        await expect(request.locator(".where")).to_contain_text(handle.id)
        await expect(request.locator(".arguments")).to_contain_text("greeter.py")
        await expect(request.locator(".arguments")).not_to_contain_text("Howdy")  # the edit is the diff, not JSON
        await expect(request.locator("tr.diff-del td.code")).to_have_text(["Hello, {name}!"])  # rendered as a diff
        await expect(request.locator("tr.diff-add td.code")).to_have_text(["Howdy, {name}!"])
        assert unit_server.called() == []  # nothing ran before the answer
        await shoot(page, "approval-page", readme=True)

        await request.get_by_role("button", name="Approve", exact=True).click()
        await expect(page.locator(".notice-ok")).to_contain_text("Approved: unit_apply_patch (apr-")
        await expect(page.locator(".notice-ok")).to_contain_text(f"turn {handle.id} goes on.")
        await handle.wait(60)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        await expect(page.locator(".empty")).to_be_visible()

        await page.goto(f"{app.base}/sessions/{session.id}")
        result = page.locator(".item.tool-result")
        await expect(result).to_have_count(1)
        await expect(result).to_have_class("item tool-result")
        await expect(result.locator(".item-title")).to_have_text("← unit_apply_patch")
        await expect(result.locator(".duration")).not_to_be_empty()
        await result.locator("summary").click()
        await expect(result.locator("pre")).to_contain_text('"changed": true')
        await expect(page.locator(".item.approval .badge-approved")).to_have_count(1)
        await expect(page.locator(".item.message-assistant").last).to_contain_text("Done:")
        await expect(page.locator("#status")).to_have_text("idle")
        await shoot(page, "session-transcript", readme=True)
        await page.goto(f"{app.base}/sessions")
        await expect(page.locator("table.sessions tbody tr")).to_have_count(1)
        await shoot(page, "sessions", readme=True)
    assert unit_server.called() == ["unit_apply_patch"]  # exactly once
    assert greeter.read_text().count("Howdy, {name}!") == 1


async def test_a_rollback_waiting_for_approval_shows_the_diff_of_its_dry_run(
    tmp_path: Path, unit_server: UnitServer, browser: Browser, shoot: Shoot
) -> None:
    """What a rollback would write is in no argument: the page shows the diff of a dry run made through the unit
    server, and nothing is written before the answer."""
    greeter = unit_server.units_root / "greeter.py"
    original = greeter.read_bytes()
    async with unit_server.source() as tools:
        checkpoint = (await tools.call("unit_checkpoint", {"label": "before howdy"})).structured_content
        assert checkpoint is not None
        assert not (await tools.call("unit_apply_patch", PATCH)).is_error
    rollback = {"checkpoint_id": checkpoint["checkpoint_id"]}
    steps = [call(tool_call("unit_rollback", rollback)), say("Done: {{last}}", when=Match(last_role="tool"))]
    async with ScriptedModel(steps) as model, embedded(tmp_path, unit_server, model.base_url) as app:
        page = await logged_in(browser, app.login_url)
        session = await app.runner.create_session(AGENT, title="undo the howdy")
        handle = await app.runner.run_turn(session.id, "undo the howdy")
        request = page.locator(".request")
        await expect(request.locator(".tool")).to_have_text("unit_rollback")
        await expect(request.locator(".badge")).to_have_text("destructive")
        await expect(request.locator(".diff-head .key")).to_have_text(["greeter/greeter.py"])
        await expect(request.locator("tr.diff-del td.code")).to_contain_text(["Howdy, {name}!"])
        await expect(request.locator("tr.diff-add td.code")).to_contain_text(["Hello, {name}!"])
        assert unit_server.called()[-1] == "unit_rollback" and unit_server.calls[-1].arguments["dry_run"] is True
        assert b"Howdy" in greeter.read_bytes()  # the dry run wrote nothing
        await shoot(page, "approval-rollback")

        await request.get_by_role("button", name="Approve", exact=True).click()
        await expect(page.locator(".notice-ok")).to_contain_text("Approved: unit_rollback")
        await handle.wait(60)
        assert handle.status is TurnStatus.COMPLETED, handle.error
    dry, real = [c.arguments for c in unit_server.calls if c.name == "unit_rollback"]
    assert dry["dry_run"] is True and real.get("dry_run", False) is False  # one preview, then the approved call
    assert greeter.read_bytes() == original


async def test_deny_leaves_the_units_file_unchanged(
    tmp_path: Path, unit_server: UnitServer, browser: Browser, shoot: Shoot
) -> None:
    greeter = unit_server.units_root / "greeter.py"
    before = greeter.read_bytes()
    steps = [call(tool_call("unit_apply_patch", PATCH)), say("Not allowed: {{last}}", when=Match(last_role="tool"))]
    async with ScriptedModel(steps) as model, embedded(tmp_path, unit_server, model.base_url) as app:
        page = await logged_in(browser, app.login_url)
        await expect(page.locator("#live-state")).to_have_text("live")
        session = await app.runner.create_session(AGENT)
        handle = await app.runner.run_turn(session.id, "make greeter say howdy")
        request = page.locator(".request")
        await expect(request.locator(".tool")).to_have_text("unit_apply_patch")
        await request.get_by_role("button", name="Deny").click()
        await expect(page.locator(".notice-ok")).to_contain_text("Denied: unit_apply_patch")
        await handle.wait(60)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        await page.goto(f"{app.base}/sessions/{session.id}")
        await expect(page.locator(".item.approval .badge-denied")).to_have_count(1)
        result = page.locator(".item.tool-result")
        await expect(result).to_have_class("item tool-result is-error")
        await expect(result).to_contain_text("[approval_denied]")
        await shoot(page, "denied-transcript")
    assert unit_server.called() == [] and greeter.read_bytes() == before


async def test_a_request_left_by_a_killed_process_is_answered_on_a_new_page_and_the_turn_resumes(
    tmp_path: Path, unit_server: UnitServer, browser: Browser, shoot: Shoot
) -> None:
    steps = [call(tool_call("unit_reload", {"unit_id": "counter"})), say("Reloaded.", when=Match(last_role="tool"))]
    data = str(tmp_path / "agent-data")
    async with ScriptedModel(steps) as model:
        options = [
            "--model", "m", "--base-url", model.base_url, "--mcp-url", unit_server.url,
            "--mcp-token-file", unit_server.token_file(tmp_path),
        ]  # fmt: skip
        await ask_on_a_terminal_then_die(data, [*options, "--session", "ses-cli", "reload", "counter"], wait=60)
        assert unit_server.called() == []

        ui = ServerProcess("--data-dir", data, "ui", *options, tmp=tmp_path, module="unit_mcp.agent")
        try:
            # the unit server runs on this event loop: wait for the child in a thread, never blocking the loop
            printed = await anyio.to_thread.run_sync(lambda: ui.ready(60, last="AGENT_UI_URL"))
            url = printed["AGENT_UI_URL"]
            page = await logged_in(browser, url)
            request = page.locator(".request")
            await expect(request).to_have_count(1)
            await expect(request.locator(".tool")).to_have_text("unit_reload")
            await expect(request).to_contain_text("Its turn ended with its process; answering resumes it here.")
            await shoot(page, "paused-approval")
            await request.get_by_role("button", name="Always approve").click()
            await expect(page.locator(".notice-ok")).to_contain_text("Approved (always, this session): unit_reload")
            await expect(page.locator(".notice-ok")).to_contain_text("the turn resumed as turn-")

            await page.goto(url.split("?")[0] + "sessions/ses-cli")
            result = page.locator(".item.tool-result")
            await expect(result.locator(".item-title")).to_have_text("← unit_reload")  # live, from the journal
            await expect(page.locator(".item.message-assistant pre").last).to_have_text("Reloaded.")
            await expect(page.locator("#status")).to_have_text("idle")
            await shoot(page, "resumed-transcript")
            assert unit_server.called() == ["unit_reload"]  # ran once, after the answer
            # the page let go of the session once its turn ended: a terminal can open it again
            with anyio.fail_after(20):
                while (await agent_cli("--data-dir", data, "sessions", "pending", "ses-cli"))[0] != 0:
                    await anyio.sleep(0.2)
            _, shown, _ = await agent_cli("--data-dir", data, "sessions", "show", "ses-cli", "--json")
            assert json.loads(shown)["data"]["approval_grants"] == ["shell"]  # "always" was kept
        finally:
            code = await anyio.to_thread.run_sync(ui.stop)
            assert code == 0, ui.stderr()
