"""Risk and bounds (security round 4, item 6): `unit_revert_change`, declared `shell`, undid a person's rollback of
several units without a question under `--confirm destructive`; `unit_changes` returned a reload error's
megabytes whole; 300 `unit_checkpoint` calls in a burst pushed a person's checkpoint off the page behind look-alike
labels. Reverting a change of several sources, or a rollback or a revert, is now `destructive` per call; every
stored message is clipped; each checkpoint says who made it, the page keeps its own findable, and a client keeps a
bounded number."""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from unit_mcp import Host, UnitService
from unit_mcp.bridge import Bridge
from unit_mcp.changelog import MAX_CHECKPOINTS_PER_CLIENT, MAX_MESSAGE
from unit_mcp.confirm import Confirmations
from unit_mcp.service import call_as
from unit_mcp.tools import UnitTools
from unit_mcp.unitpage import UnitsUI
from unit_mcp.unitpage.app import PAGE_CALLER

from .clients import call, connect, visible
from .report import Report

pytestmark = pytest.mark.anyio


def persons_rollback(service: UnitService) -> int:
    """A person's checkpoint, two units edited, and the person's rollback of both: the rollback's change id."""

    def made() -> int:
        checkpoint = service.checkpoint(label="before the edits")
        service.apply_patch("greeter", "greeter.py", old="Hello", new="Howdy")
        service.apply_patch("notes", "__init__.py", old="NOTES = [", new="NOTES = ['edited', ")
        rolled = service.rollback(checkpoint.checkpoint_id)
        assert rolled.change_id is not None
        return rolled.change_id

    return call_as(PAGE_CALLER, made)


async def test_reverting_a_persons_rollback_asks_as_destructive(host: Host, units_root: Path, figures: Report) -> None:
    service = UnitService(host)
    rollback_id = persons_rollback(service)
    greeter, notes = units_root / "greeter.py", units_root / "notes" / "__init__.py"
    before = (greeter.read_bytes(), notes.read_bytes())  # as the person's rollback left them
    tools = UnitTools(service, confirmations=Confirmations(["destructive"]))  # the default --confirm
    async with Bridge(tools.server()) as bridge, connect(bridge.url or "", bridge.token) as client:
        one_source = await call(client, "unit_apply_patch", GREETER_EDIT)
        assert not one_source.is_error, visible(one_source)
        single = await call(client, "unit_revert_change", {"change_id": one_source.structured["change_id"]})
        previewed = await call(client, "unit_revert_change", {"change_id": rollback_id, "dry_run": True})
        undone = await call(client, "unit_revert_change", {"change_id": rollback_id})
    assert not previewed.is_error and len(previewed.structured["sources"]) == 2, "a dry run only reads: not asked"
    assert undone.code == "declined", visible(undone)  # no page, no elicitation: a question nobody can answer
    assert (greeter.read_bytes(), notes.read_bytes()) == before, "the person's rollback stands"
    assert not single.is_error, f"a change of one source stays shell, not asked: {visible(single)}"
    figures.record("risk_and_bounds", revert_of_a_rollback="destructive: asked", revert_of_one_source="shell")


GREETER_EDIT = {"unit_id": "greeter", "source_id": "greeter.py", "old": "Hello", "new": "Hi"}


async def test_a_megabyte_reload_error_is_clipped_in_the_change_log(
    host: Host, units_root: Path, figures: Report
) -> None:
    """A unit whose import fails with a 5 MB message, changed outside the tools: the log's record is clipped, so
    unit_changes (whose first record is always returned whole) stays small."""
    huge = "E" * (5 * 1024 * 1024)
    (units_root / "noisy.py").write_text(f"raise RuntimeError('{huge}')\n")
    service = UnitService(host)
    service.change_log.record_outside("noisy", [("noisy.py", (units_root / "noisy.py").read_bytes())], error=huge)
    tools = UnitTools(service)
    async with Bridge(tools.server()) as bridge, connect(bridge.url or "", bridge.token) as client:
        listed = await call(client, "unit_changes", {"limit": 1})
    size = len(visible(listed))
    record = listed.structured["changes"][0]
    assert len(record["message"]) <= MAX_MESSAGE, f"the message came back whole: {len(record['message']):,}"
    assert size < 64 * 1024, f"unit_changes returned {size:,} bytes"
    figures.record("risk_and_bounds", reload_error_stored_chars=len(record["message"]), unit_changes_bytes=size)


async def test_a_burst_of_look_alike_checkpoints_does_not_hide_the_persons(host: Host, figures: Report) -> None:
    """The burst comes from a client that calls itself what the page is called, with the person's label."""
    service = UnitService(host)
    persons = call_as(PAGE_CALLER, lambda: service.checkpoint(label="before the release"))
    tools = UnitTools(service)
    page = UnitsUI(service)
    look_alike = types.Implementation(name=PAGE_CALLER.name or "", version="1")
    async with (
        Bridge(tools.server()) as bridge,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {bridge.token}"}) as http,
        Client(streamable_http_client(bridge.url or "", http_client=http), client_info=look_alike) as client,
    ):
        for _ in range(300):
            made = await call(client, "unit_checkpoint", {"label": "before the release"})
            assert not made.is_error, visible(made)
    overview = page.templates.get_template("_overview.html").render(root="", now=0, **page._overview({}))
    shown = re.findall(r'data-checkpoint="(\d+)"', overview)
    kept = service.change_log.checkpoints(10_000)
    assert str(persons.checkpoint_id) in shown, "the person's checkpoint is on the page"
    item = re.search(rf'data-checkpoint="{persons.checkpoint_id}".*?</li>', overview, re.S)
    assert item is not None and f"by {PAGE_CALLER.name}" in item.group(0), "and says who made it"
    by_client = [c for c in kept if c.id != persons.checkpoint_id]
    assert all(c.caller.name != PAGE_CALLER.name for c in by_client), "a client cannot pass for the page"
    assert len(by_client) <= MAX_CHECKPOINTS_PER_CLIENT, f"one client keeps {len(by_client)} checkpoints"
    figures.record("risk_and_bounds", checkpoints_of_one_client_kept=len(by_client), persons_shown=True)
