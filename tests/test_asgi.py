"""unit_mcp.asgi on a real uvicorn on loopback, with httpx clients: routes of units, 503 only for a unit not loaded,
no failed request and no lost write while the units reload, request-time errors in the app log, streams across a
reload, and the units app mounted in the user's own Starlette app."""

from __future__ import annotations

import signal
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
from conftest import root_of
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp
from support.server_process import ServerProcess

from unit_mcp import Host, UnitService
from unit_mcp.asgi import unit_use, units_app
from unit_mcp.loopback import LoopbackServer

pytestmark = pytest.mark.anyio

TALLY = """\
import threading
import time

from starlette.responses import JSONResponse
from starlette.routing import Route

_lock = threading.Lock()
count = 0


async def add(request):
    global count
    with _lock:
        count += 1
        return JSONResponse({"count": count})


async def show(request):
    return JSONResponse({"count": count})


async def fail(request):
    raise RuntimeError("the unit broke while answering")


def snapshot():
    taken = {"count": count}
    time.sleep(0.005)  # a snapshot that takes a moment: a request reaching this module now would lose its write
    return taken


def restore(state):
    global count
    count = state["count"]


routes = [Route("/", show), Route("/add", add, methods=["POST"]), Route("/fail", fail)]
"""

WHERE = """\
import threading

from starlette.responses import JSONResponse
from starlette.routing import Route


async def where(request):
    return JSONResponse({"thread": threading.current_thread().name})


routes = [Route("/", where)]
"""

TICKER = """\
import asyncio

from starlette.responses import StreamingResponse
from starlette.routing import Route

VERSION = {version}
release = asyncio.Event()


async def ticks(request):
    async def events():
        yield f"data: v{{VERSION}} first\\n\\n"
        await release.wait()
        for n in range(3):
            yield f"data: v{{VERSION}} tick {{n}}\\n\\n"

    return StreamingResponse(events(), media_type="text/event-stream")


routes = [Route("/", ticks)]
"""


def put_unit(host: Host, unit_id: str, source: str) -> Path:
    path = root_of(host) / f"{unit_id}.py"
    path.write_text(textwrap.dedent(source))
    host.reload(unit_id)
    return path


