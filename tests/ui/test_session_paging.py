"""The sessions list of the page, served from a PostgreSQL store, a page at a time: newest first, a link to the older
ones, and a cursor that is not one answered with a clear 400."""

from __future__ import annotations

import re
from typing import Any

import pytest

from unit_mcp.agent import AgentApprovals, AgentRegistry, AgentRunner, AgentToolSurface, SessionStore
from unit_mcp.agent.ui.app import PAGE_SIZE

from .conftest import page_client, serving

pytestmark = pytest.mark.anyio


async def test_the_page_lists_a_postgres_store_a_page_at_a_time(pg_cluster: Any) -> None:
    address = pg_cluster.new_database()
    store = SessionStore(address, durability="never")
    made = [store.create("a", title=f"number {n}").id for n in range(PAGE_SIZE + 5)]
    store.close()
    runner = AgentRunner(store=address, registry=AgentRegistry(), tools=AgentToolSurface(AgentApprovals()))
    async with runner, serving(runner) as (ui, base), page_client(ui.login_url(base)) as client:
        first = (await client.get("/sessions")).text
        shown = re.findall(r'<td><a href="/sessions/(ses-[0-9a-f]+)">', first)
        assert shown == made[::-1][:PAGE_SIZE]
        (older,) = re.findall(r'<a href="(/sessions\?after=[^"]+)">Older sessions</a>', first)
        assert 'data-fragment="/fragments/sessions"' in first
        second = (await client.get(older)).text
        assert re.findall(r'<td><a href="/sessions/(ses-[0-9a-f]+)">', second) == made[::-1][PAGE_SIZE:]
        assert "Older sessions" not in second and 'data-fragment="/fragments/sessions?after=' in second
        fragment = (await client.get(older.replace("/sessions?", "/fragments/sessions?"))).text
        assert re.findall(r'<td><a href="/sessions/(ses-[0-9a-f]+)">', fragment) == made[::-1][PAGE_SIZE:]
        refused = await client.get("/sessions?after=nonsense")
        assert refused.status_code == 400 and refused.text.startswith("invalid page cursor 'nonsense'")
