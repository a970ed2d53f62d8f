"""Who may use the page: requests without the token, from a foreign Host or Origin, or forms posted by another
site (another loopback port is the same *site* to a browser, so the cookie alone would go along) are refused,
and nothing is answered."""

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

from .conftest import Shoot, embedded
from .hostile import paused_session

pytestmark = pytest.mark.anyio
NO_MODEL = "http://127.0.0.1:9/v1"


async def test_without_the_token_from_a_foreign_host_or_origin_or_without_the_csrf_token_nothing_is_served(
    tmp_path: Path,
) -> None:
    session_id = paused_session(tmp_path / "sessions", {"unit_id": "counter"})
    async with embedded(tmp_path, None, NO_MODEL) as app, httpx.AsyncClient() as client:
        base, origin = app.base, app.base.removesuffix("/agents")
        for path in ("/", "/sessions", f"/sessions/{session_id}", "/events", "/fragments/pending", "/static/ui.js"):
            refused = await client.get(base + path)
            assert refused.status_code == 401, path
            assert "AGENT_UI_URL" in refused.text
        assert (await client.get(f"{base}/?token=not-the-token")).status_code == 401

        login = await client.get(app.login_url)
        assert login.status_code == 303 and login.headers["location"] == "/agents/"  # the token leaves the URL
        cookie = login.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/agents" in cookie
        page = await client.get(f"{base}/")
        assert page.status_code == 200 and "unit_read_source" in page.text
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy and "script-src 'self'" in policy and "unsafe" not in policy

        assert (await client.get(f"{base}/", headers={"Origin": "http://evil.example"})).status_code == 403
        assert (await client.get(f"{base}/", headers={"Host": "evil.example"})).status_code == 421
        assert (await client.get(f"{base}/", headers={"Host": "127.0.0.1:1"})).status_code == 421

        (request_id,) = [entry.request.id for entry in app.ui.pending.pending()]
        answer = f"{base}/approvals/{session_id}/{request_id}"
        form = {"csrf": app.ui.csrf, "decision": "approve"}
        same = {"Origin": origin}
        assert (await client.get(answer)).status_code == 405  # state changes are POSTs
        assert (await client.put(answer, data=form, headers=same)).status_code == 405
        assert (await client.post(answer, data={"decision": "approve"}, headers=same)).status_code == 403
        assert (await client.post(answer, data={**form, "csrf": "stale"}, headers=same)).status_code == 403
        assert (await client.post(answer, data=form, headers={"Origin": "http://127.0.0.1:1"})).status_code == 403
        cross_site = {**same, "Sec-Fetch-Site": "same-site"}
        assert (await client.post(answer, data=form, headers=cross_site)).status_code == 403
        async with httpx.AsyncClient() as anonymous:
            assert (await anonymous.post(answer, data=form, headers=same)).status_code == 401
        assert [entry.request.id for entry in app.ui.pending.pending()] == [request_id]  # nothing was answered

        decided = await client.post(answer, data={**form, "decision": "maybe"}, headers=same)
        assert decided.status_code == 400


async def test_a_form_posted_from_another_loopback_site_is_refused_in_the_browser(
    tmp_path: Path, browser: Browser, shoot: Shoot
) -> None:
    session_id = paused_session(tmp_path / "sessions", {"unit_id": "counter"})
    async with embedded(tmp_path, None, NO_MODEL) as app:
        stranger = await browser.new_page()
        refused = await stranger.goto(f"{app.base}/")
        assert refused is not None and refused.status == 401  # no token, no cookie: nothing to see
        await expect(stranger.locator("body")).to_contain_text("Unauthorized")

        page = await browser.new_page()
        await page.goto(app.login_url)
        request_id = await page.locator(".request").get_attribute("data-request")
        assert request_id is not None
        target = f"{app.base}/approvals/{session_id}/{request_id}"

        async def attack(request: Request) -> HTMLResponse:  # even knowing the CSRF token would not help
            return HTMLResponse(
                f'<form method="post" action="{target}"><input name="csrf" value="{app.ui.csrf}">'
                '<input name="decision" value="approve"></form><script>document.forms[0].submit()</script>'
            )

        attacker = LoopbackServer(error=AgentError)
        await attacker.start(Starlette(routes=[Route("/", attack)]))
        try:
            async with page.expect_response(target) as posted:
                await page.goto(f"{attacker.base_url}/")
            assert (await posted.value).status == 403
            await expect(page.locator("body")).to_contain_text("Forbidden: a form of another site.")
        finally:
            await attacker.stop()
        assert [entry.request.id for entry in app.ui.pending.pending()] == [request_id]
        await page.goto(f"{app.base}/")
        await expect(page.locator(".request")).to_have_count(1)
        await shoot(page, "still-pending")
