"""What the page lists as waiting, read from the store without claiming sessions: a request whose turn is alive in
another process is shown as that process's to answer (and answering it here is refused with a clear message);
once that process is killed the same request is paused, and answering it here resumes the turn."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from agent.test_paused_approvals import SESSION, app, deployed
from agent.test_paused_properties import first_life
from hypothesis import given
from hypothesis import strategies as st
from playwright.async_api import Browser, expect
from support.agent_cli import main

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, TurnStatus
from unit_mcp.agent.ui import AgentUI
from unit_mcp.agent.ui.folding import SHOW_CHARS, fold_arguments
from unit_mcp.agent.ui.pending import proposed_diff

from .conftest import Shoot, page_client, serving

pytestmark = pytest.mark.anyio
NO_MODEL = "http://127.0.0.1:9/v1"


async def test_a_request_of_a_live_process_is_its_own_and_becomes_answerable_here_when_it_dies(tmp_path: Path) -> None:
    module = app(tmp_path)
    process = subprocess.Popen(
        [sys.executable, str(tmp_path / "paused_app.py"), str(tmp_path), "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().split()
        assert line[:1] == ["waiting"], f"the app did not reach its approval (exit code {process.poll()})"
        runner, _ = module.build(tmp_path, 1)  # the same app, second life: this process serves the page
        async with runner, serving(runner) as (ui, base), page_client(ui.login_url(base)) as client:
            (entry,) = ui.pending.pending()
            assert (entry.request.id, entry.state, entry.writer_pid) == (line[1], "elsewhere", process.pid)
            page = await client.get(f"{base}/")
            assert f"another process (pid {process.pid})" in page.text and "Approve</button>" not in page.text

            answer = f"{base}/approvals/{SESSION}/{entry.request.id}"
            form = {"decision": "approve"}
            answered = await client.post(answer, data=form, headers={"Origin": base}, follow_redirects=True)
            assert f"Not answered: session {SESSION} is open in another process" in answered.text

            process.send_signal(signal.SIGKILL)
            process.wait(10)
            (entry,) = ui.pending.pending()
            assert (entry.state, entry.writer_pid) == ("paused", None)
            answered = await client.post(answer, data=form, headers={"Origin": base}, follow_redirects=True)
            assert "Approved: deploy" in answered.text and "the turn resumed as turn-" in answered.text
            handle = runner.active_turn(SESSION)
            if handle is not None:
                await handle.wait(20)
                assert handle.status is TurnStatus.COMPLETED
            assert ui.pending.pending() == []
            again = await client.post(answer, data=form, headers={"Origin": base}, follow_redirects=True)
            assert f"Already answered or withdrawn: session {SESSION} has no pending approval" in again.text
    finally:
        process.kill()
        process.wait(10)
    assert deployed(tmp_path) == ["t0"]


async def test_in_the_browser_a_turn_of_another_process_shows_up_live_and_so_does_its_death(
    tmp_path: Path, browser: Browser, shoot: Shoot
) -> None:
    runner, _ = app(tmp_path).build(tmp_path, 1)
    async with runner, serving(runner) as (ui, base):
        page = await browser.new_page(viewport={"width": 1100, "height": 700})
        await page.goto(ui.login_url(base))
        await expect(page.locator(".empty")).to_be_visible()
        process = subprocess.Popen(
            [sys.executable, str(tmp_path / "paused_app.py"), str(tmp_path), "1"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            line = (await anyio.to_thread.run_sync(process.stdout.readline)).split()
            assert line[:1] == ["waiting"], f"the app did not reach its approval (exit code {process.poll()})"
            request = page.locator(".request")
            await expect(request).to_contain_text(f"running in another process (pid {process.pid})")
            await expect(request.get_by_role("button")).to_have_count(0)
            await shoot(page, "another-process")
            process.send_signal(signal.SIGKILL)
            process.wait(10)
            await expect(request).to_contain_text("Its turn ended with its process")  # the writer's death, live
            await request.get_by_role("button", name="Approve", exact=True).click()
            await expect(page.locator(".notice-ok")).to_contain_text("the turn resumed as turn-")
            await expect(page.locator(".empty")).to_be_visible()
        finally:
            process.kill()
            process.wait(10)
        handle = runner.active_turn(SESSION)
        if handle is not None:
            await handle.wait(20)
    assert deployed(tmp_path) == ["t0"]


@pytest.mark.parametrize("database", ["sqlite", "postgres"])
async def test_the_page_the_cli_and_the_runner_answer_what_is_pending_alike(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], database: str, request: pytest.FixtureRequest
) -> None:
    """One store, three readers, one rule (`SessionStore.pending`): before the runner holds the session and after;
    on either database."""
    root = tmp_path / "sessions" if database == "sqlite" else request.getfixturevalue("pg_cluster").new_database()
    paused = first_life(root, ["policy", "waiting", "answered-running", "waiting"])
    settled = first_life(root, ["answered-ran"])
    runner = AgentRunner(store=root, registry=AgentRegistry(), tools=AgentToolSurface(AgentApprovals()))
    ui = AgentUI(runner, port=1)  # the page's reads, without serving it

    def cli(session_id: str) -> list[str]:
        assert (
            main(
                [
                    "--data-dir",
                    str(tmp_path / "data"),
                    "--sessions",
                    str(root),
                    "sessions",
                    "pending",
                    session_id,
                    "--json",
                ]
            )
            == 0
        )
        return [request["id"] for request in json.loads(capsys.readouterr().out)]

    def page() -> list[tuple[str, str, str]]:
        return [(entry.session_id, entry.request.id, entry.state) for entry in reversed(ui.pending.pending())]

    before = page()
    assert len(before) == 2 and {state for _, _, state in before} == {"paused"}
    assert [request for _, request, _ in before] == cli(paused) and cli(settled) == []
    async with runner:
        asked = [request.id for request in await runner.pending_approvals(paused)]  # the runner now holds it
        assert asked == [request for _, request, _ in before] == cli(paused)
        assert page() == before and await runner.pending_approvals(settled) == []


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20_000),
    lambda inner: st.lists(inner, max_size=150) | st.dictionaries(st.text(max_size=300), inner, max_size=150),
    max_leaves=400,
)


@given(st.dictionaries(st.text(max_size=50), json_values, max_size=120) | st.text(max_size=30_000))
def test_folded_arguments_are_bounded_whatever_the_model_sent(arguments: dict | str) -> None:
    entries = fold_arguments(arguments)
    assert len(entries) <= 101
    for entry in entries:
        assert len(entry.text) <= SHOW_CHARS
        assert len(entry.preview) <= 101
        assert entry.folded or (len(entry.text) <= 240 and entry.omitted == 0)


def test_a_patch_request_is_shown_as_its_diff_with_line_numbers() -> None:
    patch = "--- a/greeter.py\n+++ b/greeter.py\n@@ -7,2 +7,2 @@\n def greet(name):\n-    return 1\n"
    patch += "+    return '<script>'\n"
    shown = proposed_diff("space_unit_apply_patch", {"unit_id": "greeter", "source_id": "greeter.py", "patch": patch})
    assert shown is not None and shown.target == "greeter/greeter.py"
    rows = [(line.kind, line.old, line.new, line.text) for line in shown.lines]
    assert rows[3:] == [
        ("ctx", 7, 7, "def greet(name):"),
        ("del", 8, None, "    return 1"),
        ("add", None, 8, "    return '<script>'"),
    ]
    edit = proposed_diff("unit_apply_patch", {"unit_id": "u", "source_id": "s.py", "old": "a\nb", "new": "a\nc"})
    assert edit is not None and [(line.kind, line.text) for line in edit.lines][1:] == [
        ("ctx", "a"),
        ("del", "b"),
        ("add", "c"),
    ]
    assert proposed_diff("unit_read_source", {"unit_id": "u", "source_id": "s.py"}) is None
    assert proposed_diff("unit_apply_patch", {"unit_id": "u", "source_id": "s.py", "patch": "x" * 300_000}) is None
