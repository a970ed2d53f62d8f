"""A person at the unit server's page (`UNITS_UI_URL`), for the real-client tests of `--confirm`: logs in, waits
for a call that waits for a yes, and answers it, as the page's own buttons do."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import anyio
import httpx

from unit_mcp.changelog import Change, SqliteChangeLog
from unit_mcp.webpage.auth import SESSION_HEADER

QUESTION = re.compile(r'<li class="request question".*?</li>', re.S)
WAIT = 120  # generous bound on waiting for the client's call to reach the server


async def answer_on_page(login_url: str, approve: bool, *, before: Callable[[], None] = lambda: None) -> str:
    """Answer the first call that waits for a yes, calling `before` once it waits (to check that nothing happened
    yet); returns what the page showed of it (tool, client, diff)."""
    base = login_url.split("?")[0].rstrip("/")
    origin = "{0.scheme}://{0.netloc}".format(urlsplit(base))
    async with httpx.AsyncClient(base_url=base, timeout=30) as page:
        login = await page.get(login_url)
        assert login.status_code == 200, login.text
        found = re.search(r'data-session="([^"]+)"', login.text)
        assert found is not None, login.text
        page.headers[SESSION_HEADER] = found.group(1)
        with anyio.fail_after(WAIT):
            while (question := QUESTION.search((await page.get("/")).text)) is None:
                await anyio.sleep(0.2)
        shown = question.group(0)
        action = re.search(r'action="[^"]*(/questions/\d+/)approve"', shown)
        assert action is not None, shown
        before()
        answered = await page.post(action.group(1) + ("approve" if approve else "deny"), headers={"Origin": origin})
        assert answered.status_code in (200, 303), answered.text
        return shown


def not_yet_in(path: Path, text: str) -> Callable[[], None]:
    """A `before` for `answer_on_page`: `text` is not in `path` yet (nothing was written before the answer)."""

    def check() -> None:
        assert text not in path.read_text(), f"{path.name} holds {text!r} before the answer"

    return check


def logged_changes(data: Path) -> list[Change]:
    """The change log the server kept in its data dir `data`, oldest first: what the answer let through."""
    changes = SqliteChangeLog(data / "changes.db", private=True)
    try:
        return list(reversed(changes.changes()))
    finally:
        changes.close()
