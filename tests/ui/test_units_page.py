"""The unit server's page, opened from the `UNITS_UI_URL` the real `python -m unit_mcp.server` prints: a change made
by a real MCP client arrives live, its diff opens with line numbers, a rollback shows its dry run before it
writes; hostile unit source, client names and labels stay text; the page refuses what lacks its credential or
comes from another origin, and another loopback server the same browser visits gets nothing it can replay."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from playwright.async_api import Browser, Page, expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route
from support.server_process import ServerProcess

from unit_mcp.loopback import LoopbackServer
from unit_mcp.webpage.auth import SESSION_HEADER

from .conftest import Shoot, page_client
from .hostile import IMG, JS_URL, SCRIPT

pytestmark = pytest.mark.anyio
HOSTILE_CLIENT = types.Implementation(name=f"{SCRIPT}{IMG}-client", version="6.6.6")
STORAGE_KEY = "unit-mcp-page-session:/units"


class Served:
    """The real server, its printed lines, and a way to get the next login link it prints."""

    def __init__(self, process: ServerProcess, printed: dict[str, str]) -> None:
        self.process = process
        self.printed = printed

    async def login_url(self) -> str:
        """The next UNITS_UI_URL (the server prints one at start and one after each login)."""
        return (await anyio.to_thread.run_sync(lambda: self.process.ready(60, last="UNITS_UI_URL")))["UNITS_UI_URL"]

    @property
    def base(self) -> str:
        return self.printed["MCP_URL"].removesuffix("/mcp") + "/units"

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        headers = {"Authorization": f"Bearer {self.printed['MCP_TOKEN']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
            Client(
                streamable_http_client(self.printed["MCP_URL"], http_client=http),
                mode="legacy",
                client_info=HOSTILE_CLIENT,
            ) as client,
        ):
            yield client

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        async with self.client() as client:
            done = await client.call_tool(tool, arguments)
        assert not done.is_error and done.structured_content is not None, done
        return dict(done.structured_content)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    process = ServerProcess("--no-watch", tmp=tmp_path)
    try:
        yield Served(process, process.ready(60))
    finally:
        assert process.stop() == 0, process.stderr()


async def greeter_hash(served: Served) -> str:
    read = await served.call("unit_read_source", {"unit_id": "greeter", "source_id": "greeter.py"})
    return str(read["hash"])


async def no_script_ran(page: Page) -> None:
    assert await page.evaluate("window.__pwned") is None
    assert await page.locator("main script, main img").count() == 0
    assert await page.locator("a[href^='javascript']").count() == 0


async def test_a_change_arrives_live_its_diff_opens_and_a_rollback_is_previewed_then_confirmed(
    served: Served, browser: Browser, shoot: Shoot
) -> None:
    before = await greeter_hash(served)
    page = await browser.new_page()
    await page.goto(await served.login_url())
    await expect(page.locator("h1")).to_have_text("Units and changes")
    await expect(page.locator("tr[data-unit='greeter'] .badge")).to_have_text("loaded")
    await expect(page.locator("#live-state")).to_have_text("live")

    await page.get_by_placeholder("checkpoint label (optional)").fill(f"before {SCRIPT}")
    await page.get_by_role("button", name="Take a checkpoint").click()
    checkpoint = page.locator(".checkpoint")
    await expect(checkpoint).to_have_count(1)
    await expect(checkpoint.locator(".item-title")).to_have_text(f"before {SCRIPT}")  # a label is text

    new = f"Hello {SCRIPT} {JS_URL}"
    refreshed = await page.evaluate("document.body.dataset.refreshed || '0'")
    await served.call("unit_apply_patch", {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": new})
    change = page.locator(".change")
    await expect(change).to_have_count(1)  # live: no reload
    assert await page.evaluate("document.body.dataset.refreshed") != refreshed
    await expect(change.locator(".client")).to_have_text(f"{SCRIPT}{IMG}-client 6.6.6")
    await expect(change.locator(".badge-applied")).to_have_text("applied")
    await expect(page.locator("tr[data-unit='greeter'] .preview")).not_to_have_text(before[:19])
    await no_script_ran(page)
    await shoot(page, "units-page", readme=True)

    await change.locator("a.tool").click()
    await expect(page.locator("h1")).to_contain_text("unit_apply_patch")
    added, removed = page.locator("tr.diff-add"), page.locator("tr.diff-del")
    await expect(added.locator("td.code")).to_contain_text([new])
    await expect(removed.locator("td.code")).to_contain_text(["Hello"])
    line = await added.first.locator("td.ln").nth(1).text_content()
    assert line is not None and int(line) == int(await removed.first.locator("td.ln").first.text_content() or 0)
    await no_script_ran(page)
    await shoot(page, "units-change-diff", readme=True)

    await page.get_by_role("link", name="Back to the change log").click()
    await page.locator(".checkpoint").get_by_role("button", name="Roll back to here…").click()
    await expect(page.locator("h1")).to_contain_text("Roll back to checkpoint")
    await expect(page.locator("tr.diff-del td.code")).to_contain_text([new])  # the dry run: what would go
    assert await greeter_hash(served) != before, "a preview writes nothing"
    await shoot(page, "units-rollback-preview", readme=True)

    await page.get_by_role("button", name="Confirm: roll back to checkpoint 1").click()
    await expect(page.locator("h1")).to_contain_text("unit_rollback")
    await expect(page.locator("h1 .badge")).to_have_text("applied")
    await expect(page.locator("dd.client")).to_have_text("unit-mcp page")
    assert await greeter_hash(served) == before

    await page.get_by_role("link", name="Back to the change log").click()
    await expect(page.locator(".change")).to_have_count(2)
    await page.get_by_label("Unit").fill("counter")  # filtered by unit: nothing of greeter
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator(".change")).to_have_count(0)
    await expect(page.locator(".changes .empty")).to_have_text("No changes match.")
    await page.get_by_label("Unit").fill("")
    await page.get_by_label("Client").fill(HOSTILE_CLIENT.name)
    await page.get_by_role("button", name="Filter").click()
    await expect(page.locator(".change")).to_have_count(1)  # the client's patch, not the page's rollback
    await expect(page.locator(".change a.tool")).to_contain_text("unit_apply_patch")
    await no_script_ran(page)


async def test_one_change_is_reverted_after_its_preview(served: Served, browser: Browser) -> None:
    before = await greeter_hash(served)
    done = await served.call(
        "unit_apply_patch", {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Hi"}
    )
    page = await browser.new_page()
    await page.goto(await served.login_url())
    await page.locator(f".change[data-change='{done['change_id']}'] a.tool").click()
    await page.get_by_role("button", name="Revert this change…").click()
    await expect(page.locator("h1")).to_contain_text(f"Revert change {done['change_id']}: preview")
    await expect(page.locator("tr.diff-add td.code")).to_contain_text(["Hello"])
    assert await greeter_hash(served) != before
    await page.get_by_role("button", name=f"Confirm: revert change {done['change_id']}").click()
    await expect(page.locator("h1")).to_contain_text("unit_revert_change")
    assert await greeter_hash(served) == before

    await page.goto(f"{served.base}/changes/{done['change_id']}")  # again: the source moved on, refused in a line
    await page.get_by_role("button", name="Revert this change…").click()
    await expect(page.locator("#shell-message")).to_contain_text("refused (stale_hash)")


async def checkpoints(client: httpx.AsyncClient) -> int:
    return (await client.get("/")).text.count("data-checkpoint=")


async def test_a_post_without_the_page_credential_or_from_another_origin_is_refused(served: Served) -> None:
    async with page_client(await served.login_url()) as client, httpx.AsyncClient() as bare:
        origin = served.base.removesuffix("/units")
        target = f"{served.base}/checkpoints"
        bearer = {"Authorization": f"Bearer {served.printed['MCP_TOKEN']}"}
        own = {SESSION_HEADER: client.headers[SESSION_HEADER]}
        assert (await bare.post(target, data={"label": "x"}, headers={"Origin": origin})).status_code == 401
        assert (await bare.post(target, data={"label": "x"}, headers={**bearer, "Origin": origin})).status_code == 401
        assert (await bare.get(f"{served.base}/", headers=bearer)).status_code == 401  # the MCP token is not it
        other_port = {**own, "Origin": "http://127.0.0.1:1"}
        assert (await bare.post(target, data={"label": "x"}, headers=other_port)).status_code == 403
        cross_site = {**own, "Origin": origin, "Sec-Fetch-Site": "cross-site"}
        assert (await bare.post(target, data={"label": "x"}, headers=cross_site)).status_code == 403
        assert (
            await bare.post(target, data={"label": "x"}, headers={**own, "Host": "evil.example"})
        ).status_code == 421
        assert await checkpoints(client) == 0  # nothing was taken
        mcp = await bare.post(served.printed["MCP_URL"], headers=own, json={})
        assert mcp.status_code == 401  # and the page's credential is not the MCP token
        page = await client.get("/")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "unsafe" not in policy
        taken = await bare.post(target, data={"label": "ok"}, headers={**own, "Origin": origin})
        assert taken.status_code == 303
        assert await checkpoints(client) == 1


async def test_another_loopback_server_the_browser_visits_gets_nothing_it_can_replay(
    served: Served, browser: Browser
) -> None:
    received: list[dict[str, str]] = []
    target = f"{served.base}/checkpoints"

    async def visited(request: Request) -> HTMLResponse:
        """Keeps what the browser sends it, and posts a form to the unit page with whatever the browser holds."""
        received.append({"url": str(request.url), **request.headers})
        return HTMLResponse(
            f'<form method="post" action="{target}"><input name="label" value="planted"></form>'
            "<script>fetch('/units/asset', {credentials: 'include'}).then(() => document.forms[0].submit())</script>"
        )

    other = LoopbackServer()
    await other.start(Starlette(routes=[Route("/{path:path}", visited)]))
    try:
        context = await browser.new_context()
        page = await context.new_page()
        login_url = await served.login_url()
        await page.goto(login_url)
        await expect(page.locator("#live-state")).to_have_text("live")
        secret = await page.evaluate(f"sessionStorage.getItem({json.dumps(STORAGE_KEY)})")
        assert secret

        async with page.expect_response(target) as posted:
            await page.goto(f"{other.base_url}/units/visit")
        assert (await posted.value).status == 401
        await page.wait_for_url(target)  # the form's navigation has landed: none left in flight to cut the goto below
        with anyio.fail_after(30):
            while len(received) < 2:
                await anyio.sleep(0.05)
        assert await context.cookies() == []
        sent = json.dumps(received)
        assert secret not in sent and login_url.split("token=")[1] not in sent
        async with httpx.AsyncClient() as replay:
            for headers in received:
                stolen = {key: value for key, value in headers.items() if key not in ("url", "host")}
                for path in ("/", "/fragments/changes", "/events"):
                    read = await replay.get(served.base + path, headers=stolen)
                    assert read.status_code == 401 and "data-unit" not in read.text, path
                origin = served.base.removesuffix("/units")
                assert (
                    await replay.post(target, data={"label": "x"}, headers={**stolen, "Origin": origin})
                ).status_code == 401

        await page.goto(f"{served.base}/")  # back on the page's origin: its own session still works, nothing taken
        await expect(page.locator(".checkpoints .empty")).to_have_text("No checkpoints yet.")
    finally:
        await other.stop()


async def test_a_unit_that_does_not_load_shows_its_error_as_text(tmp_path: Path, browser: Browser) -> None:
    units = tmp_path / "units"
    units.mkdir()
    (units / "fine.py").write_text('"""A unit that loads."""\n')
    (units / "broken.py").write_text(f"raise RuntimeError({SCRIPT!r})\n")
    process = ServerProcess("--units", str(units), "--no-watch", tmp=tmp_path)
    try:
        served = Served(process, process.ready(60))
        page = await browser.new_page()
        await page.goto(await served.login_url())
        await expect(page.locator("tr[data-unit='fine'] .badge")).to_have_text("loaded")
        broken = page.locator("tr[data-unit='broken']")
        await expect(broken.locator(".badge")).to_have_text("not loaded")
        await expect(broken.locator(".note")).to_contain_text(SCRIPT)
        await no_script_ran(page)
    finally:
        assert process.stop() == 0, process.stderr()
