"""The approval page's credential stays on its own port (issue 22, item 1).

The break: the page's cookie held the login token with `Path=/`; the browser sent it to another loopback server
it visited (127.0.0.1 cookies go to every port), which replayed it without a browser, scraped the CSRF token
and approved a waiting call. Now the browser holds no cookie at all: the page session's secret lives in the
page origin's sessionStorage and goes out only as a header of the page's own requests. And a login URL works
once."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Route
from support.server_process import ServerProcess
from ui.conftest import chromium, embedded, page_client, session_secret
from ui.hostile import paused_session

from unit_mcp.agent import AgentError
from unit_mcp.loopback import LoopbackServer

from .report import Report

pytestmark = pytest.mark.anyio
NO_MODEL = "http://127.0.0.1:9/v1"
STORAGE_KEY = "unit-mcp-page-session:/agents"  # ui.js keeps the secret under this key (per mount path)


async def test_page_cookie_replayed_by_another_loopback_server(tmp_path: Path, figures: Report) -> None:
    session_id = paused_session(tmp_path / "sessions", {"unit_id": "counter"})
    received: list[dict[str, str]] = []

    async def visited(request: Request) -> HTMLResponse:
        """The other loopback server: keeps every header and URL the browser sends it (a navigation, then its own
        page's script asking for more with every credential the browser would attach)."""
        received.append({"url": str(request.url), **request.headers})
        return HTMLResponse("<p>a page of another local server</p>")

    other = LoopbackServer(error=AgentError)
    await other.start(Starlette(routes=[Route("/{path:path}", visited)]))
    try:
        async with embedded(tmp_path, None, NO_MODEL) as app, chromium() as browser:
            context = await browser.new_context()
            page = await context.new_page()
            login_url = app.login_url
            await page.goto(login_url)
            request_id = await page.locator(".request").get_attribute("data-request")  # logged in: the page works
            assert request_id is not None
            secret = await page.evaluate(f"sessionStorage.getItem({json.dumps(STORAGE_KEY)})")
            assert secret

            await page.goto(f"{other.base_url}/agents/visit")  # the same tab, then the same browser, go elsewhere
            await page.evaluate("fetch('/agents/asset', {credentials: 'include'})")
            await (await context.new_page()).goto(f"{other.base_url}/another-tab")
            with anyio.fail_after(30):
                while len(received) < 3:
                    await anyio.sleep(0.05)
            seen_there = await page.evaluate("[sessionStorage.length, localStorage.length, document.cookie]")
            assert seen_there == [0, 0, ""]  # the other origin's storage: nothing of the page's
            cookies = await context.cookies()  # every cookie the browser holds, for any port
            assert cookies == []

            sent = json.dumps(received)
            assert secret not in sent and login_url.split("token=")[1] not in sent
            answer = f"{app.base}/approvals/{session_id}/{request_id}"
            origin = app.base.removesuffix("/agents")
            jar = "; ".join(f"{cookie['name']}={cookie['value']}" for cookie in cookies)
            async with httpx.AsyncClient() as replay:
                statuses = []
                for headers in received:  # replayed as sent, to the page, with every cookie there is
                    stolen = {key: value for key, value in headers.items() if key not in ("url", "host")}
                    stolen["cookie"] = "; ".join(filter(None, [stolen.get("cookie", ""), jar]))
                    for path in ("/", "/fragments/pending", f"/sessions/{session_id}", "/events"):
                        read = await replay.get(app.base + path, headers=stolen)
                        statuses.append(read.status_code)
                        assert read.status_code == 401 and request_id not in read.text, path
                    posted = await replay.post(
                        answer, data={"decision": "approve"}, headers={**stolen, "Origin": origin}
                    )
                    statuses.append(posted.status_code)
                    assert posted.status_code == 401
            assert [entry.request.id for entry in app.ui.pending.pending()] == [request_id]  # nothing approved

            await page.goto(f"{app.base}/")  # back on the page's origin: its own session still works there
            await page.locator(".request").get_by_role("button", name="Deny").click()
            await page.locator(".notice-ok").wait_for()
            assert app.ui.pending.pending() == []
    finally:
        await other.stop()
    figures.record(
        "approval page",
        other_loopback_server_received=f"{len(received)} requests: no cookie, no page secret, no login token",
        replayed_to_the_page=sorted(set(statuses)),
    )


async def test_login_url_used_twice_is_refused(tmp_path: Path, figures: Report) -> None:
    async with embedded(tmp_path, None, NO_MODEL) as app, chromium() as browser:
        login_url = app.login_url
        async with httpx.AsyncClient() as client:  # a link preview's HEAD does not spend it
            assert (await client.head(login_url)).status_code == 401
        first = await browser.new_page()
        await first.goto(login_url)
        await first.locator(".empty").wait_for()

        second = await browser.new_page()  # another tab, or someone who read the URL
        response = await second.goto(login_url)
        assert response is not None and response.status == 410
        refusal = second.locator("#shell-message")
        await refusal.wait_for()
        text = await refusal.text_content()
        assert text is not None and "used already" in text and "Open the newest AGENT_UI_URL" in text
        assert await second.evaluate("sessionStorage.length") == 0
        async with httpx.AsyncClient() as client:
            again = await client.get(login_url)
            assert again.status_code == 410 and "data-session" not in again.text
        async with page_client(app.login_url) as client:  # a new link works (once)
            assert (await client.get("/")).status_code == 200

        await first.reload()  # the tab that logged in keeps its session
        await first.locator(".empty").wait_for()

    # `python -m unit_mcp.agent ui` prints a new link after each login
    data = str(tmp_path / "agent-data")
    ui = ServerProcess(
        "--data-dir", data, "ui", "--model", "m", "--base-url", NO_MODEL, tmp=tmp_path, module="unit_mcp.agent"
    )
    try:
        url = (await anyio.to_thread.run_sync(lambda: ui.ready(60, last="AGENT_UI_URL")))["AGENT_UI_URL"]
        async with page_client(url) as client:
            assert (await client.get("/")).status_code == 200
        following = (await anyio.to_thread.run_sync(lambda: ui.ready(60, last="AGENT_UI_URL")))["AGENT_UI_URL"]
        assert following != url
        async with httpx.AsyncClient() as client:
            assert (await client.get(url)).status_code == 410
            assert session_secret((await client.get(following)).text)
    finally:
        assert await anyio.to_thread.run_sync(ui.stop) == 0, ui.stderr()
    figures.record("approval page", login_url_second_use="410 Gone, with how to get a new link")
