"""Who may use the page: requests without a live page session (the header only the page's own script sends),
from a foreign Host or Origin, or forms posted by another site are refused, and nothing is answered; a session
expires unless used."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.async_api import Browser, expect
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route

from unit_mcp.agent import AgentError
from unit_mcp.loopback import LoopbackServer
from unit_mcp.webpage.auth import SESSION_HEADER

from .conftest import Shoot, embedded, page_client, session_secret
from .hostile import paused_session

pytestmark = pytest.mark.anyio
NO_MODEL = "http://127.0.0.1:9/v1"


async def test_without_a_page_session_from_a_foreign_host_or_origin_or_another_site_nothing_is_served(
    tmp_path: Path,
) -> None:
    session_id = paused_session(tmp_path / "sessions", {"unit_id": "counter"})
    async with embedded(tmp_path, None, NO_MODEL) as app, httpx.AsyncClient() as client:
        base, origin = app.base, app.base.removesuffix("/agents")
        for path in ("/", "/sessions", f"/sessions/{session_id}", "/events", "/fragments/pending"):
            for headers in ({}, {SESSION_HEADER: "not-a-session"}):
                refused = await client.get(base + path, headers=headers)
                assert refused.status_code == 401, path
                assert "AGENT_UI_URL" in refused.text and "unit_read_source" not in refused.text  # the shell only
        assert (await client.get(f"{base}/static/ui.js")).status_code == 200  # the script needs no secret
        assert (await client.get(f"{base}/?token=not-the-token")).status_code == 401

        login = await client.get(app.login_url)
        assert login.status_code == 200 and "set-cookie" not in login.headers  # no cookie, for any port
        assert "unit_read_source" not in login.text  # the shell, with the session for the script
        own = {SESSION_HEADER: session_secret(login.text)}
        page = await client.get(f"{base}/", headers=own)
        assert page.status_code == 200 and "unit_read_source" in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "unsafe" not in policy

        assert (await client.get(f"{base}/", headers={**own, "Origin": "http://evil.example"})).status_code == 403
        assert (await client.get(f"{base}/", headers={**own, "Host": "evil.example"})).status_code == 421
        assert (await client.get(f"{base}/", headers={**own, "Host": "127.0.0.1:1"})).status_code == 421

        (request_id,) = [entry.request.id for entry in app.ui.pending.pending()]
        answer = f"{base}/approvals/{session_id}/{request_id}"
        form = {"decision": "approve"}
        same = {**own, "Origin": origin}
        assert (await client.get(answer, headers=own)).status_code == 405  # state changes are POSTs
        assert (await client.put(answer, data=form, headers=same)).status_code == 405
        assert (await client.post(answer, data=form, headers={"Origin": origin})).status_code == 401
        other_port = {**own, "Origin": "http://127.0.0.1:1"}
        assert (await client.post(answer, data=form, headers=other_port)).status_code == 403
        cross_site = {**same, "Sec-Fetch-Site": "same-site"}
        assert (await client.post(answer, data=form, headers=cross_site)).status_code == 403
        assert [entry.request.id for entry in app.ui.pending.pending()] == [request_id]  # nothing was answered

        decided = await client.post(answer, data={"decision": "maybe"}, headers=same)
        assert decided.status_code == 400


async def test_a_page_session_expires_unless_used(tmp_path: Path, browser: Browser) -> None:
    now = [0.0]
    async with embedded(tmp_path, None, NO_MODEL, session_seconds=60, clock=lambda: now[0]) as app:
        page = await browser.new_page()
        await page.goto(app.login_url)
        await expect(page.locator(".empty")).to_be_visible()
        await page.goto("about:blank")  # the tab keeps its session storage; its event stream (renewing) ends
        async with page_client(app.login_url) as client:
            for _ in range(4):  # 200 s in all, never 60 s unused: each answer renews it
                now[0] += 50
                assert (await client.get("/")).status_code == 200
            now[0] += 61
            expired = await client.get("/")
            assert expired.status_code == 401 and "AGENT_UI_URL" in expired.text
            await page.goto(f"{app.base}/sessions")  # the tab's session, unused for 261 s: the page says what to do
            await expect(page.locator("#shell-message")).to_contain_text("Unauthorized: open the AGENT_UI_URL")
            await expect(page.locator(".empty")).to_have_count(0)  # no sessions list: it was not served
            now[0] -= 61  # gone for good, whatever the clock says later
            assert (await client.get("/")).status_code == 401


async def test_a_form_posted_from_another_loopback_site_is_refused_in_the_browser(
    tmp_path: Path, browser: Browser, shoot: Shoot
) -> None:
    session_id = paused_session(tmp_path / "sessions", {"unit_id": "counter"})
    async with embedded(tmp_path, None, NO_MODEL) as app:
        stranger = await browser.new_page()
        refused = await stranger.goto(f"{app.base}/")
        assert refused is not None and refused.status == 401  # no login, no session: nothing to see
        await expect(stranger.locator("#shell-message")).to_contain_text("Unauthorized")

        page = await browser.new_page()
        await page.goto(app.login_url)
        request_id = await page.locator(".request").get_attribute("data-request")
        assert request_id is not None
        target = f"{app.base}/approvals/{session_id}/{request_id}"

        async def attack(request: Request) -> HTMLResponse:  # the browser sends what it holds: nothing of use
            return HTMLResponse(
                f'<form method="post" action="{target}"><input name="decision" value="approve"></form>'
                "<script>document.forms[0].submit()</script>"
            )

        attacker = LoopbackServer(error=AgentError)
        await attacker.start(Starlette(routes=[Route("/", attack)]))
        try:
            async with page.expect_response(target) as posted:
                await page.goto(f"{attacker.base_url}/")
            assert (await posted.value).status == 401
            await expect(page.locator("body")).to_contain_text("Unauthorized")
        finally:
            await attacker.stop()
        assert [entry.request.id for entry in app.ui.pending.pending()] == [request_id]
        await page.goto(f"{app.base}/")
        await expect(page.locator(".request")).to_have_count(1)
        await shoot(page, "still-pending")
