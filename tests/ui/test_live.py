"""The page's event streams follow the store's `changes()`: a reconnect with `Last-Event-ID` gets exactly what it
missed, a session replaced under its id asks the page to reload, and the store stream speaks only when something
changed."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx
import pytest

from unit_mcp.agent.items import MessageItem

from .conftest import embedded, page_client

pytestmark = pytest.mark.anyio
NO_MODEL = "http://127.0.0.1:9/v1"


async def next_event(client: httpx.AsyncClient, url: str, **headers: str) -> tuple[str | None, str, dict]:
    """Connect, and return the first event (id, name, data); the stream is closed afterwards."""
    event: dict[str, str] = {}
    with anyio.fail_after(20):
        async with client.stream("GET", url, headers=headers) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if line.startswith(("id:", "event:", "data:")):
                    key, _, value = line.partition(":")
                    event[key] = value.strip()
                elif not line and "event" in event:
                    return event.get("id"), event["event"], json.loads(event["data"])
    raise AssertionError("the stream ended without an event")


async def test_a_reconnect_gets_what_it_missed_and_a_replaced_session_resets_the_page(tmp_path: Path) -> None:
    async with embedded(tmp_path, None, NO_MODEL) as app, page_client(app.login_url) as client:
        store = app.runner.store
        session = store.create("unit-agent", session_id="ses-live")
        store.append_item(session.id, MessageItem(role="user", content="first"))
        url = f"{app.base}/sessions/ses-live/events"
        page = (await client.get(f"{app.base}/sessions/ses-live")).text
        shown = page.split('data-from="')[1].split('"')[0]  # what the page rendered

        async def later(text: str) -> None:
            await anyio.sleep(0.5)
            store.append_item(session.id, MessageItem(role="assistant", content=text))

        async with anyio.create_task_group() as tg:
            tg.start_soon(later, "second")
            first_id, name, data = await next_event(client, f"{url}?from={shown}")
        assert name == "item" and data["id"] == "itm-2" and "second" in data["html"] and first_id

        store.append_item(session.id, MessageItem(role="assistant", content="third <b>"))  # while disconnected
        missed_id, name, data = await next_event(client, f"{url}?from={shown}", **{"Last-Event-ID": first_id})
        assert name == "item" and data["id"] == "itm-3"  # not itm-2 again: Last-Event-ID wins over `from`
        assert "third &lt;b&gt;" in data["html"] and "<b>" not in data["html"]

        store.delete(session.id)
        store.create("unit-agent", session_id="ses-live")  # another session under the same id
        assert (await next_event(client, url, **{"Last-Event-ID": missed_id}))[1] == "reset"


async def test_the_store_stream_speaks_when_the_store_changed_since_the_clients_last_event(tmp_path: Path) -> None:
    async with embedded(tmp_path, None, NO_MODEL) as app, page_client(app.login_url) as client:
        url = f"{app.base}/events"
        state, name, _ = await next_event(client, f"{url}?from=stale")
        assert name == "store" and state == app.ui.store_state()

        async def later() -> None:
            await anyio.sleep(0.5)
            app.runner.store.create("unit-agent", session_id="ses-new")

        async with anyio.create_task_group() as tg:
            tg.start_soon(later)
            changed, name, _ = await next_event(client, url, **{"Last-Event-ID": state})  # waits for the change
        assert name == "store" and changed != state and changed == app.ui.store_state()