async def serving(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    server = LoopbackServer()
    await server.start(app)
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            yield client
    finally:
        await server.stop()


@pytest.fixture
async def client(host: Host) -> AsyncIterator[httpx.AsyncClient]:
    async for started in serving(units_app(host)):
        yield started


async def test_each_unit_serves_its_routes_under_its_id(host: Host, client: httpx.AsyncClient) -> None:
    index = (await client.get("/")).json()["units"]
    assert index == {"counter": "counter/", "greeter": "greeter/", "weather": "weather/"}
    assert (await client.get("/counter/")).json() == {"count": 0, "step": 1}
    assert (await client.post("/counter/increment")).json() == {"count": 1}
    assert (await client.get("/greeter/Ada")).text == "Hello, Ada!"
    assert (await client.get("/weather/lisbon")).json() == {"forecast": "sunny, 19 °C"}
    assert (await client.get("/weather/atlantis")).status_code == 404
    assert (await client.get("/counter/nothing-here")).status_code == 404
    assert (await client.get("/notes/")).status_code == 404, "a loaded unit without routes"
    assert (await client.get("/nosuchunit/")).status_code == 404
    refused = await client.get("/broken/")
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1", "a unit that did not load"


async def test_no_request_fails_and_no_write_is_lost_while_the_unit_reloads(
    host: Host, client: httpx.AsyncClient
) -> None:
    put_unit(host, "tally", TALLY)
    statuses: list[int] = []
    stop = anyio.Event()

    async def writer() -> None:
        while not stop.is_set():
            statuses.append((await client.post("/tally/add")).status_code)

    async with anyio.create_task_group() as tasks:
        for _ in range(8):
            tasks.start_soon(writer)
        for _ in range(15):
            await anyio.to_thread.run_sync(host.reload, "tally")
        stop.set()
    assert statuses and set(statuses) == {200}
    assert (await client.get("/tally/")).json() == {"count": len(statuses)}


async def test_a_request_time_exception_is_answered_500_and_logged_for_unit_read_log(
    host: Host, client: httpx.AsyncClient
) -> None:
    put_unit(host, "tally", TALLY)
    answer = await client.get("/tally/fail?x=1", headers={"Authorization": "Bearer very-secret-value"})
    assert answer.status_code == 500
    found = UnitService(host).read_log(grep="GET /tally/fail failed")
    assert len(found.lines) == 1 and "units.tally" in found.lines[0]
    log = host.log_path.read_text()
    assert "RuntimeError: the unit broke while answering" in log
    assert 'raise RuntimeError("the unit broke while answering")' in log
    assert "very-secret-value" not in log
    assert (await client.get("/tally/")).status_code == 200, "the unit serves on"


async def test_a_stream_started_before_a_reload_runs_to_its_end_on_the_old_version(
    host: Host, client: httpx.AsyncClient
) -> None:
    path = put_unit(host, "ticker", TICKER.format(version=1))
    old = host.module("ticker")
    async with client.stream("GET", "/ticker/") as stream:
        lines = stream.aiter_lines()
        assert await anext(lines) == "data: v1 first"
        path.write_text(TICKER.format(version=2))
        result = await anyio.to_thread.run_sync(host.reload, "ticker")  # does not wait for the open stream
        assert result.blocked_ms >= result.window_ms >= 0
        assert host.module("ticker") is not old
        old.release.set()
        rest = [line async for line in lines if line]
    assert rest == ["data: v1 tick 0", "data: v1 tick 1", "data: v1 tick 2"]
    host.module("ticker").release.set()
    async with client.stream("GET", "/ticker/") as stream:
        assert await anext(stream.aiter_lines()) == "data: v2 first"


async def test_the_units_app_mounts_in_your_own_starlette_app(host: Host) -> None:
    app = Starlette(routes=[Mount("/units", app=units_app(host))])
    async for client in serving(app):
        assert (await client.post("/units/counter/increment")).json() == {"count": 1}
        assert (await client.get("/units/counter/")).json() == {"count": 1, "step": 1}
        assert (await client.get("/units/")).json()["units"]["counter"] == "counter/"


async def test_a_server_on_its_own_loop_answers_while_the_callers_loop_is_busy(host: Host) -> None:
    """`unit-mcp serve --app-port` serves the app so: a request is answered while the loop that started the server
    (the one the MCP calls run on) is busy, and stop() ends the thread; a port taken is the caller's error."""
    put_unit(host, "where", WHERE)
    server = LoopbackServer()
    await server.start_on_own_loop(units_app(host), name="app-under-test")
    answered: list[tuple[float, str]] = []

    def get() -> None:
        reply = httpx.get(f"{server.base_url}/where/", timeout=30)
        answered.append((time.monotonic(), reply.json()["thread"]))

    try:
        asker = threading.Thread(target=get)
        asker.start()
        time.sleep(1.0)  # the caller's loop does nothing else meanwhile: a request queued on it would wait
        busy_until = time.monotonic()
        asker.join(30)
        assert answered and answered[0][0] < busy_until, "the request waited for the caller's loop"
        assert answered[0][1] == "app-under-test"
        taken = LoopbackServer(port=server.port or 0)
        with pytest.raises(RuntimeError, match="cannot listen"):
            await taken.start_on_own_loop(units_app(host), name="second")
    finally:
        await server.stop()
    assert not any(thread.name == "app-under-test" for thread in threading.enumerate())
    assert await server.stop() is None, "a second stop does nothing"


async def test_serve_with_app_port_serves_the_examples_an_agent_changes_through_mcp(
    tmp_path: Path, server_processes: list[ServerProcess]
) -> None:
    process = ServerProcess("--no-watch", "--app-port", "0", tmp=tmp_path)
    server_processes.append(process)
    printed = process.ready()
    app_url = printed["APP_URL"]
    assert app_url.startswith("http://127.0.0.1:") and app_url.endswith("/")
    async with httpx.AsyncClient(base_url=app_url, timeout=30) as web:
        assert (await web.post("counter/increment")).json() == {"count": 1}
        headers = {"Authorization": f"Bearer {printed['MCP_TOKEN']}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http,
            Client(streamable_http_client(printed["MCP_URL"], http_client=http), mode="legacy") as client,
        ):
            patched = await client.call_tool(
                "unit_apply_patch",
                {"unit_id": "counter", "source_id": "__init__.py", "old": "step = 1", "new": "step = 5"},
            )
            assert not patched.is_error and patched.structured_content["reload"]["reloaded"]
        assert (await web.post("counter/increment")).json() == {"count": 6}, "the state moved, the new step serves"
        assert (await web.get("counter/")).json() == {"count": 6, "step": 5}
    assert process.stop(signal.SIGTERM) == 0


FEED = """\
import asyncio

from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from unit_mcp.asgi import unit_use

VERSION = {version}
count = 0
release = asyncio.Event()


async def feed(request):
    async def events():
        yield "data: started\\n\\n"
        await release.wait()
        for n in range(3):
            async with unit_use(request) as unit:  # each write handed to the version serving now
                unit.count += 1
                yield f"data: write {{n}} by v{{VERSION}} into v{{unit.VERSION}}\\n\\n"

    return StreamingResponse(events(), media_type="text/event-stream")


async def show(request):
    return JSONResponse({{"count": count, "version": VERSION}})


def snapshot():
    return {{"count": count}}


def restore(state):
    global count
    count = state["count"]


routes = [Route("/", feed), Route("/count", show)]
"""


async def test_a_stream_hands_its_writes_after_a_reload_to_the_new_version(
    host: Host, client: httpx.AsyncClient
) -> None:
    """The stream runs on the version it started with; its writes through unit_use(request) land in the version that
    serves when it writes (a write into its own module after the swap would be lost)."""
    path = put_unit(host, "feed", FEED.format(version=1))
    old = host.module("feed")
    async with client.stream("GET", "/feed/") as stream:
        lines = stream.aiter_lines()
        assert await anext(lines) == "data: started"
        path.write_text(FEED.format(version=2))
        await anyio.to_thread.run_sync(host.reload, "feed")
        old.release.set()
        rest = [line async for line in lines if line]
    assert rest == [f"data: write {n} by v1 into v2" for n in range(3)]
    assert (await client.get("/feed/count")).json() == {"count": 3, "version": 2}
    assert old.count == 0
    with pytest.raises(LookupError, match="units_app"):
        unit_use({"type": "http"})
