"""A person's yes before a risky call (`--confirm`): the real bridge over Streamable HTTP, the SDK's client with
an elicitation handler (handshake era; a 2026-07-28 client is asked on the page) and without one (both eras), and
the unit server's page answered over HTTP with its credential."""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from unit_mcp.bridge import Bridge
from unit_mcp.changelog import Caller
from unit_mcp.confirm import Confirmations
from unit_mcp.errors import Declined
from unit_mcp.host import Host
from unit_mcp.server import parse_args
from unit_mcp.service import UnitService
from unit_mcp.tools import UnitTools
from unit_mcp.unitpage import UnitsUI
from unit_mcp.wire import ERROR_META_KEY

from .conftest import page_client

pytestmark = pytest.mark.anyio
EXAMPLE_UNITS = Path(__file__).resolve().parents[2] / "unit_mcp" / "examples" / "units"
PATCH = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Howdy"}
WAIT = 60  # generous bound on a wait that ends as soon as its condition holds
ERAS = ["legacy", "auto"]


@dataclass
class Served:
    bridge: Bridge
    page: UnitsUI
    confirmations: Confirmations
    units: Path

    @property
    def base(self) -> str:
        return f"{self.bridge.base_url}/units"

    def greeting_changed(self) -> bool:
        return "Howdy" in (self.units / "greeter.py").read_text()


@asynccontextmanager
async def served(tmp_path: Path, risks: list[str], timeout: float = 300.0) -> AsyncIterator[Served]:
    units = tmp_path / "units"
    shutil.copytree(EXAMPLE_UNITS, units, ignore=shutil.ignore_patterns("__pycache__"))
    confirmations = Confirmations(risks, timeout=timeout, on_page=True)
    with Host(units, tmp_path / "host-data", namespace=f"confirm_units_{secrets.token_hex(4)}") as host:
        tools = UnitTools(UnitService(host), confirmations=confirmations)
        page = UnitsUI(tools.service, confirmations=confirmations)
        async with Bridge(tools.server(), config_root=tmp_path / "oc", pages={"/units": page.app}) as bridge:
            yield Served(bridge, page, confirmations, units)


@asynccontextmanager
async def client(server: Served, mode: str, elicit: Any = None, name: str = "confirm-test") -> AsyncIterator[Client]:
    assert server.bridge.url is not None
    headers = {"Authorization": f"Bearer {server.bridge.token}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
        Client(
            streamable_http_client(server.bridge.url, http_client=http),
            mode=mode,  # type: ignore[arg-type]
            client_info=types.Implementation(name=name, version="1"),
            elicitation_callback=elicit,
        ) as connected,
    ):
        yield connected


async def waiting(server: Served, count: int = 1) -> None:
    with anyio.fail_after(WAIT):
        while len(server.confirmations.questions()) != count:
            await anyio.sleep(0.05)


CONFIRM_OUTCOMES = ("asked", "approved", "declined", "unanswered", "withdrawn")


def questions_logged(server: Served) -> list[tuple[str, str | None]]:
    """The change log's question and answer records, oldest first, as (outcome, error code)."""
    changes = server.page.service.change_log.changes(limit=50)
    return [(c.outcome, c.error_code) for c in reversed(changes) if c.outcome in CONFIRM_OUTCOMES]


async def withdrawn(server: Served) -> None:
    """Waits until the change log records the question withdrawn (the server notices a client leave on its own)."""
    with anyio.fail_after(WAIT):
        while questions_logged(server) != [("asked", None), ("withdrawn", None)]:
            await anyio.sleep(0.05)


def refusal(result: types.CallToolResult) -> str:
    assert result.is_error, result
    assert result.meta is not None
    return str(result.meta[ERROR_META_KEY]["code"])


