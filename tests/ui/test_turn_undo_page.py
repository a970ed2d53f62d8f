"""Issue 36 item 3 on the agent page, in a real browser (Debian's chromium, headless): a turn's checkpoint shows an
"Undo this turn" link; it leads to the rollback's dry run (diffs and conflicts, nothing written), and the person's
yes puts the units back, leaving alone a source a person edited after the turn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agent.conftest import UnitServer
from playwright.async_api import Browser, Page, expect

from unit_mcp.agent import TurnStatus
from unit_mcp.agent.items import EventItem
from unit_mcp.testing import Match, ScriptedModel, call, say, tool_call

from .conftest import AGENT, Shoot, embedded

pytestmark = pytest.mark.anyio
GREETER = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello, {name}!", "new": "Howdy, {name}!"}
NOTES = {"unit_id": "notes", "source_id": "__init__.py", "old": "café au lait", "new": "café crème"}


async def logged_in(browser: Browser, url: str) -> Page:
    page = await browser.new_page(viewport={"width": 1100, "height": 800})
    response = await page.goto(url)
    assert response is not None and response.ok
    await expect(page).not_to_have_url(re.compile("token="))
    return page


async def test_undo_this_turn_shows_the_diffs_then_puts_back_all_but_a_persons_later_edit(
    tmp_path: Path, unit_server: UnitServer, browser: Browser, shoot: Shoot
) -> None:
    greeter, notes = unit_server.units_root / "greeter.py", unit_server.units_root / "notes" / "__init__.py"
    before = greeter.read_text(), notes.read_text()
    steps = [
        call(tool_call("unit_apply_patch", GREETER), tool_call("unit_apply_patch", NOTES)),
        say("Done", when=Match(last_role="tool")),
    ]
    async with ScriptedModel(steps) as model, embedded(tmp_path, unit_server, model.base_url) as app:
        page = await logged_in(browser, app.login_url)
        app.runner.approvals.set_policy("shell", "auto")  # the patches run unasked: the undo is what is shown here
        session = await app.runner.create_session(AGENT, title="howdy and crème")
        handle = await app.runner.run_turn(session.id, "make greeter say howdy, notes crème")
        await handle.wait(60)
        assert handle.status is TurnStatus.COMPLETED, handle.error
        assert "Howdy" in greeter.read_text() and "café crème" in notes.read_text()

        # a person edits notes after the turn
        edited = notes.read_text().replace("café crème", "café noir")
        notes.write_text(edited)

        await page.goto(f"{app.base}/sessions/{session.id}")
        checkpoint = page.locator(".item.event", has_text=f"checkpoint at the start of turn {handle.id}")
        await expect(checkpoint).to_have_count(1)
        await checkpoint.get_by_role("link", name="Undo this turn").click()
        await expect(page.locator("h1")).to_have_text(f"Undo turn {handle.id}")
        shown = page.locator(".undo-source")
        await expect(shown).to_have_count(1)
        await expect(shown.locator(".key")).to_have_text("greeter/greeter.py")
        await expect(shown.locator("pre.diff")).to_contain_text(re.compile(r'-\s+return f"Howdy, \{name\}!"'))
        await expect(shown.locator("pre.diff")).to_contain_text(re.compile(r'\+\s+return f"Hello, \{name\}!"'))
        await expect(page.locator(".undo-conflict")).to_have_count(1)
        await expect(page.locator(".undo-conflict")).to_contain_text("notes/__init__.py")
        assert "Howdy" in greeter.read_text()  # the dry run wrote nothing
        await shoot(page, "undo-turn")

        await page.get_by_role("button", name="Yes, undo this turn").click()
        notice = page.locator(".notice-error")
        await expect(notice).to_contain_text(f"Turn {handle.id} of session {session.id} undone: 1 source(s) put back.")
        await expect(notice).to_contain_text("Left alone (changed after the turn by others): notes/__init__.py.")
        assert greeter.read_text() == before[0]
        assert notes.read_text() == edited  # the person's edit stays

        # with the conflicts put back too
        await page.goto(f"{app.base}/sessions/{session.id}/undo/{handle.id}?force=1")
        await expect(page.locator(".undo-source .key")).to_have_text(["notes/__init__.py"])
        await page.get_by_role("button", name="Yes, undo this turn").click()
        await expect(page.locator(".notice-ok")).to_contain_text("undone: 1 source(s) put back.")
        assert notes.read_text() == before[1]
        stored = await app.runner.get_session(session.id)
        assert stored is not None
        undone = [i.data for i in stored.items if isinstance(i, EventItem) and i.kind == "turn-undone"]
        assert [(d["restored"], d["force"]) for d in undone] == [
            (["greeter/greeter.py"], False),
            (["notes/__init__.py"], True),
        ]
