"""The guarantees `--confirm` promises (security round 4, item 5). A page grant ("allow shell for this client's
session") was used by another client: it read the session id from `unit_changes` and sent it as an
`Mcp-Session-Id` header on the 2026-07-28 stateless path, which no session manager routes, and the server took it
for the session. And a Deny was outrun by two concurrent retries of one sealed `requestState`: one was declined,
the other ran. The session is now the transport's (a 2026-07-28 caller has none), the log keeps only a digest of
it, a closed question answers every waiter with its answer, and a second retry of one state is refused."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from unit_mcp import Host, UnitService
from unit_mcp.bridge import Bridge
from unit_mcp.changelog import Caller
from unit_mcp.confirm import Confirmations
from unit_mcp.errors import Declined
from unit_mcp.tools import UnitTools

from .clients import call, connect, visible
from .report import Report

pytestmark = pytest.mark.anyio

VICTIM_EDIT = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Howdy"}
ATTACK_EDIT = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Howdy", "new": "Pwned"}


async def test_a_page_grant_is_not_used_by_a_client_claiming_its_session(
    host: Host, units_root: Path, figures: Report
) -> None:
    confirmations = Confirmations(["shell"], timeout=2, on_page=True)  # a person answers on the page
    tools = UnitTools(UnitService(host), confirmations=confirmations)
    greeter = units_root / "greeter.py"
    async with Bridge(tools.server()) as bridge, connect(bridge.url or "", bridge.token, mode="legacy") as victim:
        victims: list[object] = []

        async def victims_call() -> None:
            victims.append(await call(victim, "unit_apply_patch", VICTIM_EDIT))

        async with anyio.create_task_group() as group:
            group.start_soon(victims_call)
            with anyio.fail_after(30):
                while not (waiting := confirmations.questions()):
                    await anyio.sleep(0.02)
            session = waiting[0].caller.session_id
            assert session is not None, "a handshake-era client over HTTP has its session"
            assert confirmations.allow(waiting[0].id, 15) is not None  # "allow shell for this client for 15 min"
        assert "Howdy" in greeter.read_text(), visible(victims[0])  # type: ignore[arg-type]

        async with connect(bridge.url or "", bridge.token) as reader:  # any holder of the token reads the log
            listed = visible(await call(reader, "unit_changes", {}))
        headers = {"Authorization": f"Bearer {bridge.token}", "Mcp-Session-Id": session}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            Client(streamable_http_client(bridge.url or "", http_client=http)) as attacker,  # 2026-07-28
        ):
            attacked = await call(attacker, "unit_apply_patch", ATTACK_EDIT)
    assert "Pwned" not in greeter.read_text(), "the grant of the victim's session let another client's write through"
    assert attacked.code in ("declined", "confirmation_timeout"), visible(attacked)
    assert session not in listed, "unit_changes shows another client's session id"
    figures.record(
        "confirmation_guarantees",
        claimed_session="asked, not granted",
        session_ids_in_unit_changes=0,
    )


async def test_a_deny_is_not_outrun_by_two_concurrent_retries_of_one_request_state(host: Host, figures: Report) -> None:
    """Two retries of one parked question wait for the page; the person says no: neither may run."""
    confirmations = Confirmations(["shell"], timeout=30, on_page=True)
    question = confirmations.question(Caller("agent", None, None), "unit_apply_patch", "shell", "a patch", None)
    await confirmations.park(question)
    assert question.token is not None
    outcomes: list[str] = []

    async def retry() -> None:
        try:
            await confirmations.resume(question.token or "", None)  # the client's person did not answer: the page
        except Declined:
            outcomes.append("declined")
        else:
            outcomes.append("ran")

    async with anyio.create_task_group() as group:
        group.start_soon(retry)
        group.start_soon(retry)
        await anyio.sleep(0.2)  # both retries are in
        assert confirmations.answer(question.id, False, by="the page")
    assert outcomes == ["declined", "declined"], outcomes
    figures.record("confirmation_guarantees", concurrent_retries_after_a_deny="both declined, none ran")
