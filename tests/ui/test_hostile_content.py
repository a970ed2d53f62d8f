"""Content from models and tools is hostile: markup, `javascript:` links and a 5 MB argument render as inert,
folded text, and the page stays small."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, expect

from .conftest import Shoot, embedded
from .hostile import BIG, HOSTILE_ARGUMENTS, IMG, JS_URL, SCRIPT, paused_session

pytestmark = pytest.mark.anyio
NO_MODEL = "http://127.0.0.1:9/v1"  # nothing is resumed here


async def inert(page: Page) -> None:
    """Nothing the content carries ran, and the only script on the page is the page's own."""
    assert await page.evaluate("window.__pwned") is None
    assert await page.evaluate("Array.from(document.scripts, s => s.src.split('/').pop())") == ["ui.js"]
    assert await page.evaluate("document.images.length") == 0
    assert await page.locator('[href^="javascript" i]').count() == 0


async def test_markup_and_links_in_arguments_and_messages_stay_text_and_a_5mb_argument_is_folded(
    tmp_path: Path, browser: Browser, shoot: Shoot
) -> None:
    session_id = paused_session(tmp_path / "sessions", HOSTILE_ARGUMENTS, title=SCRIPT + IMG)
    async with embedded(tmp_path, None, NO_MODEL) as app:
        page = await browser.new_page(viewport={"width": 1100, "height": 800})
        started = time.perf_counter()
        response = await page.goto(app.login_url)
        assert response is not None and response.ok
        request = page.locator(".request")
        await expect(request).to_have_count(1)
        elapsed = time.perf_counter() - started
        size = len(await page.content())
        print(f"pending page with a 5 MB argument: {size:,} bytes of HTML, loaded in {elapsed:.2f} s")
        assert size < 100_000  # the 5 MB value was cut on the server
        await expect(request.locator(".where")).to_contain_text(SCRIPT + IMG)  # the title, as text
        await expect(request.locator(".arguments")).to_contain_text(SCRIPT)
        await expect(request.locator(".arguments")).to_contain_text(JS_URL)
        blob = request.locator('details[data-key="blob"]')
        await expect(blob.locator(".size")).to_have_text(f"{len(BIG):,} chars")
        await blob.locator("summary").click()
        await expect(blob.locator(".omitted")).to_contain_text("more characters not shown")
        for summary in await request.locator("summary").all():
            await summary.click()
        await inert(page)
        await shoot(page, "hostile-pending")

        await page.goto(f"{app.base}/sessions/{session_id}")
        await expect(page.locator(".item.message-assistant")).to_contain_text(f"[click me]({JS_URL}) {SCRIPT}")
        assert len(await page.content()) < 200_000
        await expect(page.locator(".item.message-user")).to_contain_text(IMG)
        error = page.locator(".item.tool-result")
        await expect(error).to_have_class("item tool-result is-error")
        await expect(error).to_contain_text(SCRIPT + IMG)
        for summary in await page.locator("summary").all():
            await summary.click()
        await inert(page)
        await shoot(page, "hostile-transcript")

        await page.goto(f"{app.base}/sessions")
        await expect(page.locator("td.title")).to_have_text((SCRIPT + IMG)[:120])
        await inert(page)