def answering(action: str, approve: bool, asked: list[str]) -> Any:
    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action=action, content={"approve": approve} if action == "accept" else None)  # type: ignore[arg-type]

    return elicit


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_that_elicits_is_asked_with_the_diff_and_its_yes_runs_the_call(
    tmp_path: Path, mode: str
) -> None:
    asked: list[str] = []
    async with served(tmp_path, ["shell"]) as server, client(server, mode, answering("accept", True, asked)) as c:
        done = await c.call_tool("unit_apply_patch", PATCH)
        assert not done.is_error, done
        assert server.greeting_changed()
        assert len(asked) == 1
        assert "unit_apply_patch (risk shell) from client confirm-test" in asked[0]
        assert "unit_id=greeter source_id=greeter.py" in asked[0]
        assert "-" in asked[0] and "+" in asked[0] and "Howdy" in asked[0]  # the dry run's diff
        dry = await c.call_tool("unit_apply_patch", {**PATCH, "old": "Howdy", "new": "Hi", "dry_run": True})
        assert not dry.is_error and len(asked) == 1  # a dry run's risk is filesystem-read: not asked
        assert server.confirmations.questions() == []
        assert questions_logged(server) == [("asked", None), ("approved", None)]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_no_from_the_client_is_declined_and_writes_nothing(tmp_path: Path, mode: str) -> None:
    for action in ("decline", "accept"):  # a declined form, and a form sent back with the box unticked
        asked: list[str] = []
        async with (
            served(tmp_path / action, ["shell"]) as server,
            client(server, mode, answering(action, False, asked)) as c,
        ):
            assert refusal(await c.call_tool("unit_apply_patch", PATCH)) == "declined"
            assert not server.greeting_changed() and len(asked) == 1
            assert questions_logged(server) == [("asked", None), ("declined", "declined")]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_question_the_client_dismisses_is_left_to_the_page(
    tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancel (dismissed without a choice; headless Claude Code sends one at once) is no answer: the page's is."""
    caplog.set_level(logging.INFO, logger="unit_mcp.confirm")
    asked: list[str] = []
    async with (
        served(tmp_path, ["shell"]) as server,
        client(server, mode, answering("cancel", False, asked)) as c,
        page_client(server.page.login_url(server.base)) as page,
        anyio.create_task_group() as tasks,
    ):
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await c.call_tool("unit_apply_patch", PATCH))

        tasks.start_soon(call)
        with anyio.fail_after(WAIT):
            while "was not answered through the client" not in caplog.text:
                await anyio.sleep(0.05)
        assert len(asked) == 1 and not server.greeting_changed()
        question = server.confirmations.questions()[0]
        post = await page.post(f"/questions/{question.id}/approve", headers={"Origin": server.bridge.base_url})
        assert post.status_code in (200, 303), post.text
    assert not results[0].is_error, results[0]
    assert server.greeting_changed()
    assert questions_logged(server) == [("asked", None), ("approved", None)]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_without_elicitation_waits_for_the_page_and_a_second_call_waits_beside_it(
    tmp_path: Path, mode: str
) -> None:
    async with served(tmp_path, ["shell"]) as server, client(server, mode) as c:
        async with page_client(server.page.login_url(server.base)) as page, anyio.create_task_group() as tasks:
            results: dict[str, types.CallToolResult] = {}

            async def call(tool: str, arguments: dict[str, Any]) -> None:
                results[tool] = await c.call_tool(tool, arguments)

            before = server.page.state()
            tasks.start_soon(call, "unit_apply_patch", PATCH)
            await waiting(server)
            assert server.page.state() != before  # an open page's event stream redraws it
            tasks.start_soon(call, "unit_reload", {"unit_id": "greeter"})
            await waiting(server, 2)  # a second call waits beside the first
            assert not server.greeting_changed()
            shown = (await page.get("/")).text
            assert "Waiting for your yes" in shown and "unit_reload" in shown and "Howdy" in shown  # the diff
            patch, reload = server.confirmations.questions()
            assert (patch.tool, reload.tool) == ("unit_apply_patch", "unit_reload")
            assert f'/questions/{patch.id}/approve"' in shown
            origin = {"Origin": server.bridge.base_url}
            denied = await page.post(f"/questions/{reload.id}/deny", headers=origin)
            assert denied.status_code in (200, 303), denied.text
            post = await page.post(f"/questions/{patch.id}/approve", headers=origin)
            assert post.status_code in (200, 303), post.text
            late = await page.post(f"/questions/{patch.id}/deny", headers=origin)
            assert late.status_code == 409  # answered already: no second answer
        assert not results["unit_apply_patch"].is_error, results["unit_apply_patch"]
        assert refusal(results["unit_reload"]) == "declined"
        logged = await c.call_tool("unit_read_log", {"grep": "unit_mcp.confirm"})
        lines = "\n".join((logged.structured_content or {}).get("lines", []))
        assert "unit_apply_patch (risk shell) from client 'confirm-test'" in lines and "waits for a yes" in lines
        assert f"question {patch.id} answered yes by the page" in lines
        assert f"question {reload.id} answered no by the page" in lines
        assert server.greeting_changed()


