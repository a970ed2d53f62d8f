"""A diff that froze the server: the unit page's change view ran `difflib` without autojunk on the event loop,
roughly cubic on repeated lines (1,400 lines of `x` against `x`/`y`: every MCP client stalled for as long as the
page rendered). Every diff the pages show is now windowed and autojunked, capped, computed in a worker thread
once per change and cached; a bystander's `unit_list` is measured against its quiet time while a person opens
the planted change and refreshes it."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from support.server_process import ServerProcess

from unit_mcp.webpage import DIFF_MAX_LINES, diff_lines
from unit_mcp.webpage.auth import SESSION_HEADER

from .clients import call, connect
from .report import Report

pytestmark = pytest.mark.anyio

PLANTED = "x\n" * 1400  # 2.8 KB
REPLACED = "x\ny\n" * 700  # one match per line at best: the longest-match recursion of difflib goes deep
CALLS = 20
VIEWS = 5
STALL = 10.0  # a bystander's call that waits this long is recorded as this long, and ends the measure


async def timed_list(client: object) -> float:
    started = time.perf_counter()
    with anyio.move_on_after(STALL):
        result = await call(client, "unit_list", {})  # type: ignore[arg-type]
        assert not result.is_error, result.text
    return time.perf_counter() - started


@asynccontextmanager
async def logged_in_page(login_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A person's page client, logged in with the printed URL (as tests/support/confirm_page.py does)."""
    base = login_url.split("?")[0].rstrip("/")
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(STALL * 30)) as page:
        login = await page.get(login_url)
        assert login.status_code == 200, login.text
        found = re.search(r'data-session="([^"]+)"', login.text)
        assert found is not None, login.text
        page.headers[SESSION_HEADER] = found.group(1)
        yield page


async def test_a_planted_worst_case_diff_does_not_freeze_other_clients(tmp_path: Path, figures: Report) -> None:
    units = tmp_path / "units"
    (units / "planted").mkdir(parents=True)
    (units / "planted" / "__init__.py").write_text('"""A unit whose data file is a worst case for difflib."""\n')
    (units / "planted" / "data.txt").write_text(PLANTED)
    server = ServerProcess(
        "--units", str(units), "--data-dir", str(tmp_path / "data"), "--no-watch", "--no-auth", tmp=tmp_path
    )
    try:
        printed = server.ready(last="UNITS_UI_URL")
        url = printed["MCP_URL"]
        async with connect(url, None) as attacker, connect(url, None) as bystander:
            planted = await call(
                attacker,
                "unit_apply_patch",
                {"unit_id": "planted", "source_id": "data.txt", "old": PLANTED, "new": REPLACED},
            )
            assert not planted.is_error, planted.text
            change_id = planted.structured["change_id"]
            async with logged_in_page(printed["UNITS_UI_URL"]) as page:
                await timed_list(bystander)  # warmed up
                quiet = [await timed_list(bystander) for _ in range(CALLS)]
                renders: list[tuple[int, str]] = []
                loaded: list[float] = []

                async def person_opens_the_change() -> None:
                    """A click on the planted change, then a few refreshes."""
                    for _ in range(VIEWS):
                        shown = await page.get(f"/changes/{change_id}")
                        renders.append((shown.status_code, shown.text))
                        await anyio.sleep(0.1)

                async with anyio.create_task_group() as group:
                    group.start_soon(person_opens_the_change)
                    await anyio.sleep(0.01)  # the first view is under way
                    while (len(loaded) < CALLS or len(renders) < VIEWS) and STALL not in loaded:
                        loaded.append(min(await timed_list(bystander), STALL))
                    group.cancel_scope.cancel()
    finally:
        server.stop()
    quiet_s, loaded_s = statistics.median(quiet), statistics.median(loaded)
    figures.record(
        "diff_freeze",
        planted=f"{PLANTED.count(chr(10)):,} lines of x, replaced by x/y",
        page_renders=len(renders),
        bystander_unit_list_quiet_ms=round(quiet_s * 1000, 1),
        bystander_unit_list_while_rendering_ms=round(loaded_s * 1000, 1),
        bystander_slowest_while_rendering_ms=round(max(loaded) * 1000, 1),
        ratio=round(loaded_s / quiet_s, 2),
    )
    # generous on a shared machine: the median call while the page renders against twice the quiet median,
    # with 20 ms of slack for a scheduler tick
    assert loaded_s <= 2 * quiet_s + 0.02, f"unit_list took {loaded_s:.3f} s while the page rendered ({quiet_s:.3f})"
    assert renders and all(status == 200 for status, _ in renders), renders[:1]
    assert "diff-add" in renders[0][1], "the planted change's diff is shown"


def test_every_page_diff_is_capped() -> None:
    """Past `DIFF_MAX_LINES` lines a diff is not computed: one row says it is too large to show."""
    many = "".join(f"line {i}\n" for i in range(DIFF_MAX_LINES + 1))
    rows = diff_lines("", many)
    assert len(rows) == 1 and "too large to show" in rows[0].text
    assert [row.kind for row in diff_lines("a\nb\n", "a\nc\n")] == ["hunk", "ctx", "del", "add"]