@pytest.mark.parametrize("mode", ERAS)
async def test_where_the_page_answers_first_its_answer_stands(tmp_path: Path, mode: str) -> None:
    """Handshake era: the client's question is withdrawn (its handler is cancelled); 2026-07-28: the client's
    later answer (a no here) does not override the page's yes."""
    asked, answered = anyio.Event(), anyio.Event()

    async def slow(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.set()
        with anyio.fail_after(WAIT):
            await answered.wait()
        return types.ElicitResult(action="decline")

    async with served(tmp_path, ["shell"]) as server, client(server, mode, slow) as c:
        async with page_client(server.page.login_url(server.base)) as page, anyio.create_task_group() as tasks:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await c.call_tool("unit_apply_patch", PATCH))

            tasks.start_soon(call)
            with anyio.fail_after(WAIT):
                await asked.wait()
            question = server.confirmations.questions()[0]
            post = await page.post(f"/questions/{question.id}/approve", headers={"Origin": server.bridge.base_url})
            assert post.status_code in (200, 303), post.text
            answered.set()
        assert not results[0].is_error, results[0]
        assert server.greeting_changed()
        assert server.confirmations.questions() == []
        assert questions_logged(server) == [("asked", None), ("approved", None)]
        approved = [c for c in server.page.service.change_log.changes() if c.outcome == "approved"]
        assert "yes from the page" in (approved[0].message or "")
        # the client is still usable: a read runs without a question
        assert not (await c.call_tool("unit_list", {})).is_error


async def test_no_answer_in_time_is_a_confirmation_timeout(tmp_path: Path) -> None:
    async with served(tmp_path, ["destructive"], timeout=0.5) as server, client(server, "legacy") as c:
        checkpoint = await c.call_tool("unit_checkpoint", {})
        assert not checkpoint.is_error  # normal: not asked
        assert checkpoint.structured_content is not None
        rollback = {"checkpoint_id": checkpoint.structured_content["checkpoint_id"]}
        assert refusal(await c.call_tool("unit_rollback", rollback)) == "confirmation_timeout"
        assert server.confirmations.questions() == []
        assert questions_logged(server) == [("asked", None), ("unanswered", "confirmation_timeout")]


async def test_a_2026_client_that_answers_after_the_timeout_gets_a_confirmation_timeout(tmp_path: Path) -> None:
    async def late(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        with anyio.fail_after(WAIT):
            while server.confirmations.questions():  # looking expires the question once its time is up
                await anyio.sleep(0.05)
        return types.ElicitResult(action="accept", content={"approve": True})

    async with served(tmp_path, ["shell"], timeout=0.5) as server, client(server, "auto", late) as c:
        assert refusal(await c.call_tool("unit_apply_patch", PATCH)) == "confirmation_timeout"
        assert not server.greeting_changed()
        assert questions_logged(server) == [("asked", None), ("unanswered", "confirmation_timeout")]


@pytest.mark.parametrize("mode", ERAS)
async def test_a_client_that_gives_up_while_waiting_leaves_nothing_pending(tmp_path: Path, mode: str) -> None:
    """Handshake era: the client sends notifications/cancelled; 2026-07-28: it closes the call's response."""
    async with served(tmp_path, ["shell"]) as server:
        async with client(server, mode) as c:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(c.call_tool, "unit_apply_patch", PATCH)
                await waiting(server)
                tasks.cancel_scope.cancel()
            await waiting(server, 0)
            assert not (await c.call_tool("unit_list", {})).is_error  # the session goes on
        assert not server.greeting_changed()
        await withdrawn(server)


async def test_the_page_allows_a_risk_for_the_session_for_some_minutes_and_revokes_it(tmp_path: Path) -> None:
    async with (
        served(tmp_path, ["shell"], timeout=WAIT) as server,
        client(server, "legacy") as c,
        client(server, "legacy") as same_name,  # another session of a client that calls itself the same
        page_client(server.page.login_url(server.base)) as page,
        anyio.create_task_group() as tasks,
    ):
        origin = {"Origin": server.bridge.base_url}
        results: list[types.CallToolResult] = []

        async def call(on: Client, arguments: dict[str, Any]) -> None:
            results.append(await on.call_tool("unit_apply_patch", arguments))

        tasks.start_soon(call, c, PATCH)
        await waiting(server)
        question = server.confirmations.questions()[0]
        assert question.caller.session_id is not None
        shown = (await page.get("/")).text
        assert f"/questions/{question.id}/allow" in shown and "for this client" in shown
        refused = await page.post(f"/questions/{question.id}/allow", data={"minutes": "x"}, headers=origin)
        assert refused.status_code == 400 and "minutes" in refused.text
        allowed = await page.post(f"/questions/{question.id}/allow", data={"minutes": "5"}, headers=origin)
        assert allowed.status_code in (200, 303), allowed.text
        with anyio.fail_after(WAIT):
            while not results:
                await anyio.sleep(0.05)
        assert not results[0].is_error, results[0]  # the allow answered the waiting call yes
        grant = server.confirmations.grants()[0]
        assert grant.session == question.caller.session_id
        assert 4 * 60 < grant.until - server.confirmations.clock() <= 5 * 60
        shown = (await page.get("/")).text
        assert "Allowed without asking" in shown and f"/grants/{grant.id}/revoke" in shown
        done = await c.call_tool("unit_apply_patch", {**PATCH, "old": "Howdy", "new": "Hi"})
        assert not done.is_error, done  # no question: the grant covers this session
        assert server.confirmations.questions() == []
        tasks.start_soon(call, same_name, {**PATCH, "old": "Hi", "new": "Hey"})
        await waiting(server)  # the same client name in another session is asked: the grant is the session's
        other = server.confirmations.questions()[0]
        assert server.confirmations.answer(other.id, False, by="the test")
        revoked = await page.post(f"/grants/{grant.id}/revoke", headers=origin)
        assert revoked.status_code in (200, 303), revoked.text
        assert server.confirmations.grants() == []
        tasks.start_soon(call, c, {**PATCH, "old": "Hi", "new": "Hey"})
        await waiting(server)  # asked again after the revoke
        again = server.confirmations.questions()[0]
        assert server.confirmations.answer(again.id, False, by="the test")
    assert [refusal(r) for r in results[1:]] == ["declined", "declined"]


def test_the_confirm_options() -> None:
    assert parse_args([]).confirm == ["destructive"]
    assert parse_args(["--confirm", "shell", "--confirm", "destructive"]).confirm == ["shell", "destructive"]
    assert parse_args(["--confirm", "none"]).confirm == []
    assert parse_args(["--confirm-timeout", "5"]).confirm_timeout == 5
    for wrong in (["--confirm", "sometimes"], ["--confirm", "none", "--confirm", "shell"], ["--confirm-timeout", "0"]):
        with pytest.raises(SystemExit):
            parse_args(wrong)


async def test_without_a_page_a_client_that_cannot_ask_is_declined_at_once() -> None:
    confirmations = Confirmations(["shell"])  # --stdio: no page
    reload_question = confirmations.question(
        Caller("c", None, None), "unit_reload", "shell", "unit_reload of greeter", None
    )
    with pytest.raises(Declined, match="nobody can be asked"):
        await confirmations.ask(reload_question, None)

    async def cannot(message: str) -> bool:
        raise RuntimeError("no back-channel")

    with pytest.raises(Declined, match="nobody"):
        await confirmations.ask(reload_question, cannot)
    assert confirmations.questions() == []


def test_a_page_takes_only_confirmations_made_for_a_page(tmp_path: Path) -> None:
    """Made without `on_page`, the questions are declined when the client cannot ask: a page given them says so at
    once, instead of showing questions nobody expected it to answer."""
    (tmp_path / "units").mkdir()
    with Host(tmp_path / "units", tmp_path / "data", namespace=f"confirm_units_{secrets.token_hex(4)}") as host:
        service = UnitService(host)
        with pytest.raises(ValueError, match=r"on_page=True"):
            UnitsUI(service, confirmations=Confirmations(["shell"]))
        assert UnitsUI(service, confirmations=Confirmations(["shell"], on_page=True)).confirmations is not None


def test_a_grant_covers_its_session_or_for_a_session_less_client_its_name() -> None:
    confirmations = Confirmations(["shell"], clock=lambda: 1000.0)
    in_session, other_session = Caller("c", None, "s1"), Caller("c", None, "s2")
    stateless, stateless_other = Caller("c", None, None), Caller("d", None, None)
    confirmations.grant(in_session, "shell", 5)
    assert not confirmations.needed("shell", in_session)
    assert confirmations.needed("shell", other_session) and confirmations.needed("shell", stateless)
    confirmations.grant(stateless, "shell", 5)
    assert not confirmations.needed("shell", stateless)
    assert confirmations.needed("shell", stateless_other) and confirmations.needed("shell", other_session)
    with pytest.raises(ValueError, match="neither an MCP session nor a name"):
        confirmations.grant(Caller(None, None, None), "shell", 5)
    with pytest.raises(ValueError, match="needs no yes"):
        confirmations.grant(in_session, "destructive", 5)
